"""The LightningModule: a frozen verifier, a trainable diffusion drafter, streak-distillation."""

from __future__ import annotations

import copy
import os
import zlib
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from ..constants import IGNORE_INDEX
from ..decoding.calibration import warn_if_slower_than_plain
from ..decoding.compiled import warm_decoding
from ..decoding.config import DecodingConfig
from ..decoding.generate import speculative_generate, verifier_generate
from ..decoding.timing import throughput, timed
from ..decoding.validation import check_tokenizers, check_vocab
from ..metrics import PositionalAcceptance, StreakLength
from ..models.diffusion import DiffusionDrafter
from ..models.loading import load_drafter, load_tokenizer, load_verifier
from .losses import LOSSES, needs_verifier_logprobs, window_streak_terms
from .teacher import sample_continuations, verifier_window_logprobs

__all__ = ["DrafterDistillation"]

_TEACHERS = ("corpus", "online")


class DrafterDistillation(L.LightningModule):
    """Align a diffusion drafter to a frozen verifier (METHOD.md §5).

    Predict, bench and eval-budget decode with any drafter :func:`~specdiff_lightning.models.loading.load_drafter`
    loads (a slice of the verifier such as ``assets/smollm2/drafter`` included: it is built
    around this module's verifier; a DFlash drafter such as ``assets/smollm2/drafter_dflash`` too); ``fit`` and ``validate`` train diffusion drafters only.

    Args:
        verifier: a verifier spec: a named verifier (``"smollm2-135m-instruct"``), a directory, a hub
            id, or ``"tiny-qwen2"`` / ``"tiny-llama"``.
        drafter: a drafter spec: a directory (a Hugging Face checkpoint, or a slice saved by this
            project, ``slice.json``), a hub id, or a tiny preset.
        verifier_kwargs: for :func:`~specdiff_lightning.models.loading.load_verifier` (``dtype``,
            ``device_map``, ``tiny`` sizes...).
        drafter_kwargs: for :func:`~specdiff_lightning.models.loading.load_drafter` (``family``,
            ``mask_token_id``, ``shift_logits``, ``max_prefix_tokens``, ``dtype``, ``tiny``; for a
            DFlash drafter ``head_vocab``).
        loss: a name in :data:`~specdiff_lightning.training.losses.LOSSES`: ``streak`` (default),
            ``expected_streak``, ``ar_distillation``, ``tv``, ``forward_kl``, ``masked_ce``, or one
            you registered there.
        gamma: window length trained (the deployment draft window).
        draft_temperature: T applied to the drafter's logits inside the loss, as at deployment.
        teacher: ``"corpus"`` (continuations stored in the corpus) or ``"online"`` (the verifier
            samples a fresh continuation of every window prefix at temperature 1.0).
        lora: PEFT ``LoraConfig`` kwargs (e.g. ``{r: 16, lora_alpha: 32, target_modules: [q_proj, v_proj]}``);
            None trains all drafter weights.
        lr, weight_decay, warmup_steps: AdamW with linear warm-up.
        decoding: settings for ``predict``/``bench``/``eval-budget`` (self-selection speculative
            decoding); its ``gamma`` defaults to ``gamma``. From the command line these always come
            from the config, never from a checkpoint's hyper-parameters.
        baseline: in ``predict``, also time verifier-only decoding of each prompt (the speed-up
            denominator, measured side by side).
        tokenizer: the verifier's tokenizer (a named verifier, directory or hub id; decodes
            completions; checked against ``drafter_tokenizer`` when both are given).
    """

    def __init__(
        self,
        verifier: str = "tiny-qwen2",
        drafter: str = "tiny-llama",
        verifier_kwargs: dict | None = None,
        drafter_kwargs: dict | None = None,
        loss: str = "streak",
        gamma: int = 8,
        draft_temperature: float = 1.0,
        teacher: str = "corpus",
        lora: dict | None = None,
        lr: float = 3e-4,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        decoding: DecodingConfig | None = None,
        baseline: bool = True,
        tokenizer: str | None = None,
        drafter_tokenizer: str | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if loss not in LOSSES:
            raise ValueError(f"unknown loss {loss!r}; choose one of {sorted(LOSSES)}")
        if teacher not in _TEACHERS:
            raise ValueError(f"unknown teacher {teacher!r}; choose one of {_TEACHERS}")
        if gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {gamma}")
        self.loss_fn = LOSSES[loss]
        if not callable(self.loss_fn):
            raise TypeError(
                f"LOSSES[{loss!r}] must be a function fn(draft_logits, targets, temperature=1.0, "
                f"verifier_logprobs=None); declare a need for verifier_logprobs with @uses_verifier_logprobs"
            )
        self.needs_verifier_probs = needs_verifier_logprobs(self.loss_fn)
        # dtype "auto" compares the forward predict will decode through (compiled or eager)
        compiled = bool(decoding is not None and decoding.compile)
        verifier_model = load_verifier(verifier, **{"compiled": compiled, **(verifier_kwargs or {})})
        if getattr(verifier_model, "hf_device_map", None):
            # Placed across devices by accelerate (device_map): keep it out of the module tree so
            # Lightning never moves it; it is frozen and never checkpointed anyway.
            object.__setattr__(self, "verifier", verifier_model)
        else:
            self.verifier = verifier_model
        # a slice of the verifier (slice.json) is built around it; other drafters ignore it
        self.drafter = load_drafter(drafter, verifier=verifier_model, **(drafter_kwargs or {}))
        check_vocab(self.verifier, self.drafter.vocab_size)
        self.decoding = (decoding or DecodingConfig()).with_gamma(gamma)
        self.tokenizer = None
        if tokenizer is not None:
            self.tokenizer = load_tokenizer(tokenizer)
            if drafter_tokenizer is not None:
                check_tokenizers(self.tokenizer, load_tokenizer(drafter_tokenizer))
        if lora is not None:
            from peft import LoraConfig, get_peft_model

            self.drafter.model = get_peft_model(self.drafter.model, LoraConfig(**lora))
        # Registered so Lightning moves it and the optimizer sees it; the verifier stays frozen.
        self.drafter_model = self.drafter.model
        self.strict_loading = False
        self.val_streak = StreakLength()
        self.val_positional = PositionalAcceptance(gamma)

    # ------------------------------------------------------------------ frozen verifier
    def train(self, mode: bool = True):
        super().train(mode)
        self.verifier.eval()  # no dropout, whatever the Trainer does
        return self

    def on_fit_start(self) -> None:
        self._require_diffusion("fit")
        # Lightning keeps each module's train/eval mode; models load in eval mode.
        self.drafter_model.train()

    def state_dict(self, *args, **kwargs) -> dict[str, Any]:
        """The drafter only (only its LoRA adapter when training LoRA), never the verifier."""
        state = super().state_dict(*args, **kwargs)
        keep = "lora_" if self.hparams.lora is not None else "drafter_model."
        return {k: v for k, v in state.items() if k.startswith("drafter_model.") and keep in k}

    # ------------------------------------------------------------------ data
    def _check_batch(self, batch: dict) -> None:
        vocab = self.drafter.vocab_size
        top = max(int(batch["prefix"].max()), int(batch["targets"].max()))
        if top >= vocab:
            raise ValueError(
                f"corpus token id {top} is outside the models' vocabulary of {vocab}: the corpus was tokenized "
                f"with another tokenizer; regenerate it with this verifier's tokenizer"
            )

    def teacher_batch(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Targets ``[B, g]`` and, when the loss needs them, verifier log-probs ``[B, g, V]``."""
        prefix, mask = batch["prefix"], batch["prefix_mask"]
        gamma = self.hparams.gamma
        if self.hparams.teacher == "online":
            targets = sample_continuations(
                self.verifier, prefix, mask, gamma, eos_token_id=self.verifier.generation_config.eos_token_id
            )
        else:
            targets = batch["targets"][:, :gamma]
        logp = (
            verifier_window_logprobs(self.verifier, prefix, mask, targets)
            if self.needs_verifier_probs
            else None
        )
        return targets, logp

    def forward(self, prefix: torch.Tensor, prefix_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Drafter window logits ``[B, gamma, V]`` for left-padded prefixes."""
        self._require_diffusion("fit and validate")
        return self.drafter.window_logits(prefix, self.hparams.gamma, prefix_mask)

    def _require_diffusion(self, what: str) -> None:
        if not isinstance(self.drafter, DiffusionDrafter):
            raise TypeError(
                f"{what} of DrafterDistillation need a diffusion drafter; {self.hparams.drafter} is a "
                f"{type(self.drafter).__name__}, which decodes here (predict, bench, eval-budget) but trains "
                f"with its own module (configs/smollm2/*.yaml: SliceDrafterTraining, DFlashDrafterTraining)"
            )

    # ------------------------------------------------------------------ steps
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self._check_batch(batch)
        targets, logp = self.teacher_batch(batch)
        logits = self(batch["prefix"], batch["prefix_mask"])
        loss, streak = self.loss_fn(logits, targets, self.hparams.draft_temperature, logp)
        size = targets.shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=size)
        self.log("train/streak", streak.mean(), prog_bar=True, batch_size=size)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._check_batch(batch)
        targets = batch["targets"][:, : self.hparams.gamma]
        logits = self(batch["prefix"], batch["prefix_mask"])
        # P(first j accepted) under greedy acceptance: the streak loss and both metrics read it.
        terms = window_streak_terms(logits, targets, self.hparams.draft_temperature)
        streak = terms.sum(-1)
        self.val_streak.update(streak, torch.ones_like(streak))
        self.val_positional.update_from_streak_terms(terms, valid=targets != IGNORE_INDEX)
        self.log("val/streak_loss", -streak.mean(), batch_size=targets.shape[0], sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        # compute() reduces the metric states across ranks; sync_dist then averages equal values.
        self.log("val/streak", self.val_streak.compute(), prog_bar=True, sync_dist=True)
        curve = self.val_positional.compute()
        self.log_dict({f"val/gamma_{j + 1}": v for j, v in enumerate(curve.nan_to_num(0.0))}, sync_dist=True)
        self.val_streak.reset()
        self.val_positional.reset()

    def configure_optimizers(self):
        params = [p for p in self.drafter_model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        if not self.hparams.warmup_steps:
            return optimizer
        warmup = self.hparams.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ------------------------------------------------------------------ predict
    #: whether this predict run has warned that speculation lost to plain decoding (once a run)
    _warned_slower = False

    def on_predict_start(self) -> None:
        self.eval()
        self._warned_slower = False
        if self.decoding.compile:
            # compile before the first prompt, untimed (as bench does): otherwise its wall_time and
            # speed-up would hold minutes of compiling, and the slower-than-plain warning would fire
            rank_zero_info("decoding.compile: compiling the verifier's forward and the drafter's round first")
            seconds = warm_decoding(
                self.verifier, drafter=self.drafter, tree_auto=self.decoding.tree == "auto"
            )
            rank_zero_info(f"decoding.compile: ready in {seconds:.0f} s")

    def predict_step(self, batch: dict, batch_idx: int) -> list[dict]:
        """Decode every prompt of the batch (one at a time for now); returns one row per prompt
        with the completion, statistics and wall times (see ``JsonlPredictionWriter``)."""
        cfg = self.decoding
        eos = self.verifier.generation_config.eos_token_id
        drafter = cfg.shape_drafter(self.drafter)  # decoding.tree / decoding.lookup, if set
        rows = []
        for rid, ids, prompt in zip(batch["ids"], batch["input_ids"], batch["prompts"], strict=True):
            ids = ids[None].to(self.device)
            seed = cfg.seed + zlib.crc32(str(rid).encode())
            out, wall = timed(
                lambda g, ids=ids: speculative_generate(
                    self.verifier, drafter, ids, **cfg.generate_kwargs(), eos_token_id=eos, generator=g
                ),
                self.device,
                seed,
            )
            stats = out.stats
            new = out.sequences[0, ids.shape[1] :].tolist()
            row = {
                "id": rid,
                "prompt": prompt,
                "completion": self.tokenizer.decode(new) if self.tokenizer is not None else new,
                "new_tokens": stats.new_tokens,
                "verifier_calls": stats.verifier_calls,
                "accepted_tokens": stats.accepted_tokens,
                "mean_accepted": stats.mean_accepted,
                "position_accepted": stats.position_accepted.tolist(),
                "position_reached": stats.position_reached.tolist(),
                "wall_time": wall,
                "baseline_wall_time": None,
                "speedup": None,
                "config_hash": cfg.config_hash(),
            }
            plain_tps = None  # this prompt's plain decoding, where the run times it
            if self.hparams.baseline:
                base, base_wall = timed(
                    lambda g, ids=ids: verifier_generate(
                        self.verifier, ids, **cfg.sampling_kwargs(), eos_token_id=eos, generator=g
                    ),
                    self.device,
                    seed,
                )
                base_new = base.stats.new_tokens
                row.update(baseline_wall_time=base_wall, baseline_new_tokens=base_new)
                plain_tps = throughput(base_new, base_wall) if base_new > 1 else None
                if stats.new_tokens > 1 and plain_tps is not None:
                    row["speedup"] = throughput(stats.new_tokens, wall) / plain_tps
            # once per run: a decode slower than plain decoding (this prompt's, where it was timed)
            if not self._warned_slower:
                self._warned_slower = warn_if_slower_than_plain(
                    throughput(stats.new_tokens, wall),
                    self.verifier,
                    ids.shape[1] + stats.new_tokens // 2,
                    stats.mean_accepted,
                    plain_tokens_per_s=plain_tps,
                    tree_auto=cfg.tree == "auto",
                )
            rows.append(row)
        return rows

    # ------------------------------------------------------------------ export
    def export(self, path: str | os.PathLike) -> None:
        """Write a plain HF drafter directory (LoRA merged) that ``DiffusionDrafter.from_pretrained``
        and :func:`~specdiff_lightning.models.loading.load_drafter` load (a drafter sliced from the
        verifier is written whole: the directory stands alone)."""
        self._require_diffusion("export")
        model = self.drafter.model
        if self.hparams.lora is not None:
            model = copy.deepcopy(model).merge_and_unload()
        exported = DiffusionDrafter(
            model,
            self.drafter.mask_token_id,
            self.drafter.shift_logits,
            max_prefix_tokens=self.drafter.max_prefix_tokens,
            attention=self.drafter.attention,
        )
        exported.save_pretrained(path)
