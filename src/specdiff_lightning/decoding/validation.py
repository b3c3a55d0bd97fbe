"""Input checks that turn bad input into a clear error before any model runs."""

from __future__ import annotations

import torch
from torch import nn

__all__ = [
    "check_prompt",
    "check_sampling",
    "check_vocab",
    "check_tokenizers",
    "check_context",
    "check_verifier_dtypes",
]


def check_prompt(input_ids: torch.Tensor, vocab_size: int) -> None:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype not in (
        torch.long,
        torch.int32,
        torch.int64,
    ):
        raise TypeError(
            "input_ids must be an integer torch.Tensor of shape [1, L], e.g. tokenizer(..., return_tensors='pt').input_ids"
        )
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape [batch, length], got {tuple(input_ids.shape)}")
    if input_ids.shape[0] != 1:
        raise NotImplementedError(
            f"batch size {input_ids.shape[0]}: speculative decoding runs one sequence at a time for now; "
            f"loop over the rows"
        )
    if input_ids.shape[1] == 0:
        raise ValueError("the prompt is empty: give at least one token (e.g. the BOS token)")
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(
            f"prompt token ids must lie in [0, {vocab_size}) (the verifier's vocabulary); got ids in [{lo}, {hi}]. "
            f"Was the prompt encoded with another model's tokenizer?"
        )


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy decoding), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p}")


def check_vocab(verifier: nn.Module, drafter_vocab_size: int, shared_vocab_size: int | None = None) -> int:
    """Drafter and verifier must score the same token ids; returns the vocab size decoding uses.

    ``shared_vocab_size`` (a drafter's ``vocab_limit``, set by
    :func:`~specdiff_lightning.decoding.drafting.share_vocabulary` once the tokenizers agree) accepts
    a pair whose sizes differ only by padding rows: both sides are then restricted to those ids.
    """
    verifier_vocab = int(verifier.config.vocab_size)
    if shared_vocab_size is not None:
        if not 1 <= shared_vocab_size <= min(verifier_vocab, drafter_vocab_size):
            raise ValueError(
                f"the shared vocabulary ({shared_vocab_size} ids) exceeds the verifier's ({verifier_vocab}) or "
                f"the drafter's ({drafter_vocab_size}) vocabulary"
            )
        return int(shared_vocab_size)
    if verifier_vocab != drafter_vocab_size:
        raise ValueError(
            f"vocabulary mismatch: the verifier has {verifier_vocab} token ids, the drafter {drafter_vocab_size}. "
            f"Speculative decoding needs drafter and verifier on the same tokenizer (e.g. DiffuCoder with "
            f"Qwen2.5, DiffuLLaMA with Llama-2). If only padding rows differ (same tokenizer), call "
            f"share_vocabulary(verifier, drafter, tokenizer, drafter_tokenizer) first."
        )
    return verifier_vocab


def check_context(verifier: nn.Module, prompt_length: int, max_new_tokens: int) -> None:
    """Refuse a prompt + ``max_new_tokens`` that would feed the verifier past its positions.

    The verifier sees the prompt and every emitted token except the last (the last one is sampled
    from the final forward and never fed back), so ``prompt_length + max_new_tokens - 1``
    positions must fit: a 64-token prompt on a 64-position model may emit exactly one token.
    """
    limit = getattr(verifier.config, "max_position_embeddings", None)
    needed = prompt_length + max_new_tokens - 1
    if limit is not None and needed > limit:
        fits = limit - prompt_length + 1  # the most new tokens this prompt leaves room for
        keep = limit - max_new_tokens + 1  # the longest prompt that leaves room for max_new_tokens
        # Suggest only a fix that works: max_new_tokens must be >= 1, so a prompt that fills the
        # context can only be shortened (PromptDataModule's max_prompt_tokens keeps its last tokens).
        if fits >= 1:
            fix = f"shorten the prompt or lower max_new_tokens to {fits}"
        elif keep >= 1:
            fix = f"the prompt alone fills it: keep at most its last {keep} tokens (e.g. max_prompt_tokens: {keep})"
        else:
            fix = f"lower max_new_tokens below {limit} and keep at most the prompt's last {limit} tokens"
        raise ValueError(
            f"prompt ({prompt_length} tokens) + max_new_tokens ({max_new_tokens}) needs {needed} positions (the "
            f"last new token is never fed back), which exceeds the verifier's context of {limit} positions; {fix}"
        )


def check_verifier_dtypes(verifier: nn.Module) -> None:
    """Refuse a verifier whose input embeddings and next weight disagree in floating dtype.

    A drafter sliced from its verifier shares the verifier's embeddings (``models/slicing.py``), so
    casting the drafter alone (``drafter.model.to(torch.bfloat16)``) casts them in the verifier
    too; its next forward would fail deep inside a matmul. Reads two parameters: no cost."""
    embeddings = verifier.get_input_embeddings() if hasattr(verifier, "get_input_embeddings") else None
    weight = getattr(embeddings, "weight", None)
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        return
    other = next((p for p in verifier.parameters() if p is not weight), None)
    if other is None or not other.is_floating_point() or other.dtype == weight.dtype:
        return
    raise ValueError(
        f"the verifier's embeddings are {weight.dtype} but its other weights {other.dtype}: a drafter cut "
        f"from this verifier shares its embeddings, so casting the drafter alone cast them too. Cast the "
        f"verifier and the drafter together, or load the verifier in the dtype wanted and the drafter around it"
    )


def check_tokenizers(verifier_tokenizer, drafter_tokenizer) -> None:
    """Raise unless both tokenizers map every token to the same id."""
    if verifier_tokenizer is None or drafter_tokenizer is None:
        return
    v_vocab, d_vocab = verifier_tokenizer.get_vocab(), drafter_tokenizer.get_vocab()
    if v_vocab == d_vocab:
        return
    only_v = sorted(set(v_vocab) - set(d_vocab))[:5]
    only_d = sorted(set(d_vocab) - set(v_vocab))[:5]
    moved = [t for t in v_vocab if t in d_vocab and v_vocab[t] != d_vocab[t]][:5]
    raise ValueError(
        "tokenizer mismatch between verifier and drafter "
        f"({len(v_vocab)} vs {len(d_vocab)} tokens; only in verifier: {only_v}; only in drafter: {only_d}; "
        f"different ids: {moved}). Use a drafter trained on the verifier's tokenizer."
    )
