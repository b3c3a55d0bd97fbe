"""Per-generation bookkeeping: what was drafted, accepted and emitted each round."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

__all__ = ["RoundStats", "DecodingStats", "GenerationOutput"]


@dataclass(frozen=True)
class RoundStats:
    """One verifier call. ``drafted`` is the window actually verified (``<= gamma`` near the end),
    ``accepted`` the draft tokens kept, ``bonus`` whether all were kept and a bonus token followed,
    ``draft_index`` which of the K drafts was verified, ``draft`` its tokens and ``emitted`` the
    tokens the round added (accepted draft tokens + the correction or bonus token)."""

    drafted: int
    accepted: int
    bonus: bool
    tree_size: int
    draft_index: int
    draft: tuple[int, ...] = ()
    emitted: tuple[int, ...] = ()


@dataclass(repr=False)
class DecodingStats:
    """Statistics of one :func:`speculative_generate` call.

    ``verifier_calls`` counts the per-round forwards (not the prompt prefill, see
    ``prefill_calls``); ``drafter_calls`` counts the drafter's forwards (under ``tree='auto'``,
    rounds whose gate skipped the drafter run none); ``mean_accepted`` excludes the token each
    round emits itself, while ``mean_tokens_per_call`` includes it (correction or bonus).

    Acceptance counts only what was emitted: when decoding stops at an EOS inside a round, the
    draft tokens accepted after it are thrown away and not counted (see :attr:`emitted_rounds`;
    ``rounds`` keeps the raw trace).
    """

    gamma: int
    rounds: list[RoundStats] = field(default_factory=list)
    prefill_calls: int = 0
    drafter_calls: int = 0
    new_tokens: int = 0

    @property
    def verifier_calls(self) -> int:
        return len(self.rounds)

    @property
    def emitted_rounds(self) -> list[RoundStats]:
        """The rounds as they count: the last one cut where the output ends.

        The output stops at an EOS, so ``new_tokens`` can be fewer than the rounds emitted in
        total; the surplus is the tail of the last round. A cut round keeps its first ``kept``
        emitted tokens, all of them accepted draft tokens (the EOS was a draft token), so it
        counts ``drafted = accepted = kept`` and no bonus.
        """
        surplus = sum(len(r.emitted) for r in self.rounds) - self.new_tokens
        if not self.rounds or surplus <= 0:
            return list(self.rounds)
        last = self.rounds[-1]
        kept = max(0, len(last.emitted) - surplus)
        accepted = min(last.accepted, kept)
        cut = replace(last, drafted=accepted, accepted=accepted, bonus=False, emitted=last.emitted[:kept])
        return [*self.rounds[:-1], cut]

    @property
    def accepted_tokens(self) -> int:
        """Accepted draft tokens that were emitted."""
        return sum(r.accepted for r in self.emitted_rounds)

    @property
    def mean_accepted(self) -> float:
        """Accepted draft tokens per verifier call (bonus excluded)."""
        return self.accepted_tokens / max(1, self.verifier_calls)

    @property
    def mean_tokens_per_call(self) -> float:
        """Emitted tokens per verifier call (accepted + the correction/bonus token)."""
        return self.new_tokens / max(1, self.verifier_calls)

    @property
    def position_reached(self) -> torch.Tensor:
        """``LongTensor[gamma]``: rounds in which draft position j was verified with 1..j-1 accepted."""
        counts = torch.zeros(self.gamma, dtype=torch.long)
        for r in self.emitted_rounds:
            counts[: min(r.drafted, r.accepted + 1)] += 1
        return counts

    @property
    def position_accepted(self) -> torch.Tensor:
        """``LongTensor[gamma]``: rounds in which draft position j was accepted."""
        counts = torch.zeros(self.gamma, dtype=torch.long)
        for r in self.emitted_rounds:
            counts[: r.accepted] += 1
        return counts

    @property
    def positional_acceptance(self) -> torch.Tensor:
        """``FloatTensor[gamma]``: ``gamma_j = P(j accepted | 1..j-1 accepted)`` (Fig. 2); NaN if never reached."""
        reached = self.position_reached.double()
        return self.position_accepted.double() / reached.where(reached > 0, torch.nan)

    def summary(self) -> dict:
        return {
            "new_tokens": self.new_tokens,
            "verifier_calls": self.verifier_calls,
            "drafter_calls": self.drafter_calls,
            "mean_accepted": self.mean_accepted,
            "mean_tokens_per_call": self.mean_tokens_per_call,
        }

    def __repr__(self) -> str:
        # The summary, not every round's RoundStats (``print(out.stats)`` printed hundreds of them);
        # ``rounds`` holds the trace.
        fields = ", ".join(
            f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in self.summary().items()
        )
        return f"DecodingStats(gamma={self.gamma}, {fields}, rounds=<{len(self.rounds)} rounds>)"


@dataclass
class GenerationOutput:
    """``sequences``: ``LongTensor[1, L + new]`` (prompt + new tokens); ``stats``: :class:`DecodingStats`."""

    sequences: torch.Tensor
    stats: DecodingStats
