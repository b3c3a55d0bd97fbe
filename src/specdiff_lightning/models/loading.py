"""Load verifiers and drafters from a spec string: a local directory, a hub id, or a tiny preset.

``"tiny-qwen2"`` / ``"tiny-llama"`` build small random models of the real classes (``tiny`` kwargs
set their sizes), so every config in ``configs/`` runs on a laptop with the real paths swapped in.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from ..decoding.attention import GROUPED_SDPA
from .diffusion import DiffusionDrafter
from .smollm2 import SMOLLM2_SPEC, smollm2_dir
from .tiny import tiny_model

__all__ = ["load_verifier", "load_drafter", "resolve_dtype", "TINY_PREFIX", "NAMED_VERIFIERS"]

TINY_PREFIX = "tiny-"

#: named verifiers: spec -> a function returning a local Hugging Face directory (converted and cached
#: on first use). Every config and CLI command that takes a verifier spec accepts these names.
NAMED_VERIFIERS = {SMOLLM2_SPEC: smollm2_dir}


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | str | None:
    """``"bfloat16"`` -> ``torch.bfloat16``; ``"auto"`` and None pass through."""
    if dtype is None or isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    resolved = getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use e.g. 'float32', 'bfloat16', 'float64' or 'auto'")
    return resolved


def _tiny(spec: str, tiny: dict | None, dtype, attn_implementation: str) -> PreTrainedModel:
    kwargs = dict(tiny or {})
    kwargs.setdefault("attn_implementation", attn_implementation)
    if isinstance(dtype, torch.dtype):
        kwargs.setdefault("dtype", dtype)
    return tiny_model(spec[len(TINY_PREFIX) :], **kwargs)


def load_verifier(
    spec: str,
    *,
    dtype: str | torch.dtype | None = "auto",
    attn_implementation: str = GROUPED_SDPA,
    tiny: dict | None = None,
    **model_kwargs,
) -> PreTrainedModel:
    """A frozen causal LM in eval mode with gradients off.

    Args:
        spec: directory or hub id for ``AutoModelForCausalLM.from_pretrained``, a name in
            :data:`NAMED_VERIFIERS` (``"smollm2-135m-instruct"``), or ``"tiny-qwen2"`` / ``"tiny-llama"``.
        attn_implementation: ``"sdpa_grouped"`` (default: SDPA that reads each cached key once for
            the few masked queries of a draft tree, :mod:`specdiff_lightning.decoding.attention`),
            ``"sdpa"`` or ``"eager"``.
        tiny: sizes for a tiny preset (``vocab_size``, ``hidden_size``, ``num_layers``, ``seed``...).
        dtype: a dtype, or ``"auto"`` (default): the one this machine runs the model fastest in
            (:func:`~specdiff_lightning.decoding.calibration.fastest_dtype`: on a CPU float32 or
            bfloat16 by their measured cost of a draft tree's forward, cached per machine; on a GPU
            bfloat16 where supported). Tiny presets are test models: "auto" is float32 for them.
            ``model.dtype_choice`` says what "auto" chose.
        model_kwargs: passed to ``from_pretrained`` (``device_map``, ``revision``...).
    """
    from ..decoding.calibration import check_dtype_runs, fastest_dtype

    dtype = resolve_dtype(dtype)
    auto = dtype == "auto" or dtype is None
    if spec.startswith(TINY_PREFIX):
        model = _tiny(spec, tiny, torch.float32 if auto else dtype, attn_implementation)
        auto = False
    else:
        if spec in NAMED_VERIFIERS:
            spec = str(NAMED_VERIFIERS[spec]())
        model = AutoModelForCausalLM.from_pretrained(
            spec, dtype=dtype, attn_implementation=attn_implementation, **model_kwargs
        )
    model.eval()
    model.requires_grad_(False)
    if auto:
        chosen = fastest_dtype(model)
        if chosen != model.dtype:
            model.to(chosen)
        model.dtype_choice = f"auto: {str(chosen).removeprefix('torch.')} (fastest measured here)"
    else:
        check_dtype_runs(next(model.parameters()).dtype, next(model.parameters()).device)
    return model


def load_drafter(
    spec: str,
    *,
    family: str = "auto",
    mask_token_id: int | None = None,
    shift_logits: bool | None = None,
    max_prefix_tokens: int | None = None,
    steps: int = 1,
    dtype: str | torch.dtype | None = "auto",
    tiny: dict | None = None,
    **model_kwargs,
) -> DiffusionDrafter:
    """A :class:`DiffusionDrafter` from a checkpoint (see :meth:`DiffusionDrafter.from_pretrained`)
    or a tiny preset (mask id defaults to the last vocabulary id, logits shifted)."""
    dtype = resolve_dtype(dtype)
    if spec.startswith(TINY_PREFIX):
        model = _tiny(spec, tiny, dtype, model_kwargs.get("attn_implementation", "sdpa"))
        return DiffusionDrafter(
            model,
            mask_token_id=model.config.vocab_size - 1 if mask_token_id is None else mask_token_id,
            shift_logits=True if shift_logits is None else shift_logits,
            steps=steps,
            max_prefix_tokens=max_prefix_tokens,
        )
    return DiffusionDrafter.from_pretrained(
        spec,
        family=family,
        mask_token_id=mask_token_id,
        shift_logits=shift_logits,
        steps=steps,
        max_prefix_tokens=max_prefix_tokens,
        dtype=dtype,
        **model_kwargs,
    )
