"""Custom 4D attention masks for stock Hugging Face decoders.

Both the drafter (bidirectional over ``[prefix, MASK*gamma]``) and the verifier (tree attention over
the draft trie) pass a prepared 4D mask through the model's ``forward``. Transformers returns a 4D
mask untouched (``masking_utils._preprocess_mask_arguments``), but the *format* each attention
kernel expects differs (METHOD.md §9): SDPA takes a bool mask (True = attend) or an additive float
mask, eager only an additive float mask (a bool one is silently wrong), flash-attention takes none.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["attention_implementation", "check_custom_mask_support", "to_model_mask"]

_SUPPORTED = ("sdpa", "eager")


def attention_implementation(model: nn.Module) -> str:
    """The attention kernel name a HF model was configured with (``"sdpa"``, ``"eager"``, ...)."""
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) or "eager"


def check_custom_mask_support(model: nn.Module, role: str) -> None:
    """Raise a clear error when ``model``'s attention kernel cannot take a custom 4D mask."""
    impl = attention_implementation(model)
    if impl not in _SUPPORTED:
        raise ValueError(
            f"the {role}'s attention implementation {impl!r} does not accept a custom 4D mask, which tree "
            f"verification and bidirectional drafting need. Load it with attn_implementation='sdpa' (or "
            f"'eager'), e.g. AutoModelForCausalLM.from_pretrained(path, attn_implementation='sdpa')."
        )


def to_model_mask(allowed: torch.Tensor, model: nn.Module, dtype: torch.dtype) -> torch.Tensor:
    """Convert a boolean "may attend" matrix into the 4D mask ``model``'s kernel expects.

    Args:
        allowed: ``BoolTensor[B, Q, K]`` (or ``[B, 1, Q, K]``); True where query q may attend key k.
        model: the HF model that will receive the mask.
        dtype: the model's compute dtype (for the additive float mask).

    Returns:
        ``Tensor[B, 1, Q, K]``: bool for SDPA, additive ``dtype`` (0 / most negative) for eager.
    """
    if allowed.dim() == 3:
        allowed = allowed[:, None]
    if attention_implementation(model) == "sdpa":
        return allowed
    check_custom_mask_support(model, "model")
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)
