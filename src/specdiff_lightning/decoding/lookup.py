"""Prompt-lookup drafts joining the diffusion drafts in one tree.

Greedy acceptance is exact for any way a draft is chosen (METHOD.md §4), so a draft copied from the
context (the tokens that followed the latest earlier occurrence of the last n-gram, as in prompt
lookup decoding) may join the K sampled drafts in the same verifier forward: self-selection then
picks whichever the verifier likes best. Code answers often restate the prompt's signature and
docstring, where such copies run long.
"""

from __future__ import annotations

import torch

from .drafting import Drafter, Proposal

__all__ = ["lookup_continuation", "LookupAugmentedDrafter"]


def lookup_continuation(context: list[int], gamma: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to ``gamma`` tokens that followed the most recent earlier occurrence of the context's last
    n-gram (longest n first, ``max_ngram`` down to ``min_ngram``); ``[]`` when nothing matches."""
    length = len(context)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        tail = context[length - n :]
        # Scan backwards: the most recent match is the likeliest to continue the same way.
        for start in range(length - n - 1, -1, -1):
            if context[start : start + n] == tail:
                follow = context[start + n : start + n + gamma]
                if follow:
                    return follow
    return []


class LookupAugmentedDrafter(Drafter):
    """``base``'s K drafts plus one prompt-lookup draft (when the context has a match).

    The lookup draft is completed to the window with the base's first draft where the copied run is
    shorter than gamma. Its tokens are not sampled from ``q``, so the proposal is marked
    ``exact_q=False``: only q-free (``greedy``) acceptance may verify it, which stays lossless.

    Args:
        base: the drafter whose drafts are augmented (e.g. a :class:`DiffusionDrafter`).
        max_ngram: the longest suffix n-gram searched for.
    """

    def __init__(self, base: Drafter, max_ngram: int = 3) -> None:
        self.base = base
        self.vocab_size = base.vocab_size
        self.max_ngram = max_ngram

    @property
    def vocab_limit(self) -> int | None:
        return self.base.vocab_limit

    @property
    def device(self) -> torch.device:
        return self.base.device

    @property
    def feature_layers(self) -> tuple[int, ...] | None:
        return self.base.feature_layers

    def reset(self) -> None:
        self.base.reset()

    def observe(self, features: torch.Tensor) -> None:
        self.base.observe(features)

    def propose(self, input_ids, gamma, num_drafts=1, temperature=1.0, generator=None) -> Proposal:
        proposal = self.base.propose(input_ids, gamma, num_drafts, temperature, generator)
        if input_ids.shape[0] != 1:
            return proposal
        copied = lookup_continuation(input_ids[0].tolist(), gamma, self.max_ngram)
        if not copied:
            return proposal
        tokens = proposal.tokens
        extra = tokens[:, :1].clone()
        extra[0, 0, : len(copied)] = torch.tensor(copied, dtype=tokens.dtype, device=tokens.device)
        batch, k, g, vocab = proposal.probs.shape
        # q of the extra row is nominal (greedy acceptance never reads it): a view, no copy.
        probs = proposal.probs[:, :1].expand(batch, k + 1, g, vocab)
        return Proposal(torch.cat([extra, tokens], dim=1), probs, exact_q=False)
