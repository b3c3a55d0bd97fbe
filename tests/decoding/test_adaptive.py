"""Draft trees shaped by the drafter's confidence, lookup drafts of their own lengths, and drafts of
different lengths in one round: greedy decoding stays identical to the verifier's."""

import pytest
import torch

from helpers import NoisyOracleDrafter, make_pair, reference_greedy
from specdiff_lightning import DiffusionDrafter, speculative_generate
from specdiff_lightning.decoding import AcceptanceRule
from specdiff_lightning.decoding.adaptive import AdaptiveDrafter, confident_lengths
from specdiff_lightning.decoding.drafting import Proposal
from specdiff_lightning.decoding.lookup import LookupAugmentedDrafter, lookup_continuations
from specdiff_lightning.models import tiny_model


def test_confident_lengths_cut_where_the_prefix_probability_falls_below_the_threshold():
    probs = torch.tensor([[0.9, 0.5, 0.9, 0.9], [0.05, 0.9, 0.9, 0.9], [1.0, 1.0, 1.0, 1.0]])
    assert confident_lengths(probs, 0.4).tolist() == [3, 1, 4]  # prefixes 0.9, 0.45, 0.405 | 0.36
    assert confident_lengths(probs, 0.0).tolist() == [4, 4, 4]


def _diffusion_drafter(verifier, seed=3):
    vocab = int(verifier.config.vocab_size)
    model = tiny_model("llama", vocab_size=vocab, seed=seed, dtype=torch.float64)
    return DiffusionDrafter(model, mask_token_id=vocab - 1, shift_logits=True)


def test_adaptive_proposals_cut_drafts_and_add_runner_up_branches():
    verifier, _ = make_pair("llama", "qwen2", seed=4)
    base = _diffusion_drafter(verifier)
    drafter = AdaptiveDrafter(base, min_confidence=0.2, siblings=(0, 1))
    ids = torch.tensor([[3, 4, 5, 6]])
    plain = base.propose(ids, 5, 1, 0.0)
    shaped = drafter.propose(ids, 5, 1, 0.0)
    assert not shaped.exact_q
    lengths = shaped.lengths[0].tolist()
    marginals = torch.softmax(plain.logits[0].float(), -1)
    prefix = torch.cumprod(marginals.gather(-1, plain.tokens[0, 0, :, None])[:, 0], 0)
    assert lengths[0] == max(1, int((prefix >= 0.2).sum()))
    # one branch per sibling position the cut draft reaches: its prefix, then the runner-up token
    branches = [j for j in (0, 1) if j < lengths[0]]
    assert lengths[1:] == [j + 1 for j in branches]
    for row, j in zip(shaped.tokens[0, 1:], branches, strict=True):
        assert torch.equal(row[:j], plain.tokens[0, 0, :j])
        assert int(row[j]) == int(marginals[j].topk(2).indices[1])


def test_branch_width_adds_the_next_best_first_tokens():
    verifier, _ = make_pair("qwen2", "llama", seed=9)
    base = _diffusion_drafter(verifier)
    ids = torch.tensor([[3, 4, 5, 6]])
    plain = base.propose(ids, 5, 1, 0.0)
    shaped = AdaptiveDrafter(base, siblings=(0, 2), branch_width=3).propose(ids, 5, 1, 0.0)
    ranked = plain.logits[0].float().topk(4, dim=-1).indices  # the mode, then the runner-ups
    assert torch.equal(shaped.tokens[0, 0], plain.tokens[0, 0])
    assert shaped.lengths[0].tolist() == [5, 1, 1, 1, 3, 3, 3]
    assert shaped.tokens[0, 1:4, 0].tolist() == ranked[0, 1:].tolist()
    for row, token in zip(shaped.tokens[0, 4:], ranked[2, 1:], strict=True):
        assert torch.equal(row[:2], plain.tokens[0, 0, :2]) and int(row[2]) == int(token)
    with pytest.raises(ValueError, match="branch_width"):
        AdaptiveDrafter(base, siblings=(0,), branch_width=0)


def test_mode_first_makes_the_first_sampled_draft_the_marginals_mode():
    verifier, _ = make_pair("llama", "qwen2", seed=4)
    base = _diffusion_drafter(verifier)
    drafter = AdaptiveDrafter(base, mode_first=True)
    ids = torch.tensor([[3, 4, 5, 6]])
    gen = lambda: torch.Generator().manual_seed(11)  # noqa: E731
    sampled = base.propose(ids, 5, 4, 1.5, gen())
    shaped = drafter.propose(ids, 5, 4, 1.5, gen())
    assert not shaped.exact_q  # the mode is no sample: only q-free acceptance may verify it
    assert torch.equal(shaped.tokens[0, 0], sampled.logits[0].argmax(-1))
    assert torch.equal(shaped.tokens[0, 1:], sampled.tokens[0, 1:])
    assert shaped.draft_lengths().tolist() == [[5, 5, 5, 5]]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_adaptive_and_lookup_drafts_decode_identically_to_the_verifier(arch):
    verifier, _ = make_pair(arch, "llama", seed=5)
    drafter = LookupAugmentedDrafter(
        AdaptiveDrafter(
            _diffusion_drafter(verifier),
            min_confidence=0.05,
            siblings=(0, 1),
            branch_width=2,
            mode_first=True,
        ),
        num_lookups=2,
        ngram_lengths={1: 2, 2: 3},
    )
    ids = torch.tensor([[6, 1, 6, 1, 6, 2, 6, 1]])
    ref = reference_greedy(verifier, ids, 30)
    for num_drafts in (1, 3):
        out = speculative_generate(
            verifier,
            drafter,
            ids,
            max_new_tokens=30,
            gamma=5,
            num_drafts=num_drafts,
            temperature=0,
            eos_token_id=[],
        )
        assert torch.equal(out.sequences, ref)


class _RaggedOracle(NoisyOracleDrafter):
    """The verifier's continuation with corruptions, each draft cut to a random length (or to
    ``lengths``, cycled)."""

    def __init__(self, verifier, noise=0.25, lengths=None):
        super().__init__(verifier, noise)
        self.lengths = lengths

    def propose(self, input_ids, gamma, num_drafts=1, temperature=1.0, generator=None):
        proposal = super().propose(input_ids, gamma, num_drafts, temperature, generator)
        if self.lengths is None:
            lengths = torch.randint(1, gamma + 1, (1, num_drafts), generator=self.rng)
        else:
            lengths = torch.tensor([[self.lengths[i % len(self.lengths)] for i in range(num_drafts)]])
        return Proposal(proposal.tokens, proposal.probs, False, lengths)


def test_drafts_of_different_lengths_decode_identically_to_the_verifier():
    """Long accepted paths, bonus tokens after short drafts, and chosen drafts other than the first."""
    verifier, _ = make_pair("qwen2", "llama", seed=6)
    ids = torch.tensor([[2, 7, 1]])
    ref = reference_greedy(verifier, ids, 40)
    out = speculative_generate(
        verifier,
        _RaggedOracle(verifier, noise=0.15),
        ids,
        max_new_tokens=40,
        gamma=6,
        num_drafts=3,
        temperature=0,
        eos_token_id=[],
        tree=None,  # the oracle's ragged drafts, as drawn
    )
    assert torch.equal(out.sequences, ref)
    rounds = out.stats.rounds
    assert any(r.bonus and r.drafted < 6 for r in rounds)
    assert any(r.draft_index > 0 for r in rounds)
    assert all(r.accepted <= r.drafted == len(r.draft) for r in rounds)


def test_lookup_continuations_are_distinct_and_cut_by_match_length():
    ctx = [1, 2, 3, 9, 4, 2, 3, 7, 8, 5, 6, 3]
    # "3" (n=1) last seen before 7, then before 9; "2 3"/"6 3" do not match as 2-grams
    assert lookup_continuations(ctx, 4, limit=2) == [[7, 8, 5, 6], [9, 4, 2, 3]]
    assert lookup_continuations(ctx, 4, limit=2, ngram_lengths={1: 2}) == [[7, 8], [9, 4]]
    assert lookup_continuations([5, 5, 5], 3, limit=3) == [[5], [5, 5]]  # a run stops at the end


def test_adaptive_drafter_needs_a_drafter_with_marginals():
    verifier, _ = make_pair("llama", "llama", seed=7)
    drafter = AdaptiveDrafter(NoisyOracleDrafter(verifier), min_confidence=0.1)
    with pytest.raises(ValueError, match="marginals"):
        speculative_generate(
            verifier, drafter, torch.tensor([[1, 2]]), max_new_tokens=4, gamma=3, temperature=0
        )
    with pytest.raises(ValueError, match="min_confidence"):
        AdaptiveDrafter(NoisyOracleDrafter(verifier), min_confidence=1.5)


def test_a_rule_for_one_length_refuses_drafts_of_several():
    class SameLength(AcceptanceRule):
        name = "same-length"

        def verify(self, drafts, q, p, generator=None):
            raise AssertionError("never reached")

    verifier, _ = make_pair("llama", "llama", seed=8)
    with pytest.raises(ValueError, match="different lengths"):
        speculative_generate(
            verifier,
            _RaggedOracle(verifier, lengths=[1, 2]),
            torch.tensor([[1, 2]]),
            max_new_tokens=4,
            gamma=3,
            num_drafts=2,
            acceptance=SameLength(),
            temperature=0,
            tree=None,
        )
