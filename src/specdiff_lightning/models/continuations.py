"""Batches for a causal LM: left padding, position ids, and sampled continuations.

One verifier sampler serves corpus generation (``generate-corpus``) and the online teacher of
streak-distillation, so both sample the verifier's true distribution the same way.
"""

from __future__ import annotations

import torch
from torch import nn

from ..constants import IGNORE_INDEX

__all__ = ["left_pad", "positions_from_mask", "sample_continuations"]


def left_pad(
    rows: list[list[int]], pad_token_id: int = 0, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token rows into ``ids[B, L]`` and ``mask[B, L]`` (1 on tokens, 0 on padding)."""
    length = max(map(len, rows))
    ids = torch.full((len(rows), length), pad_token_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(rows), length), dtype=torch.long, device=device)
    for i, row in enumerate(rows):
        if row:
            ids[i, length - len(row) :] = torch.tensor(row, dtype=torch.long, device=device)
            mask[i, length - len(row) :] = 1
    return ids, mask


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
    num_return_sequences: int = 1,
    pad_token_id: int = 0,
    generator_seed: int | None = None,
) -> torch.Tensor:
    """Sample ``x_1..x_length ~ P(. | s)`` for left-padded prefixes ``[B, L]`` with ``generate()``.

    Pure temperature sampling: ``top_k=0``/``top_p=1`` switch off ``generate``'s default truncation
    (its default ``top_k=50`` would silently change the teacher distribution); ``temperature=0``:
    greedy decoding. Decoding stops at
    ``eos_token_id`` (kept); without one, exactly ``length`` tokens are sampled. Rows are
    ``num_return_sequences`` consecutive samples per prefix. Returns ``LongTensor[B * n, length]``
    with ``IGNORE_INDEX`` after an EOS.
    """
    if generator_seed is not None:
        torch.manual_seed(generator_seed)
    # temperature 0: the verifier's greedy continuations (one per prefix is all there is)
    sampling = (
        dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        if temperature > 0
        else {"do_sample": False}
    )
    out = verifier.generate(
        input_ids=prefix,
        attention_mask=prefix_mask,
        **sampling,
        max_new_tokens=length,
        min_new_tokens=length if eos_token_id is None else 0,
        num_return_sequences=num_return_sequences,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )[:, prefix.shape[1] :]
    targets = torch.full((out.shape[0], length), IGNORE_INDEX, dtype=torch.long, device=prefix.device)
    targets[:, : out.shape[1]] = out
    if eos_token_id is not None:
        is_eos = torch.isin(targets, torch.tensor(eos_token_id, device=prefix.device).reshape(-1)).long()
        targets[is_eos.cumsum(-1) - is_eos > 0] = IGNORE_INDEX
    return targets
