"""What the frozen verifier supplies to training: continuations and per-position distributions."""

from __future__ import annotations

import torch
from torch import nn

from .losses import IGNORE_INDEX

__all__ = ["positions_from_mask", "sample_continuations", "verifier_window_logprobs"]


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids for left-padded rows: ``cumsum(mask) - 1`` (pads get 0)."""
    return (mask.long().cumsum(-1) - 1).clamp_min(0)


@torch.no_grad()
def sample_continuations(
    verifier: nn.Module,
    prefix: torch.Tensor,
    prefix_mask: torch.Tensor,
    length: int,
    temperature: float = 1.0,
    eos_token_id: int | list[int] | None = None,
    generator_seed: int | None = None,
) -> torch.Tensor:
    """Sample ``x_1..x_length ~ P(. | s)`` for left-padded prefixes ``[B, L]`` with ``generate()``.

    Pure temperature sampling: ``top_k=0``/``top_p=1`` switch off ``generate``'s default truncation
    (its default ``top_k=50`` would silently change the teacher distribution). Tokens after an EOS
    become ``IGNORE_INDEX``. Returns ``LongTensor[B, length]``.
    """
    if generator_seed is not None:
        torch.manual_seed(generator_seed)
    out = verifier.generate(
        input_ids=prefix,
        attention_mask=prefix_mask,
        do_sample=True,
        temperature=temperature,
        top_k=0,
        top_p=1.0,
        max_new_tokens=length,
        min_new_tokens=length if eos_token_id is None else 0,
        eos_token_id=eos_token_id,
        pad_token_id=0,
    )[:, prefix.shape[1] :]
    targets = torch.full((prefix.shape[0], length), IGNORE_INDEX, dtype=torch.long, device=prefix.device)
    targets[:, : out.shape[1]] = out
    if eos_token_id is not None:
        eos = torch.tensor(eos_token_id, device=prefix.device).reshape(-1)
        after_eos = torch.isin(targets, eos).long().cumsum(-1) - torch.isin(targets, eos).long() > 0
        targets[after_eos] = IGNORE_INDEX
    return targets


@torch.no_grad()
def verifier_window_logprobs(
    verifier: nn.Module, prefix: torch.Tensor, prefix_mask: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """``log p(. | s ⊕ x_<k)`` for k = 1..g in one parallel forward over ``s ⊕ x``: ``[B, g, V]``."""
    valid = targets != IGNORE_INDEX
    tokens = torch.cat([prefix, targets.clamp_min(0)], dim=1)
    mask = torch.cat([prefix_mask, valid.to(prefix_mask.dtype)], dim=1)
    logits = verifier(input_ids=tokens, attention_mask=mask, position_ids=positions_from_mask(mask)).logits
    start = prefix.shape[1] - 1
    window = logits[:, start : start + targets.shape[1]]
    return torch.log_softmax(window.float() if window.dtype != torch.float64 else window, dim=-1)
