"""Greedy exactness: temperature 0 reproduces the verifier's own greedy decoding, token for token."""

import pytest
import torch

from helpers import NoisyOracleDrafter, make_pair, reference_greedy, tree_for, trees_for
from specdiff_lightning import AutoregressiveDrafter, speculative_generate, verifier_generate
from specdiff_lightning.models import tiny_model

MODES = [
    ("greedy", 1),
    ("greedy", 4),
    ("greedy", 8),
    ("standard", 1),
    ("recursive", 1),
    ("recursive", 4),
    ("recursive", 8),
]
PAIRS = [("qwen2", "llama"), ("llama", "qwen2")]


def _prompt(seed, vocab, length=7):
    return torch.randint(0, vocab - 1, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}-verifier")
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("gamma", [1, 4, 16])
def test_diffusion_drafter_greedy_exact(pair, seed, gamma):
    verifier, drafter = make_pair(*pair, seed=seed)
    prompt = _prompt(seed, verifier.config.vocab_size)
    ref = reference_greedy(verifier, prompt, 24)
    for acceptance, num_drafts in MODES:
        for tree in trees_for(acceptance):
            out = speculative_generate(
                verifier,
                drafter,
                prompt,
                max_new_tokens=24,
                gamma=gamma,
                num_drafts=num_drafts,
                acceptance=acceptance,
                temperature=0,
                draft_temperature=1.5,
                generator=torch.Generator().manual_seed(seed),
                tree=tree,
            )
            assert out.sequences.tolist() == ref.tolist(), (acceptance, num_drafts, tree)
            assert out.stats.new_tokens == 24


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("gamma", [1, 4, 16])
@pytest.mark.parametrize("num_drafts", [1, 4, 8])
def test_deep_acceptance_and_branching_trees_greedy_exact(seed, gamma, num_drafts):
    """Drafts close to the verifier's: long accepted paths, bonus tokens, non-first selections."""
    verifier = tiny_model("qwen2", vocab_size=48, seed=seed, dtype=torch.float64)
    drafter = NoisyOracleDrafter(verifier, noise=0.15, seed=seed)
    prompt = _prompt(seed, 48)
    ref = reference_greedy(verifier, prompt, 40)
    out = speculative_generate(
        verifier,
        drafter,
        prompt,
        max_new_tokens=40,
        gamma=gamma,
        num_drafts=num_drafts,
        acceptance="greedy",
        temperature=0,
        tree=None,  # the K drafts as drawn: this test is about their trees
    )
    assert out.sequences.tolist() == ref.tolist()
    assert out.stats.mean_accepted > 0.5 * min(gamma, 4)  # the paths really were long
    if num_drafts > 1 and gamma > 1:
        assert any(r.draft_index > 0 for r in out.stats.rounds)  # selection picked later drafts


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}-verifier")
@pytest.mark.parametrize("acceptance,num_drafts", [("greedy", 4), ("standard", 1), ("recursive", 8)])
def test_eos_handling_matches_generate(pair, acceptance, num_drafts):
    verifier, drafter = make_pair(*pair, seed=5)
    prompt = _prompt(5, verifier.config.vocab_size)
    free = reference_greedy(verifier, prompt, 30)[0, prompt.shape[1] :].tolist()
    eos = free[len(free) // 2]  # a token the verifier emits mid-way
    ref = reference_greedy(verifier, prompt, 30, eos_token_id=eos)
    assert ref.shape[1] < prompt.shape[1] + 30 and ref[0, -1] == eos
    for gamma in (1, 4, 16):
        for tree in trees_for(acceptance):
            out = speculative_generate(
                verifier,
                drafter,
                prompt,
                max_new_tokens=30,
                gamma=gamma,
                num_drafts=num_drafts,
                acceptance=acceptance,
                temperature=0,
                eos_token_id=[eos],
                tree=tree,
            )
            assert out.sequences.tolist() == ref.tolist()
    oracle = speculative_generate(
        verifier,
        NoisyOracleDrafter(verifier, noise=0.0),
        prompt,
        max_new_tokens=30,
        gamma=16,
        acceptance="greedy",
        temperature=0,
        eos_token_id=eos,
    )
    assert oracle.sequences.tolist() == ref.tolist()  # EOS inside an accepted window truncates it


@pytest.mark.parametrize("max_new_tokens", [1, 2, 5, 17])
def test_never_exceeds_max_new_tokens(max_new_tokens):
    verifier = tiny_model("llama", vocab_size=48, seed=7, dtype=torch.float64)
    prompt = _prompt(7, 48)
    ref = reference_greedy(verifier, prompt, max_new_tokens)
    out = speculative_generate(
        verifier,
        NoisyOracleDrafter(verifier, noise=0.0),
        prompt,
        max_new_tokens=max_new_tokens,
        gamma=8,
        temperature=0,
    )
    assert out.sequences.tolist() == ref.tolist()
    assert out.stats.new_tokens == max_new_tokens


def test_autoregressive_drafter_sps_greedy_exact():
    verifier = tiny_model("qwen2", vocab_size=48, seed=8, dtype=torch.float64)
    prompt = _prompt(8, 48)
    ref = reference_greedy(verifier, prompt, 30)
    # The verifier as its own drafter accepts everything: every round is gamma + bonus.
    self_drafter = AutoregressiveDrafter(tiny_model("qwen2", vocab_size=48, seed=8, dtype=torch.float64))
    out = speculative_generate(
        verifier,
        self_drafter,
        prompt,
        max_new_tokens=30,
        gamma=4,
        acceptance="standard",
        temperature=0,
        draft_temperature=0,
        tree=None,
    )
    assert out.sequences.tolist() == ref.tolist()
    assert all(r.accepted == r.drafted for r in out.stats.rounds)
    other = AutoregressiveDrafter(tiny_model("llama", vocab_size=48, seed=9, dtype=torch.float64))
    for acceptance in ("standard", "greedy", "recursive"):
        out = speculative_generate(
            verifier,
            other,
            prompt,
            max_new_tokens=30,
            gamma=5,
            acceptance=acceptance,
            temperature=0,
            tree=tree_for(acceptance),
        )
        assert out.sequences.tolist() == ref.tolist()


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_verifier_generate_greedy_exact(arch):
    verifier = tiny_model(arch, vocab_size=48, seed=11, dtype=torch.float64)
    prompt = _prompt(11, 48)
    ref = reference_greedy(verifier, prompt, 25)
    out = verifier_generate(verifier, prompt, max_new_tokens=25, temperature=0)
    assert out.sequences.tolist() == ref.tolist()
    assert out.stats.verifier_calls == 25


def test_multistep_drafter_greedy_exact():
    verifier, drafter = make_pair("qwen2", "llama", seed=12)
    drafter.steps = 3
    prompt = _prompt(12, 48)
    ref = reference_greedy(verifier, prompt, 20)
    out = speculative_generate(
        verifier, drafter, prompt, max_new_tokens=20, gamma=6, num_drafts=4, temperature=0
    )
    assert out.sequences.tolist() == ref.tolist()
    with pytest.raises(ValueError, match="greedy"):
        speculative_generate(
            verifier,
            drafter,
            prompt,
            max_new_tokens=5,
            gamma=6,
            acceptance="standard",
            temperature=0,
            tree=None,
        )
