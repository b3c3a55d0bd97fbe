"""Batches for a causal LM: left padding, position ids, and sampled continuations.

One verifier sampler serves corpus generation (``generate-corpus``) and the online teacher of
streak-distillation, so both sample the verifier's true distribution the same way.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LogitsProcessorList

from ..constants import IGNORE_INDEX

__all__ = ["left_pad", "positions_from_mask", "sample_continuations", "RowGumbelSampler"]


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


class RowGumbelSampler:
    """Temperature sampling with one random stream per row, inside ``generate()``'s greedy search.

    ``generate(do_sample=True)`` draws every row from torch's one global stream, so what a row
    samples depends on the rows batched with it (batch size, order, a resumed run's batches).
    Here each step adds ``G ~ Gumbel(0, 1)``, drawn from the row's own generator, to
    ``scores / temperature``; the greedy argmax of that is an exact draw from
    ``softmax(scores / temperature)`` (the Gumbel-max trick). A row's t-th token uses its t-th
    draw, so it depends only on its seed and its own prefix. A ``LogitsProcessor`` for
    ``generate(do_sample=False, logits_processor=[...])``; rows are ``generate``'s (prompt-major,
    ``num_return_sequences`` consecutive rows per prompt).
    """

    def __init__(self, seeds: list[int], temperature: float, device: torch.device | str | None = None):
        if temperature <= 0:
            raise ValueError(f"RowGumbelSampler samples at a temperature > 0, got {temperature}")
        self.temperature = float(temperature)
        self.generators = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if scores.shape[0] != len(self.generators):
            raise ValueError(f"{len(self.generators)} row seeds for a batch of {scores.shape[0]} rows")
        uniform = torch.stack(
            [torch.rand(scores.shape[-1], generator=g, device=scores.device) for g in self.generators]
        )
        # -log(-log u) for u in [0, 1): u = 0 gives -inf (never the argmax), never NaN
        return scores.float() / self.temperature - torch.log(-torch.log(uniform))


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
    row_seeds: list[int] | None = None,
) -> torch.Tensor:
    """Sample ``x_1..x_length ~ P(. | s)`` for left-padded prefixes ``[B, L]`` with ``generate()``.

    Pure temperature sampling: ``top_k=0``/``top_p=1`` switch off ``generate``'s default truncation
    (its default ``top_k=50`` would silently change the teacher distribution); ``temperature=0``:
    greedy decoding. Decoding stops at
    ``eos_token_id`` (kept); without one, exactly ``length`` tokens are sampled. Rows are
    ``num_return_sequences`` consecutive samples per prefix. Returns ``LongTensor[B * n, length]``
    with ``IGNORE_INDEX`` after an EOS.

    ``row_seeds`` (one per returned row): each row samples from its own generator
    (:class:`RowGumbelSampler`), so its tokens do not depend on the rows batched with it; else all
    rows share torch's global stream (``generator_seed`` reseeds it first).
    """
    if generator_seed is not None:
        torch.manual_seed(generator_seed)
    # temperature 0: the verifier's greedy continuations (one per prefix is all there is)
    if temperature > 0 and row_seeds is not None:
        # greedy search takes one row per sequence: the prompt-major copies made here, as
        # num_return_sequences would make them
        prefix = prefix.repeat_interleave(num_return_sequences, dim=0)
        prefix_mask = prefix_mask.repeat_interleave(num_return_sequences, dim=0)
        num_return_sequences = 1
        processor = RowGumbelSampler(row_seeds, temperature, prefix.device)
        sampling = dict(do_sample=False, logits_processor=LogitsProcessorList([processor]))
    elif temperature > 0:
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    else:
        sampling = {"do_sample": False}
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
