"""Losses against brute-force enumeration on a tiny vocabulary."""

import itertools

import pytest
import torch

from specdiff_lightning.training import (
    IGNORE_INDEX,
    LOSSES,
    ar_distillation_loss,
    expected_streak_loss,
    forward_kl_loss,
    masked_ce_loss,
    mdm_corrupt,
    mdm_loss,
    streak_loss,
    tv_loss,
)

V, G = 3, 3


def _verifier_table(seed):
    """p(. | s ⊕ x_<k) for every prefix, as a dict prefix-tuple -> FloatTensor[V]."""
    gen = torch.Generator().manual_seed(seed)
    return {
        prefix: torch.softmax(2 * torch.randn(V, generator=gen, dtype=torch.float64), -1)
        for k in range(G)
        for prefix in itertools.product(range(V), repeat=k)
    }


def _path_logprobs(table, x):
    return torch.stack([table[tuple(x[:k])].log() for k in range(G)])[None]  # [1, G, V]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("temperature", [1.0, 1.7])
def test_streak_objective_expectations_agree_with_enumeration(seed, temperature):
    table = _verifier_table(seed)
    draft_logits = torch.randn(
        1, G, V, generator=torch.Generator().manual_seed(100 + seed), dtype=torch.float64
    )
    q = torch.softmax(draft_logits[0] / temperature, -1)
    sampled = rao_blackwell = 0.0
    for x in itertools.product(range(V), repeat=G):
        prob = 1.0
        for k in range(G):
            prob *= float(table[x[:k]][x[k]])
        targets = torch.tensor([x])
        sampled += prob * float(streak_loss(draft_logits, targets, temperature)[1])
        rao_blackwell += prob * float(
            expected_streak_loss(draft_logits, targets, temperature, _path_logprobs(table, x))[1]
        )
    # Expected accepted length of a draft y ~ prod_k q_k verified by greedy acceptance.
    accepted = 0.0
    for y in itertools.product(range(V), repeat=G):
        qy = float(torch.prod(torch.stack([q[k, y[k]] for k in range(G)])))
        streak, run = 0.0, 1.0
        for k in range(G):
            run *= float(table[y[:k]][y[k]])
            streak += run
        accepted += qy * streak
    assert sampled == pytest.approx(accepted, rel=1e-9)
    assert rao_blackwell == pytest.approx(accepted, rel=1e-9)


def test_streak_loss_matches_its_definition_and_ignores_padding():
    logits = torch.randn(2, 4, 5, dtype=torch.float64)
    targets = torch.tensor([[1, 2, 3, 4], [0, 1, IGNORE_INDEX, IGNORE_INDEX]])
    loss, streak = streak_loss(logits, targets)
    q = torch.softmax(logits, -1)
    expected0 = sum(
        float(torch.prod(torch.stack([q[0, k, targets[0, k]] for k in range(j + 1)]))) for j in range(4)
    )
    expected1 = float(q[1, 0, 0]) + float(q[1, 0, 0] * q[1, 1, 1])
    assert streak.tolist() == pytest.approx([expected0, expected1])
    assert float(loss) == pytest.approx(-(expected0 + expected1) / 2)


def test_gradients_finite_for_long_windows_with_tiny_probabilities():
    logits = torch.full((2, 32, 50), -30.0)
    logits[..., 0] = 30.0  # the targets below get probability ~e^-60
    logits.requires_grad_(True)
    targets = torch.randint(1, 50, (2, 32))
    logp = torch.log_softmax(torch.randn(2, 32, 50), -1)
    for name, fn in LOSSES.items():  # one signature for every objective
        loss, streak = fn(logits, targets, 1.0, logp)
        (grad,) = torch.autograd.grad(loss, logits)
        assert torch.isfinite(loss) and torch.isfinite(grad).all() and torch.isfinite(streak).all(), name


def test_ar_distillation_only_trains_the_first_position():
    logits = torch.randn(1, 4, 6, requires_grad=True)
    targets = torch.tensor([[1, 2, 3, 4]])
    loss, streak = ar_distillation_loss(logits, targets)
    (grad,) = torch.autograd.grad(loss, logits)
    assert grad[0, 0].abs().sum() > 0 and grad[0, 1:].abs().sum() == 0
    assert float(streak) == pytest.approx(float(streak_loss(logits, targets)[1]))


def test_baselines_vanish_at_a_perfect_drafter():
    logp = torch.log_softmax(torch.randn(1, 3, 6, dtype=torch.float64), -1)
    targets = torch.tensor([[0, 1, 2]])
    assert float(tv_loss(logp, targets, verifier_logprobs=logp)[0]) == pytest.approx(0.0, abs=1e-12)
    assert float(forward_kl_loss(logp, targets, verifier_logprobs=logp)[0]) == pytest.approx(0.0, abs=1e-12)
    ce = masked_ce_loss(logp, targets)[0]
    assert float(ce) == pytest.approx(-float(logp[0, [0, 1, 2], [0, 1, 2]].mean()))


def test_mdm_loss_weights_masked_tokens_by_inverse_t():
    tokens = torch.tensor([[1, 2, 3, 4, 5]])
    noisy, masked, t = mdm_corrupt(tokens, mask_token_id=9, generator=torch.Generator().manual_seed(0))
    assert ((noisy == 9) == masked).all() and 0 < float(t) <= 1
    logits = torch.randn(1, 5, 10)
    loss = mdm_loss(logits, tokens, masked, t, shift_logits=False)
    ce = torch.nn.functional.cross_entropy(logits[0], tokens[0], reduction="none")
    assert float(loss) == pytest.approx(float((ce * masked[0]).sum() / t / 5), rel=1e-5)
    shifted = mdm_loss(logits, tokens, masked, t, shift_logits=True)
    ce_s = torch.nn.functional.cross_entropy(logits[0, :-1], tokens[0, 1:], reduction="none")
    assert float(shifted) == pytest.approx(float((ce_s * masked[0, 1:]).sum() / t / 4), rel=1e-5)
    _, never, _ = mdm_corrupt(tokens, 9, valid=torch.zeros_like(tokens, dtype=torch.bool))
    assert not never.any()


def test_objectives_declare_their_need_for_verifier_distributions():
    from specdiff_lightning.training.losses import needs_verifier_logprobs

    needs = {name for name, fn in LOSSES.items() if needs_verifier_logprobs(fn)}
    assert needs == {"expected_streak", "tv", "forward_kl"}
    logits, targets = torch.randn(1, 3, 6), torch.tensor([[0, 1, 2]])
    with pytest.raises(ValueError, match="needs verifier_logprobs"):
        tv_loss(logits, targets, 1.0)


def test_greedy_chain_accepted_counts_leading_argmax_matches():
    from specdiff_lightning.training.losses import greedy_chain_accepted

    logits = torch.full((3, 4, 5), -1.0)
    chain = torch.tensor([[1, 2, 3, 4], [0, 0, 0, 0], [2, 2, 1, 1]])
    logits.scatter_(-1, chain[..., None], 1.0)  # argmax = chain
    targets = torch.tensor([[1, 2, 0, 4], [1, 0, 0, 0], [2, 2, -100, -100]])
    assert greedy_chain_accepted(logits, targets).tolist() == [2, 0, 2]  # a miss or the end stops it


def test_greedy_chain_streaks_scores_lazily_what_greedy_chain_accepted_scores():
    from specdiff_lightning.training.losses import greedy_chain_accepted, greedy_chain_streaks

    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(6, 4, bias=False)
    rows = torch.randn(200, 5, 6, generator=gen)
    with torch.no_grad():
        chain = head(rows).argmax(-1)
    # targets that follow the argmax for a random number of positions, then miss or end
    keep = torch.randint(0, 6, (200,), generator=gen)
    pos = torch.arange(5)
    targets = torch.where(pos < keep[:, None], chain, (chain + 1) % 4)
    targets[::7, 3:] = -100
    with torch.no_grad():
        want = greedy_chain_accepted(head(rows), targets)
        assert torch.equal(greedy_chain_streaks(rows, head, targets), want)
    assert want.float().mean() > 1  # long streaks occur, so the later positions are scored too


def test_the_decode_path_walks_the_rounds_greedy_decoding_takes():
    from specdiff_lightning.training.losses import decode_path_streaks

    # a round accepting s tokens emits s + 1: the next round starts s + 1 anchors on
    assert decode_path_streaks(torch.tensor([2, 0, 0, 1, 5, 0, 3, 9, 9, 9])).tolist() == [2, 1, 0, 3]
    assert decode_path_streaks(torch.tensor([0, 0, 0])).tolist() == [0, 0, 0]
    assert decode_path_streaks(torch.zeros(0, dtype=torch.long)).tolist() == []


def test_masked_ce_position_decay_weights_each_window_position():
    """DFlash's decay: position k's cross-entropy weighs exp(-(k-1)/decay); ignored positions weigh
    nothing; without decay the plain mean."""
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 7, dtype=torch.float64)
    targets = torch.tensor([[1, 2, 3, 4], [0, 6, IGNORE_INDEX, IGNORE_INDEX], [5, 5, 5, IGNORE_INDEX]])
    ce = -torch.log_softmax(logits, -1).gather(-1, targets.clamp_min(0)[..., None]).squeeze(-1)
    valid = targets != IGNORE_INDEX
    weights = torch.exp(-torch.arange(4, dtype=torch.float64) / 2.0).expand(3, 4) * valid
    expected = (ce * weights).sum() / weights.sum()
    torch.testing.assert_close(masked_ce_loss(logits, targets, decay=2.0)[0], expected)
    torch.testing.assert_close(masked_ce_loss(logits, targets)[0], ce[valid].mean())
    with pytest.raises(ValueError, match="decay must be > 0"):
        masked_ce_loss(logits, targets, decay=-1.0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_target_logprobs_equal_the_whole_log_softmax_and_its_gradient(temperature):
    """The chunked log q(x) (losses._TargetLogProbs, rows in chunks) gives the values and the
    gradient of ``log_softmax(logits / T).gather(x)`` over more rows than one chunk, ignored
    targets included; masked_ce and streak built on it equal their plain expressions."""
    from specdiff_lightning.training import losses

    torch.manual_seed(1)
    rows = 2 * losses._ROWS_PER_CHUNK + 5  # three chunks, the last partial
    logits = torch.randn(rows // 5, 5, 11, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (rows // 5, 5))
    targets[::3, 3:] = IGNORE_INDEX
    valid = targets != IGNORE_INDEX
    seed = torch.randn(rows // 5, 5, dtype=torch.float64)

    plain = torch.log_softmax(logits / temperature, -1).gather(-1, targets.clamp_min(0)[..., None])
    plain = plain.squeeze(-1).masked_fill(~valid, 0.0)
    (want,) = torch.autograd.grad((plain * seed).sum(), logits)
    got_values = losses._target_logprobs(logits, targets, temperature)
    (got,) = torch.autograd.grad((got_values * seed).sum(), logits)
    torch.testing.assert_close(got_values, plain)
    torch.testing.assert_close(got, want)

    ce, streak = masked_ce_loss(logits, targets, temperature)
    torch.testing.assert_close(ce, -plain[valid].mean())
    torch.testing.assert_close(streak, torch.exp(torch.cumsum(plain, -1)).mul(valid).sum(-1))


def test_chunked_target_logprobs_of_bf16_logits_are_float32_with_a_bf16_gradient():
    """bf16 logits (autocast's head) are scored in float32; their gradient keeps their dtype."""
    from specdiff_lightning.training import losses

    torch.manual_seed(2)
    logits = torch.randn(4, 3, 9).to(torch.bfloat16).requires_grad_(True)
    targets = torch.randint(0, 9, (4, 3))
    values = losses._target_logprobs(logits, targets, 1.0)
    assert values.dtype == torch.float32
    values.sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    want = torch.log_softmax(logits.detach().float(), -1).gather(-1, targets[..., None]).squeeze(-1)
    torch.testing.assert_close(values, want)
