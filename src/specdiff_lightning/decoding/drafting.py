"""What a drafter gives the decoding loop: K candidate windows and the distributions behind them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn

from .sampling import compute_dtype, greedy_tokens, logits_to_probs
from .validation import check_tokenizers

__all__ = [
    "Proposal",
    "Drafter",
    "DrafterWrapper",
    "sample_from_marginals",
    "expand_support",
    "derived_generator",
    "model_device",
    "head_logits",
    "DraftVocabulary",
    "share_vocabulary",
]


@dataclass(frozen=True)
class Proposal:
    """K drafts of one window.

    Attributes:
        tokens: ``LongTensor[B, K, gamma]``.
        probs: ``FloatTensor[B, K, gamma, V]``: the distribution each token was drawn from.
        exact_q: True when ``probs`` are exactly those sampling distributions (in left-to-right
            order), which rules that read q (``standard``, ``recursive``) rely on for exactness.
        lengths: ``LongTensor[B, K]``, each draft's length (``1 <= lengths <= gamma``; the tokens
            after it are padding), or None when every draft fills the window. Drafts of different
            lengths (a cut where the drafter is unsure, a short copy from the context) are chosen
            with knowledge of the drafts, so they come with ``exact_q=False``.
        logits: ``FloatTensor[B, gamma, V]``, the per-position marginal logits the drafts came from
            (diffusion drafters), or None. Read by wrappers that shape the draft tree
            (:class:`~specdiff_lightning.decoding.adaptive.AdaptiveDrafter`).
        support: ``LongTensor[V']``, sorted, or None: a drafter that scores a draft vocabulary
            only (:class:`DraftVocabulary`) proposes nothing else, and its ``logits`` are then
            compact, ``[B, gamma, V']``, column i being token ``support[i]`` (its q is 0 at every
            other id). Readers reduce over those columns (the same maxima, softmax and top-k, at
            ``V' / V`` of the cost: SmolLM2's drafter scores 8,192 of 49,152 ids, and a full bf16
            row's argmax, softmax or column gather each cost ~1 ms a round on 2 cores), or take
            :meth:`full_logits`.
    """

    tokens: torch.Tensor
    probs: torch.Tensor
    exact_q: bool = True
    lengths: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    support: torch.Tensor | None = None

    def full_logits(self) -> torch.Tensor | None:
        """``FloatTensor[B, gamma, V]``: :attr:`logits` over the whole vocabulary (-inf off the
        support), or None."""
        if self.logits is None or self.support is None:
            return self.logits
        return expand_support(self.logits, self.support, self.probs.shape[-1])

    def truncate(self, gamma: int) -> Proposal:
        lengths = None if self.lengths is None else self.lengths.clamp(max=gamma)
        logits = None if self.logits is None else self.logits[..., :gamma, :]
        return Proposal(
            self.tokens[..., :gamma], self.probs[..., :gamma, :], self.exact_q, lengths, logits, self.support
        )

    def pad_to(self, gamma: int) -> Proposal:
        """The same drafts in a window of ``gamma`` (``>=`` the current one): the new positions are
        padding (token 0, q and logits 0), and :attr:`lengths` says where each draft ends."""
        batch, k, width = self.tokens.shape
        extra = gamma - width
        if extra <= 0:
            return self
        lengths = self.draft_lengths()
        tokens = torch.nn.functional.pad(self.tokens, (0, extra))
        probs = self.probs
        if k > 1 and probs.stride(1) == 0:  # one q shared by the K drafts: pad it once
            probs = torch.nn.functional.pad(probs[:, :1], (0, 0, 0, extra)).expand(batch, k, gamma, -1)
        else:
            probs = torch.nn.functional.pad(probs, (0, 0, 0, extra))
        logits = None if self.logits is None else torch.nn.functional.pad(self.logits, (0, 0, 0, extra))
        return Proposal(tokens, probs, self.exact_q, lengths, logits, self.support)

    def reshaped(self, tokens: torch.Tensor, lengths: torch.Tensor) -> Proposal:
        """Other drafts ``tokens[B, K', gamma]`` of ``lengths[B, K']`` in this window, chosen with
        knowledge of the drafts (cut, added): ``exact_q=False``, so only q-free acceptance reads them,
        and their q is nominal (the first draft's, a view: no copy)."""
        batch, k, gamma = tokens.shape
        probs = self.probs[:, :1].expand(batch, k, gamma, self.probs.shape[-1])
        return Proposal(tokens, probs, False, lengths, self.logits, self.support)

    def draft_lengths(self) -> torch.Tensor:
        """``LongTensor[B, K]``: every draft's length (the window where :attr:`lengths` is None)."""
        if self.lengths is not None:
            return self.lengths
        batch, k, gamma = self.tokens.shape
        return torch.full((batch, k), gamma, dtype=torch.long, device=self.tokens.device)

    def to(self, device: torch.device | str) -> Proposal:
        """The same proposal on ``device`` (one copy of the tokens and one of the distributions).

        ``probs`` shared by all K drafts (an expanded view, as :func:`sample_from_marginals` returns)
        is moved once, not K times, and stays a view."""
        device = torch.device(device)
        if self.tokens.device == device and self.probs.device == device:
            return self
        probs = self.probs
        if probs.dim() == 4 and probs.shape[1] > 1 and probs.stride(1) == 0:
            probs = probs[:, :1].to(device).expand(probs.shape)
        else:
            probs = probs.to(device)
        lengths = None if self.lengths is None else self.lengths.to(device)
        logits = None if self.logits is None else self.logits.to(device)
        support = None if self.support is None else self.support.to(device)
        return Proposal(self.tokens.to(device), probs, self.exact_q, lengths, logits, support)


def expand_support(logits: torch.Tensor, support: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``FloatTensor[..., vocab_size]``: compact ``logits[..., V']`` (column i: token
    ``support[i]``, sorted) in place at their ids, -inf elsewhere."""
    support = support.to(logits.device)
    n = support.numel()
    if n and int(support[-1]) == n - 1:  # ids [0, n): one block, padded
        return torch.nn.functional.pad(logits, (0, vocab_size - n), value=float("-inf"))
    out = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))
    return out.index_copy_(-1, support, logits)


def sample_from_marginals(
    logits: torch.Tensor,
    num_drafts: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    support: torch.Tensor | None = None,
    vocab_size: int | None = None,
) -> Proposal:
    """Sample K drafts i.i.d. from ``prod_j q_j`` (one drafter pass serves all K; METHOD.md §3.1).

    Args:
        logits: ``FloatTensor[B, gamma, V]`` per-position draft logits; with ``support``, compact
            ``[B, gamma, V']`` over its ids (:attr:`Proposal.support`).
        temperature: draft temperature T (``q = softmax(logits / T)``); 0 drafts the argmax.
        support, vocab_size: the sorted ids ``LongTensor[V']`` of compact logits, and the
            vocabulary V their q spans. At T = 0 the argmax over the compact columns is the
            full row's (its first maximum: the support is sorted); at T > 0 the drafts are drawn
            from the full rows, the same draws as without a support.
    Returns:
        a :class:`Proposal` with ``tokens[B, K, gamma]`` and ``probs`` an expanded view
        ``[B, K, gamma, V]``; its ``logits`` are the ones given (compact with ``support``).
    """
    compact = logits
    if support is not None:
        if vocab_size is None:
            raise ValueError(
                "sample_from_marginals: compact logits (a support) need the vocab_size their q spans"
            )
        support = support.to(logits.device)
        if temperature == 0:
            batch, gamma, _ = logits.shape
            mode = support[greedy_tokens(logits)]  # [B, gamma]
            q = torch.zeros(batch, gamma, vocab_size, dtype=compute_dtype(logits.dtype), device=logits.device)
            q.scatter_(-1, mode[..., None], 1.0)
            tokens = mode[:, None].expand(batch, num_drafts, gamma)
            probs = q[:, None].expand(batch, num_drafts, gamma, vocab_size)
            return Proposal(tokens, probs, logits=logits, support=support)
        logits = expand_support(logits, support, vocab_size)
    batch, gamma, vocab = logits.shape
    q = logits_to_probs(logits, temperature)
    if temperature == 0:  # q is one-hot: nothing to sample
        tokens = greedy_tokens(q)[:, None].expand(batch, num_drafts, gamma)
        return Proposal(
            tokens, q[:, None].expand(batch, num_drafts, gamma, vocab), logits=compact, support=support
        )
    # torch.multinomial's one-sample path draws V exponentials per row (5.6 ms for 8 rows at
    # V = 49,152 on a CPU); with two or more samples it inverts the CDF (~1 ms). Each draw is an exact
    # i.i.d. sample, so for K = 1 draw two and keep the first.
    draws = max(num_drafts, 2)
    tokens = torch.multinomial(q.reshape(-1, vocab), draws, replacement=True, generator=generator)[
        :, :num_drafts
    ]
    tokens = tokens.reshape(batch, gamma, num_drafts).transpose(1, 2)
    return Proposal(
        tokens, q[:, None].expand(batch, num_drafts, gamma, vocab), logits=compact, support=support
    )


def derived_generator(generator: torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """A generator for ``device`` when ``generator`` lives on another one.

    One ``torch.Generator`` cannot serve two devices (``multinomial`` refuses it), so a drafter on
    its own device draws from a generator of its own, seeded each round with one number drawn from
    the caller's ``generator``: runs stay reproducible from the caller's seed, the drafter's
    randomness is independent of the acceptance coins (a fresh seed per round, never the caller's
    seed itself: two CUDA generators seeded alike would produce the same stream), and it costs one
    small draw (one host read if the caller's generator is on a GPU) per round. None passes through
    (global RNG of each device); a generator already on ``device`` is used as it is.
    """
    if generator is None or torch.device(generator.device) == torch.device(device):
        return generator
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    return torch.Generator(device=device).manual_seed(seed)


def head_logits(
    head: nn.Linear, rows: torch.Tensor, vocab: int | DraftVocabulary | None = None
) -> torch.Tensor:
    """``head(rows)`` for ``rows[N, H]``; with ``vocab``, computed for a subset of the ids only
    (an int n: ids ``[0, n)``; a :class:`DraftVocabulary`: its ids) and -inf elsewhere, the logits'
    width unchanged. A drafter's head then reads a fraction of its weights, and drafts stay drafts
    (acceptance, not exactness, depends on it). ``rows`` is copied to a fresh 2-D tensor first: the
    bf16 CPU head on an offset view is ~18x slower (see DiffusionDrafter)."""
    rows = rows.reshape(-1, rows.shape[-1]).clone()
    size = head.weight.shape[0]
    if isinstance(vocab, int):
        vocab = None if vocab == size else DraftVocabulary.first(vocab, size)
    if vocab is None:
        return head(rows)
    return vocab.logits(head, rows)


def _check_size(size: int, vocab_size: int) -> None:
    """A clear error for a ``head_vocab`` outside ``[1, vocab_size]``."""
    if not 1 <= int(size) <= vocab_size:
        raise ValueError(f"head_vocab={size} must lie in [1, {vocab_size}] (the vocabulary)")


class DraftVocabulary:
    """The token ids a drafter's head scores when decoding (EAGLE-3's draft vocabulary): the others
    get -inf, so the drafter never proposes them and its head costs ``len(ids) / V`` of the full one.

    BPE ids follow merge order, so the first ids (:meth:`first`) are roughly the frequent tokens;
    ranking the tokens by how often the verifier actually writes them (:meth:`top`, from a
    drafter's training answers) covers far more of what it writes at the same size (SmolLM2's
    corpus: the first 8,192 ids cover 85% of held-out answer tokens, the 8,192 most frequent 99%).

    Args:
        ids: the token ids scored (any order, no repeats), each in ``[0, vocab_size)``.
        vocab_size: the head's width (the verifier's vocabulary).
    """

    def __init__(self, ids: torch.Tensor | list[int], vocab_size: int) -> None:
        ids = torch.as_tensor(ids, dtype=torch.long).flatten().sort().values
        if ids.numel() == 0 or int(ids[0]) < 0 or int(ids[-1]) >= vocab_size:
            raise ValueError(f"a draft vocabulary needs 1.. ids in [0, {vocab_size}), got {ids.numel()} ids")
        if bool((ids[1:] == ids[:-1]).any()):
            raise ValueError("a draft vocabulary's ids must not repeat")
        self.ids, self.vocab_size = ids, int(vocab_size)
        # ids [0, n): the head's first rows are one contiguous block, read in place
        self.contiguous = int(ids[-1]) == ids.numel() - 1
        self._weights: tuple | None = None  # (stamp of the head's weight, its rows at ids, bias)

    @classmethod
    def first(cls, size: int, vocab_size: int) -> DraftVocabulary:
        """Ids ``[0, size)``."""
        _check_size(size, vocab_size)
        return cls(torch.arange(int(size)), vocab_size)

    @classmethod
    def top(cls, ranking: list[int] | torch.Tensor, size: int, vocab_size: int) -> DraftVocabulary:
        """The ``size`` first ids of ``ranking`` (most frequent first); where the ranking is shorter
        (tokens never seen), the remaining ids in id order."""
        _check_size(size, vocab_size)
        ranked = [int(i) for i in ranking][: int(size)]
        if len(ranked) < size:
            taken = set(ranked)
            ranked += [i for i in range(vocab_size) if i not in taken][: int(size) - len(ranked)]
        return cls(ranked, vocab_size)

    def __len__(self) -> int:
        return self.ids.numel()

    def _rows(self, head: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
        weight = head.weight
        if self.contiguous:
            n = len(self)
            return weight[:n], None if head.bias is None else head.bias[:n]
        # the gathered rows are a copy, made once and remade when the head's weight changes
        stamp = (weight.data_ptr(), weight._version, weight.dtype, weight.device)
        if self._weights is None or self._weights[0] != stamp:
            # made outside inference mode: an eager decode's copy serves later compiled ones too
            with torch.inference_mode(False), torch.no_grad():
                ids = self.ids.to(weight.device)
                bias = None if head.bias is None else head.bias.detach()[ids]
                self._weights = (stamp, weight.detach()[ids].contiguous(), bias)
        return self._weights[1], self._weights[2]

    def logits(self, head: nn.Linear, rows: torch.Tensor) -> torch.Tensor:
        """``FloatTensor[N, V]``: ``head(rows)`` at the ids, -inf elsewhere (``rows[N, H]``)."""
        return expand_support(self.compact_logits(head, rows), self.ids, self.vocab_size)

    def compact_logits(self, head: nn.Linear, rows: torch.Tensor) -> torch.Tensor:
        """``FloatTensor[N, V']``: ``head(rows)`` at the ids only (column i: token ``ids[i]``)."""
        weight, bias = self._rows(head)
        return torch.nn.functional.linear(rows, weight, bias)


def model_device(model: nn.Module) -> torch.device:
    """Where a (possibly ``device_map``-sharded) HF model takes its inputs: its input embeddings' device."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is not None and getattr(embeddings, "weight", None) is not None:
        return embeddings.weight.device
    return next(model.parameters()).device


class Drafter(ABC):
    """Anything that proposes draft windows for a prefix."""

    #: size of the drafter's output distribution (rows of its output layer)
    vocab_size: int
    #: when set (:meth:`restrict_vocab`), proposals cover token ids ``[0, vocab_limit)`` only
    vocab_limit: int | None = None
    #: indices into the verifier's ``hidden_states`` (0: embeddings, i: after layer i) that this
    #: drafter conditions on; the decoding loop then hands it those features (:meth:`observe`)
    feature_layers: tuple[int, ...] | None = None

    @property
    def device(self) -> torch.device:
        """Where the drafter takes its inputs (its model's input-embedding device)."""
        return model_device(self.model)

    @property
    def proposal_vocab_size(self) -> int:
        """The last dimension of this drafter's ``Proposal.probs``."""
        return self.vocab_size if self.vocab_limit is None else self.vocab_limit

    def restrict_vocab(self, size: int | None) -> None:
        """Draft over token ids ``[0, size)`` only (``q`` is the softmax over those logits).

        For pairs whose embedding matrices differ only by padding rows (e.g. 151,936 vs 152,064 on
        the Qwen2.5 tokenizer): both sides are restricted to the shared ids; see
        :func:`~specdiff_lightning.decoding.sampling.restrict_vocab`. None: no restriction."""
        if size is not None and not 1 <= int(size) <= self.vocab_size:
            raise ValueError(
                f"restrict_vocab({size}) must lie in [1, {self.vocab_size}] (the drafter's vocabulary)"
            )
        self.vocab_limit = None if size is None else int(size)

    def _restrict_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits if self.vocab_limit is None else logits[..., : self.vocab_limit]

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

    def set_compiled(self, enabled: bool) -> None:  # noqa: B027 (an optional hook, not abstract)
        """Draft through compiled forwards or not: the loop's ``compile`` setting, given before every
        generation. A drafter without a compiled path ignores it (drafts eagerly)."""

    def observe(self, features: torch.Tensor) -> None:  # noqa: B027 (an optional hook, not abstract)
        """Take the verifier's features ``[n, F]`` (its ``feature_layers`` hidden states, concatenated)
        of the n tokens it committed since the last call, in order. Called by the decoding loop after
        the prefill and after every round, only when :attr:`feature_layers` is set."""


class DrafterWrapper(Drafter):
    """A drafter that reshapes another one's proposals (adds or cuts drafts); everything else
    (vocabulary, device, per-sequence state, the verifier's features) is the base drafter's."""

    def __init__(self, base: Drafter) -> None:
        self.base = base
        self.vocab_size = base.vocab_size

    @property
    def vocab_limit(self) -> int | None:
        return self.base.vocab_limit

    @property
    def device(self) -> torch.device:
        return self.base.device

    @property
    def feature_layers(self) -> tuple[int, ...] | None:
        return self.base.feature_layers

    def restrict_vocab(self, size: int | None) -> None:
        self.base.restrict_vocab(size)

    def reset(self) -> None:
        self.base.reset()

    def set_compiled(self, enabled: bool) -> None:
        self.base.set_compiled(enabled)

    def observe(self, features: torch.Tensor) -> None:
        self.base.observe(features)


def share_vocabulary(verifier: nn.Module, drafter: Drafter, tokenizer, drafter_tokenizer=None) -> int:
    """Accept a pair whose vocabularies differ only by padding rows; returns the shared size.

    The tokenizers must agree id for id (:func:`check_tokenizers`) and every tokenizer id must lie
    below both models' sizes; then the drafter proposes over the ``min`` of the two sizes
    (:meth:`Drafter.restrict_vocab`) and the verifier's logits are restricted to the same ids
    (:func:`~specdiff_lightning.decoding.sampling.restrict_vocab`). A real mismatch stays an error.
    """
    check_tokenizers(tokenizer, drafter_tokenizer if drafter_tokenizer is not None else tokenizer)
    verifier_vocab, drafter_vocab = int(verifier.config.vocab_size), int(drafter.vocab_size)
    if verifier_vocab == drafter_vocab:
        drafter.restrict_vocab(None)
        return verifier_vocab
    shared = min(verifier_vocab, drafter_vocab)
    if len(tokenizer) > shared:
        raise ValueError(
            f"vocabulary mismatch: the tokenizer has {len(tokenizer)} ids but the verifier embeds {verifier_vocab} "
            f"and the drafter {drafter_vocab}; only padding rows above the tokenizer's ids may differ"
        )
    drafter.restrict_vocab(shared)
    return shared
