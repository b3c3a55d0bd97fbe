"""speculative_generate behaves like generate(): EOS from generation_config, streamers, lookup drafts."""

import torch

from helpers import NoisyOracleDrafter, make_pair, reference_greedy
from specdiff_lightning import speculative_generate, verifier_generate
from specdiff_lightning.decoding.lookup import LookupAugmentedDrafter, lookup_continuation


class _Streamer:
    def __init__(self):
        self.chunks, self.ended = [], False

    def put(self, value):
        self.chunks.append(value.reshape(-1).tolist())

    def end(self):
        self.ended = True


def _eos_setup():
    verifier, drafter = make_pair("qwen2", "llama", seed=0)
    ids = torch.tensor([[3, 5, 7, 9]])
    free = reference_greedy(verifier, ids, 24)[0, ids.shape[1] :].tolist()
    eos = free[5]  # a token the verifier emits at position 6 (maybe earlier too)
    verifier.generation_config.eos_token_id = eos
    return verifier, drafter, ids, eos


def test_stops_at_the_verifiers_generation_config_eos_by_default():
    verifier, drafter, ids, eos = _eos_setup()
    ref = reference_greedy(verifier, ids, 24, eos_token_id=eos)
    for d in (drafter, NoisyOracleDrafter(verifier, noise=0.1)):
        out = speculative_generate(verifier, d, ids, max_new_tokens=24, gamma=4, num_drafts=2, temperature=0)
        assert torch.equal(out.sequences, ref)
        assert out.sequences[0, -1] == eos
        assert out.stats.new_tokens == ref.shape[1] - ids.shape[1]
    plain = verifier_generate(verifier, ids, max_new_tokens=24, temperature=0)
    assert torch.equal(plain.sequences, ref)
    assert not plain.sequences.is_inference() and not out.sequences.is_inference()  # writable by the caller
    # eos_token_id=[] decodes the full budget
    full = speculative_generate(
        verifier, drafter, ids, max_new_tokens=24, gamma=4, temperature=0, eos_token_id=[]
    )
    assert full.sequences.shape[1] == ids.shape[1] + 24


def test_streamer_receives_the_prompt_then_every_emitted_token():
    verifier, _ = make_pair("qwen2", "llama", seed=1)
    oracle = NoisyOracleDrafter(verifier, noise=0.2)
    ids = torch.tensor([[4, 2, 8]])
    streamer = _Streamer()
    out = speculative_generate(
        verifier, oracle, ids, max_new_tokens=20, gamma=4, temperature=0, eos_token_id=[], streamer=streamer
    )
    assert streamer.ended
    assert streamer.chunks[0] == ids[0].tolist()
    assert sum(streamer.chunks[1:], []) == out.sequences[0, ids.shape[1] :].tolist()
    assert len(streamer.chunks) - 1 == out.stats.verifier_calls  # one chunk per round


def test_lookup_continuation_prefers_the_longest_most_recent_match():
    ctx = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    assert lookup_continuation(ctx, 3) == [7, 8, 5]  # "2 3" last seen before 7 8 5
    assert lookup_continuation([1, 2, 3], 2) == []
    assert lookup_continuation([5, 6, 5], 4) == [6, 5]


def test_lookup_drafts_join_the_tree_losslessly():
    verifier, drafter = make_pair("llama", "qwen2", seed=2)
    ids = torch.tensor([[6, 1, 6, 1, 6, 1, 6]])
    ref = reference_greedy(verifier, ids, 30)
    out = speculative_generate(
        verifier,
        LookupAugmentedDrafter(drafter),
        ids,
        max_new_tokens=30,
        gamma=4,
        num_drafts=2,
        temperature=0,
        eos_token_id=[],
    )
    assert torch.equal(out.sequences, ref)
    assert out.stats.rounds[0].tree_size > 1
