"""Small models of the real architectures, built from configs (tests, demos, notebooks).

They are the same classes as the production checkpoints (``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``,
``LlamaForCausalLM``), only smaller, so every code path that runs on Qwen2.5-72B runs on them too.
"""

from __future__ import annotations

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

__all__ = ["tiny_qwen2", "tiny_llama", "tiny_model"]


def _common(vocab_size: int, hidden_size: int, num_layers: int, num_heads: int, max_positions: int, **kw):
    return dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=kw.pop("intermediate_size", hidden_size * 2),
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=kw.pop("num_key_value_heads", max(1, num_heads // 2)),
        max_position_embeddings=max_positions,
        tie_word_embeddings=kw.pop("tie_word_embeddings", False),
        **kw,
    )


def _build(
    cls, config, seed: int, dtype: torch.dtype, attn_implementation: str, logit_scale: float
) -> PreTrainedModel:
    config._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
        if logit_scale != 1.0 and not config.tie_word_embeddings:
            # Random tiny models at the default init are nearly uniform; widen the logits so greedy
            # decoding and acceptance have real structure to get right (1.0 for models to train).
            with torch.no_grad():
                model.lm_head.weight.mul_(logit_scale)
    return model.to(dtype).eval()


_ARCHITECTURES = {
    "qwen2": (Qwen2ForCausalLM, Qwen2Config),
    "llama": (LlamaForCausalLM, LlamaConfig),
    # the family z-lab's DFlash drafters target (QK-norm)
    "qwen3": (Qwen3ForCausalLM, Qwen3Config),
}


def tiny_model(
    arch: str,
    vocab_size: int = 64,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    max_positions: int = 512,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
    logit_scale: float = 8.0,
    **config_kwargs,
) -> PreTrainedModel:
    """A randomly initialised ``Qwen2ForCausalLM`` (``arch="qwen2"``), ``Qwen3ForCausalLM``
    (``"qwen3"``) or ``LlamaForCausalLM`` (``"llama"``). ``config_kwargs`` go to the config class
    (``intermediate_size``, ``eos_token_id``, ...); ``logit_scale`` sharpens random output layers
    (use 1.0 for a model that will be trained)."""
    if arch not in _ARCHITECTURES:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {sorted(_ARCHITECTURES)}")
    model_cls, config_cls = _ARCHITECTURES[arch]
    config = config_cls(
        **_common(vocab_size, hidden_size, num_layers, num_heads, max_positions, **config_kwargs)
    )
    return _build(model_cls, config, seed, dtype, attn_implementation, logit_scale)


def tiny_qwen2(**kwargs) -> Qwen2ForCausalLM:
    """``tiny_model("qwen2", **kwargs)``."""
    return tiny_model("qwen2", **kwargs)


def tiny_llama(**kwargs) -> LlamaForCausalLM:
    """``tiny_model("llama", **kwargs)``."""
    return tiny_model("llama", **kwargs)
