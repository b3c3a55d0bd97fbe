"""Training the feature-conditioned block-diffusion drafter (``models/conditioned.py``).

The frozen verifier reads each sequence (prompt ⊕ its own greedy continuation) once and yields its
hidden states; the drafter learns, for many windows per sequence in one forward, the next ``gamma``
tokens from those features, with the visibility of a decoding round. Objectives are the shared
window losses (``masked_ce``: cross-entropy at every slot; ``streak``: streak-distillation).
"""

from __future__ import annotations

import torch

from ..models.conditioned import ConditionedDrafter
from ..models.loading import load_verifier
from .losses import masked_ce_loss, streak_loss
from .slice_drafter import SharedEmbeddingDrafterTraining, block_targets, sample_block_starts

__all__ = ["ConditionedDrafterTraining"]

_OBJECTIVES = {"masked_ce": masked_ce_loss, "streak": streak_loss}


class ConditionedDrafterTraining(SharedEmbeddingDrafterTraining):
    """Train a :class:`ConditionedDrafter` against a frozen verifier.

    Args:
        verifier: a :func:`~specdiff_lightning.models.loading.load_verifier` spec.
        num_layers: the drafter's depth (its layers start as the verifier's first ones, or as
            ``init_layers_from``'s).
        feature_layers: the verifier's hidden states the drafter reads (0: embeddings, i: after layer i).
        init_layers_from: a saved diffusion slice (``models/slicing.py``) whose layers and norm start the drafter.
        init_from: a saved conditioned drafter to continue training.
        objective: ``"masked_ce"`` or ``"streak"``.
        gamma, blocks: the window, and windows per sequence and step.
        mask_token_id: an id the verifier never emits (SmolLM2: 16, ``<empty_output>``).
        targets: ``"corpus"``: the record's own tokens (the verifier's greedy continuations); or
            ``"verifier"``: the verifier's teacher-forced argmax at every position (what it would
            write next after the record's prefix), so any text (e.g. real code answers) can train it.
        cache_features: keep each sequence's features after its first epoch (bf16, in memory), so the
            verifier reads every sequence once.
        export_dir: write the trained drafter here when training ends (an existing one stops ``fit``
            before it trains, unless ``overwrite_export``).
        overwrite_export: replace what ``export_dir`` holds (an earlier run's export).
    """

    def __init__(
        self,
        verifier: str = "smollm2-135m-instruct",
        num_layers: int = 2,
        feature_layers: tuple[int, ...] = (2, 15, 28),
        init_layers_from: str | None = None,
        init_from: str | None = None,
        objective: str = "masked_ce",
        gamma: int = 8,
        blocks: int = 24,
        mask_token_id: int = 16,
        draft_temperature: float = 1.0,
        lr: float = 5e-4,
        weight_decay: float = 0.0,
        warmup_steps: int = 20,
        seed: int = 0,
        targets: str = "corpus",
        cache_features: bool = True,
        export_dir: str | None = None,
        export_dtype: str = "bfloat16",
        overwrite_export: bool = False,
    ) -> None:
        super().__init__()
        if objective not in _OBJECTIVES:
            raise ValueError(f"objective must be one of {sorted(_OBJECTIVES)}, got {objective!r}")
        if targets not in ("corpus", "verifier"):
            raise ValueError(f"targets must be 'corpus' or 'verifier', got {targets!r}")
        self.save_hyperparameters()
        frozen = load_verifier(verifier, dtype=torch.float32)
        # Not a submodule: frozen, shared, never checkpointed (the drafter's embeddings are its tensors).
        self._hold_verifier(frozen)
        if init_from:
            drafter = ConditionedDrafter.from_slice(frozen, init_from)
        else:
            drafter = ConditionedDrafter.build(frozen, num_layers, tuple(feature_layers), mask_token_id)
            if init_layers_from:
                from ..models.slicing import load_slice

                layers, _ = load_slice(frozen, init_layers_from)
                drafter.model.model.layers.load_state_dict(layers.model.layers.state_dict())
                drafter.model.model.norm.load_state_dict(layers.model.norm.state_dict())
        drafter.model.model.layers.requires_grad_(True)
        drafter.model.model.norm.requires_grad_(True)
        self.drafter_model = drafter.model.train()
        self.fusion = drafter.fusion.train().requires_grad_(True)
        self.drafter = drafter
        self._generator = torch.Generator().manual_seed(seed)
        self._features: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def on_fit_start(self) -> None:
        self.verifier.to(self.device)

    @torch.no_grad()
    def verifier_features(
        self, ids: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The verifier's reading of right-padded ``ids[B, L]``: ``features[B, L, F]`` (its
        ``feature_layers`` hidden states) and ``greedy[B, L]``, its argmax next token after each
        prefix, shifted so that ``greedy[b, t]`` predicts position t (``greedy[b, 0] = ids[b, 0]``)."""
        layers = self.drafter.feature_layers
        keys = [tuple(row[: int(n)].tolist()) for row, n in zip(ids, lengths, strict=True)]
        if self.hparams.cache_features and all(k in self._features for k in keys):
            rows = [self._features[k] for k in keys]
        else:
            attention = (torch.arange(ids.shape[1], device=ids.device)[None] < lengths[:, None]).long()
            out = self.verifier(input_ids=ids, attention_mask=attention, output_hidden_states=list(layers))
            full = torch.cat([out.hidden_states[i] for i in layers], dim=-1)
            greedy = torch.cat([ids[:, :1], out.logits[:, :-1].argmax(-1)], dim=1)
            rows = [(full[b, : int(n)], greedy[b, : int(n)]) for b, n in enumerate(lengths)]
            if self.hparams.cache_features:
                self._features.update(
                    {k: (f.to("cpu", torch.bfloat16), g.cpu()) for k, (f, g) in zip(keys, rows, strict=True)}
                )
        features = torch.zeros(*ids.shape, rows[0][0].shape[-1], device=ids.device)
        greedy = ids.clone()
        for b, (f, g) in enumerate(rows):
            features[b, : f.shape[0]] = f.to(features)
            greedy[b, : g.shape[0]] = g.to(greedy)
        return features, greedy

    def _loss(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        hp = self.hparams
        ids, lengths, cont = batch["input_ids"], batch["lengths"], batch["cont_start"]
        feats, greedy = self.verifier_features(ids, lengths)
        starts = sample_block_starts(cont, lengths, hp.blocks, self._generator).to(ids.device)
        labels = greedy if hp.targets == "verifier" else ids
        targets = block_targets(labels, lengths, starts, hp.gamma)
        logits = self.drafter.blocks_logits(feats, ids, starts, hp.gamma)
        return _OBJECTIVES[hp.objective](logits.flatten(0, 1), targets.flatten(0, 1), hp.draft_temperature)

    def export(self, path: str, dtype: torch.dtype | None = torch.bfloat16) -> None:
        """Write the drafter (its layers, norm and fusion; the embeddings stay the verifier's)."""
        hp = self.hparams
        settings = {"objective": hp.objective, "verifier": hp.verifier, "gamma": hp.gamma}
        self.drafter.save(path, settings, dtype)
