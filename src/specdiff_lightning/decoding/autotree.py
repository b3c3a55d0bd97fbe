"""Draft trees sized each round for this machine (``tree: auto``).

Every round the drafter's marginals and the context offer candidate nodes: the drafter's mode
chain, its runner-up tokens at every depth (hanging off the mode prefix), and copies of what followed
earlier occurrences of the context's last n-gram. Each candidate gets an estimated probability that
the verifier accepts the path to it: the product, along the path, of per-token acceptance
probabilities *calibrated against the acceptance this drafter actually gets* (an online table
keyed by the drafter's own probability, the depth, and, for copies, the n-gram matched). The
verifier's cost of a tree of n nodes comes from the machine's :class:`~.costmodel.CostModel`, and
a drafting round's cost is measured as the loop runs. The round verifies the n most probable nodes
(a prefix-closed set: a child is never more probable than its parent) for the n that maximises

    expected tokens / seconds = (1 + sum of the n nodes' probabilities) / (c(n + 1) + drafting)

(Sequoia's hardware-aware sizing, EAGLE-2's confidence-ranked dynamic trees). n = 0 verifies the
pending token alone: plain decoding. When several rounds in a row find that nothing beats plain
decoding, the drafter itself is skipped for a few rounds (doubling while it keeps losing), so the loop
is never slower than plain decoding by more than its bookkeeping and an occasional probe.

Drafts chosen this way are chosen knowing the drafter's marginals, so only q-free (``greedy``)
acceptance may verify them; it stays lossless for any choice of drafts (METHOD.md §4).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from .costmodel import CostModel
from .drafting import Drafter, DrafterWrapper, Proposal
from .lookup import lookup_matches
from .timing import now

__all__ = ["AcceptanceCalibration", "AutoTreeDrafter", "TreeChoice", "auto_tree", "choose_tree_size"]

#: pseudo-count of the prior in each calibration cell: a few observations override it
PRIOR_WEIGHT = 2.0
#: prior per-token acceptance of a context copy, by the n-gram length it matched (1, 2, 3+). Set a
#: priori (a longer match is likelier to continue); the online table replaces them within rounds.
COPY_PRIOR = {1: 0.3, 2: 0.5, 3: 0.6}
#: bins of the drafter's own probability of a token
_Q_EDGES = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


def _depth_bucket(depth: int) -> int:
    return 1 if depth <= 1 else 2 if depth == 2 else 3 if depth <= 4 else 4


def _q_bin(q: float) -> int:
    return sum(q >= e for e in _Q_EDGES)


class AcceptanceCalibration:
    """How often draft nodes were accepted, by what predicted them; learned online.

    A cell holds ``[accepted, reached]`` counts (reached: the verifier scored the node with its parent
    accepted). An estimate is ``(accepted + w * prior) / (reached + w)``, the prior being the drafter's
    own probability for drafter tokens and :data:`COPY_PRIOR` for copies."""

    def __init__(self) -> None:
        self.cells: dict[tuple, list[float]] = {}

    @staticmethod
    def drafter_cell(q: float, depth: int, runner_up: bool) -> tuple:
        return ("drafter", runner_up, _depth_bucket(depth), _q_bin(q))

    @staticmethod
    def copy_cell(ngram: int, depth: int) -> tuple:
        return ("copy", min(ngram, 3), _depth_bucket(depth))

    def estimate(self, cell: tuple, prior: float) -> float:
        accepted, reached = self.cells.get(cell, (0.0, 0.0))
        return (accepted + PRIOR_WEIGHT * prior) / (reached + PRIOR_WEIGHT)

    def drafter(self, q: float, depth: int, runner_up: bool) -> tuple[float, tuple]:
        cell = self.drafter_cell(q, depth, runner_up)
        return self.estimate(cell, q), cell

    def copy(self, ngram: int, depth: int) -> tuple[float, tuple]:
        cell = self.copy_cell(ngram, depth)
        return self.estimate(cell, COPY_PRIOR[min(ngram, 3)]), cell

    def record(self, cell: tuple, accepted: bool) -> None:
        counts = self.cells.setdefault(cell, [0.0, 0.0])
        counts[0] += float(accepted)
        counts[1] += 1.0


@dataclass
class _Node:
    parent: int  # -1: the root (the pending token)
    token: int
    depth: int
    prob: float  # estimated probability that the verifier accepts the path to this node
    cells: list = field(default_factory=list)


class _Trie:
    def __init__(self) -> None:
        self.nodes: list[_Node] = []
        self.index: dict[tuple[int, int], int] = {}

    def add(self, parent: int, token: int, prob: float, cell: tuple) -> int:
        key = (parent, token)
        i = self.index.get(key)
        if i is None:
            depth = 1 if parent < 0 else self.nodes[parent].depth + 1
            i = len(self.nodes)
            self.nodes.append(_Node(parent, token, depth, prob, [cell]))
            self.index[key] = i
        else:  # two sources propose the same node: it is as likely as the likelier says
            node = self.nodes[i]
            node.prob = max(node.prob, prob)
            node.cells.append(cell)
        return i

    def children(self, parent: int) -> list[int]:
        return [i for (p, _), i in self.index.items() if p == parent]


@dataclass(frozen=True)
class TreeChoice:
    """The size a round verifies: ``nodes`` draft nodes, expecting ``expected_tokens`` per round at
    ``rate`` tokens/ms; ``gain``: that rate over plain decoding's (1 / a one-token step)."""

    nodes: int
    expected_tokens: float
    rate: float
    gain: float


def choose_tree_size(
    probs: list[float], cost: CostModel, context: int, drafting_ms: float, max_nodes: int | None = None
) -> TreeChoice:
    """The number of nodes to verify, given the candidates' acceptance probabilities in the order
    they would join (most probable first): the n >= 1 maximising ``(1 + sum probs[:n]) /
    (c(n+1) + d)``, or none (plain decoding: one token a ``c(1)``, with no drafting) where that
    rate is not above plain decoding's. ``gain``: the best drafted rate over plain decoding's (at
    most 1 when the round verifies the pending token alone; 0 with no candidates)."""
    limit = len(probs) if max_nodes is None else min(len(probs), max_nodes)
    step = cost.step_cost(context)
    best, total = None, 1.0
    for n in range(1, limit + 1):
        total += probs[n - 1]
        rate = total / (cost.verifier_cost(n + 1, context) + drafting_ms)
        if best is None or rate > best.rate:
            best = TreeChoice(n, total, rate, rate * step)
    # Drafting's time counts against drafted rounds only: a plain round does not draft. (Charging it
    # to plain decoding too let a slow drafting measurement pick trees slower than plain decoding.)
    if best is None or best.gain <= 1.0:  # a tie goes to plain decoding, as before
        return TreeChoice(0, 1.0, 1.0 / step, 0.0 if best is None else best.gain)
    return best


class AutoTreeDrafter(DrafterWrapper):
    """``base``'s drafts as a tree sized each round by ``cost`` and calibrated confidences.

    Args:
        base: a drafter; diffusion drafters (their proposals carry marginal logits) offer their mode
            chain, runner-up tokens at every depth and the K drafts sampled for self-selection
            (``num_drafts``); others offer their drafted chain.
        cost: the verifier's cost model on this machine (:func:`~.calibration.cost_model_for`).
        branch_width: runner-up tokens offered at each depth.
        num_lookups: context copies offered (distinct runs after the last n-gram's matches).
        max_ngram: the longest suffix n-gram searched for copies.
        max_nodes: the largest tree considered (default: the largest the cost model measured).
        patience: rounds in a row that find nothing beating plain decoding before the drafter is
            skipped; it is then skipped 1, 2, 4, ... up to ``max_skip`` rounds between probes.
        calibration: the acceptance table to learn into (share one across calls to keep learning).
    """

    def __init__(
        self,
        base: Drafter,
        cost: CostModel,
        branch_width: int = 3,
        num_lookups: int = 2,
        max_ngram: int = 3,
        max_nodes: int | None = None,
        patience: int = 2,
        max_skip: int = 32,
        calibration: AcceptanceCalibration | None = None,
    ) -> None:
        super().__init__(base)
        if branch_width < 0 or num_lookups < 0 or max_ngram < 1 or patience < 1 or max_skip < 1:
            raise ValueError(
                "branch_width and num_lookups must be >= 0, max_ngram, patience and max_skip >= 1; got "
                f"{branch_width}, {num_lookups}, {max_ngram}, {patience}, {max_skip}"
            )
        self.cost = cost
        self.branch_width = int(branch_width)
        self.num_lookups = int(num_lookups)
        self.max_ngram = int(max_ngram)
        self.max_nodes = int(max_nodes) if max_nodes is not None else int(cost.nodes[-1])
        self.patience = int(patience)
        self.max_skip = int(max_skip)
        self.calibration = calibration if calibration is not None else AcceptanceCalibration()
        self.drafting_ms: float | None = None  # running estimate of a drafting round
        self.reset()

    def reset(self) -> None:
        super().reset()
        self._last: tuple[int, _Trie] | None = None
        self._losing = 0
        self._skip = 0
        self._backoff = 1
        #: this sequence's rounds verified with drafts, with nothing worth verifying, and with the
        #: drafter skipped (the last two: plain decoding)
        self.counts = {"drafted": 0, "plain": 0, "skipped": 0}

    # ------------------------------------------------------------------ learning
    def _learn(self, context: list[int]) -> None:
        """Record which of last round's nodes the verifier accepted: walk the emitted tokens down the
        trie; at each accepted node every child was reached, the matching one accepted."""
        if self._last is None:
            return
        start, trie = self._last
        self._last = None
        node = -1
        for token in context[start:]:
            children = trie.children(node)
            nxt = None
            for child in children:
                hit = trie.nodes[child].token == token
                for cell in trie.nodes[child].cells:
                    self.calibration.record(cell, hit)
                if hit:
                    nxt = child
            if nxt is None:
                return
            node = nxt

    # ------------------------------------------------------------------ candidates
    def _candidates(self, proposal: Proposal, context: list[int], gamma: int) -> _Trie:
        trie = _Trie()
        cal = self.calibration
        length = int(proposal.draft_lengths()[0, 0])
        if proposal.logits is not None:
            logq = torch.log_softmax(proposal.logits[0, :length].float(), dim=-1)
            top = logq.topk(self.branch_width + 1, dim=-1)
            probs, tokens = top.values.exp().tolist(), top.indices.tolist()
        else:  # one drafted chain and the q it was drawn from
            drafted = proposal.tokens[0, 0, :length]
            q = proposal.probs[0, 0, :length].gather(-1, drafted[:, None])[:, 0]
            probs, tokens = [[v] for v in q.float().tolist()], [[t] for t in drafted.tolist()]
        parent, path = -1, 1.0
        chain = []
        for j in range(length):
            a, cell = cal.drafter(probs[j][0], j + 1, False)
            path *= a
            parent = trie.add(parent, tokens[j][0], path, cell)
            chain.append((parent, path))
        for j in range(length):
            above, p_above = (-1, 1.0) if j == 0 else chain[j - 1]
            for w in range(1, len(tokens[j])):
                a, cell = cal.drafter(probs[j][w], j + 1, True)
                trie.add(above, tokens[j][w], p_above * a, cell)
        if proposal.logits is not None and proposal.tokens.shape[1] > 1:
            # self-selection's K sampled drafts join as chains, each token rated by its marginal
            sampled = proposal.tokens[0, :, :length]
            q = logq.gather(-1, sampled.T).T.exp().tolist()  # [K, length]
            for row, row_q in zip(sampled.tolist(), q, strict=True):
                parent, path = -1, 1.0
                for j, (token, qj) in enumerate(zip(row, row_q, strict=True)):
                    a, cell = cal.drafter(qj, j + 1, token != tokens[j][0])
                    path *= a
                    parent = trie.add(parent, token, path, cell)
        if self.num_lookups:
            for ngram, run in lookup_matches(context, gamma, self.max_ngram, limit=self.num_lookups):
                parent, path = -1, 1.0
                for i, token in enumerate(run):
                    a, cell = cal.copy(ngram, i + 1)
                    path *= a
                    parent = trie.add(parent, token, path, cell)
        return trie

    @staticmethod
    def _ranked(trie: _Trie) -> list[int]:
        """Nodes most probable first, each after its parent (so every prefix is a tree)."""
        order = sorted(range(len(trie.nodes)), key=lambda i: (-trie.nodes[i].prob, trie.nodes[i].depth, i))
        chosen, seen = [], set()
        for i in order:
            parent = trie.nodes[i].parent
            if parent < 0 or parent in seen:
                chosen.append(i)
                seen.add(i)
        return chosen

    def _drafts(self, trie: _Trie, chosen: list[int], proposal: Proposal) -> Proposal:
        """The leaves of the chosen nodes as drafts ``[1, K', gamma]`` with their lengths."""
        parents = {trie.nodes[i].parent for i in chosen}
        leaves = [i for i in chosen if i not in parents]
        gamma = proposal.tokens.shape[-1]
        device = proposal.tokens.device
        rows, lengths = [], []
        for leaf in leaves:
            path, node = [], leaf
            while node >= 0:  # chosen is prefix-closed: every ancestor is chosen
                path.append(trie.nodes[node].token)
                node = trie.nodes[node].parent
            path.reverse()
            rows.append(path + [0] * (gamma - len(path)))
            lengths.append(len(path))
        tokens = torch.tensor([rows], dtype=proposal.tokens.dtype, device=device)
        return proposal.reshaped(tokens, torch.tensor([lengths], dtype=torch.long, device=device))

    def _plain(self, input_ids: torch.Tensor) -> Proposal:
        """No drafts: the round verifies the pending token alone (plain decoding)."""
        vocab = self.base.proposal_vocab_size
        device = input_ids.device
        empty = torch.zeros(1, 1, 0, dtype=torch.long, device=device)
        return Proposal(empty, torch.zeros(1, 1, 0, vocab, device=device), exact_q=False)

    # ------------------------------------------------------------------ a round
    def propose(self, input_ids, gamma, num_drafts=1, temperature=1.0, generator=None) -> Proposal:
        if input_ids.shape[0] != 1:
            raise ValueError("tree: auto sizes one sequence's tree at a time (batch size 1)")
        context = input_ids[0].tolist()
        first = not any(self.counts.values())  # this sequence's first round
        self._learn(context)
        if self._skip > 0:
            self._skip -= 1
            self.counts["skipped"] += 1
            return self._plain(input_ids)
        start = now(input_ids.device)
        proposal = self.base.propose(input_ids, gamma, num_drafts, temperature, generator)
        elapsed = (now(input_ids.device) - start) * 1e3
        # the first round of a sequence also fills the drafter's prefix cache: not a typical round
        if self.drafting_ms is None:
            self.drafting_ms = elapsed
        elif not first:
            self.drafting_ms = 0.7 * self.drafting_ms + 0.3 * elapsed
        trie = self._candidates(proposal, context, gamma)
        ranked = self._ranked(trie)
        choice = choose_tree_size(
            [trie.nodes[i].prob for i in ranked],
            self.cost,
            len(context),
            self.drafting_ms,
            self.max_nodes - 1,
        )
        self._pace(choice)
        if choice.nodes == 0:
            self.counts["plain"] += 1
            return self._plain(input_ids)
        chosen = ranked[: choice.nodes]
        self._last = (len(context), _subtrie(trie, chosen))
        self.counts["drafted"] += 1
        return self._drafts(trie, chosen, proposal)

    def _pace(self, choice: TreeChoice) -> None:
        """Skip the drafter for a while when drafting has not paid for ``patience`` rounds."""
        if choice.nodes > 0:  # chosen only where it beats plain decoding
            self._losing, self._backoff = 0, 1
            return
        self._losing += 1
        if self._losing >= self.patience:
            self._skip, self._losing = self._backoff, 0
            self._backoff = min(2 * self._backoff, self.max_skip)


def _subtrie(trie: _Trie, chosen: list[int]) -> _Trie:
    """The chosen nodes only (what the verifier scores), for learning from the verdict."""
    keep = sorted(chosen, key=lambda i: trie.nodes[i].depth)
    remap: dict[int, int] = {}
    out = _Trie()
    for i in keep:
        node = trie.nodes[i]
        parent = -1 if node.parent < 0 else remap[node.parent]
        j = len(out.nodes)
        out.nodes.append(_Node(parent, node.token, node.depth, node.prob, list(node.cells)))
        out.index[(parent, node.token)] = j
        remap[i] = j
    return out


#: the auto-tree wrapper of each drafter, so its acceptance table and drafting-cost estimate carry
#: over from one generate call to the next (a weak key: it goes with the drafter)
_WRAPPERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def auto_tree(drafter: Drafter, verifier: torch.nn.Module, **options) -> AutoTreeDrafter:
    """``drafter`` wrapped to size its trees for ``verifier`` on this machine: the cost model comes
    from :func:`~.calibration.cost_model_for` (measured once per machine, model and dtype), and the
    wrapper is reused across calls with the same drafter and cost model, so it keeps learning."""
    from .calibration import cost_model_for

    if isinstance(drafter, AutoTreeDrafter):
        return drafter
    cost = cost_model_for(verifier)
    cached = _WRAPPERS.get(drafter)
    if cached is not None and cached.cost is cost and not options:
        return cached
    wrapper = AutoTreeDrafter(
        drafter, cost, calibration=cached.calibration if cached is not None else None, **options
    )
    if not options:
        _WRAPPERS[drafter] = wrapper
    return wrapper
