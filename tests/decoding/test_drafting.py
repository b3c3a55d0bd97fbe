"""A drafter's decoding head over a subset of the vocabulary (``DraftVocabulary``): the head's own
logits at its ids, -inf elsewhere, whichever ids; the gathered weights follow the head's."""

import pytest
import torch
from torch import nn

from specdiff_lightning.decoding.drafting import DraftVocabulary, head_logits


def _head(vocab=40, width=8, bias=False):
    torch.manual_seed(0)
    return nn.Linear(width, vocab, bias=bias).double()


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("vocab", ["first", "top"])
def test_the_head_scores_its_ids_as_the_full_head_does_and_nothing_else(vocab, bias):
    head = _head(bias=bias)
    rows = torch.randn(3, 8, dtype=torch.float64)
    chosen = (
        DraftVocabulary.first(7, 40)
        if vocab == "first"
        else DraftVocabulary.top([31, 2, 17, 39, 5, 0, 22], 7, 40)
    )
    full = head(rows)
    got = head_logits(head, rows, chosen)
    ids = chosen.ids
    assert got.shape == full.shape
    torch.testing.assert_close(got[:, ids], full[:, ids], rtol=0, atol=1e-12)
    others = torch.ones(40, dtype=torch.bool)
    others[ids] = False
    assert torch.isinf(got[:, others]).all() and (got[:, others] < 0).all()
    assert chosen.contiguous == (vocab == "first")
    # an int is the first ids, and the whole vocabulary is the plain head
    torch.testing.assert_close(
        head_logits(head, rows, 7), head_logits(head, rows, DraftVocabulary.first(7, 40))
    )
    torch.testing.assert_close(head_logits(head, rows, 40), full)


def test_top_fills_a_short_ranking_with_the_other_ids_in_order():
    assert DraftVocabulary.top([9, 4], 5, 12).ids.tolist() == [0, 1, 2, 4, 9]
    assert DraftVocabulary.top([9, 4, 7], 2, 12).ids.tolist() == [4, 9]


def test_the_gathered_rows_follow_a_changed_head():
    head = _head()
    rows = torch.randn(2, 8, dtype=torch.float64)
    chosen = DraftVocabulary.top([5, 30, 11], 3, 40)
    head_logits(head, rows, chosen)
    with torch.no_grad():
        head.weight.mul_(2)  # trained, or reloaded in place
    torch.testing.assert_close(head_logits(head, rows, chosen)[:, [5, 11, 30]], head(rows)[:, [5, 11, 30]])


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: DraftVocabulary([3, 3], 10), "repeat"),
        (lambda: DraftVocabulary([10], 10), r"\[0, 10\)"),
        (lambda: DraftVocabulary([], 10), r"\[0, 10\)"),
        (lambda: DraftVocabulary.first(0, 10), "head_vocab=0"),
        (lambda: DraftVocabulary.top([1], 11, 10), "head_vocab=11"),
    ],
)
def test_bad_vocabularies_are_clear_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("temperature", [0.0, 1.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_drafts_from_compact_logits_are_the_full_rows_drafts(dtype, temperature):
    """Logits over a draft vocabulary only (compact, with their support): the argmax over them (ties
    included: the first maximum) or the draws at T > 0 give the same tokens and q as the full rows,
    -inf elsewhere, do; the proposal keeps them compact and gives the full rows back."""
    from specdiff_lightning.decoding.drafting import expand_support, sample_from_marginals

    gen = torch.Generator().manual_seed(0)
    vocab, width = 60, 17
    support = torch.randperm(vocab, generator=gen)[:width].sort().values
    compact = torch.randint(-2, 2, (2, 5, width), generator=gen).to(dtype)  # many ties
    logits = torch.full((2, 5, vocab), float("-inf"), dtype=dtype).index_copy_(2, support, compact)
    assert torch.equal(expand_support(compact, support, vocab), logits)
    fast = sample_from_marginals(compact, 3, temperature, torch.Generator().manual_seed(1), support, vocab)
    full = sample_from_marginals(logits, 3, temperature, torch.Generator().manual_seed(1))
    assert torch.equal(fast.tokens, full.tokens) and torch.equal(fast.probs, full.probs)
    assert fast.probs.dtype == full.probs.dtype and torch.equal(fast.logits, compact)
    assert torch.equal(fast.full_logits(), logits) and torch.equal(full.full_logits(), logits)
    assert torch.equal(fast.truncate(2).support, support) and fast.pad_to(7).support is fast.support
    with pytest.raises(ValueError, match="vocab_size"):
        sample_from_marginals(compact, 3, temperature, support=support)
    first = torch.arange(width)  # ids [0, n): padded rather than scattered
    assert torch.equal(
        expand_support(compact, first, vocab)[..., width:],
        torch.full((2, 5, vocab - width), float("-inf"), dtype=dtype),
    )
