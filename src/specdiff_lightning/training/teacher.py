"""What the frozen verifier supplies to training: continuations and per-position distributions."""

from __future__ import annotations

import torch
from torch import nn

from ..constants import IGNORE_INDEX
from ..models.continuations import positions_from_mask, sample_continuations

__all__ = ["positions_from_mask", "sample_continuations", "verifier_window_logprobs"]


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
