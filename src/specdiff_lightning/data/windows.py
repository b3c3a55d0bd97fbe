"""Cutting training windows ``(s, x_1..x_gamma)`` from tokenized records, and batching them."""

from __future__ import annotations

import random

import torch

from ..constants import IGNORE_INDEX
from ..models.continuations import left_pad

__all__ = ["cut_windows", "collate_windows"]


def cut_windows(
    prompt_ids: list[int],
    continuation_ids: list[int],
    gamma: int,
    num_windows: int,
    rng: random.Random,
    max_prefix_tokens: int | None = None,
) -> list[dict]:
    """Exactly ``num_windows`` windows at random offsets into the continuation.

    Window at offset o: prefix ``s = prompt ⊕ continuation[:o]`` (non-empty, left-truncated to
    ``max_prefix_tokens``), targets ``continuation[o:o+gamma]`` padded with ``IGNORE_INDEX`` when the
    record ends first. Offsets are drawn without replacement while there are enough, then with
    replacement, so every record yields the same number of windows (equal batch counts per rank).
    Returns an empty list when no window has a non-empty prefix.
    """
    first = 0 if prompt_ids else 1
    offsets = list(range(first, len(continuation_ids)))
    if not offsets:
        return []
    if len(offsets) >= num_windows:
        chosen = rng.sample(offsets, num_windows)
    else:
        chosen = offsets + [rng.choice(offsets) for _ in range(num_windows - len(offsets))]
    windows = []
    for o in chosen:
        prefix = prompt_ids + continuation_ids[:o]
        if max_prefix_tokens is not None:
            prefix = prefix[-max_prefix_tokens:]
        targets = continuation_ids[o : o + gamma]
        windows.append({"prefix": prefix, "targets": targets + [IGNORE_INDEX] * (gamma - len(targets))})
    return windows


def collate_windows(windows: list[dict], pad_token_id: int = 0) -> dict:
    """Left-pad prefixes into ``prefix[B, L]`` with ``prefix_mask[B, L]``; ``targets[B, gamma]``."""
    prefix, mask = left_pad([w["prefix"] for w in windows], pad_token_id)
    batch = {
        "prefix": prefix,
        "prefix_mask": mask,
        "targets": torch.tensor([w["targets"] for w in windows], dtype=torch.long),
    }
    for key, name in (("id", "ids"), ("window_id", "window_ids")):
        if key in windows[0]:
            batch[name] = [w[key] for w in windows]
    return batch
