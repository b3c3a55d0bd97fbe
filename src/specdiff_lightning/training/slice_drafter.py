"""Training drafters cut from their verifier (``models/slicing.py``) on verifier continuations.

One LightningModule, three objectives over the same sequences (prompt ⊕ the verifier's continuation):
- ``masked_ce``: block-diffusion adaptation: blocks of gamma masks at random continuation positions
  (block-causal attention, the exact inference condition), cross-entropy at every masked slot;
- ``streak``: streak-distillation (METHOD.md §5) on the same blocks;
- ``ar``: AR-distillation of an autoregressive drafter of the same shape (next-token cross-entropy
  at the same number of positions per sequence), the SpS / HF-assisted peer.
The verifier is frozen and shared: the drafter's embeddings and tied head are the verifier's own
tensors, so checkpoints and exports hold only the N layers and the final norm.
"""

from __future__ import annotations

import time
from abc import ABCMeta, abstractmethod

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_warn

from ..constants import IGNORE_INDEX
from ..models.diffusion import DiffusionDrafter
from ..models.loading import load_verifier
from ..models.slicing import load_slice, save_slice, slice_causal_lm
from .exports import check_export_dir, export_exists
from .losses import masked_ce_loss, streak_loss
from .pretraining import adamw_warmup_cosine

__all__ = [
    "SharedEmbeddingDrafterTraining",
    "SliceDrafterTraining",
    "OBJECTIVES",
    "sample_block_starts",
    "block_targets",
]

OBJECTIVES = ("masked_ce", "streak", "ar")


def sample_block_starts(
    cont_start: torch.Tensor, lengths: torch.Tensor, blocks: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``LongTensor[B, M]`` block starts uniform in ``[max(cont_start, 1), length - 1]`` per row, on
    ``cont_start``'s device. The draws come from ``generator``'s device (a module's CPU generator
    while the batch is on a GPU), so a seed gives the same starts on every device."""
    low = cont_start.clamp_min(1).float()
    span = (lengths - 1 - low.long()).clamp_min(0).float() + 1
    home = generator.device if generator is not None else cont_start.device
    u = torch.rand(cont_start.shape[0], blocks, generator=generator, device=home).to(cont_start.device)
    return (low[:, None] + (u * span[:, None]).floor()).long()


def block_targets(
    input_ids: torch.Tensor, lengths: torch.Tensor, starts: torch.Tensor, gamma: int
) -> torch.Tensor:
    """``LongTensor[B, M, gamma]``: ``input_ids[b, t + j]``, ``IGNORE_INDEX`` past the row's length."""
    pos = starts[:, :, None] + torch.arange(gamma, device=starts.device)
    valid = pos < lengths[:, None, None]
    picked = input_ids.gather(1, pos.clamp_max(input_ids.shape[1] - 1).flatten(1)).view_as(pos)
    return picked.masked_fill(~valid, IGNORE_INDEX)


class SharedEmbeddingDrafterTraining(L.LightningModule, metaclass=ABCMeta):
    """What every module training a drafter around a frozen verifier's embeddings shares: the
    Lightning steps (a subclass gives ``_loss(batch) -> (loss, streak)`` and ``export(path, dtype)``),
    checkpoints without the shared embeddings / tied head, the optimizer, the export at the end.

    ``verifier`` is the frozen verifier, as on every training module that has one (``generate-corpus``
    samples from it); it is kept outside the module tree: never checkpointed, never trained.
    """

    # Only the drafter's own tensors are trained and checkpointed (embeddings/head are the verifier's).
    def state_dict(self, *args, **kwargs):
        state = super().state_dict(*args, **kwargs)
        return {k: v for k, v in state.items() if "embed_tokens" not in k and "lm_head" not in k}

    strict_loading = False

    @abstractmethod
    def _loss(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss, streak)`` of a batch."""

    @abstractmethod
    def export(self, path: str, dtype: torch.dtype | None = torch.bfloat16) -> None:
        """Write the trained drafter to ``path``."""

    def _hold_verifier(self, verifier: torch.nn.Module) -> None:
        """Keep ``verifier`` as ``self.verifier`` without registering it (Lightning would checkpoint
        and count it); its tensors that the drafter shares are registered through the drafter."""
        self.__dict__["verifier"] = verifier.eval().requires_grad_(False)

    def setup(self, stage: str) -> None:
        # Before training, not after it: a run that would overwrite an earlier export stops here.
        if stage == "fit" and self.hparams.export_dir:
            check_export_dir(self.hparams.export_dir, self.hparams.get("overwrite_export", False))

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, streak = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/streak", streak.float().mean(), prog_bar=True)
        return loss

    def on_train_batch_end(self, outputs, batch: dict, batch_idx: int) -> None:
        # What sizes max_steps to a time budget (see _warn_if_not_annealed): train/batch_s, wall
        # seconds from one batch's end to the next's (data loading included), and train/elapsed_s
        # since the run's first batch ended. On a GPU a batch's end is when its kernels were queued,
        # not run: there the slope of elapsed_s between logged steps is the honest rate.
        now = time.perf_counter()
        last, self._last_batch_end = getattr(self, "_last_batch_end", None), now
        if last is not None:
            self._first_batch_end = getattr(self, "_first_batch_end", last)
            self.log("train/batch_s", now - last)
            self.log("train/elapsed_s", now - self._first_batch_end)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        loss, streak = self._loss(batch)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)
        self.log("val/streak", streak.float().mean(), prog_bar=True, sync_dist=True)

    def configure_optimizers(self):
        total = self.trainer.max_steps if self.trainer and self.trainer.max_steps > 0 else None
        hp = self.hparams
        return adamw_warmup_cosine(self, hp.lr, hp.weight_decay, hp.warmup_steps, total)

    def on_train_end(self) -> None:
        self._warn_if_not_annealed()
        if self.hparams.export_dir and self.trainer.is_global_zero:
            replaced = export_exists(self.hparams.export_dir)
            self.export(self.hparams.export_dir, getattr(torch, self.hparams.export_dtype))
            print(
                f"drafter written to {self.hparams.export_dir}"
                + (" (replacing its export)" if replaced else "")
            )

    def _warn_if_not_annealed(self) -> None:
        """The cosine runs over ``max_steps``: a run that ``max_time`` (or a stop) ends early exports
        weights taken at a high learning rate, which a later session found worse than the weights it
        started from. Say so, with the step, the rate and the fix."""
        trainer = self.trainer
        if trainer.max_steps <= 0 or trainer.global_step >= trainer.max_steps or not trainer.optimizers:
            return
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        if lr > 0.5 * self.hparams.lr:
            rank_zero_warn(
                f"training stopped at step {trainer.global_step} of max_steps {trainer.max_steps} "
                f"(max_time or an interruption) with the learning rate at {lr:.3g}, "
                f"{lr / self.hparams.lr:.0%} of its peak: the cosine schedule decays over max_steps, "
                "so these weights were not annealed. Set --trainer.max_steps to the steps that fit in "
                "max_time, or resume with --ckpt_path and a smaller --trainer.max_steps."
            )


class SliceDrafterTraining(SharedEmbeddingDrafterTraining):
    """Train an N-layer slice of ``verifier`` as a block-causal diffusion drafter or an AR drafter.

    Args:
        verifier: a :func:`~specdiff_lightning.models.loading.load_verifier` spec
            (e.g. ``"smollm2-135m-instruct"``).
        num_layers: N, the drafter's depth (its first N layers start as the verifier's).
        objective: ``"masked_ce"``, ``"streak"`` or ``"ar"``.
        init_from: a slice saved by :meth:`export` (e.g. the ``masked_ce`` stage) to start from.
        gamma: the draft window. blocks: windows (or, for ``ar``, blocks of gamma positions) per sequence.
        mask_token_id: the drafter's [MASK]: an id the verifier never emits (SmolLM2: 16, ``<empty_output>``).
        draft_temperature: T in the streak objective (as at deployment).
        export_dir: write the trained slice here when training ends (see :meth:`export`). A
            directory that already holds files stops ``fit`` before it trains, unless
            ``overwrite_export``.
        overwrite_export: replace what ``export_dir`` holds (an earlier run's export).
    """

    def __init__(
        self,
        verifier: str = "smollm2-135m-instruct",
        num_layers: int = 2,
        objective: str = "streak",
        init_from: str | None = None,
        gamma: int = 8,
        blocks: int = 16,
        mask_token_id: int = 16,
        shift_logits: bool = True,
        draft_temperature: float = 1.0,
        lr: float = 3e-4,
        weight_decay: float = 0.0,
        warmup_steps: int = 20,
        seed: int = 0,
        export_dir: str | None = None,
        export_dtype: str = "bfloat16",
        overwrite_export: bool = False,
    ) -> None:
        super().__init__()
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
        self.save_hyperparameters()
        frozen = load_verifier(verifier, dtype=torch.float32)
        self._hold_verifier(frozen)
        if init_from:
            model, _ = load_slice(frozen, init_from)
        else:
            model = slice_causal_lm(frozen, num_layers)
        self.drafter_model = model.train()
        self.drafter = DiffusionDrafter(model, mask_token_id, shift_logits, attention="block_causal")
        self._generator = torch.Generator().manual_seed(seed)

    def _loss(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        hp = self.hparams
        ids, lengths, cont = batch["input_ids"], batch["lengths"], batch["cont_start"]
        starts = sample_block_starts(cont, lengths, hp.blocks, self._generator)
        if hp.objective == "ar":
            return self._ar_loss(ids, lengths, starts)
        targets = block_targets(ids, lengths, starts, hp.gamma)  # [B, M, g]
        logits = self.drafter.blocks_logits(ids, starts, hp.gamma)
        fn = streak_loss if hp.objective == "streak" else masked_ce_loss
        loss, streak = fn(logits.flatten(0, 1), targets.flatten(0, 1), hp.draft_temperature)
        return loss, streak

    def _ar_loss(self, ids, lengths, starts) -> tuple[torch.Tensor, torch.Tensor]:
        # The same number of supervised positions as the diffusion objective: blocks x gamma.
        hp = self.hparams
        pos = (starts[:, :, None] + torch.arange(hp.gamma, device=ids.device)).flatten(1)  # [B, M*g]
        valid = pos < lengths[:, None]
        pos = pos.clamp_max(ids.shape[1] - 1)
        attention = (torch.arange(ids.shape[1], device=ids.device)[None] < lengths[:, None]).long()
        hidden = self.drafter_model.model(input_ids=ids, attention_mask=attention).last_hidden_state
        rows = (pos - 1).clamp_min(0)
        h = hidden.gather(1, rows[..., None].expand(-1, -1, hidden.shape[-1]))
        logits = self.drafter_model.lm_head(h)
        targets = ids.gather(1, pos).masked_fill(~valid, IGNORE_INDEX)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
        first = (logits.argmax(-1) == targets).float()[valid].mean()
        return loss, first.detach()[None]

    def export(self, path: str, dtype: torch.dtype | None = torch.bfloat16) -> None:
        """Write the drafter slice (N layers + norm; embeddings stay the verifier's)."""
        hp = self.hparams
        settings = {
            "kind": "autoregressive" if hp.objective == "ar" else "diffusion",
            "objective": hp.objective,
            "verifier": hp.verifier,
            "gamma": hp.gamma,
            "mask_token_id": hp.mask_token_id,
            "shift_logits": hp.shift_logits,
            "attention": "block_causal",
        }
        save_slice(self.drafter_model, path, settings, dtype)
