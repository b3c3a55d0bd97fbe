"""Sampling exactness: the output distribution equals the verifier's, for every acceptance mode.

Each test samples the first three generated tokens many times with a fixed seed and compares the
counts with the verifier's exact sequence probabilities (Pearson chi-square). The same counts must
*reject* a reference shifted by 2% total variation, so each test shows it could catch such a bias;
each sample is sized (``samples_to_detect``) so that it does with probability 0.9999.

``tree='auto'`` sizes its trees here from a fixed cost model (nearly free nodes, as tiny models
measure), not from this run's measurement: a test's draws then depend on its seed alone, and a
failure reproduces on any machine.
"""

from collections import Counter

import pytest
import torch

from helpers import tree_for
from specdiff_lightning import DiffusionDrafter, speculative_generate, verifier_generate
from specdiff_lightning.decoding import (
    AcceptanceRule,
    DrafterWrapper,
    GreedyAcceptance,
    Verdict,
    accept_standard,
)
from specdiff_lightning.decoding.autotree import AutoTreeDrafter
from specdiff_lightning.decoding.costmodel import CostModel
from specdiff_lightning.models import tiny_model
from specdiff_lightning.testing import (
    chi_square_test,
    exact_sequence_probs,
    perturb,
    sample_counts,
    samples_to_detect,
)

pytestmark = pytest.mark.slow

VOCAB = 5
LENGTH = 3
SAMPLES = 6000
ALPHA = 1e-3
PROMPT = torch.tensor([[1, 2, 0]])
#: tree: auto's cost model in these tests: a node costs 1% of a step, as on tiny models
_ROW = [10.0 + 0.1 * (n - 1) for n in (1, 2, 4, 8, 16)]
PINNED_COST = CostModel([1, 2, 4, 8, 16], [4, 64], [_ROW, _ROW], {})


@pytest.fixture(scope="module")
def verifier():
    return tiny_model("qwen2", vocab_size=VOCAB, seed=0, dtype=torch.float64, hidden_size=16, num_layers=1)


@pytest.fixture(scope="module")
def drafter():
    model = tiny_model("llama", vocab_size=VOCAB, seed=100, dtype=torch.float64, hidden_size=16, num_layers=1)
    return DiffusionDrafter(model, mask_token_id=VOCAB - 1, shift_logits=True)


def _samples(probs) -> int:
    """At least SAMPLES draws, and as many as a 2% bias of ``probs`` needs to be caught."""
    return max(SAMPLES, samples_to_detect(probs, 0.02, ALPHA))


def _speculative_counts(verifier, drafter, num_samples=SAMPLES, seed=0, **kwargs):
    generator = torch.Generator().manual_seed(seed)
    # auto-sized trees where the rule verifies them (greedy), the drafts as drawn otherwise
    kwargs.setdefault("tree", tree_for(kwargs.get("acceptance", "greedy")))
    if kwargs["tree"] == "auto" and not isinstance(drafter, DrafterWrapper):
        drafter = AutoTreeDrafter(drafter, PINNED_COST)  # what the loop's own auto_tree would build

    def draw():
        out = speculative_generate(
            verifier, drafter, PROMPT, max_new_tokens=LENGTH, gamma=LENGTH, generator=generator, **kwargs
        )
        return tuple(out.sequences[0, PROMPT.shape[1] :].tolist())

    return sample_counts(draw, num_samples)


def _assert_exact(counts, probs):
    assert sum(counts.values()) >= samples_to_detect(probs, 0.02, ALPHA), "size the sample: _samples"
    fit = chi_square_test(counts, probs)
    assert fit.pvalue > ALPHA, f"output distribution differs from the verifier's: {fit}"
    biased = chi_square_test(counts, perturb(probs, 0.02))
    assert biased.pvalue < ALPHA, f"too few samples to detect a 2% bias: {biased}"


@pytest.mark.parametrize(
    "acceptance,num_drafts,draft_temperature",
    [("greedy", 4, 1.5), ("greedy", 1, 0.7), ("recursive", 4, 0.7), ("standard", 1, 1.3)],
)
def test_speculative_sampling_is_exact(verifier, drafter, acceptance, num_drafts, draft_temperature):
    probs = exact_sequence_probs(verifier, PROMPT, LENGTH)
    counts = _speculative_counts(
        verifier, drafter, acceptance=acceptance, num_drafts=num_drafts, draft_temperature=draft_temperature
    )
    _assert_exact(counts, probs)


@pytest.mark.parametrize("acceptance,num_drafts", [("standard", 1), ("recursive", 3)])
def test_speculative_sampling_with_a_dflash_drafter_is_exact(verifier, acceptance, num_drafts):
    """A drafter fed the verifier's hidden states between rounds (DFlash, transformers' stock class)
    draws its drafts from q too."""
    from specdiff_lightning import DFlashDrafter

    drafter = DFlashDrafter.build(verifier, 1, (0,), VOCAB - 1, LENGTH + 1, dtype=torch.float64)
    probs = exact_sequence_probs(verifier, PROMPT, LENGTH)
    counts = _speculative_counts(
        verifier, drafter, acceptance=acceptance, num_drafts=num_drafts, draft_temperature=0.8
    )
    _assert_exact(counts, probs)


def test_greedy_acceptance_of_adaptive_and_lookup_drafts_is_exact(verifier, drafter):
    """Drafts cut by the drafter's confidence, its runner-up branches (two a position), the mode in
    place of a sample and copies from the context, all of different lengths in one tree: the output
    is still distributed as the verifier's."""
    from specdiff_lightning.decoding import AdaptiveDrafter, LookupAugmentedDrafter

    shaped = LookupAugmentedDrafter(
        AdaptiveDrafter(drafter, min_confidence=0.2, siblings=(0, 1), branch_width=2, mode_first=True),
        num_lookups=2,
    )
    probs = exact_sequence_probs(verifier, PROMPT, LENGTH)
    counts = _speculative_counts(verifier, shaped, acceptance="greedy", num_drafts=2, draft_temperature=0.9)
    _assert_exact(counts, probs)


def test_greedy_acceptance_of_auto_trees_with_corpus_copies_is_exact(verifier, drafter):
    """tree: auto with a datastore whose continuations match the context often (every short
    sequence over the 5 ids), a gated drafter and nearly free nodes: still the verifier's law."""
    import itertools

    from specdiff_lightning.decoding import TokenDatastore

    store = TokenDatastore(
        [list(s) for s in itertools.product(range(VOCAB), repeat=3)] * 2 + [[1, 2, 0, 3, 3, 1]]
    )
    row = [10.0 + 0.01 * (n - 1) for n in (1, 2, 4, 8, 16)]
    auto = AutoTreeDrafter(drafter, CostModel([1, 2, 4, 8, 16], [4, 64], [row, row], {}), datastore=store)
    probs = exact_sequence_probs(verifier, PROMPT, LENGTH)
    counts = _speculative_counts(verifier, auto, acceptance="greedy", num_drafts=2, draft_temperature=0.9)
    _assert_exact(counts, probs)
    assert sum(c[1] for cell, c in auto.calibration.cells.items() if cell[0] == "store") > 100  # they joined


def test_exact_under_temperature_and_top_p(verifier, drafter):
    """p is the verifier's distribution after its warpers, and that is what stays exact."""
    warp = dict(temperature=0.8, top_p=0.9)
    probs = exact_sequence_probs(verifier, PROMPT, LENGTH, **warp)
    counts = _speculative_counts(
        verifier,
        drafter,
        num_samples=_samples(probs),
        acceptance="greedy",
        num_drafts=4,
        draft_temperature=2.0,
        **warp,
    )
    _assert_exact(counts, probs)


def test_verifier_only_sampling_is_exact(verifier):
    probs = exact_sequence_probs(verifier, PROMPT, LENGTH, top_k=3)
    generator = torch.Generator().manual_seed(1)

    def draw():
        out = verifier_generate(verifier, PROMPT, max_new_tokens=LENGTH, top_k=3, generator=generator)
        return tuple(out.sequences[0, PROMPT.shape[1] :].tolist())

    _assert_exact(sample_counts(draw, _samples(probs)), probs)


class SelectThenStandard(AcceptanceRule):
    """The combination the engine refuses: self-selection followed by min(1, p/q) acceptance."""

    name = "select-then-standard"
    needs_exact_q = True

    def verify(self, drafts, q, p, generator=None):
        k = GreedyAcceptance().select(drafts, p)
        verdict = accept_standard(drafts[k], q[k], p[k], generator)
        return Verdict(verdict.num_accepted, verdict.next_token, k)


def test_detects_standard_acceptance_after_selection(verifier, drafter):
    """The test has teeth: the biased combination fails it."""
    probs = exact_sequence_probs(verifier, PROMPT, LENGTH)
    counts = _speculative_counts(
        verifier,
        drafter,
        num_samples=SAMPLES // 2,
        acceptance=SelectThenStandard(),
        num_drafts=8,
        draft_temperature=2.0,
    )
    fit = chi_square_test(counts, probs)
    assert fit.pvalue < 1e-6, fit


def test_engine_refuses_standard_with_several_drafts(verifier, drafter):
    with pytest.raises(ValueError, match="single draft"):
        speculative_generate(
            verifier, drafter, PROMPT, max_new_tokens=3, gamma=3, num_drafts=4, acceptance="standard"
        )


def test_row_seeded_continuations_sample_the_verifiers_distribution(verifier):
    """The corpus sampler's per-row streams (Gumbel-max inside generate's greedy search) draw from
    the verifier's temperature distribution exactly: 3-token continuations, one row per seed."""
    from specdiff_lightning.models.continuations import sample_continuations

    temperature = 0.8
    probs = exact_sequence_probs(verifier, PROMPT, LENGTH, temperature=temperature)
    n = _samples(probs)
    rows = sample_continuations(
        verifier,
        PROMPT.repeat(n, 1),
        torch.ones(n, PROMPT.shape[1], dtype=torch.long),
        LENGTH,
        temperature=temperature,
        row_seeds=list(range(n)),
    )
    counts = Counter(tuple(r) for r in rows.tolist())
    _assert_exact(counts, probs)
