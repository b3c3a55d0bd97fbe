"""The grouped SDPA kernel for few masked queries equals stock SDPA, and decoding through it stays
identical to the verifier's own greedy decoding."""

import pytest
import torch
from transformers import DynamicCache
from transformers.integrations import sdpa_attention

from helpers import NoisyOracleDrafter, reference_greedy
from specdiff_lightning import speculative_generate
from specdiff_lightning.decoding.attention import GROUPED_SDPA, MAX_GROUPED_QUERIES, to_model_mask
from specdiff_lightning.models import tiny_model
from specdiff_lightning.models.loading import load_verifier


def _never(*args, **kwargs):
    raise AssertionError("repeat_kv called")


def _logits_after_prefix(model, ids, prefix, mask):
    cache = DynamicCache(config=model.config)
    model(input_ids=ids[:, :prefix], cache=cache, use_cache=True)
    q = ids.shape[1] - prefix
    return model(
        input_ids=ids[:, prefix:],
        attention_mask=mask,
        position_ids=torch.arange(prefix, prefix + q)[None],
        cache=cache,
        use_cache=True,
    ).logits


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("queries", [1, 5, MAX_GROUPED_QUERIES + 3])
def test_grouped_sdpa_equals_stock_sdpa_under_a_tree_mask(arch, queries, monkeypatch):
    model = tiny_model(arch, vocab_size=40, seed=2, dtype=torch.float64)
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # grouped-query
    prefix = 9
    ids = torch.randint(0, 40, (1, prefix + queries), generator=torch.Generator().manual_seed(0))
    allowed = torch.ones(1, queries, prefix + queries, dtype=torch.bool)
    # a tree: every query sees the prefix, itself and a random subset of the earlier queries
    tree = torch.rand(queries, queries, generator=torch.Generator().manual_seed(1)) < 0.5
    allowed[0, :, prefix:] = torch.tril(tree, -1) | torch.eye(queries, dtype=torch.bool)
    results = {}
    for impl in ("sdpa", GROUPED_SDPA):
        model.set_attn_implementation(impl)
        if impl == GROUPED_SDPA and queries <= MAX_GROUPED_QUERIES:
            # the grouped path copies no key/value heads (stock SDPA's repeat_kv)
            monkeypatch.setattr(sdpa_attention, "repeat_kv", _never)
        bool_mask = to_model_mask(allowed, model, torch.float64)
        additive = torch.zeros(bool_mask.shape, dtype=torch.float64).masked_fill(~bool_mask, -1e300)
        results[impl] = [_logits_after_prefix(model, ids, prefix, m) for m in (bool_mask, additive)]
    for stock, grouped in zip(results["sdpa"], results[GROUPED_SDPA], strict=True):
        torch.testing.assert_close(grouped, stock, rtol=1e-12, atol=1e-12)


def test_decoding_through_grouped_sdpa_is_identical_to_the_verifier():
    verifier = tiny_model("qwen2", vocab_size=48, seed=6, dtype=torch.float64)
    verifier.set_attn_implementation(GROUPED_SDPA)
    ids = torch.tensor([[2, 7, 1, 5]])
    ref = reference_greedy(verifier, ids, 40)
    for num_drafts in (1, 3):  # trees of up to 1 + 3 * 6 nodes: both sides of the query limit
        out = speculative_generate(
            verifier,
            NoisyOracleDrafter(verifier, noise=0.2),
            ids,
            max_new_tokens=40,
            gamma=6,
            num_drafts=num_drafts,
            temperature=0,
            eos_token_id=[],
        )
        assert torch.equal(out.sequences, ref)


def test_load_verifier_uses_grouped_sdpa_by_default():
    assert load_verifier("tiny-llama").config._attn_implementation == GROUPED_SDPA
    assert load_verifier("tiny-llama", attn_implementation="eager").config._attn_implementation == "eager"
