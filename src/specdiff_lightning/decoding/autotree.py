"""Draft trees sized each round for this machine (``tree: auto``).

Every round the drafter's marginals and the context offer candidate nodes: the drafter's mode
chain, its runner-up tokens at every depth (hanging off the mode prefix), copies of what followed
earlier occurrences of the context's last n-gram, and, given a datastore, the continuations of the
context's longest suffix in a corpus of the verifier's answers (:mod:`.datastore`). Each candidate gets an estimated probability that
the verifier accepts the path to it: the product, along the path, of per-token acceptance
probabilities *calibrated against the acceptance this drafter actually gets* (an online table
keyed by the drafter's own probability, the depth, for copies the n-gram matched, for corpus
continuations their frequency there and the suffix length matched). The
verifier's cost of a tree of n nodes comes from the machine's :class:`~.costmodel.CostModel`, and
a drafting round's cost is measured as the loop runs. The round verifies the n most probable nodes
(a prefix-closed set: a child is never more probable than its parent) for the n that maximises

    expected tokens / seconds = (1 + sum of the n nodes' probabilities) / (c(n + 1) + drafting)

(Sequoia's hardware-aware sizing, EAGLE-2's confidence-ranked dynamic trees). n = 0 verifies the
pending token alone: plain decoding. When several rounds in a row find that nothing beats plain
decoding, the drafter itself is skipped for a few rounds (doubling while it keeps losing), so the loop
is never slower than plain decoding by more than its bookkeeping and an occasional probe. The context's
candidates cost a lookup and the drafter's a forward, so the cheap ones are gathered first, and a
:class:`DraftGate` learns from realised rates whether, at what they promise, the drafter pays.

Drafts chosen this way are chosen knowing the drafter's marginals, so only q-free (``greedy``)
acceptance may verify them; it stays lossless for any choice of drafts (METHOD.md §4).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from .costmodel import CostModel
from .datastore import TokenDatastore
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


def _ngram_bucket(ngram: int) -> int:
    return ngram if ngram <= 2 else 3 if ngram <= 4 else 5


class AcceptanceCalibration:
    """How often draft nodes were accepted, by what predicted them; learned online.

    A cell holds ``[accepted, reached]`` counts (reached: the verifier scored the node with its parent
    accepted). An estimate is ``(accepted + w * prior) / (reached + w)``, the prior being the drafter's
    own probability for drafter tokens, :data:`COPY_PRIOR` for copies, and a corpus continuation's
    frequency there (shrunk: ``count / (parent's count + 1)``, so one occurrence is not a certainty)."""

    def __init__(self) -> None:
        self.cells: dict[tuple, list[float]] = {}

    @staticmethod
    def drafter_cell(q: float, depth: int, runner_up: bool) -> tuple:
        return ("drafter", runner_up, _depth_bucket(depth), _q_bin(q))

    @staticmethod
    def copy_cell(ngram: int, depth: int) -> tuple:
        return ("copy", min(ngram, 3), _depth_bucket(depth))

    @staticmethod
    def store_cell(frequency: float, ngram: int, depth: int) -> tuple:
        return ("store", _ngram_bucket(ngram), _depth_bucket(depth), _q_bin(frequency))

    def estimate(self, cell: tuple, prior: float) -> float:
        accepted, reached = self.cells.get(cell, (0.0, 0.0))
        return (accepted + PRIOR_WEIGHT * prior) / (reached + PRIOR_WEIGHT)

    def drafter(self, q: float, depth: int, runner_up: bool) -> tuple[float, tuple]:
        cell = self.drafter_cell(q, depth, runner_up)
        return self.estimate(cell, q), cell

    def copy(self, ngram: int, depth: int) -> tuple[float, tuple]:
        cell = self.copy_cell(ngram, depth)
        return self.estimate(cell, COPY_PRIOR[min(ngram, 3)]), cell

    def store(self, frequency: float, ngram: int, depth: int) -> tuple[float, tuple]:
        cell = self.store_cell(frequency, ngram, depth)
        return self.estimate(cell, frequency), cell

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


class DraftGate:
    """Whether a round pays for the drafter, learnt from the rates rounds actually realise.

    Copies from the context and the datastore cost a lookup; the drafter costs a forward. Where the
    cheap candidates already promise much (a long copy, a frequent corpus continuation), the
    drafter's nodes may add less than its forward costs. Each round is put in a bucket by the
    expected tokens of the best tree of the cheap candidates alone, and the gate compares, per
    bucket, the tokens per millisecond realised by rounds that drafted and rounds that did not
    (from one round's start to the next's: lookups, drafting, the verifier's forward, acceptance).
    Each arm is tried ``tries`` times first; then the better one is taken, the other every
    ``explore``-th time, and old rounds fade (``decay``), as the acceptance table keeps learning."""

    #: bucket edges of the expected tokens a round of the cheap candidates alone would emit
    EDGES = (1.05, 1.5, 2.0, 3.0)

    def __init__(self, tries: int = 3, explore: int = 16, decay: float = 0.97) -> None:
        self.tries = tries
        self.explore = explore
        self.decay = decay
        #: (bucket, drafted) -> [tokens, ms] (faded) and the rounds recorded
        self.rates: dict[tuple[int, bool], list[float]] = {}
        self.rounds: dict[tuple[int, bool], int] = {}
        self.visits: dict[int, int] = {}
        self._pending: tuple[int, bool, int, float] | None = None

    def bucket(self, expected_tokens: float) -> int:
        return sum(expected_tokens >= e for e in self.EDGES)

    def rate(self, bucket: int, drafted: bool) -> float | None:
        tokens, ms = self.rates.get((bucket, drafted), (0.0, 0.0))
        return tokens / ms if ms > 0 else None

    def choose(self, bucket: int) -> bool:
        """True: draft this round."""
        for drafted in (True, False):
            if self.rounds.get((bucket, drafted), 0) < self.tries:
                return drafted
        self.visits[bucket] = self.visits.get(bucket, 0) + 1
        better = self.rate(bucket, True) >= self.rate(bucket, False)
        return better if self.visits[bucket] % self.explore else not better

    def start(self, bucket: int, drafted: bool, length: int, at: float) -> None:
        """A round of ``bucket`` began at ``at`` (seconds) with ``length`` tokens of context."""
        self._pending = (bucket, drafted, length, at)

    def settle(self, length: int, at: float) -> None:
        """The next round begins: the pending round emitted ``length`` minus its context's tokens."""
        if self._pending is not None:
            bucket, drafted, before, began = self._pending
            if length > before and at > began:
                cell = self.rates.setdefault((bucket, drafted), [0.0, 0.0])
                cell[0] = self.decay * cell[0] + (length - before)
                cell[1] = self.decay * cell[1] + (at - began) * 1e3
                self.rounds[(bucket, drafted)] = self.rounds.get((bucket, drafted), 0) + 1
        self._pending = None

    def clear(self) -> None:
        """A new sequence: the time since the last round is not a round's."""
        self._pending = None


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
        datastore: a :class:`~.datastore.TokenDatastore` (e.g. the distillation corpus's answers)
            whose continuations of the context's longest suffix join as candidates; None: none.
        store_nodes: the most frequent continuation nodes offered from the datastore.
        store_sample: occurrences of the matched suffix sampled for those continuations.
        store_depth: the longest continuation offered (at most the draft window).
        gate_drafter: let a :class:`DraftGate` skip the drafter on rounds where the context's and
            the datastore's candidates alone realise more tokens a second (False: always draft).
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
        datastore: TokenDatastore | None = None,
        store_nodes: int = 24,
        store_sample: int = 64,
        store_depth: int = 8,
        gate_drafter: bool = True,
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
        if store_nodes < 1 or store_sample < 1 or store_depth < 1:
            raise ValueError(
                f"store_nodes, store_sample and store_depth must be >= 1; got {store_nodes}, {store_sample}, "
                f"{store_depth}"
            )
        self.cost = cost
        self.branch_width = int(branch_width)
        self.num_lookups = int(num_lookups)
        self.max_ngram = int(max_ngram)
        self.datastore = datastore
        self.store_nodes = int(store_nodes)
        self.store_sample = int(store_sample)
        self.store_depth = int(store_depth)
        self.gated = bool(gate_drafter)
        self.gate = DraftGate()
        self.lookup_ms: float | None = None  # running estimate of the context's lookups
        self.max_nodes = int(max_nodes) if max_nodes is not None else int(cost.nodes[-1])
        self.patience = int(patience)
        self.max_skip = int(max_skip)
        self.calibration = calibration if calibration is not None else AcceptanceCalibration()
        self.drafting_ms: float | None = None  # running estimate of a drafting round
        self._typical_timed = False  # whether drafting_ms has timed a typical round yet
        self.reset()

    def reset(self) -> None:
        super().reset()
        self._last: tuple[int, _Trie] | None = None
        self.gate.clear()
        self._losing = 0
        self._skip = 0
        self._backoff = 1
        #: whether the drafter has run in this sequence: its first call reads the whole prompt (and
        #: what was committed before it), not a typical round's few tokens
        self._drafter_read = False
        #: this sequence's rounds verified with the drafter's and the context's drafts, with the
        #: context's alone (the gate skipped the drafter), with nothing worth verifying, and with
        #: the drafter skipped for losing (the last two: plain decoding)
        self.counts = {"drafted": 0, "undrafted": 0, "plain": 0, "skipped": 0}
        #: this sequence's forwards of the drafter itself (rounds the gate or the pacing skipped
        #: it run none; a round that drafted and then chose plain decoding ran one)
        self.drafter_calls = 0

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
    def _context_candidates(self, trie: _Trie, context: list[int], gamma: int) -> None:
        """Copies from the context and the datastore's continuations: no drafter needed."""
        cal = self.calibration
        if self.num_lookups:
            for ngram, run in lookup_matches(context, gamma, self.max_ngram, limit=self.num_lookups):
                parent, path = -1, 1.0
                for i, token in enumerate(run):
                    a, cell = cal.copy(ngram, i + 1)
                    path *= a
                    parent = trie.add(parent, token, path, cell)
        if self.datastore is not None:
            self._store_candidates(trie, context, gamma)

    def _drafter_candidates(self, trie: _Trie, proposal: Proposal) -> None:
        """The drafter's mode chain, its runner-ups at every depth and the K sampled drafts."""
        cal = self.calibration
        length = int(proposal.draft_lengths()[0, 0])
        if proposal.logits is not None:
            # compact logits where the drafter has a support (Proposal.support): the same log q at
            # its ids (q is 0 elsewhere), at a sixth of a full row's cost for SmolLM2's drafter
            support = proposal.support
            logq = torch.log_softmax(proposal.logits[0, :length].float(), dim=-1)
            top = logq.topk(self.branch_width + 1, dim=-1)
            ids = top.indices if support is None else support[top.indices]
            probs, tokens = top.values.exp().tolist(), ids.tolist()
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
            q = _log_q_at(logq, sampled.T, support).T.exp().tolist()  # [K, length]
            for row, row_q in zip(sampled.tolist(), q, strict=True):
                parent, path = -1, 1.0
                for j, (token, qj) in enumerate(zip(row, row_q, strict=True)):
                    a, cell = cal.drafter(qj, j + 1, token != tokens[j][0])
                    path *= a
                    parent = trie.add(parent, token, path, cell)

    def _store_candidates(self, trie: _Trie, context: list[int], gamma: int) -> None:
        """The datastore's most frequent continuations of the context's longest stored suffix."""
        match = self.datastore.lookup(context, min(gamma, self.store_depth), self.store_sample)
        if match is None:
            return
        counts = match.counts
        # a path is never more frequent than its prefix, and ties go to the shorter: prefix-closed
        paths = sorted(counts, key=lambda path: (-counts[path], len(path)))[: self.store_nodes]
        nodes: dict[tuple[int, ...], tuple[int, float]] = {}
        for path in sorted(paths, key=len):
            parent, above = (-1, 1.0) if len(path) == 1 else nodes[path[:-1]]
            frequency = counts[path] / (match.parent_count(path) + 1)
            a, cell = self.calibration.store(frequency, match.ngram, len(path))
            nodes[path] = (trie.add(parent, path[-1], above * a, cell), above * a)

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

    def _empty(self, input_ids: torch.Tensor, gamma: int = 0) -> Proposal:
        """No drafter's drafts in a window of ``gamma``: with 0, the round verifies the pending token
        alone (plain decoding); otherwise the drafts are the context's (the drafter sat it out)."""
        vocab = self.base.proposal_vocab_size
        tokens = torch.zeros(1, 1, gamma, dtype=torch.long, device=input_ids.device)
        q = torch.zeros(1, 1, 1, vocab, device=input_ids.device).expand(1, 1, gamma, vocab)
        return Proposal(tokens, q, exact_q=False)

    # ------------------------------------------------------------------ a round
    def propose(self, input_ids, gamma, num_drafts=1, temperature=1.0, generator=None) -> Proposal:
        if input_ids.shape[0] != 1:
            raise ValueError("tree: auto sizes one sequence's tree at a time (batch size 1)")
        context = input_ids[0].tolist()
        first = not any(self.counts.values())  # this sequence's first round
        start = now(input_ids.device)
        self._learn(context)
        self.gate.settle(len(context), start)
        if self._skip > 0:
            self._skip -= 1
            self.counts["skipped"] += 1
            return self._empty(input_ids)
        looked = now(input_ids.device)
        trie = _Trie()
        self._context_candidates(trie, context, gamma)
        lookup_ms = (now(input_ids.device) - looked) * 1e3
        self.lookup_ms = lookup_ms if self.lookup_ms is None else 0.7 * self.lookup_ms + 0.3 * lookup_ms
        ranked = self._ranked(trie)
        bucket = None
        if self.gated:
            # what the context's candidates alone promise decides, from the rates realised so far
            # at that promise, whether this round pays for the drafter too (with none, the other
            # arm is plain decoding)
            alone = choose_tree_size(
                [trie.nodes[i].prob for i in ranked],
                self.cost,
                len(context),
                self.lookup_ms,
                self.max_nodes - 1,
            )
            bucket = self.gate.bucket(alone.expected_tokens if alone.nodes else 1.0)
        drafts = bucket is None or self.gate.choose(bucket)
        # the drafter's first call in a sequence also fills its prefix cache with the prompt: not a
        # typical round, whichever round it comes in (the gate may skip the drafter in the first
        # rounds); counted, its one-off cost would price every later drafting round higher
        fresh = drafts and not self._drafter_read
        if drafts:
            begin = now(input_ids.device)
            proposal = self.base.propose(input_ids, gamma, num_drafts, temperature, generator)
            self.drafter_calls += 1
            self._drafter_read = True
            self._drafter_candidates(trie, proposal)
            elapsed = (now(input_ids.device) - begin) * 1e3
            typical = not (first or fresh)
            if self.drafting_ms is None or (typical and not self._typical_timed):
                # an untypical first estimate stands in until a typical round replaces it
                self.drafting_ms = elapsed
                self._typical_timed = typical
            elif typical:
                self.drafting_ms = 0.7 * self.drafting_ms + 0.3 * elapsed
            ranked = self._ranked(trie)
        else:
            proposal = self._empty(input_ids, gamma)
        choice = choose_tree_size(
            [trie.nodes[i].prob for i in ranked],
            self.cost,
            len(context),
            self.lookup_ms + (self.drafting_ms if drafts else 0.0),
            self.max_nodes - 1,
        )
        # the first round's time holds the prefill's catch-up; a fresh drafter's, the prompt's read
        if bucket is not None and not (first or fresh):
            self.gate.start(bucket, drafts, len(context), start)
        self._pace(choice)
        if choice.nodes == 0:
            self.counts["plain"] += 1
            return self._empty(input_ids)
        chosen = ranked[: choice.nodes]
        self._last = (len(context), _subtrie(trie, chosen))
        self.counts["drafted" if drafts else "undrafted"] += 1
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


def _log_q_at(logq: torch.Tensor, tokens: torch.Tensor, support: torch.Tensor | None) -> torch.Tensor:
    """``log q`` of ``tokens[g, K]`` from ``logq[g, V]``, or from ``logq[g, V']`` over the sorted
    ``support`` (-inf for a token outside it, where the drafter's q is 0)."""
    if support is None:
        return logq.gather(-1, tokens)
    at = torch.searchsorted(support, tokens.contiguous()).clamp(max=support.numel() - 1)
    return logq.gather(-1, at).masked_fill(support[at] != tokens, float("-inf"))


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


#: the auto-tree wrappers of each drafter, one per datastore, so their acceptance table (shared),
#: drafting-cost estimates and gates carry over from one generate call to the next (a weak key: they
#: go with the drafter)
_WRAPPERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def auto_tree(
    drafter: Drafter,
    verifier: torch.nn.Module,
    datastore: TokenDatastore | None = None,
    compiled: bool = False,
    **options,
) -> AutoTreeDrafter:
    """``drafter`` wrapped to size its trees for ``verifier`` on this machine: the cost model comes
    from :func:`~.calibration.cost_model_for` (measured once per machine, model, dtype and forward:
    eager, or ``compiled``), and the wrapper is reused across calls with the same drafter, cost
    model and ``datastore``, so it keeps learning (wrappers of one drafter share one acceptance
    table)."""
    from .calibration import cost_model_for

    if isinstance(drafter, AutoTreeDrafter):
        return drafter
    cost = cost_model_for(verifier, compiled=compiled)
    wrappers = _WRAPPERS.setdefault(drafter, {})
    key = (None if datastore is None else id(datastore), bool(compiled))
    cached = wrappers.get(key)
    if cached is not None and cached.cost is cost and cached.datastore is datastore and not options:
        return cached
    shared = next(iter(wrappers.values()), None)
    wrapper = AutoTreeDrafter(
        drafter,
        cost,
        datastore=datastore,
        calibration=shared.calibration if shared is not None else None,
        **options,
    )
    if not options:
        wrappers[key] = wrapper
    return wrapper
