"""Decoding statistics count only emitted tokens."""

import torch

from helpers import NoisyOracleDrafter, make_pair, reference_greedy
from specdiff_lightning import speculative_generate
from specdiff_lightning.decoding import DecodingStats, RoundStats


def test_accepted_tokens_after_an_eos_are_not_counted():
    # Round 1 accepts 2 of 4 then corrects; round 2 accepts all 4 + bonus, but the output ends at
    # an EOS that was its 2nd draft token: 3 + 2 tokens emitted, 2 + 2 accepted.
    stats = DecodingStats(gamma=4, new_tokens=5)
    stats.rounds += [
        RoundStats(4, 2, False, 5, 0, (1, 2, 3, 4), (1, 2, 9)),
        RoundStats(4, 4, True, 5, 0, (5, 6, 7, 8), (5, 6, 7, 8, 10)),
    ]
    assert stats.accepted_tokens == 4 and stats.verifier_calls == 2
    assert stats.position_accepted.tolist() == [2, 2, 0, 0]
    assert stats.position_reached.tolist() == [2, 2, 1, 0]
    assert [r.emitted for r in stats.emitted_rounds] == [(1, 2, 9), (5, 6)]
    assert stats.rounds[-1].accepted == 4  # the raw trace is kept
    # nothing cut: the rounds count as they are
    whole = DecodingStats(gamma=4, new_tokens=6, rounds=[stats.rounds[0]] * 2)
    assert whole.accepted_tokens == 4 and whole.emitted_rounds == whole.rounds


def test_stats_of_a_generation_that_stops_at_eos_mid_round():
    """The probe of issue 11: an oracle drafter proposes the verifier's greedy continuation, the
    whole window is accepted, and EOS is its 6th token: 6 tokens out, 6 accepted (not 8)."""
    verifier, _ = make_pair("qwen2", "llama", seed=1)
    prompt = torch.tensor([[1, 2, 3, 4]])
    ref = reference_greedy(verifier, prompt, 8)[0, 4:].tolist()
    stop = 5
    assert ref[stop] not in ref[:stop]  # the 6th greedy token appears there first: make it the EOS
    out = speculative_generate(
        verifier,
        NoisyOracleDrafter(verifier, noise=0.0),
        prompt,
        max_new_tokens=16,
        gamma=8,
        temperature=0,
        eos_token_id=ref[stop],
        tree=None,  # the oracle's whole window, as drawn
    )
    assert out.sequences[0, 4:].tolist() == ref[: stop + 1]
    stats = out.stats
    assert stats.new_tokens == stop + 1 and stats.verifier_calls == 1
    assert stats.rounds[0].accepted == 8  # the verifier accepted the whole window...
    assert stats.accepted_tokens == stop + 1  # ...but only the tokens up to EOS were emitted
    assert int(stats.position_accepted.sum()) == int(stats.position_reached.sum()) == stop + 1
    assert stats.mean_accepted <= stats.mean_tokens_per_call


def test_repr_is_a_summary_not_the_round_trace():
    """Issue 19: print(out.stats) printed every round's RoundStats."""
    stats = DecodingStats(gamma=4, new_tokens=6, drafter_calls=2)
    stats.rounds += [RoundStats(4, 2, False, 5, 0, (1, 2, 3, 4), (1, 2, 9))] * 2
    assert repr(stats) == (
        "DecodingStats(gamma=4, new_tokens=6, verifier_calls=2, drafter_calls=2, mean_accepted=2.00, "
        "mean_tokens_per_call=3.00, rounds=<2 rounds>)"
    )
    assert "RoundStats" not in str(stats)
