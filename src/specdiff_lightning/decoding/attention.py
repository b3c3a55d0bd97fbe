"""Custom 4D attention masks for stock Hugging Face decoders.

Both the drafter (bidirectional over ``[prefix, MASK*gamma]``) and the verifier (tree attention over
the draft trie) pass a prepared 4D mask through the model's ``forward``. Transformers returns a 4D
mask untouched (``masking_utils._preprocess_mask_arguments``), but the *format* each attention
kernel expects differs (METHOD.md §9): SDPA takes a bool mask (True = attend) or an additive float
mask, eager only an additive float mask (a bool one is silently wrong), flash-attention takes none.

``"sdpa_grouped"`` (registered with transformers' ``AttentionInterface`` on import) is SDPA made
cheap for what speculative decoding sends most: a few queries (a draft tree, one token) under a
custom mask on a grouped-query model. Stock SDPA then copies every key/value head ``n_rep`` times
(``repeat_kv``, O(context) per layer); here the query heads that share a key/value head are stacked
as extra query rows of that head, so one SDPA call reads each cached key once. Same kernel, same
accumulation: measured on a 2-core CPU (SmolLM2, 3 KV heads for 9 query heads, bf16), one masked
query over 500 cached tokens 251 -> 49 us a layer, six 127 -> 96 us, sixteen over 800 355 -> 291
us; from about 24 queries on it stops paying, so larger calls (prefill, training, wide trees) take
stock SDPA unchanged. Decoding 20 HumanEval problems with the best SmolLM2 setting (bf16): a round
34.8 -> 34.3 ms with the same tokens per round.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

__all__ = [
    "GROUPED_SDPA",
    "MAX_GROUPED_QUERIES",
    "MAX_GROUPED_QUERIES_COMPILED",
    "grouped_sdpa_attention",
    "attention_implementation",
    "check_custom_mask_support",
    "to_model_mask",
]

#: the attention implementation name to load a model with (``attn_implementation=GROUPED_SDPA``)
GROUPED_SDPA = "sdpa_grouped"
#: calls with more queries than this take stock SDPA (the stacked rows stop paying, measured above)
MAX_GROUPED_QUERIES = 16
#: the same limit inside a compiled forward (decoding/compiled.py), where the stacked rows kept paying
#: up to the largest tree measured (SmolLM2, bf16, 2-core Xeon, compiled tree forwards: 17 nodes
#: 35.6 against 39.0-42.2 ms with stock SDPA above 16, 32 nodes 37.8 against 40.6-43.2, 48 nodes 43.8
#: against 46.9-49.9), and one branch fewer is one graph fewer to compile
MAX_GROUPED_QUERIES_COMPILED = 64

_SDPA_FAMILY = ("sdpa", GROUPED_SDPA)
_SUPPORTED = (*_SDPA_FAMILY, "eager")


def grouped_sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query[B, H, q, D]``, ``key``/``value``
    ``[B, H_kv, k, D]``, ``attention_mask[B|1, 1, q|1, k]`` (bool or additive); returns
    ``(output[B, q, H, D], None)``. Stock SDPA unless the call is a few masked queries on a
    grouped-query layer; then the ``H / H_kv`` query heads of each key/value head become
    ``H / H_kv * q`` query rows of it, their mask rows repeated, and nothing is copied per key."""
    groups = int(getattr(module, "num_key_value_groups", 1))
    batch, heads, q_len, dim = query.shape
    limit = MAX_GROUPED_QUERIES_COMPILED if torch.compiler.is_compiling() else MAX_GROUPED_QUERIES
    plain = (
        groups == 1
        or attention_mask is None
        or attention_mask.dim() != 4
        or attention_mask.shape[1] != 1  # per-head masks
        or q_len > limit
        or dropout > 0
        or any(kwargs.get(name) is not None for name in ("position_bias", "softcap", "s_aux"))
        or kwargs.get("output_attentions", False)
    )
    if plain:
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    # row j * q + i of key/value head h is query i of head h * groups + j
    stacked = query.reshape(batch, heads // groups, groups * q_len, dim)
    mask = attention_mask if attention_mask.shape[2] == 1 else attention_mask.repeat(1, 1, groups, 1)
    out = torch.nn.functional.scaled_dot_product_attention(stacked, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(batch, heads, q_len, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(GROUPED_SDPA, sdpa_mask)


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
    if attention_implementation(model) in _SDPA_FAMILY:
        return allowed
    check_custom_mask_support(model, "model")
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)
