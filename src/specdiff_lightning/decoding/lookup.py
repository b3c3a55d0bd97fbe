"""Prompt-lookup drafts joining the diffusion drafts in one tree.

Greedy acceptance is exact for any way a draft is chosen (METHOD.md §4), so drafts copied from the
context (the tokens that followed earlier occurrences of the last n-gram, as in prompt lookup
decoding) may join the K sampled drafts in the same verifier forward: self-selection then picks
whichever the verifier likes best. Code answers often restate the prompt's signature and docstring,
where such copies run long; a copy after a one-token match rarely does, so it can be kept short.
"""

from __future__ import annotations

import torch

from .drafting import DrafterWrapper, Proposal

__all__ = ["lookup_continuation", "lookup_continuations", "lookup_matches", "LookupAugmentedDrafter"]


def lookup_matches(
    context: list[int],
    gamma: int,
    max_ngram: int = 3,
    min_ngram: int = 1,
    limit: int = 1,
    ngram_lengths: dict[int, int] | None = None,
) -> list[tuple[int, list[int]]]:
    """Up to ``limit`` distinct runs that followed earlier occurrences of the context's last n-gram,
    each with the n it matched: longest n first (``max_ngram`` down to ``min_ngram``), the most
    recent occurrence first; a run after an n-gram match holds at most ``ngram_lengths.get(n, gamma)``
    tokens (and at most gamma)."""
    found: list[tuple[int, list[int]]] = []
    length = len(context)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        size = min(gamma, (ngram_lengths or {}).get(n, gamma))
        tail = context[length - n :]
        # Scan backwards: the most recent match is the likeliest to continue the same way.
        for start in range(length - n - 1, -1, -1):
            if context[start : start + n] == tail:
                follow = context[start + n : start + n + size]
                if follow and all(follow != run for _, run in found):
                    found.append((n, follow))
                    if len(found) == limit:
                        return found
    return found


def lookup_continuations(
    context: list[int],
    gamma: int,
    max_ngram: int = 3,
    min_ngram: int = 1,
    limit: int = 1,
    ngram_lengths: dict[int, int] | None = None,
) -> list[list[int]]:
    """The runs of :func:`lookup_matches`, without their match lengths."""
    return [run for _, run in lookup_matches(context, gamma, max_ngram, min_ngram, limit, ngram_lengths)]


def lookup_continuation(context: list[int], gamma: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to ``gamma`` tokens that followed the most recent earlier occurrence of the context's last
    n-gram (longest n first, ``max_ngram`` down to ``min_ngram``); ``[]`` when nothing matches."""
    runs = lookup_continuations(context, gamma, max_ngram, min_ngram)
    return runs[0] if runs else []


class LookupAugmentedDrafter(DrafterWrapper):
    """``base``'s K drafts plus up to ``num_lookups`` prompt-lookup drafts (when the context matches).

    A lookup draft is as long as its copied run (the proposal's ``lengths``); its tokens are not
    sampled from ``q``, so the proposal is marked ``exact_q=False``: only q-free (``greedy``)
    acceptance may verify it, which stays lossless.

    Args:
        base: the drafter whose drafts are augmented (e.g. a :class:`DiffusionDrafter`).
        max_ngram: the longest suffix n-gram searched for.
        num_lookups: how many distinct copied runs may join (each a tree branch the verifier scores).
        ngram_lengths: the longest run copied after an n-gram match of each n (default: the window);
            a tree node costs the verifier a little, and runs after short matches are rarely kept long.
    """

    def __init__(
        self,
        base,
        max_ngram: int = 3,
        num_lookups: int = 1,
        ngram_lengths: dict[int, int] | None = None,
    ) -> None:
        super().__init__(base)
        if num_lookups < 1 or max_ngram < 1:
            raise ValueError(f"num_lookups and max_ngram must be >= 1, got {num_lookups} and {max_ngram}")
        self.max_ngram = max_ngram
        self.num_lookups = num_lookups
        self.ngram_lengths = {int(n): int(size) for n, size in (ngram_lengths or {}).items()}

    def propose(self, input_ids, gamma, num_drafts=1, temperature=1.0, generator=None) -> Proposal:
        proposal = self.base.propose(input_ids, gamma, num_drafts, temperature, generator)
        if input_ids.shape[0] != 1:
            return proposal
        runs = lookup_continuations(
            input_ids[0].tolist(),
            gamma,
            self.max_ngram,
            limit=self.num_lookups,
            ngram_lengths=self.ngram_lengths,
        )
        if not runs:
            return proposal
        tokens = proposal.tokens
        extra = torch.zeros(1, len(runs), tokens.shape[-1], dtype=tokens.dtype, device=tokens.device)
        for i, run in enumerate(runs):
            extra[0, i, : len(run)] = torch.tensor(run, dtype=tokens.dtype, device=tokens.device)
        lengths = torch.cat(
            [proposal.draft_lengths(), torch.tensor([[len(run) for run in runs]], device=tokens.device)],
            dim=1,
        )
        return proposal.reshaped(torch.cat([tokens, extra], dim=1), lengths)
