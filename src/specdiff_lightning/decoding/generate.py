"""The decoding loops: self-selection speculative decoding and its verifier-only baseline."""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch
from torch import nn

from .acceptance import AcceptanceRule, Verdict, get_acceptance_rule
from .drafting import Drafter
from .sampling import logits_to_probs, sample_tokens
from .stats import DecodingStats, GenerationOutput, RoundStats
from .timing import RoundProfiler
from .tree import build_tree, path_probs
from .validation import check_context, check_prompt, check_sampling, check_vocab
from .verifier import TreeVerifier

__all__ = ["speculative_generate", "verifier_generate"]


def _eos_set(eos_token_id: int | list[int] | None) -> set[int]:
    if eos_token_id is None:
        return set()
    return {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(t) for t in eos_token_id}


def _check_common(verifier, input_ids, max_new_tokens, temperature, top_k, top_p) -> None:
    check_prompt(input_ids, int(verifier.config.vocab_size))
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    check_sampling(temperature, top_k, top_p)
    check_context(verifier, input_ids.shape[1], max_new_tokens)


def _finish(input_ids: torch.Tensor, new_tokens: list[int], stats: DecodingStats) -> GenerationOutput:
    stats.new_tokens = len(new_tokens)
    tail = torch.tensor([new_tokens], dtype=input_ids.dtype, device=input_ids.device)
    return GenerationOutput(torch.cat([input_ids, tail], dim=1), stats)


@torch.no_grad()
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
        eos_token_id: stop after emitting any of these.
        generator: a ``torch.Generator`` on the models' device, for reproducible runs.
        max_time: stop after the round during which this many seconds passed (time-budgeted decoding).
        profiler: a :class:`RoundProfiler` to split each round's time into phases.

    Returns:
        :class:`GenerationOutput` with ``sequences[1, L + new]`` and per-round ``stats``.
    """
    _check_common(verifier, input_ids, max_new_tokens, temperature, top_k, top_p)
    if not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma (the draft window) must be an integer >= 1, got {gamma!r}")
    if not isinstance(num_drafts, int) or num_drafts < 1:
        raise ValueError(f"num_drafts must be an integer >= 1, got {num_drafts!r}")
    if draft_temperature < 0:
        raise ValueError(f"draft_temperature must be >= 0, got {draft_temperature}")
    rule = get_acceptance_rule(acceptance)
    if rule.max_drafts is not None and num_drafts > rule.max_drafts:
        raise ValueError(
            f"acceptance={rule.name!r} is exact only for a single draft sampled from q (no selection), but "
            f"num_drafts={num_drafts}. Use acceptance='greedy' (lossless under self-selection) or "
            f"'recursive' for K > 1, or set num_drafts=1."
        )
    check_vocab(verifier, drafter.vocab_size)

    drafter.reset()
    eos = _eos_set(eos_token_id)
    state = TreeVerifier(verifier, input_ids)
    stats = DecodingStats(gamma=gamma, prefill_calls=state.forward_calls)
    context = input_ids[0].tolist()
    new_tokens: list[int] = []
    device = input_ids.device

    prof = profiler or _NullProfiler()
    deadline = None if max_time is None else time.perf_counter() + max_time
    while len(new_tokens) < max_new_tokens:
        with prof.round():
            # Each round emits up to window + 1 tokens; never draft past max_new_tokens.
            window = min(gamma, max_new_tokens - len(new_tokens) - 1)
            with prof.phase("draft"):
                if window > 0:
                    prefix = torch.tensor([context], dtype=torch.long, device=device)
                    proposal = drafter.propose(
                        prefix, gamma, num_drafts, draft_temperature, generator
                    ).truncate(window)
                    stats.drafter_calls += 1
                    if rule.needs_exact_q and not proposal.exact_q:
                        raise ValueError(
                            f"acceptance={rule.name!r} needs drafts sampled from the q it is given, but this "
                            f"drafter's proposal is not (e.g. multi-step denoising); use acceptance='greedy'"
                        )
                    drafts, q = proposal.tokens[0], proposal.probs[0]
                else:
                    drafts = torch.empty(1, 0, dtype=torch.long, device=device)
                    q = torch.empty(1, 0, state.model.config.vocab_size, device=device)
            with prof.phase("tree"):
                tree = build_tree(state.pending, drafts)
            with prof.phase("verify"):
                logits = state.score(tree)
            with prof.phase("accept"):
                p = path_probs(logits_to_probs(logits, temperature, top_k, top_p), tree)
                if window > 0:
                    verdict = rule.verify(drafts, q, p, generator)
                else:  # nothing drafted (the last token): plain sampling, no rule involved
                    verdict = Verdict(0, int(sample_tokens(p[0, :1], generator)))
            k, a = verdict.draft_index, verdict.num_accepted
            with prof.phase("cache"):
                root = torch.zeros(1, dtype=torch.long, device=device)
                state.commit(tree, torch.cat([root, tree.paths[k, :a]]), verdict.next_token)
            draft = drafts[k].tolist()
            emitted = draft[:a] + [verdict.next_token]
            stats.rounds.append(
                RoundStats(window, a, a == window and window > 0, tree.size, k, tuple(draft), tuple(emitted))
            )
            for token in emitted:
                new_tokens.append(token)
                context.append(token)
                if token in eos:
                    return _finish(input_ids, new_tokens, stats)
        if deadline is not None and time.perf_counter() >= deadline:
            break
    return _finish(input_ids, new_tokens, stats)


class _NullProfiler:
    @contextmanager
    def phase(self, name):
        yield

    @contextmanager
    def round(self):
        yield


@torch.no_grad()
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
) -> GenerationOutput:
    """Plain autoregressive decoding through the same cache code (root-only trees): the
    speed-up denominator. Arguments as :func:`speculative_generate`."""
    _check_common(verifier, input_ids, max_new_tokens, temperature, top_k, top_p)
    eos = _eos_set(eos_token_id)
    state = TreeVerifier(verifier, input_ids)
    stats = DecodingStats(gamma=0, prefill_calls=state.forward_calls)
    empty = torch.empty(1, 0, dtype=torch.long, device=input_ids.device)
    root = torch.zeros(1, dtype=torch.long, device=input_ids.device)
    new_tokens: list[int] = []
    deadline = None if max_time is None else time.perf_counter() + max_time
    while len(new_tokens) < max_new_tokens and (deadline is None or time.perf_counter() < deadline):
        tree = build_tree(state.pending, empty)
        probs = logits_to_probs(state.score(tree), temperature, top_k, top_p)
        token = int(sample_tokens(probs, generator))
        stats.rounds.append(RoundStats(0, 0, False, 1, 0, (), (token,)))
        state.commit(tree, root, token)
        new_tokens.append(token)
        if token in eos:
            break
    return _finish(input_ids, new_tokens, stats)
