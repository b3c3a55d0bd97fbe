"""Training the feature-conditioned block-diffusion drafter (``models/conditioned.py``); the
verifier's reading and the objectives are shared with the DFlash family (``training/features.py``).
"""

from __future__ import annotations

import torch

from ..models.conditioned import ConditionedDrafter
from ..models.loading import load_verifier
from .features import VerifierFeatureTraining

__all__ = ["ConditionedDrafterTraining"]


class ConditionedDrafterTraining(VerifierFeatureTraining):
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
        feature_store: a directory that keeps each sequence's verifier features on disk
            (:mod:`~specdiff_lightning.feature_store`): written on the first read, read back by
            the data module (``SequenceDataModule(feature_store=...)``, linked by the CLI) in later
            epochs and runs, so the verifier reads each training sequence once. None: no store.
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
        feature_store: str | None = None,
        export_dir: str | None = None,
        export_dtype: str = "bfloat16",
        overwrite_export: bool = False,
    ) -> None:
        super().__init__()
        self._check_objective(objective, targets)
        self.save_hyperparameters()
        self.window = gamma
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

    def export(self, path: str, dtype: torch.dtype | None = torch.bfloat16) -> None:
        """Write the drafter (its layers, norm and fusion; the embeddings stay the verifier's)."""
        hp = self.hparams
        settings = {"objective": hp.objective, "verifier": hp.verifier, "gamma": hp.gamma}
        self.drafter.save(path, settings, dtype)
