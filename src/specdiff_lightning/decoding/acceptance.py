"""Acceptance rules (METHOD.md §3–4) as pure tensor functions, plus the pluggable rule objects.

Notation: a draft ``x[g]``; ``p[g + 1, V]`` the verifier's (warped) distributions along it, ``p[j]``
conditioned on ``s ⊕ x_{<j}`` (``p[g]`` is the bonus distribution); ``q[g, V]`` the distributions the
draft tokens were sampled from. Every rule returns how many draft tokens it accepted and the one
token it emits after them (a correction on rejection, the bonus token when all ``g`` pass).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from .sampling import sample_tokens

__all__ = [
    "Verdict",
    "expected_accepted_length",
    "accept_greedy",
    "greedy_tree_verdict",
    "accept_standard",
    "accept_recursive",
    "AcceptanceRule",
    "GreedyAcceptance",
    "StandardAcceptance",
    "RecursiveAcceptance",
    "ACCEPTANCE_RULES",
    "get_acceptance_rule",
]


@dataclass(frozen=True)
class Verdict:
    """Outcome of one verification round.

    Attributes:
        num_accepted: draft tokens accepted, ``0 <= a <= g``.
        next_token: the token emitted after them.
        draft_index: the draft whose first ``a`` tokens were accepted.
    """

    num_accepted: int
    next_token: int
    draft_index: int = 0


def _normalise(weights: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    total = weights.sum()
    # A residual can only vanish when acceptance was certain; fall back rather than divide by 0.
    return weights / total if total > 0 else fallback


def _first_rejection(accept: torch.Tensor) -> int:
    """Index of the first False in a bool vector (its length when all are True)."""
    rejected = (~accept).nonzero()
    return int(rejected[0]) if rejected.numel() else accept.shape[0]


def expected_accepted_length(token_probs: torch.Tensor) -> torch.Tensor:
    """Eq. (8): ``tau_k = sum_j prod_{i<=j} p(x_i^(k) | s ⊕ x_<i^(k))``.

    Args:
        token_probs: ``FloatTensor[..., g]``, the verifier probability of each draft token.
    Returns:
        ``FloatTensor[...]``. Products are taken as exponentiated cumulative log-sums (stable for
        long windows); at temperature 0 this is the count of leading argmax matches.
    """
    return torch.exp(torch.cumsum(torch.log(token_probs), dim=-1)).sum(-1)


def accept_greedy(draft: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None = None) -> Verdict:
    """The paper's q-free greedy acceptance (Alg. 1).

    Accept ``x_j`` with probability ``p_j(x_j)``; on the first rejection emit a token from ``p_j`` with
    ``x_j`` removed and renormalised. Lossless for *any* way the draft was chosen, so it is the rule
    that may follow self-selection: ``P(x) = p(x)`` and ``P(y != x) = (1 - p(x)) p(y) / (1 - p(x))``.

    Args:
        draft: ``LongTensor[g]``; p: ``FloatTensor[g + 1, V]``.
    """
    gamma = draft.shape[0]
    px = p[torch.arange(gamma, device=p.device), draft]
    u = torch.rand(gamma, generator=generator, dtype=p.dtype, device=p.device)
    a = _first_rejection(u < px)
    if a == gamma:
        return Verdict(gamma, int(sample_tokens(p[gamma][None], generator)))
    residual = p[a].clone()
    residual[draft[a]] = 0
    residual = _normalise(residual, p[a])
    return Verdict(a, int(sample_tokens(residual[None], generator)))


def greedy_tree_verdict(
    drafts: torch.Tensor, paths: torch.Tensor, targets: torch.Tensor, lengths: torch.Tensor | None = None
) -> Verdict:
    """:class:`GreedyAcceptance`'s verdict at temperature 0, from the verifier's argmax alone.

    At temperature 0 every ``p`` row is one-hot at the verifier's argmax, so self-selection's
    ``tau_k`` (Eq. 8) is draft k's count of leading argmax matches, acceptance keeps exactly those
    tokens, and the token after them is the argmax at the last one kept (the bonus, or the
    correction, which is the argmax too since the rejected token was not). The same verdict as
    ``GreedyAcceptance().verify`` given the one-hot rows (tests), without building them: V floats
    per node, a second argmax and a multinomial draw a round.

    Args:
        drafts: ``LongTensor[K, g]``; paths: ``LongTensor[K, g]`` their trie nodes
            (:class:`~.tree.DraftTree`); targets: ``LongTensor[n]`` the verifier's argmax at each
            trie node (node 0: the root); lengths: ``LongTensor[K]`` draft lengths (None: all g).
    """
    num_drafts, gamma = drafts.shape
    if gamma == 0:
        return Verdict(0, int(targets[0]))
    parents = torch.cat(
        [torch.zeros(num_drafts, 1, dtype=paths.dtype, device=paths.device), paths[:, :-1]], 1
    )
    match = drafts == targets[parents]
    if lengths is not None:
        match &= torch.arange(gamma, device=drafts.device) < lengths.to(drafts.device)[:, None]
    accepted = match.long().cumprod(dim=1).sum(dim=1)  # leading matches
    k = int(accepted.argmax())  # the first of the longest, as self-selection's argmax
    a = int(accepted[k])
    last = 0 if a == 0 else int(paths[k, a - 1])
    return Verdict(a, int(targets[last]), k)


def accept_standard(
    draft: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None = None
) -> Verdict:
    """Speculative sampling (Leviathan et al.): accept with ``min(1, p/q)``, else sample
    ``norm(max(p - q, 0))``. Exact only when ``draft`` was sampled from ``q`` itself (one draft, no
    selection).

    Args:
        draft: ``LongTensor[g]``; q: ``FloatTensor[g, V]``; p: ``FloatTensor[g + 1, V]``.
    """
    gamma = draft.shape[0]
    idx = torch.arange(gamma, device=p.device)
    px, qx = p[idx, draft], q[idx, draft].to(p.dtype)
    u = torch.rand(gamma, generator=generator, dtype=p.dtype, device=p.device)
    # u * q < p  <=>  u < min(1, p/q), without dividing by a zero q.
    a = _first_rejection(u * qx < px)
    if a == gamma:
        return Verdict(gamma, int(sample_tokens(p[gamma][None], generator)))
    residual = _normalise(torch.clamp(p[a] - q[a].to(p.dtype), min=0), p[a])
    return Verdict(a, int(sample_tokens(residual[None], generator)))


def accept_recursive(
    drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None = None
) -> Verdict:
    """Multi-draft recursive rejection sampling (SpecInfer/SpecTr style), no selection.

    At depth j, try one by one the drafts still matching the accepted prefix: accept candidate token
    x with ``min(1, r(x)/q_j(x))``, else ``r <- norm(max(r - q_j, 0))``; when all fail emit from r.
    Exact because the j-th tokens of the matching drafts are i.i.d. from ``q_j`` given the prefix
    (duplicates are kept on purpose).

    The walk is written with tensor masks instead of Python branches, so it never waits for the
    device inside the K·g candidate loop: the coins are drawn up front, every step is a tensor op,
    and the host reads the verdict once at the end (constant syncs per round).

    Args:
        drafts: ``LongTensor[K, g]``; q: ``FloatTensor[K, g, V]``; p: ``FloatTensor[K, g + 1, V]``
            (rows of drafts sharing a prefix agree on it; a :class:`~specdiff_lightning.decoding.tree.TreeProbs`
            works too).
    """
    num_drafts, gamma = drafts.shape
    device, dtype = p.device, p.dtype
    drafts = drafts.to(device)
    coins = torch.rand(num_drafts, gamma, generator=generator, dtype=dtype, device=device)
    alive = torch.ones(num_drafts, dtype=torch.bool, device=device)  # drafts matching the accepted prefix
    running = torch.ones((), dtype=torch.bool, device=device)  # no rejection of a whole depth yet
    num_accepted = torch.full((), gamma, dtype=torch.long, device=device)
    chosen = torch.zeros((), dtype=torch.long, device=device)
    final = None  # the distribution the emitted token is drawn from
    for j in range(gamma):
        first = torch.argmax(alive.to(torch.uint8))  # first draft still matching (alive is never empty)
        r = p[first, j]
        accepted = torch.zeros((), dtype=torch.bool, device=device)
        token = torch.full((), -1, dtype=torch.long, device=device)
        for k in range(num_drafts):
            trying = running & alive[k] & ~accepted
            x = drafts[k, j]
            q_kj = q[k, j].to(dtype)
            hit = trying & (coins[k, j] * q_kj[x] < r[x])
            token = torch.where(hit, x, token)
            accepted = accepted | hit
            residual = torch.clamp(r - q_kj, min=0)
            total = residual.sum()
            residual = torch.where(total > 0, residual / torch.where(total > 0, total, 1), r)
            r = torch.where(trying & ~hit, residual, r)
        rejected = running & ~accepted  # every matching draft failed at depth j: emit from r
        final = r if final is None else torch.where(rejected, r, final)
        num_accepted = torch.where(rejected, j, num_accepted)
        chosen = torch.where(rejected, first, chosen)
        running = running & accepted
        alive = alive & (drafts[:, j] == token)
    # All g accepted: the bonus token after the first draft that survived.
    first = torch.argmax(alive.to(torch.uint8))
    bonus = p[first, gamma]
    final = bonus if final is None else torch.where(running, bonus, final)
    chosen = torch.where(running, first, chosen)
    token = sample_tokens(final[None], generator)[0]
    num_accepted, next_token, chosen = torch.stack([num_accepted, token, chosen]).tolist()  # the one sync
    return Verdict(num_accepted, next_token, chosen)


class AcceptanceRule(ABC):
    """How a round turns K scored drafts into accepted tokens: the engine's extension point.

    Subclass it, implement :meth:`verify`, and pass an instance as ``speculative_generate(...,
    acceptance=rule)``. Declare what exactness needs: ``max_drafts`` (None = any K) and whether the
    rule reads ``q`` as the exact distribution the drafts were sampled from (``needs_exact_q``), and
    whether it verifies drafts of different lengths (``ragged``: ``verify`` then takes ``lengths``).
    """

    name: str = "custom"
    max_drafts: int | None = None
    needs_exact_q: bool = False
    #: whether :meth:`verify` takes ``lengths=`` (drafts of different lengths in one round)
    ragged: bool = False

    @abstractmethod
    def verify(
        self,
        drafts: torch.Tensor,
        q: torch.Tensor,
        p: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> Verdict:
        """Args: drafts ``LongTensor[K, g]`` with ``g >= 1`` (rounds with nothing to draft never
        reach a rule), q ``FloatTensor[K, g, V]``, p ``FloatTensor[K, g + 1, V]``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _token_probs(p: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """``FloatTensor[K, g]``: p of each draft token in its own context (K·g scalars gathered from
    the trie rows when ``p`` is a :class:`~specdiff_lightning.decoding.tree.TreeProbs`)."""
    if hasattr(p, "token_probs"):
        return p.token_probs(drafts)
    return p[:, :-1].gather(-1, drafts[..., None]).squeeze(-1)


class GreedyAcceptance(AcceptanceRule):
    """Self-selection (pick ``argmax_k tau_k``, Eq. 8) followed by q-free greedy acceptance.

    Drafts may differ in length (``lengths``): tau_k sums over draft k's own tokens, and the chosen
    draft is verified as a draft of its own length (its bonus token comes after its last token)."""

    name = "greedy"
    ragged = True

    def select(self, drafts: torch.Tensor, p: torch.Tensor, lengths: torch.Tensor | None = None) -> int:
        """The draft with the largest expected accepted length (first on ties)."""
        if drafts.shape[0] == 1:
            return 0
        token_probs = _token_probs(p, drafts)
        if lengths is not None:
            positions = torch.arange(drafts.shape[1], device=token_probs.device)
            token_probs = torch.where(positions < lengths.to(token_probs.device)[:, None], token_probs, 0)
        return int(expected_accepted_length(token_probs).argmax())

    def verify(self, drafts, q, p, generator=None, lengths=None) -> Verdict:
        k = self.select(drafts, p, lengths)
        size = drafts.shape[1] if lengths is None else int(lengths[k])
        verdict = accept_greedy(drafts[k, :size], p[k][: size + 1], generator)
        return Verdict(verdict.num_accepted, verdict.next_token, k)


class StandardAcceptance(AcceptanceRule):
    """Single-draft speculative sampling, ``min(1, p/q)``."""

    name = "standard"
    max_drafts = 1
    needs_exact_q = True

    def verify(self, drafts, q, p, generator=None) -> Verdict:
        return accept_standard(drafts[0], q[0], p[0], generator)


class RecursiveAcceptance(AcceptanceRule):
    """Multi-draft recursive rejection over all K drafts (no selection)."""

    name = "recursive"
    needs_exact_q = True

    def verify(self, drafts, q, p, generator=None) -> Verdict:
        return accept_recursive(drafts, q, p, generator)


ACCEPTANCE_RULES: dict[str, type[AcceptanceRule]] = {
    "greedy": GreedyAcceptance,
    "standard": StandardAcceptance,
    "recursive": RecursiveAcceptance,
}


def get_acceptance_rule(acceptance: str | AcceptanceRule) -> AcceptanceRule:
    """Resolve a rule name (``"greedy"``, ``"standard"``, ``"recursive"``) or pass an instance through."""
    if isinstance(acceptance, AcceptanceRule):
        return acceptance
    if acceptance not in ACCEPTANCE_RULES:
        raise ValueError(
            f"unknown acceptance mode {acceptance!r}; choose one of {sorted(ACCEPTANCE_RULES)} "
            f"or pass an AcceptanceRule instance"
        )
    return ACCEPTANCE_RULES[acceptance]()
