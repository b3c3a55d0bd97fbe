"""The feature-conditioned block-diffusion drafter: its cache is exact, training sees what decoding
sees, and decoding with it stays lossless."""

import pytest
import torch

from helpers import reference_greedy
from specdiff_lightning import speculative_generate
from specdiff_lightning.decoding.lookup import LookupAugmentedDrafter
from specdiff_lightning.decoding.verifier import TreeVerifier
from specdiff_lightning.models import tiny_model
from specdiff_lightning.models.conditioned import ConditionedDrafter

VOCAB = 48
LAYERS = (1, 2)


def _pair(arch="llama", dtype=torch.float64, num_layers=3):
    verifier = tiny_model(arch, vocab_size=VOCAB, num_layers=num_layers, seed=0, dtype=dtype)
    drafter = ConditionedDrafter.build(verifier, 1, LAYERS, mask_token_id=VOCAB - 1)
    return verifier, drafter


def _features(verifier, ids):
    with torch.no_grad():
        states = verifier(input_ids=ids, output_hidden_states=list(LAYERS)).hidden_states
    return torch.cat([states[i] for i in LAYERS], dim=-1)


def test_cached_rounds_equal_the_training_forward():
    """Round by round through a growing prefix, the cached drafter's window logits equal
    blocks_logits over the whole sequence at the same window starts."""
    verifier, drafter = _pair()
    gen = torch.Generator().manual_seed(0)
    seq = torch.randint(0, VOCAB - 1, (1, 16), generator=gen)
    feats = _features(verifier, seq)
    drafter.reset()
    drafter.observe(feats[0, :4])  # the prefill: all but the pending token of a 5-token prompt
    ends = [5, 6, 9, 11, 14]
    cached = []
    for i, n in enumerate(ends):
        with torch.no_grad():
            cached.append(drafter._cached_logits(seq[:, :n], 4)[0])
        if i + 1 < len(ends):
            drafter.observe(feats[0, n - 1 : ends[i + 1] - 1])
    with torch.no_grad():
        blocks = drafter.blocks_logits(feats, seq, torch.tensor([ends]), 4)
    for m, logits in enumerate(cached):
        torch.testing.assert_close(logits, blocks[0, m], rtol=1e-9, atol=1e-9)


def test_a_cache_window_drafts_as_if_the_context_began_at_the_window():
    """With ``cache_window=W`` a round sees the last W cached positions plus the new ones: the
    training forward over that suffix alone (positions renumbered from 0: RoPE reads only relative
    positions) gives the same logits, and the cache never holds more than W positions between rounds.
    transformers computes RoPE's cos/sin in float32, so renumbered positions agree to ~1e-7 even in
    float64; the whole context, which the window drops, changes the logits far more than that."""
    verifier, drafter = _pair()
    drafter.cache_window = 3
    seq = torch.randint(0, VOCAB - 1, (1, 16), generator=torch.Generator().manual_seed(0))
    feats = _features(verifier, seq)
    drafter.reset()
    drafter.observe(feats[0, :4])
    ends = [5, 6, 9, 11, 14]
    for i, n in enumerate(ends):
        start = drafter._past - min(3, drafter._past)  # the first context position this round sees
        with torch.no_grad():
            cached = drafter._cached_logits(seq[:, :n], 4)[0]
            expected = drafter.blocks_logits(feats[:, start:], seq[:, start:], torch.tensor([[n - start]]), 4)
            whole = drafter.blocks_logits(feats, seq, torch.tensor([[n]]), 4)[0, 0]
        torch.testing.assert_close(cached, expected[0, 0], rtol=1e-5, atol=1e-6)
        if start > 0:
            assert (cached - whole).abs().max() > 1e-3
        assert drafter._cache.get_seq_length() <= 3
        if i + 1 < len(ends):
            drafter.observe(feats[0, n - 1 : ends[i + 1] - 1])
    with pytest.raises(ValueError, match="cache_window"):
        ConditionedDrafter(drafter.model, drafter.fusion, LAYERS, VOCAB - 1, cache_window=0)


def test_tree_verifier_hands_over_the_committed_tokens_features():
    verifier, _ = _pair()
    ids = torch.randint(0, VOCAB - 1, (1, 7), generator=torch.Generator().manual_seed(1))
    state = TreeVerifier(verifier, ids, LAYERS)
    torch.testing.assert_close(state.new_features, _features(verifier, ids[:, :-1])[0])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("lookup", [False, True])
def test_greedy_decoding_is_identical_to_the_verifier(arch, lookup):
    verifier, drafter = _pair(arch)
    drafter.cache_window = None if lookup else 5  # a window shapes drafts only, never the output
    if lookup:
        drafter = LookupAugmentedDrafter(drafter)
    ids = torch.randint(0, VOCAB - 1, (1, 6), generator=torch.Generator().manual_seed(2))
    ref = reference_greedy(verifier, ids, 24)
    for num_drafts in (1, 3):
        out = speculative_generate(
            verifier, drafter, ids, max_new_tokens=24, gamma=4, num_drafts=num_drafts, temperature=0
        )
        assert torch.equal(out.sequences, ref)


def test_a_one_token_prompt_and_a_second_sequence_reuse_the_drafter():
    verifier, drafter = _pair()
    for ids in (torch.tensor([[3]]), torch.tensor([[5, 9, 11]])):
        out = speculative_generate(verifier, drafter, ids, max_new_tokens=10, gamma=3, temperature=0)
        assert torch.equal(out.sequences, reference_greedy(verifier, ids, 10))


def test_drafting_without_the_verifiers_features_is_a_clear_error():
    _, drafter = _pair()
    with pytest.raises(ValueError, match="speculative_generate"):
        drafter.propose(torch.tensor([[1, 2, 3]]), 4)


def test_save_and_reload(tmp_path):
    verifier, drafter = _pair()
    with torch.no_grad():
        drafter.fusion.proj.weight.add_(0.5)
    drafter.save(tmp_path / "d", settings={"gamma": 4})
    again = ConditionedDrafter.from_slice(verifier, tmp_path / "d")
    assert again.feature_layers == LAYERS and again.mask_token_id == VOCAB - 1
    torch.testing.assert_close(again.fusion.proj.weight, drafter.fusion.proj.weight)
    ids = torch.randint(0, VOCAB - 1, (1, 5), generator=torch.Generator().manual_seed(3))
    # tree=None: the drafts as drawn. Under tree="auto" each round's size also depends on the
    # measured drafting time, so two runs of one drafter may verify different prefixes.
    a = speculative_generate(
        verifier, drafter, ids, max_new_tokens=8, gamma=3, temperature=0, draft_temperature=0, tree=None
    )
    b = speculative_generate(
        verifier, again, ids, max_new_tokens=8, gamma=3, temperature=0, draft_temperature=0, tree=None
    )
    assert [r.draft for r in a.stats.rounds] == [r.draft for r in b.stats.rounds]
    assert torch.equal(a.sequences, b.sequences)


def test_a_plain_slice_loader_refuses_a_conditioned_slice(tmp_path):
    from specdiff_lightning.models.slicing import load_slice

    verifier, drafter = _pair()
    drafter.save(tmp_path / "d")
    with pytest.raises(ValueError, match="conditioned"):
        load_slice(verifier, tmp_path / "d")


def test_a_drafter_for_another_verifier_is_a_clear_error():
    _, drafter = _pair(num_layers=3)
    shallow = tiny_model("llama", vocab_size=VOCAB, num_layers=1, seed=0, dtype=torch.float64)
    with pytest.raises(ValueError, match="hidden states"):
        speculative_generate(shallow, drafter, torch.tensor([[1, 2, 3]]), max_new_tokens=4, gamma=3)
    wide = tiny_model("llama", vocab_size=VOCAB, num_layers=3, hidden_size=64, seed=0, dtype=torch.float64)
    with pytest.raises(ValueError, match="pair it with that verifier"):
        speculative_generate(wide, drafter, torch.tensor([[1, 2, 3]]), max_new_tokens=4, gamma=3)


def test_a_head_over_the_first_ids_drafts_only_those_and_stays_lossless():
    verifier, drafter = _pair()
    small = ConditionedDrafter(drafter.model, drafter.fusion, LAYERS, drafter.mask_token_id, head_vocab=20)
    ids = torch.randint(0, VOCAB - 1, (1, 6), generator=torch.Generator().manual_seed(4))
    feats = _features(verifier, ids)
    logits = {}
    for name, d in (("full", drafter), ("small", small)):
        d.reset()
        d.observe(feats[0, :-1])
        with torch.no_grad():
            logits[name] = d._cached_logits(ids, 4)[0]
    torch.testing.assert_close(logits["small"][:, :20], logits["full"][:, :20])
    assert torch.isneginf(logits["small"][:, 20:]).all()
    # the drafter's own drafts (tree=None: no context copies, which may hold any id)
    out = speculative_generate(verifier, small, ids, max_new_tokens=16, gamma=4, temperature=0, tree=None)
    assert torch.equal(out.sequences, reference_greedy(verifier, ids, 16))
    assert all(t < 20 for r in out.stats.rounds for t in r.draft)
    auto = speculative_generate(verifier, small, ids, max_new_tokens=16, gamma=4, temperature=0)
    assert torch.equal(auto.sequences, reference_greedy(verifier, ids, 16))
    with pytest.raises(ValueError, match="head_vocab"):
        ConditionedDrafter(drafter.model, drafter.fusion, LAYERS, drafter.mask_token_id, head_vocab=0)


def test_drafts_stop_at_the_trained_block_when_gamma_is_larger():
    """A block of 3 in a window of 5: drafts of 3 (lengths), lookup copies may run to 5; greedy
    and standard acceptance both stay identical to the verifier."""
    verifier, drafter = _pair()
    capped = ConditionedDrafter(drafter.model, drafter.fusion, LAYERS, drafter.mask_token_id, block=3)
    ids = torch.tensor([[4, 9, 4, 9, 4, 9, 4]])
    ref = reference_greedy(verifier, ids, 20)
    for d, acceptance in ((capped, "standard"), (LookupAugmentedDrafter(capped), "greedy")):
        out = speculative_generate(
            verifier,
            d,
            ids,
            max_new_tokens=20,
            gamma=5,
            temperature=0,
            acceptance=acceptance,
            eos_token_id=[],
            tree=None,  # the block's cap, as drawn
        )
        assert torch.equal(out.sequences, ref)
        assert all(r.drafted <= (5 if d is not capped else 3) for r in out.stats.rounds)
    capped.reset()
    capped.observe(_features(verifier, ids)[0, :-1])
    proposal = capped.propose(ids, 5)
    assert proposal.tokens.shape == (1, 1, 5) and proposal.lengths.tolist() == [[3]]
    with pytest.raises(ValueError, match="block"):
        ConditionedDrafter(drafter.model, drafter.fusion, LAYERS, drafter.mask_token_id, block=0)
