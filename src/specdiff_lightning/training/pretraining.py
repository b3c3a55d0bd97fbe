"""Pretraining modules for the built-in pair: an AR verifier / AR drafter and an MDM drafter.

Both read the same windows as streak-distillation (``DistillationDataModule``) and treat
``prefix ⊕ targets`` as one training sequence.
"""

from __future__ import annotations

import os

import lightning as L
import torch
import torch.nn.functional as F

from ..constants import IGNORE_INDEX
from ..models.continuations import positions_from_mask
from ..models.diffusion import DiffusionDrafter
from ..models.tiny import tiny_model
from .losses import mdm_corrupt, mdm_loss

__all__ = ["CausalLMPretraining", "MaskedDiffusionPretraining", "window_sequences", "adamw_warmup_cosine"]


def window_sequences(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens[B, L], valid[B, L])`` from a window batch: left-padded prefix then targets."""
    targets = batch["targets"]
    valid_t = targets != IGNORE_INDEX
    tokens = torch.cat([batch["prefix"], targets.clamp_min(0)], dim=1)
    valid = torch.cat([batch["prefix_mask"].bool(), valid_t], dim=1)
    return tokens, valid


def _tokenizer(spec: str):
    from ..models.loading import load_tokenizer

    return load_tokenizer(spec)


def _build(arch: str, tokenizer, model: dict, seed: int):
    return tiny_model(
        arch,
        vocab_size=len(tokenizer),
        seed=seed,
        logit_scale=1.0,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        **model,
    ).train()


def adamw_warmup_cosine(
    module: L.LightningModule, lr: float, weight_decay: float, warmup: int, total: int | None
):
    """AdamW (no decay on norms/biases) with linear warm-up, then cosine to 10% over ``total`` steps
    (constant when None); Lightning's ``configure_optimizers`` dict, stepped every step."""
    decay = [p for n, p in module.named_parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for n, p in module.named_parameters() if p.requires_grad and p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
    )

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if not total:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + torch.cos(torch.tensor(progress * torch.pi)).item())

    return {
        "optimizer": opt,
        "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.LambdaLR(opt, schedule), "interval": "step"},
    }


class _WindowPretraining(L.LightningModule):
    """Shared Lightning glue: subclasses define ``_loss(batch)`` and ``export(path)``."""

    def _loss(self, batch: dict) -> torch.Tensor:
        raise NotImplementedError

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["targets"].shape[0])
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.log("val/loss", self._loss(batch), prog_bar=True, batch_size=batch["targets"].shape[0])

    def configure_optimizers(self):
        hp = self.hparams
        return adamw_warmup_cosine(self, hp.lr, hp.weight_decay, hp.warmup_steps, hp.total_steps)


class CausalLMPretraining(_WindowPretraining):
    """Next-token pretraining of a small causal LM (the built-in verifier, or an AR drafter).

    Args:
        tokenizer: tokenizer directory (vocab size, EOS/pad ids come from it).
        arch: ``qwen2`` or ``llama``.
        model: sizes for :func:`~specdiff_lightning.models.tiny_model` (``hidden_size``,
            ``num_layers``, ``num_heads``, ``intermediate_size``, ``max_positions``...).
        lr, weight_decay, warmup_steps, total_steps: AdamW, linear warm-up then cosine to 10%.
    """

    def __init__(
        self,
        tokenizer: str,
        arch: str = "qwen2",
        model: dict | None = None,
        seed: int = 0,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        warmup_steps: int = 50,
        total_steps: int | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.tokenizer = _tokenizer(tokenizer)
        self.model = _build(arch, self.tokenizer, model or {}, seed)

    def _loss(self, batch: dict) -> torch.Tensor:
        tokens, valid = window_sequences(batch)
        logits = self.model(
            input_ids=tokens, attention_mask=valid.long(), position_ids=positions_from_mask(valid)
        ).logits
        labels = tokens[:, 1:].masked_fill(~valid[:, 1:], IGNORE_INDEX)
        return F.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX
        )

    def export(self, path: str | os.PathLike) -> None:
        """A plain HF directory (model + tokenizer + generation config with EOS)."""
        self.model.generation_config.eos_token_id = self.tokenizer.eos_token_id
        self.model.generation_config.pad_token_id = self.tokenizer.pad_token_id
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)


class MaskedDiffusionPretraining(_WindowPretraining):
    """MDM pretraining / AR-to-diffusion adaptation of a drafter (METHOD.md §5, last item).

    Args:
        tokenizer: tokenizer directory with a mask token (the drafter's [MASK]).
        init_from: an AR checkpoint directory to adapt (DiffuCoder/DiffuLLaMA style); else a new
            model of ``arch``/``model`` sizes.
        shift_logits: the logit at i-1 predicts token i (True when adapting an AR model).
    """

    def __init__(
        self,
        tokenizer: str,
        init_from: str | None = None,
        arch: str = "qwen2",
        model: dict | None = None,
        shift_logits: bool = True,
        seed: int = 0,
        eps: float = 1e-3,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        warmup_steps: int = 50,
        total_steps: int | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.tokenizer = _tokenizer(tokenizer)
        if self.tokenizer.mask_token_id is None:
            raise ValueError(
                f"tokenizer {tokenizer!r} has no mask token; add one (tokenizer.add_special_tokens({{'mask_token': ...}}))"
            )
        if init_from is not None:
            from transformers import AutoModelForCausalLM

            model_ = AutoModelForCausalLM.from_pretrained(init_from, dtype=torch.float32).train()
        else:
            model_ = _build(arch, self.tokenizer, model or {}, seed)
        self.model = model_
        self.drafter = DiffusionDrafter(self.model, self.tokenizer.mask_token_id, shift_logits)

    def _loss(self, batch: dict) -> torch.Tensor:
        tokens, valid = window_sequences(batch)
        noisy, masked, t = mdm_corrupt(tokens, self.tokenizer.mask_token_id, self.hparams.eps, valid=valid)
        logits = self.drafter.denoise_logits(noisy, valid.long())
        return mdm_loss(logits, tokens, masked, t, self.hparams.shift_logits)

    def export(self, path: str | os.PathLike) -> None:
        self.drafter.save_pretrained(path, family="diffullama")
        self.tokenizer.save_pretrained(path)
