"""Block-causal diffusion drafters: the prefix KV cache is exact, training sees what decoding sees."""

import pytest
import torch

from helpers import reference_greedy
from specdiff_lightning import DiffusionDrafter, speculative_generate
from specdiff_lightning.models import tiny_model
from specdiff_lightning.models.diffusion import block_causal_allowed

VOCAB = 48


def _drafter(arch="llama", attention="block_causal", impl="sdpa", shift=True, **kw):
    model = tiny_model(arch, vocab_size=VOCAB, seed=3, dtype=torch.float64, attn_implementation=impl)
    return DiffusionDrafter(model, mask_token_id=VOCAB - 1, shift_logits=shift, attention=attention, **kw)


def test_block_causal_mask_shape():
    allowed = block_causal_allowed(past=2, num_new=2, gamma=3)
    assert allowed.shape == (5, 7)
    assert allowed[:, :2].all()  # everyone sees the cache
    assert allowed[0, 2] and not allowed[0, 3]  # prefix rows are causal
    assert not allowed[:2, 4:].any()  # the prefix never sees the masks
    assert allowed[2:, 2:].all()  # masks see the new prefix tokens and each other


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("shift", [True, False])
def test_cached_window_logits_equal_uncached(impl, shift):
    cached = _drafter(impl=impl, shift=shift)
    assert cached.prefix_cache
    uncached = DiffusionDrafter(cached.model, VOCAB - 1, shift, attention="block_causal", prefix_cache=False)
    # transformers' eager attention softmaxes in float32 even for float64 models.
    tol = 1e-9 if impl == "sdpa" else 1e-5
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB - 1, (1, 5), generator=gen)
    cached.reset()
    for step in range(6):  # growing prefix: 1-3 new tokens per round, like accepted drafts
        with torch.no_grad():
            a = cached.draft_logits(ids, 4)
            b = uncached.draft_logits(ids, 4)
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
        ids = torch.cat([ids, torch.randint(0, VOCAB - 1, (1, 1 + step % 3), generator=gen)], dim=1)
    # A prefix that is not an extension of the cached one (a new prompt) rolls the cache back.
    other = torch.cat([ids[:, :3], torch.randint(0, VOCAB - 1, (1, 4), generator=gen)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(
            cached.draft_logits(other, 4), uncached.draft_logits(other, 4), rtol=tol, atol=tol
        )


@pytest.mark.parametrize("shift", [True, False])
def test_blocks_logits_match_per_window_forwards(shift):
    drafter = _drafter(shift=shift)
    gen = torch.Generator().manual_seed(1)
    clean = torch.randint(0, VOCAB - 1, (2, 12), generator=gen)
    starts = torch.tensor([[1, 4, 9], [2, 5, 12]])
    with torch.no_grad():
        blocks = drafter.blocks_logits(clean, starts, 3)
        for b in range(2):
            for m in range(3):
                t = int(starts[b, m])
                ref = drafter.draft_logits(clean[b : b + 1, :t], 3)
                torch.testing.assert_close(blocks[b, m], ref[0], rtol=1e-9, atol=1e-9)


def test_bidirectional_prefix_cache_is_an_opt_in_approximation_and_decoding_stays_lossless():
    verifier = tiny_model("qwen2", vocab_size=VOCAB, seed=0, dtype=torch.float64)
    exact = _drafter(attention="bidirectional")
    assert not exact.prefix_cache
    approx = _drafter(attention="bidirectional", prefix_cache=True)
    ids = torch.randint(0, VOCAB - 1, (1, 6), generator=torch.Generator().manual_seed(2))
    ref = reference_greedy(verifier, ids, 20)
    for drafter in (exact, approx, _drafter()):
        out = speculative_generate(
            verifier, drafter, ids, max_new_tokens=20, gamma=4, num_drafts=3, temperature=0
        )
        assert torch.equal(out.sequences, ref)


def test_block_causal_needs_a_stock_model():
    class Remote(torch.nn.Module):
        config = tiny_model("llama", vocab_size=VOCAB).config

    with pytest.raises(ValueError, match="stock transformers model"):
        DiffusionDrafter(Remote(), VOCAB - 1, True, attention="block_causal")
