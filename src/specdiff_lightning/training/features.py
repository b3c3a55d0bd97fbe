"""What training a drafter that reads the verifier's hidden states needs (the DFlash family,
``training/dflash.py``): the frozen verifier reads each sequence (prompt ⊕ its own continuation) once and
yields its features; the drafter learns many blocks per sequence in one forward
(``drafter.blocks_logits``), each with exactly the visibility of a decoding round. Objectives are
the shared window losses (``masked_ce``: cross-entropy at every slot, as DFlash trains; ``streak``:
streak-distillation, METHOD.md §5).
"""

from __future__ import annotations

import os

import torch

from ..feature_store import FeatureStore, FeatureStoreError
from .losses import masked_ce_loss, streak_loss
from .slice_drafter import SharedEmbeddingDrafterTraining, block_targets, sample_block_starts

__all__ = ["VerifierFeatureTraining", "FEATURE_OBJECTIVES"]

#: the objectives of a feature-reading drafter, by the name configs use
FEATURE_OBJECTIVES = {"masked_ce": masked_ce_loss, "streak": streak_loss}
#: where a training step's blocks start: uniform over the continuation, or where greedy decoding
#: with the drafter as it is starts its rounds (``decode``: on-policy anchors, right after misses)
ANCHORS = ("uniform", "decode")


class VerifierFeatureTraining(SharedEmbeddingDrafterTraining):
    """A subclass sets ``self.drafter`` (``.feature_layers``, ``.blocks_logits(features, ids,
    starts, gamma)``), :attr:`window` (tokens drafted per block) and the hyperparameters
    ``verifier``, ``objective``, ``blocks``, ``targets``, ``cache_features``, ``draft_temperature``
    and optionally ``feature_store``, ``loss_decay``, ``anchors``, ``val_decode_path``."""

    window: int

    def _check_objective(
        self, objective: str, targets: str, loss_decay: float | None = None, anchors: str = "uniform"
    ) -> None:
        if objective not in FEATURE_OBJECTIVES:
            raise ValueError(f"objective must be one of {sorted(FEATURE_OBJECTIVES)}, got {objective!r}")
        if loss_decay and objective != "masked_ce":
            raise ValueError(f"loss_decay weights masked_ce's positions; objective {objective!r} takes none")
        if targets not in ("corpus", "verifier"):
            raise ValueError(f"targets must be 'corpus' or 'verifier', got {targets!r}")
        if anchors not in ANCHORS:
            raise ValueError(f"anchors must be one of {list(ANCHORS)}, got {anchors!r}")
        self._features: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def on_fit_start(self) -> None:
        self.verifier.to(self.device)

    @torch.no_grad()
    def verifier_features(
        self, ids: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The verifier's reading of right-padded ``ids[B, L]``: ``features[B, L, F]`` (its
        ``feature_layers`` hidden states) and ``greedy[B, L]``, its argmax next token after each
        prefix, shifted so that ``greedy[b, t]`` predicts position t (``greedy[b, 0] = ids[b, 0]``);
        with ``targets="corpus"`` (where it is not read) ``greedy`` is ``ids``.
        With ``cache_features`` each sequence is read once per process (kept in bf16 on the CPU)."""
        layers = self.drafter.feature_layers
        keys = [tuple(row[: int(n)].tolist()) for row, n in zip(ids, lengths, strict=True)]
        if self.hparams.cache_features and all(k in self._features for k in keys):
            rows = [self._features[k] for k in keys]
        else:
            attention = (torch.arange(ids.shape[1], device=ids.device)[None] < lengths[:, None]).long()
            # The corpus's own tokens as targets need no logits: the head (a fifth of a small
            # verifier's forward) then runs on one position only.
            own = self.hparams.targets == "corpus"
            out = self.verifier(
                input_ids=ids,
                attention_mask=attention,
                output_hidden_states=list(layers),
                **({"logits_to_keep": 1} if own else {}),
            )
            full = torch.cat([out.hidden_states[i] for i in layers], dim=-1)
            greedy = ids.clone() if own else torch.cat([ids[:, :1], out.logits[:, :-1].argmax(-1)], dim=1)
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

    def feature_store(self) -> FeatureStore | None:
        """The run's :class:`~specdiff_lightning.feature_store.FeatureStore` (``feature_store``
        hyper-parameter), opened once with this verifier's identity: its spec, a fingerprint of its
        embeddings, the dtype it reads in, the feature layers and where the greedy tokens come from."""
        root = self.hparams.get("feature_store")
        if not root:
            return None
        if getattr(self, "_store", None) is None:
            embeddings = self.verifier.get_input_embeddings().weight
            identity = {
                "verifier": str(self.hparams.verifier),
                "fingerprint": f"{float(embeddings.double().sum()):.10g}",
                "verifier_dtype": str(embeddings.dtype).removeprefix("torch."),
                "layers": [int(i) for i in self.drafter.feature_layers],
                "targets": self.hparams.targets,
            }
            self._store = FeatureStore(root, identity)
        return self._store

    def _batch_features(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's verifier features and greedy tokens: those the data module read from the
        feature store, else the verifier's read (then stored, when the run keeps a store)."""
        ids, lengths = batch["input_ids"], batch["lengths"]
        if "features" in batch:
            # only a store this module opened, and so checked against its verifier and layers
            store = self.feature_store()
            if store is None or os.path.abspath(store.root) != os.path.abspath(batch["feature_store"]):
                raise FeatureStoreError(
                    f"the data module streams features from {batch['feature_store']}, which this module "
                    f"did not open (its feature_store is {self.hparams.get('feature_store')!r}); give "
                    f"both the same feature_store (the CLI links them)"
                )
            return batch["features"].to(ids.device, torch.float32), batch["greedy"]
        feats, greedy = self.verifier_features(ids, lengths)
        store = self.feature_store()
        if store is not None:
            for b, n in enumerate(lengths.tolist()):
                store.put(ids[b, :n], feats[b, :n], greedy[b, :n])
        return feats, greedy

    def _blocks(
        self, batch: dict, read: tuple | None = None, anchors: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits[B*M, window, V], targets[B*M, window])`` of the batch's blocks (``read``: the
        batch's ``_batch_features`` when already read). Anchors (``anchors``, default the
        module's): uniform over each continuation, or (``"decode"``) drawn from those greedy
        decoding starts its rounds from."""
        hp = self.hparams
        ids, lengths, cont = batch["input_ids"], batch["lengths"], batch["cont_start"]
        feats, greedy = read or self._batch_features(batch)
        labels = greedy if hp.targets == "verifier" else ids
        starts = sample_block_starts(cont, lengths, hp.blocks, self._generator).to(ids.device)
        if (anchors or hp.get("anchors", "uniform")) == "decode":
            starts = self._decode_anchors(feats, ids, labels, lengths, cont, starts)
        targets = block_targets(labels, lengths, starts, self.window)
        logits = self.drafter.blocks_logits(feats, ids, starts, self.window)
        return logits.flatten(0, 1), targets.flatten(0, 1)

    #: anchors scored per forward when walking a decoding path (bounds the block mask and rows)
    _PATH_CHUNK = 64

    @torch.no_grad()
    def _all_anchor_streaks(self, feats, ids, labels, lengths, cont, b: int) -> tuple[int, torch.Tensor]:
        """``(first, streaks[T])``: row ``b``'s greedy-chain streak at every anchor from its first
        decoding round's on (``first``: that round's block start, the continuation's first token)."""
        from .losses import greedy_chain_streaks

        n, first = int(lengths[b]), max(int(cont[b]), 1)
        streaks = [torch.zeros(0, dtype=torch.long)]
        for lo in range(first, n, self._PATH_CHUNK):
            starts = torch.arange(lo, min(n, lo + self._PATH_CHUNK), device=ids.device)[None]
            rows = self.drafter.blocks_hidden(feats[b : b + 1, :n], ids[b : b + 1, :n], starts, self.window)
            targets = block_targets(labels[b : b + 1, :n], lengths[b : b + 1], starts, self.window)
            streaks.append(greedy_chain_streaks(rows[0], self.drafter.head, targets[0]).cpu())
        return first, torch.cat(streaks)

    def _decode_anchors(self, feats, ids, labels, lengths, cont, uniform: torch.Tensor) -> torch.Tensor:
        """``starts[B, M]``: per row, M of the anchors greedy decoding starts its rounds from
        (:func:`~.losses.decode_path`), without repeats where the path has M or more, else the
        whole path and ``uniform``'s first anchors for the rest."""
        from .losses import decode_path

        out = uniform.clone()
        m = uniform.shape[1]
        for b in range(ids.shape[0]):
            first, streaks = self._all_anchor_streaks(feats, ids, labels, lengths, cont, b)
            if streaks.numel() == 0:
                continue
            path = decode_path(streaks) + first
            if path.numel() >= m:
                path = path[torch.randperm(path.numel(), generator=self._generator)[:m]]
            out[b, : path.numel()] = path.to(out.device)
        return out

    def _objective(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hp = self.hparams
        decay = {"decay": hp.loss_decay} if hp.get("loss_decay") else {}  # masked_ce's position decay
        return FEATURE_OBJECTIVES[hp.objective](logits, targets, hp.draft_temperature, **decay)

    def _loss(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        return self._objective(*self._blocks(batch))

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        """Besides loss and streak: ``val/accepted``, the draft tokens greedy acceptance keeps of the
        drafter's argmax chain along the corpus continuation (teacher-forced: leading matches per
        block), what a K=1 chain round at draft temperature 0 accepts."""
        from .losses import greedy_chain_accepted

        read = self._batch_features(batch)
        logits, targets = self._blocks(batch, read, anchors="uniform")  # comparable across runs
        loss, streak = self._objective(logits, targets)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)
        self.log("val/streak", streak.float().mean(), prog_bar=True, sync_dist=True)
        self.log(
            "val/accepted",
            greedy_chain_accepted(logits, targets).float().mean(),
            prog_bar=True,
            sync_dist=True,
        )
        if self.hparams.get("val_decode_path"):
            path = self._decode_path(batch, read)
            if path.numel():
                self.log("val/decode_accepted", path.float().mean(), sync_dist=True, batch_size=path.numel())

    @torch.no_grad()
    def _decode_path(self, batch: dict, read: tuple) -> torch.Tensor:
        """``LongTensor[R]``: the accepted lengths of the rounds greedy decoding with the chain meets
        along the batch's continuations (:func:`~.losses.decode_path_streaks`): the first round
        drafts from the continuation's first token on (its pending token is the prompt's last)."""
        from .losses import decode_path_streaks

        ids, lengths, cont = batch["input_ids"], batch["lengths"], batch["cont_start"]
        feats, greedy = read
        labels = greedy if self.hparams.targets == "verifier" else ids
        path = [torch.zeros(0, dtype=torch.long)]
        for b in range(ids.shape[0]):
            _, streaks = self._all_anchor_streaks(feats, ids, labels, lengths, cont, b)
            if streaks.numel():
                path.append(decode_path_streaks(streaks))
        return torch.cat(path)
