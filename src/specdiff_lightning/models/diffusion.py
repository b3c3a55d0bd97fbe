"""Masked-diffusion drafters: one bidirectional forward over ``[prefix, MASK*gamma]`` (METHOD.md §2)."""

from __future__ import annotations

import math
import os

import torch
from torch import nn

from ..decoding.drafting import Drafter, Proposal, sample_from_marginals
from ..decoding.sampling import logits_to_probs
from .attention import check_custom_mask_support, to_model_mask
from .families import DRAFTER_FAMILIES, SIDECAR_FILE, DrafterFamily, family_for_model_type

__all__ = ["DiffusionDrafter", "DrafterFamily", "DRAFTER_FAMILIES", "SIDECAR_FILE"]

# Re-exported: the family registry lives in .families.
_MODEL_TYPE_TO_FAMILY = {t: name for name, spec in DRAFTER_FAMILIES.items() for t in spec.model_types}


def _config_token_ids(config, name: str) -> set[int]:
    value = getattr(config, name, None)
    if value is None:
        return set()
    return set(value) if isinstance(value, (list, tuple)) else {int(value)}


def _is_stock_transformers_model(model: nn.Module) -> bool:
    # A PEFT wrapper (LoRA fine-tuning) forwards our kwargs to the model it wraps.
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return type(base).__module__.startswith("transformers.models.")


class DiffusionDrafter(Drafter):
    """Wrap a HF model that denoises ``[prefix, MASK*gamma]`` in one bidirectional forward.

    Stock decoders (``Qwen2ForCausalLM``, ``LlamaForCausalLM``, ...) are run non-causally: they get
    a full (bidirectional) 4D attention mask and ``is_causal=False``. Remote-code diffusion models
    (Dream, LLaDA) already attend bidirectionally and get their own inputs.

    Args:
        model: the denoiser; its output must have ``.logits[B, L, V]``.
        mask_token_id: the ``[MASK]`` id (151666 for Dream/DiffuCoder, 811 DiffuLLaMA, 126336 LLaDA).
        shift_logits: True for models adapted from AR LMs (Dream/DiffuCoder, DiffuLLaMA): the logit
            at position i-1 predicts token i. False for LLaDA/MDLM.
        steps: denoising steps; 1 is the method's single pass (per-position marginals). More steps
            unmask the window progressively (most confident first); drafts are then no longer drawn
            from a product of marginals, so only q-free (``greedy``) acceptance stays exact.
        max_prefix_tokens: read at most this many trailing prefix tokens (the drafter has no KV cache,
            so its cost grows with the prefix). None: as much as its context allows.
    """

    def __init__(
        self,
        model: nn.Module,
        mask_token_id: int,
        shift_logits: bool,
        steps: int = 1,
        max_prefix_tokens: int | None = None,
    ) -> None:
        self.model = model
        config = model.config
        self.vocab_size = int(config.vocab_size)
        if not 0 <= int(mask_token_id) < self.vocab_size:
            raise ValueError(
                f"mask_token_id={mask_token_id} is outside the drafter's vocabulary [0, {self.vocab_size}). "
                f"Pass the drafter's own [MASK] id (e.g. DRAFTER_FAMILIES['dream'].mask_token_id) or add a "
                f"mask token to the tokenizer and resize the embeddings."
            )
        for name in ("pad_token_id", "eos_token_id"):
            if int(mask_token_id) in _config_token_ids(config, name):
                raise ValueError(
                    f"mask_token_id={mask_token_id} equals the drafter's {name}; the mask token must be a "
                    f"dedicated id, or masked positions would be read as padding / end of sequence."
                )
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        if max_prefix_tokens is not None and max_prefix_tokens < 1:
            raise ValueError(f"max_prefix_tokens must be >= 1 or None, got {max_prefix_tokens}")
        self.mask_token_id = int(mask_token_id)
        self.shift_logits = bool(shift_logits)
        self.steps = int(steps)
        self.max_prefix_tokens = max_prefix_tokens
        self.max_positions = getattr(config, "max_position_embeddings", None)
        self._stock = _is_stock_transformers_model(model)
        if self._stock:
            check_custom_mask_support(model, "drafter")

    # ------------------------------------------------------------------ loading / saving
    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        family: str = "auto",
        *,
        mask_token_id: int | None = None,
        shift_logits: bool | None = None,
        steps: int = 1,
        max_prefix_tokens: int | None = None,
        **model_kwargs,
    ) -> DiffusionDrafter:
        """Load a drafter checkpoint (local directory or hub id) into a stock transformers class.

        Args:
            family: ``"dream"`` (DiffuCoder/Dream), ``"diffullama"``, ``"llada"``, or ``"auto"``: read
                the ``specdiff_drafter.json`` written by :meth:`save_pretrained`, else infer the
                family from the raw ``config.json``'s ``model_type`` (``"Dream"``, ``"llada"``,
                ``"llama"``). Dream loads as ``Qwen2ForCausalLM``, LLaDA as ``LlamaForCausalLM``
                (config translated, tensors renamed on load): no code from the checkpoint runs
                unless you pass ``trust_remote_code=True`` (see ``models/families.py``).
            mask_token_id, shift_logits: override the checkpoint's / family's values.
            model_kwargs: passed to ``from_pretrained`` (``dtype``, ``device_map``, ``attn_implementation``...).
        """
        from .families import load_drafter_model

        trust_remote_code = model_kwargs.pop("trust_remote_code", None)
        # Drafter options (not model ones) that may ride along in model_kwargs or the sidecar.
        drafter_options = {k: model_kwargs.pop(k) for k in ("attention", "prefix_cache") if k in model_kwargs}
        model, family, settings, config_dict = load_drafter_model(
            path, family, trust_remote_code=trust_remote_code, **model_kwargs
        )
        if settings.get("attention") is not None:
            drafter_options.setdefault("attention", settings["attention"])
        spec = DRAFTER_FAMILIES[family]
        drafter = cls(
            model,
            mask_token_id=_first_not_none(
                mask_token_id,
                settings.get("mask_token_id"),
                config_dict.get("mask_token_id"),
                spec.mask_token_id,
            ),
            shift_logits=_first_not_none(shift_logits, settings.get("shift_logits"), spec.shift_logits),
            steps=steps,
            max_prefix_tokens=_first_not_none(max_prefix_tokens, settings.get("max_prefix_tokens")),
            **drafter_options,
        )
        drafter.family = family
        return drafter

    def save_pretrained(self, path: str | os.PathLike, family: str | None = None, **kwargs) -> None:
        """Save the model in its stock format (``save_pretrained``) plus the drafter settings needed
        to reload it; plain ``AutoModelForCausalLM.from_pretrained`` reloads the model too."""
        from .families import save_drafter_model

        if family is None:
            family = getattr(self, "family", None)
        if family is None:
            family = family_for_model_type(getattr(self.model.config, "model_type", "")) or "diffullama"
        settings = {
            "family": family,
            "mask_token_id": self.mask_token_id,
            "shift_logits": self.shift_logits,
            "max_prefix_tokens": self.max_prefix_tokens,
        }
        if getattr(self, "attention", "bidirectional") != "bidirectional":
            settings["attention"] = self.attention
        save_drafter_model(self.model, path, settings, **kwargs)

    # ------------------------------------------------------------------ forward
    def _prefix_budget(self, gamma: int) -> int | None:
        budget = self.max_prefix_tokens
        if self.max_positions is not None:
            room = int(self.max_positions) - gamma
            if room < 1:
                raise ValueError(
                    f"gamma={gamma} leaves no room for a prefix in the drafter's context of "
                    f"{self.max_positions} positions; use a smaller gamma"
                )
            budget = room if budget is None else min(budget, room)
        return budget

    def denoise_logits(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """One bidirectional forward: ``tokens[B, L] -> logits[B, L, V]`` (unshifted positions)."""
        if self._stock:
            batch, length = tokens.shape
            keys = (
                torch.ones(batch, length, dtype=torch.bool, device=tokens.device)
                if attention_mask is None
                else attention_mask.bool()
            )
            allowed = keys[:, None, :].expand(batch, length, length)
            dtype = next(self.model.parameters()).dtype
            positions = torch.arange(length, device=tokens.device)[None].expand(batch, -1)
            out = self.model(
                input_ids=tokens,
                attention_mask=to_model_mask(allowed, self.model, dtype),
                position_ids=positions,
                use_cache=False,
                is_causal=False,
            )
        else:
            out = self.model(input_ids=tokens, attention_mask=attention_mask)
        return out.logits

    def _window(self, logits: torch.Tensor, prefix_len: int, gamma: int) -> torch.Tensor:
        start = prefix_len - 1 if self.shift_logits else prefix_len
        return logits[:, start : start + gamma]

    def _masked_input(self, input_ids: torch.Tensor, gamma: int, attention_mask: torch.Tensor | None):
        if input_ids.shape[1] == 0:
            raise ValueError("the drafter needs a non-empty prefix")
        budget = self._prefix_budget(gamma)
        if budget is not None and input_ids.shape[1] > budget:
            input_ids = input_ids[:, -budget:]
            attention_mask = None if attention_mask is None else attention_mask[:, -budget:]
        batch = input_ids.shape[0]
        masks = torch.full((batch, gamma), self.mask_token_id, dtype=input_ids.dtype, device=input_ids.device)
        tokens = torch.cat([input_ids, masks], dim=1)
        if attention_mask is not None:
            attention_mask = torch.cat(
                [attention_mask, torch.ones_like(masks, dtype=attention_mask.dtype)], dim=1
            )
        return tokens, attention_mask, input_ids.shape[1]

    @torch.no_grad()
    def draft_logits(
        self, input_ids: torch.Tensor, gamma: int, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Per-position draft logits for the ``gamma`` masked slots after ``input_ids[B, L]``.

        Returns ``FloatTensor[B, gamma, V]`` (the model's dtype): row j is the logit of ``q_j(. | s)``.
        Runs without gradients; training uses :meth:`window_logits`.
        """
        return self.window_logits(input_ids, gamma, attention_mask)

    def window_logits(
        self, input_ids: torch.Tensor, gamma: int, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """:meth:`draft_logits` without ``no_grad`` (for streak-distillation)."""
        tokens, mask, prefix_len = self._masked_input(input_ids, gamma, attention_mask)
        return self._window(self.denoise_logits(tokens, mask), prefix_len, gamma)

    @torch.no_grad()
    def propose(
        self,
        input_ids: torch.Tensor,
        gamma: int,
        num_drafts: int = 1,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> Proposal:
        if self.steps == 1:
            return sample_from_marginals(
                self.draft_logits(input_ids, gamma), num_drafts, temperature, generator
            )
        return self._propose_multistep(input_ids, gamma, num_drafts, temperature, generator)

    def _propose_multistep(self, input_ids, gamma, num_drafts, temperature, generator) -> Proposal:
        """Progressive unmasking, most confident sampled tokens first, one trajectory per draft."""
        batch = input_ids.shape[0]
        tokens, _, prefix_len = self._masked_input(input_ids, gamma, None)
        tokens = tokens.repeat_interleave(num_drafts, dim=0)  # [B*K, L + gamma]
        probs = None
        masked = torch.ones(tokens.shape[0], gamma, dtype=torch.bool, device=tokens.device)
        per_step = math.ceil(gamma / self.steps)
        for step in range(self.steps):
            logits = self._window(self.denoise_logits(tokens), prefix_len, gamma)
            q = logits_to_probs(logits, temperature)  # [B*K, gamma, V]
            if probs is None:
                probs = torch.zeros_like(q)
            sampled = torch.multinomial(q.reshape(-1, q.shape[-1]), 1, generator=generator).reshape(
                q.shape[:2]
            )
            confidence = q.gather(-1, sampled[..., None]).squeeze(-1).masked_fill(~masked, -1.0)
            count = gamma if step == self.steps - 1 else min(per_step, gamma)
            chosen = confidence.topk(count, dim=-1).indices
            chosen_mask = torch.zeros_like(masked).scatter_(1, chosen, True) & masked
            window = tokens[:, prefix_len:]
            window[chosen_mask] = sampled[chosen_mask]
            probs[chosen_mask] = q[chosen_mask]
            masked &= ~chosen_mask
            if not masked.any():
                break
        window = tokens[:, prefix_len:].reshape(batch, num_drafts, gamma)
        return Proposal(window, probs.reshape(batch, num_drafts, gamma, -1), exact_q=False)

    def __repr__(self) -> str:
        return (
            f"DiffusionDrafter({type(self.model).__name__}, mask_token_id={self.mask_token_id}, "
            f"shift_logits={self.shift_logits}, steps={self.steps}, max_prefix_tokens={self.max_prefix_tokens})"
        )


def _first_not_none(*values):
    for value in values:
        if value is not None:
            return value
    return None
