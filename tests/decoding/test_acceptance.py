"""The acceptance rules as pure functions, on hand-made distributions."""

import itertools

import pytest
import torch

from specdiff_lightning.decoding import (
    GreedyAcceptance,
    accept_greedy,
    accept_recursive,
    accept_standard,
    expected_accepted_length,
    get_acceptance_rule,
    logits_to_probs,
)
from specdiff_lightning.testing import chi_square_test

V = 4


def _dist(*rows):
    t = torch.tensor(rows, dtype=torch.float64)
    return t / t.sum(-1, keepdim=True)


def test_expected_accepted_length_matches_enumeration():
    token_probs = torch.tensor([[0.9, 0.5, 0.2], [0.3, 1.0, 1.0]], dtype=torch.float64)
    tau = expected_accepted_length(token_probs)
    # E[accepted] = sum_j P(first j accepted) under greedy acceptance, enumerated over coin flips.
    for k in range(2):
        expected = 0.0
        for coins in itertools.product([0, 1], repeat=3):
            prob, accepted = 1.0, 0
            for j, c in enumerate(coins):
                prob *= float(token_probs[k, j]) if c else 1 - float(token_probs[k, j])
            for c in coins:
                if not c:
                    break
                accepted += 1
            expected += prob * accepted
        assert float(tau[k]) == pytest.approx(expected)


def test_expected_accepted_length_is_stable_for_long_windows():
    tau = expected_accepted_length(torch.full((1, 32), 1e-20, dtype=torch.float64))
    assert torch.isfinite(tau).all() and float(tau) == pytest.approx(1e-20)
    assert float(expected_accepted_length(torch.ones(1, 32))) == 32


def test_temperature_zero_is_one_hot_argmax_first_on_ties():
    probs = logits_to_probs(torch.tensor([[1.0, 3.0, 3.0, 0.0]]), temperature=0)
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_greedy_tokens_are_argmax(dtype):
    """The decoding loops' greedy pick equals torch.argmax (what generate() uses) on ties, -inf rows,
    NaN and a vocabulary-sized random batch."""
    from specdiff_lightning.decoding.sampling import greedy_tokens

    inf, nan = float("inf"), float("nan")
    rows = torch.tensor(
        [[1.0, 3.0, 3.0, 0.0], [-inf, -inf, -inf, -inf], [0.0, nan, 5.0, nan], [2.0, 2.0, 2.0, 2.0]],
        dtype=dtype,
    )
    assert torch.equal(greedy_tokens(rows), rows.argmax(-1))
    big = torch.randn(16, 49152, generator=torch.Generator().manual_seed(0)).to(dtype)
    big[3, 100] = big[3, 200] = big[3].max() + 1  # a tie at the top
    assert torch.equal(greedy_tokens(big), big.argmax(-1))
    assert torch.equal(greedy_tokens(big, keepdim=True), big.argmax(-1, keepdim=True))


P = _dist([0.5, 0.2, 0.2, 0.1], [0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25])
Q = _dist([0.1, 0.1, 0.4, 0.4], [0.4, 0.3, 0.2, 0.1])
TARGET = {(t,): float(P[0, t]) for t in range(V)}


@pytest.mark.parametrize("fixed_token", range(V))
def test_greedy_acceptance_is_lossless_for_any_draft(fixed_token):
    """Whatever (even adversarially chosen) draft token is verified, the first emitted token ~ p."""
    draft = torch.tensor([fixed_token, 0])
    gen = torch.Generator().manual_seed(fixed_token)
    counts = {}
    for _ in range(12000):
        v = accept_greedy(draft, P, gen)
        first = int(draft[0]) if v.num_accepted > 0 else v.next_token
        counts[(first,)] = counts.get((first,), 0) + 1
    assert chi_square_test(counts, TARGET).pvalue > 1e-3


def test_standard_acceptance_is_lossless_when_sampled_from_q():
    gen = torch.Generator().manual_seed(1)
    counts = {}
    for _ in range(12000):
        draft = torch.multinomial(Q, 1, generator=gen).squeeze(-1)
        v = accept_standard(draft, Q, P, gen)
        first = int(draft[0]) if v.num_accepted > 0 else v.next_token
        counts[(first,)] = counts.get((first,), 0) + 1
    assert chi_square_test(counts, TARGET).pvalue > 1e-3


def test_recursive_acceptance_is_lossless_over_iid_drafts():
    gen = torch.Generator().manual_seed(2)
    K = 3
    q = Q[None].expand(K, -1, -1)
    p = P[None].expand(K, -1, -1)  # position-1 rows only matter for the first token
    counts = {}
    for _ in range(12000):
        drafts = torch.multinomial(Q, K, replacement=True, generator=gen).T  # [K, 2]
        v = accept_recursive(drafts, q, p, gen)
        first = int(drafts[v.draft_index, 0]) if v.num_accepted > 0 else v.next_token
        counts[(first,)] = counts.get((first,), 0) + 1
    assert chi_square_test(counts, TARGET).pvalue > 1e-3


def test_standard_after_selection_is_biased():
    """Why the engine refuses standard + selection: picking the draft the verifier likes most, then
    accepting with min(1, p/q), over-emits the verifier's favourite token."""
    gen = torch.Generator().manual_seed(3)
    counts = {}
    rule = GreedyAcceptance()
    for _ in range(6000):
        drafts = torch.multinomial(Q, 8, replacement=True, generator=gen).T
        k = rule.select(drafts, P[None].expand(8, -1, -1))
        v = accept_standard(drafts[k], Q, P, gen)
        first = int(drafts[k, 0]) if v.num_accepted > 0 else v.next_token
        counts[(first,)] = counts.get((first,), 0) + 1
    assert chi_square_test(counts, TARGET).pvalue < 1e-6


def test_greedy_selection_picks_largest_tau():
    p = torch.zeros(3, 3, V, dtype=torch.float64)
    p[..., 0] = torch.tensor([[0.2, 0.2, 1.0], [0.9, 0.9, 1.0], [0.9, 0.1, 1.0]], dtype=torch.float64)
    p[..., 1] = 1 - p[..., 0]
    drafts = torch.zeros(3, 2, dtype=torch.long)
    assert GreedyAcceptance().select(drafts, p) == 1


def test_rule_lookup():
    assert get_acceptance_rule("recursive").name == "recursive"
    rule = GreedyAcceptance()
    assert get_acceptance_rule(rule) is rule
    with pytest.raises(ValueError, match="unknown acceptance mode"):
        get_acceptance_rule("eagle")


def test_greedy_selection_and_acceptance_stop_at_each_drafts_length():
    """Padding past a short draft never counts: the longer draft wins while its own tokens match,
    and a short draft accepted whole gets its bonus token from the row after its last token."""
    vocab = 4
    # rows: the trie root, then node rows after each (draft, position); one-hot, T = 0
    drafts = torch.tensor([[1, 2, 3], [1, 0, 0]])
    lengths = torch.tensor([3, 1])
    p = torch.zeros(2, 4, vocab)
    p[:, 0, 1] = 1  # both first tokens (1) match
    p[0, 1, 2] = 1  # draft 0: 2 matches, then 0 != 3
    p[0, 2, 0] = 1
    p[1, 1, 0] = 1  # draft 1's "padding" 0 would match here if it were counted
    p[1, 2, 0] = 1
    rule = GreedyAcceptance()
    assert rule.select(drafts, p, lengths) == 0
    verdict = rule.verify(drafts, None, p, lengths=lengths)
    assert (verdict.draft_index, verdict.num_accepted, verdict.next_token) == (0, 2, 0)
    short = rule.verify(drafts[1:], None, p[1:], lengths=lengths[1:])
    assert (short.num_accepted, short.next_token) == (1, 0)  # bonus from row 1, after its one token


@pytest.mark.parametrize("seed", range(20))
def test_greedy_tree_verdict_equals_the_greedy_rule_on_one_hot_rows(seed):
    """At temperature 0 the loop verifies from the argmax alone (greedy_tree_verdict); on random
    tries (shared prefixes, drafts of their own lengths, ties in the logits) its verdict is the one
    GreedyAcceptance gives the one-hot rows it replaces: the draft, the tokens kept, the next token."""
    from specdiff_lightning.decoding import build_tree, tree_probs
    from specdiff_lightning.decoding.acceptance import greedy_tree_verdict

    gen = torch.Generator().manual_seed(seed)
    k, g, vocab = (
        int(torch.randint(1, 5, (1,), generator=gen)),
        int(torch.randint(0, 5, (1,), generator=gen)),
        3,
    )
    drafts = torch.randint(0, vocab, (k, g), generator=gen)  # a small alphabet: branches and matches
    lengths = torch.randint(1, g + 1, (k,), generator=gen) if g and seed % 2 else None
    tree = build_tree(1, drafts, lengths)
    logits = torch.randint(0, 3, (tree.size, vocab), generator=gen).float()  # ties on purpose
    expected = GreedyAcceptance().verify(
        drafts, None, tree_probs(logits_to_probs(logits, temperature=0), tree), gen, lengths=lengths
    )
    assert greedy_tree_verdict(drafts, tree.paths, logits.max(-1).indices, lengths) == expected
