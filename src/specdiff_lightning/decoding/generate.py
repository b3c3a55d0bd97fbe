"""The decoding loops: self-selection speculative decoding and its verifier-only baseline."""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch
from torch import nn

from .acceptance import AcceptanceRule, GreedyAcceptance, Verdict, get_acceptance_rule, greedy_tree_verdict
from .attention import check_custom_mask_support
from .autotree import AutoTreeDrafter, auto_tree
from .compiled import StaticTreeVerifier
from .datastore import TokenDatastore, load_datastore
from .drafting import Drafter, DrafterWrapper
from .sampling import compute_dtype, greedy_tokens, logits_to_probs, restrict_vocab, sample_tokens
from .stats import DecodingStats, GenerationOutput, RoundStats
from .timing import RoundProfiler
from .tree import build_tree, tree_probs
from .validation import check_context, check_prompt, check_sampling, check_verifier_dtypes, check_vocab
from .verifier import TreeVerifier, decoding_mode

__all__ = ["speculative_generate", "verifier_generate", "check_tree", "TREE_CHOICES"]


def _eos_set(verifier: nn.Module, eos_token_id: int | list[int] | None) -> set[int]:
    """The ids that end generation: ``eos_token_id`` if given, else the verifier's
    ``generation_config.eos_token_id`` (as ``generate()`` does); ``[]`` disables stopping."""
    if eos_token_id is None:
        config = getattr(verifier, "generation_config", None)
        eos_token_id = getattr(config, "eos_token_id", None)
    if eos_token_id is None:
        return set()
    return {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(t) for t in eos_token_id}


def _check_common(verifier, input_ids, max_new_tokens, temperature, top_k, top_p) -> None:
    check_custom_mask_support(verifier, "verifier")
    check_prompt(input_ids, int(verifier.config.vocab_size))
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    check_sampling(temperature, top_k, top_p)
    check_context(verifier, input_ids.shape[1], max_new_tokens)
    check_verifier_dtypes(verifier)


def _check_drafting(gamma, num_drafts, draft_temperature, rule: AcceptanceRule) -> None:
    if not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma (the draft window) must be an integer >= 1, got {gamma!r}")
    if not isinstance(num_drafts, int) or num_drafts < 1:
        raise ValueError(f"num_drafts must be an integer >= 1, got {num_drafts!r}")
    if draft_temperature < 0:
        raise ValueError(f"draft_temperature must be >= 0, got {draft_temperature}")
    if rule.max_drafts is not None and num_drafts > rule.max_drafts:
        raise ValueError(
            f"acceptance={rule.name!r} is exact only for a single draft sampled from q (no selection), but "
            f"num_drafts={num_drafts}. Use acceptance='greedy' (lossless under self-selection) or "
            f"'recursive' for K > 1, or set num_drafts=1."
        )


def _check_compile(compile) -> bool:
    if not isinstance(compile, bool):
        raise ValueError(
            f"compile must be True (a compiled forward over a static cache) or False (eager), got {compile!r}"
        )
    return compile


#: the values of ``speculative_generate(tree=...)``
TREE_CHOICES = ("auto", None)


def check_tree(tree, rule: AcceptanceRule) -> None:
    """``tree`` must be ``"auto"`` or None, and ``"auto"`` needs a rule that verifies shaped trees."""
    if tree not in TREE_CHOICES:
        raise ValueError(
            f"tree must be 'auto' (sized for this machine each round) or None (the drafts as drawn: "
            f"num_drafts x gamma), got {tree!r}; fixed shapes: wrap the drafter in AdaptiveDrafter / "
            f"LookupAugmentedDrafter"
        )
    if tree == "auto" and not rule.ragged:
        raise ValueError(
            f"tree='auto' chooses drafts knowing the drafter's marginals, which acceptance={rule.name!r} "
            f"cannot verify exactly (it needs the drafts as sampled from q). Use acceptance='greedy' "
            f"(lossless for any drafts) with tree='auto', or keep acceptance={rule.name!r} with tree=None"
        )


def check_datastore(datastore, tree, drafter: Drafter, vocab: int) -> TokenDatastore | None:
    """The datastore (loaded from a path once per process), or a clear error where it cannot join:
    only ``tree='auto'`` sizes its continuations in, and its ids must fit the vocabulary."""
    if datastore is None:
        return None
    if tree != "auto" or (isinstance(drafter, DrafterWrapper) and not isinstance(drafter, AutoTreeDrafter)):
        raise ValueError(
            "datastore continuations join the tree that tree='auto' sizes each round; with "
            f"tree={tree!r} or a drafter already shaped ({type(drafter).__name__}) they have no place. "
            "Use tree='auto' with the plain drafter, or drop datastore"
        )
    store = load_datastore(datastore)
    if isinstance(drafter, AutoTreeDrafter) and drafter.datastore is not store:
        raise ValueError(
            "this AutoTreeDrafter was built with another datastore (or none); build it with "
            "AutoTreeDrafter(..., datastore=...) or pass the plain drafter"
        )
    if store.vocab_limit > vocab:
        raise ValueError(
            f"datastore {store.source} holds token id {store.vocab_limit - 1}, outside the verifier's "
            f"vocabulary of {vocab}: it was written with another tokenizer. Build it from a corpus of "
            f"this verifier (generate-corpus), or drop datastore"
        )
    return store


def _shaped(
    drafter: Drafter,
    verifier: nn.Module,
    tree,
    datastore: TokenDatastore | None = None,
    compiled: bool = False,
) -> Drafter:
    """The drafter the loop drafts with: sized by :func:`auto_tree` for ``tree='auto'`` (from the
    cost of the forward the loop runs, eager or ``compiled``), unless the caller already shaped it
    (a :class:`DrafterWrapper`: adaptive cuts, lookups, an auto tree)."""
    if tree is None or isinstance(drafter, DrafterWrapper):
        return drafter
    return auto_tree(drafter, verifier, datastore, compiled=compiled)


#: tree nodes a compiled verifier's static cache makes room for beyond the prompt and the new
#: tokens (the largest tree ``tree='auto'`` measures; a larger tree grows the cache)
_TREE_ROOM = 65


def _verifier_state(
    verifier: nn.Module,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    feature_layers=None,
    compile: bool = False,
    tree_room: int = _TREE_ROOM,
) -> TreeVerifier:
    """The verifier's state for one decode: eager over a dynamic cache, or (``compile``) a compiled
    forward over a static cache sized for the prompt, the new tokens and a tree."""
    if not compile:
        return TreeVerifier(verifier, input_ids, feature_layers)
    capacity = input_ids.shape[1] + max_new_tokens + tree_room
    return StaticTreeVerifier(verifier, input_ids, feature_layers, capacity=capacity)


class _Output:
    """The tokens emitted so far, the stopping rules, and the streamer that watches them."""

    def __init__(self, input_ids, max_new_tokens, eos: set[int], streamer, max_time) -> None:
        self.input_ids = input_ids
        self.context = input_ids[0].tolist()
        self.new: list[int] = []
        self.max_new_tokens = max_new_tokens
        self.eos = eos
        self.streamer = streamer
        self.deadline = None if max_time is None else time.perf_counter() + max_time
        self.stopped = False
        if streamer is not None:
            streamer.put(input_ids.cpu())  # generate() streams the prompt first; TextStreamer skips it

    @property
    def room(self) -> int:
        return self.max_new_tokens - len(self.new)

    @property
    def done(self) -> bool:
        return (
            self.stopped
            or self.room <= 0
            or (self.deadline is not None and time.perf_counter() >= self.deadline)
        )

    def emit(self, tokens: list[int]) -> None:
        """Append a round's tokens, up to and including the first EOS."""
        for i, token in enumerate(tokens):
            if token in self.eos:
                tokens, self.stopped = tokens[: i + 1], True
                break
        self.new += tokens
        self.context += tokens
        if self.streamer is not None and tokens:
            self.streamer.put(torch.tensor(tokens))

    def finish(self, stats: DecodingStats) -> GenerationOutput:
        if self.streamer is not None:
            self.streamer.end()
        stats.new_tokens = len(self.new)
        # a plain tensor even when the loop ran under inference_mode (decoding_mode): the caller may
        # write into it or feed it to training
        with torch.inference_mode(False):
            tail = torch.tensor([self.new], dtype=self.input_ids.dtype, device=self.input_ids.device)
            return GenerationOutput(torch.cat([self.input_ids, tail], dim=1), stats)


def _draft(
    drafter, rule, out: _Output, window, gamma, num_drafts, draft_temperature, generator, vocab, device
):
    """The round's K drafts ``[K, window]``, their q ``[K, window, V]`` and their lengths ``[K]``
    (None: all ``window``); empty drafts when window = 0."""
    if window == 0:
        empty = torch.empty(1, 0, dtype=torch.long, device=device)
        return empty, torch.empty(1, 0, vocab, device=device), None
    prefix = torch.tensor([out.context], dtype=torch.long, device=device)
    proposal = drafter.propose(prefix, gamma, num_drafts, draft_temperature, generator).truncate(window)
    if rule.needs_exact_q and not proposal.exact_q:
        raise ValueError(
            f"acceptance={rule.name!r} needs drafts sampled from the q it is given, but this drafter's "
            f"proposal is not (e.g. multi-step denoising or added lookup drafts); use acceptance='greedy'"
        )
    tokens, q = proposal.tokens[0], proposal.probs[0]
    lengths = None if proposal.lengths is None else proposal.lengths[0]
    if lengths is not None and bool((lengths == lengths[0]).all()):
        size = int(lengths[0])  # drafts of one length (e.g. a drafter's block shorter than gamma)
        tokens, q, lengths = tokens[:, :size], q[:, :size], None
    if lengths is not None and not rule.ragged:
        raise ValueError(
            f"acceptance={rule.name!r} verifies drafts of one length, but this drafter proposes drafts "
            f"of different lengths (adaptive cuts or lookup drafts); use acceptance='greedy'"
        )
    return tokens, q, lengths


def _feed(drafter: Drafter, state: TreeVerifier) -> None:
    """Hand a feature-conditioned drafter the verifier's features of the tokens just committed."""
    if drafter.feature_layers is not None and state.new_features is not None:
        drafter.observe(state.new_features)


def _verify(rule, drafts, q, p, lengths, generator) -> Verdict:
    if drafts.shape[1] == 0:  # nothing drafted (the last token): plain sampling, no rule involved
        return Verdict(0, int(sample_tokens(p[0, :1], generator)))
    if lengths is not None:
        return rule.verify(drafts, q, p, generator, lengths=lengths)
    return rule.verify(drafts, q, p, generator)


def _accept(rule, tree, drafts, q, logits, lengths, temperature, top_k, top_p, generator) -> Verdict:
    """The round's verdict from the verifier's ``logits`` at the tree's nodes."""
    if temperature == 0 and type(rule) is GreedyAcceptance:
        # one-hot p: the argmax decides everything (greedy_tree_verdict), without V floats a node
        targets = greedy_tokens(logits.reshape(-1, logits.shape[-1]).to(compute_dtype(logits.dtype)))
        return greedy_tree_verdict(drafts, tree.paths, targets, lengths)
    p = tree_probs(logits_to_probs(logits, temperature, top_k, top_p), tree)
    return _verify(rule, drafts, q, p, lengths, generator)


def speculative_generate(
    verifier: nn.Module,
    drafter: Drafter,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    gamma: int,
    num_drafts: int = 1,
    draft_temperature: float = 1.0,
    acceptance: str | AcceptanceRule = "greedy",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    max_time: float | None = None,
    profiler: RoundProfiler | None = None,
    streamer=None,
    tree: str | None = "auto",
    datastore: TokenDatastore | str | list[str] | None = None,
    compile: bool = False,
) -> GenerationOutput:
    """Losslessly decode ``verifier`` with drafts from ``drafter`` (SpecDiff-2, METHOD.md §2–4).

    Each round: the drafter proposes ``num_drafts`` windows of ``gamma`` tokens; they are merged into
    a prefix trie and scored in **one** verifier forward (tree attention); the acceptance rule keeps
    a prefix of one draft plus one verifier token; the KV cache is compacted to that path.

    Args:
        verifier: a HF causal LM (SDPA or eager attention), in eval mode.
        drafter: a :class:`~specdiff_lightning.DiffusionDrafter` or
            :class:`~specdiff_lightning.AutoregressiveDrafter` on the same vocabulary.
        input_ids: ``LongTensor[1, L]``; batch size 1 for now.
        max_new_tokens: upper bound on generated tokens (never exceeded).
        gamma: draft window. num_drafts: K drafts for self-selection / recursive rejection.
        draft_temperature: T of the draft distribution ``softmax(logits / T)``.
        acceptance: ``"greedy"`` (self-selection + q-free greedy acceptance, any K), ``"standard"``
            (``min(1, p/q)``, K = 1 only), ``"recursive"`` (multi-draft rejection), or a rule instance.
        temperature, top_k, top_p: the verifier's sampling transforms; ``temperature=0`` is greedy
            decoding. The output is distributed exactly as the verifier's own sampling with these.
        eos_token_id: stop after emitting any of these; None: the verifier's
            ``generation_config.eos_token_id`` (as ``generate()``); ``[]``: never stop early.
        generator: a ``torch.Generator`` on the verifier's device, for reproducible runs.
        max_time: stop after the round during which this many seconds passed (time-budgeted decoding).
        profiler: a :class:`RoundProfiler` to split each round's time into phases.
        streamer: an object with ``put(token_ids)`` / ``end()`` (HF ``TextStreamer`` protocol): gets
            the prompt, then each round's emitted tokens as they are accepted.
        tree: ``"auto"`` (default): each round verifies the draft tree that maximises expected tokens
            per second on this machine (:mod:`~specdiff_lightning.decoding.autotree`: the drafter's
            calibrated confidences, its runner-ups, the K drafts, context copies, and the verifier's
            measured cost; plain decoding when nothing pays); ``greedy`` acceptance only. A drafter
            already wrapped (:class:`AdaptiveDrafter`, :class:`LookupAugmentedDrafter`) keeps its
            shape. None: the drafts as drawn (K windows of gamma), as ``standard`` / ``recursive`` need.
        datastore: with ``tree='auto'``, a :class:`~.datastore.TokenDatastore`, or the path of a
            corpus file or a list of them (e.g. the drafter's distillation corpora of the verifier's
            answers, indexed as one): the continuations of the context's longest suffix there join
            each round's candidates.
        compile: score every tree through the verifier's compiled forward over a static KV cache
            (:mod:`~specdiff_lightning.decoding.compiled`): no framework overhead per round, at
            the price of compiling a few graphs on first use (minutes on a CPU: with the weights
            frozen in, every process compiles again); ``tree='auto'`` then sizes trees from the
            compiled forward's measured cost. The output is the same: the compiled forward is the verifier.

    Returns:
        :class:`GenerationOutput` with ``sequences[1, L + new]`` and per-round ``stats``.
    """
    _check_common(verifier, input_ids, max_new_tokens, temperature, top_k, top_p)
    rule = get_acceptance_rule(acceptance)
    _check_drafting(gamma, num_drafts, draft_temperature, rule)
    check_tree(tree, rule)
    vocab = check_vocab(verifier, drafter.vocab_size, drafter.vocab_limit)
    compile = _check_compile(compile)
    with decoding_mode(compile):
        drafter = _shaped(drafter, verifier, tree, check_datastore(datastore, tree, drafter, vocab), compile)

        drafter.set_compiled(compile)
        drafter.reset()
        out = _Output(input_ids, max_new_tokens, _eos_set(verifier, eos_token_id), streamer, max_time)
        room = max(_TREE_ROOM, num_drafts * gamma + 1)
        state = _verifier_state(verifier, input_ids, max_new_tokens, drafter.feature_layers, compile, room)
        _feed(drafter, state)
        stats = DecodingStats(gamma=gamma, prefill_calls=state.forward_calls)
        device = input_ids.device
        prof = profiler or _NullProfiler()
        while not out.done:
            with prof.round():
                # Each round emits up to window + 1 tokens; never draft past max_new_tokens.
                window = min(gamma, out.room - 1)
                with prof.phase("draft"):
                    drafts, q, lengths = _draft(
                        drafter,
                        rule,
                        out,
                        window,
                        gamma,
                        num_drafts,
                        draft_temperature,
                        generator,
                        vocab,
                        device,
                    )
                    # an auto tree counts its drafter's forwards itself (its gate may skip them)
                    if not isinstance(drafter, AutoTreeDrafter):
                        stats.drafter_calls += window > 0
                with prof.phase("tree"):
                    tree = build_tree(state.pending, drafts, lengths)
                with prof.phase("verify"):
                    logits = restrict_vocab(state.score(tree), vocab)
                with prof.phase("accept"):
                    verdict = _accept(
                        rule, tree, drafts, q, logits, lengths, temperature, top_k, top_p, generator
                    )
                k, a = verdict.draft_index, verdict.num_accepted
                drafted = drafts.shape[1] if lengths is None else int(lengths[k])
                with prof.phase("cache"):
                    root = torch.zeros(1, dtype=torch.long, device=device)
                    state.commit(tree, torch.cat([root, tree.paths[k, :a]]), verdict.next_token)
                    _feed(drafter, state)
                draft = drafts[k, :drafted].tolist()
                emitted = draft[:a] + [verdict.next_token]
                stats.rounds.append(
                    RoundStats(
                        drafted, a, a == drafted and drafted > 0, tree.size, k, tuple(draft), tuple(emitted)
                    )
                )
                out.emit(emitted)
        if isinstance(drafter, AutoTreeDrafter):
            stats.drafter_calls = drafter.drafter_calls
        return out.finish(stats)


class _NullProfiler:
    @contextmanager
    def phase(self, name):
        yield

    @contextmanager
    def round(self):
        yield


def verifier_generate(
    verifier: nn.Module,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    max_time: float | None = None,
    streamer=None,
    compile: bool = False,
) -> GenerationOutput:
    """Plain autoregressive decoding through the same cache code (root-only trees): the
    speed-up denominator. Arguments as :func:`speculative_generate`."""
    _check_common(verifier, input_ids, max_new_tokens, temperature, top_k, top_p)
    compile = _check_compile(compile)
    with decoding_mode(compile):
        out = _Output(input_ids, max_new_tokens, _eos_set(verifier, eos_token_id), streamer, max_time)
        state = _verifier_state(verifier, input_ids, max_new_tokens, compile=compile, tree_room=1)
        stats = DecodingStats(gamma=0, prefill_calls=state.forward_calls)
        empty = torch.empty(1, 0, dtype=torch.long, device=input_ids.device)
        root = torch.zeros(1, dtype=torch.long, device=input_ids.device)
        while not out.done:
            tree = build_tree(state.pending, empty)
            probs = logits_to_probs(state.score(tree), temperature, top_k, top_p)
            token = int(sample_tokens(probs, generator))
            stats.rounds.append(RoundStats(0, 0, False, 1, 0, (), (token,)))
            state.commit(tree, root, token)
            out.emit([token])
        return out.finish(stats)
