"""What a drafter gives the decoding loop: K candidate windows and the distributions behind them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from .sampling import logits_to_probs

__all__ = ["Proposal", "Drafter", "sample_from_marginals"]


@dataclass(frozen=True)
class Proposal:
    """K drafts of one window.

    Attributes:
        tokens: ``LongTensor[B, K, gamma]``.
        probs: ``FloatTensor[B, K, gamma, V]``: the distribution each token was drawn from.
        exact_q: True when ``probs`` are exactly those sampling distributions (in left-to-right
            order), which rules that read q (``standard``, ``recursive``) rely on for exactness.
    """

    tokens: torch.Tensor
    probs: torch.Tensor
    exact_q: bool = True

    def truncate(self, gamma: int) -> Proposal:
        return Proposal(self.tokens[..., :gamma], self.probs[..., :gamma, :], self.exact_q)


def sample_from_marginals(
    logits: torch.Tensor,
    num_drafts: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> Proposal:
    """Sample K drafts i.i.d. from ``prod_j q_j`` (one drafter pass serves all K; METHOD.md §3.1).

    Args:
        logits: ``FloatTensor[B, gamma, V]`` per-position draft logits.
        temperature: draft temperature T (``q = softmax(logits / T)``); 0 drafts the argmax.
    Returns:
        a :class:`Proposal` with ``tokens[B, K, gamma]`` and ``probs`` an expanded view ``[B, K, gamma, V]``.
    """
    batch, gamma, vocab = logits.shape
    q = logits_to_probs(logits, temperature)
    tokens = torch.multinomial(q.reshape(-1, vocab), num_drafts, replacement=True, generator=generator)
    tokens = tokens.reshape(batch, gamma, num_drafts).transpose(1, 2)
    return Proposal(tokens, q[:, None].expand(batch, num_drafts, gamma, vocab))


class Drafter(ABC):
    """Anything that proposes draft windows for a prefix."""

    #: size of the drafter's output distribution (must equal the verifier's)
    vocab_size: int

    @abstractmethod
    def propose(
        self,
        input_ids: torch.Tensor,
        gamma: int,
        num_drafts: int = 1,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> Proposal:
        """Draft ``num_drafts`` windows of ``gamma`` tokens after ``input_ids[B, L]``."""

    def reset(self) -> None:  # noqa: B027 (an optional hook, not abstract)
        """Forget per-sequence state (called at the start of every generation)."""
