import pytest
import torch
from transformers import DynamicCache

from specdiff_lightning.decoding import TreeVerifier, build_tree, path_probs, tree_attention_allowed
from specdiff_lightning.models import tiny_model


def test_build_tree_merges_shared_prefixes():
    drafts = torch.tensor([[5, 6, 7], [5, 6, 8], [9, 6, 7], [5, 6, 7]])
    tree = build_tree(3, drafts)
    # root, 5, 6, 7, 8 (branch under 5-6), 9, 6, 7 (under 9)
    assert tree.tokens.tolist() == [3, 5, 6, 7, 8, 9, 6, 7]
    assert tree.parents.tolist() == [0, 0, 1, 2, 2, 0, 5, 6]
    assert tree.depth.tolist() == [0, 1, 2, 3, 3, 1, 2, 3]
    assert tree.paths.tolist() == [[1, 2, 3], [1, 2, 4], [5, 6, 7], [1, 2, 3]]
    for i in range(tree.size):
        expected, node = {i}, i
        while node != 0:
            node = int(tree.parents[node])
            expected.add(node)
        assert set(tree.ancestors[i].nonzero().flatten().tolist()) == expected
    assert torch.equal(tree.tokens[tree.paths], drafts)


def test_root_only_tree():
    tree = build_tree(4, torch.empty(1, 0, dtype=torch.long))
    assert tree.size == 1 and tree.ancestors.tolist() == [[True]]
    allowed = tree_attention_allowed(tree, past_length=3)
    assert allowed.shape == (1, 1, 4) and allowed.all()


def _separate_logprobs(model, prefix, draft):
    seq = torch.cat([prefix, draft[None]], dim=1)
    logits = model(input_ids=seq, attention_mask=torch.ones_like(seq)).logits[0]
    return torch.log_softmax(logits[prefix.shape[1] - 1 :], dim=-1)  # [g + 1, V]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_tree_forward_matches_separate_scoring(arch, attn):
    model = tiny_model(arch, vocab_size=32, seed=3, dtype=torch.float64, attn_implementation=attn)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 32, (1, 9), generator=gen)
    drafts = torch.randint(0, 4, (6, 5), generator=gen)  # a small alphabet forces shared prefixes
    state = TreeVerifier(model, prompt)
    tree = build_tree(state.pending, drafts)
    assert tree.size < 1 + drafts.numel()
    with torch.no_grad():
        tree_logp = path_probs(torch.log_softmax(state.score(tree), -1), tree)
        for k in range(drafts.shape[0]):
            separate = _separate_logprobs(model, prompt, drafts[k])
            # eager softmaxes attention in float32 even for float64 models
            tol = 1e-10 if attn == "sdpa" else 1e-5
            torch.testing.assert_close(tree_logp[k], separate, atol=tol, rtol=tol)


@pytest.mark.parametrize("choice", [0, 2, 4])
def test_compacted_cache_equals_fresh_forward(choice):
    model = tiny_model("qwen2", vocab_size=32, seed=4, dtype=torch.float64)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 32, (1, 6), generator=gen)
    drafts = torch.randint(0, 3, (5, 4), generator=gen)
    state = TreeVerifier(model, prompt)
    tree = build_tree(state.pending, drafts)
    with torch.no_grad():
        state.score(tree)
        accepted = 3
        kept = torch.cat([torch.zeros(1, dtype=torch.long), tree.paths[choice, :accepted]])
        state.commit(tree, kept, next_token=7)
        assert state.past_length == prompt.shape[1] + accepted
        # The next round's root-only forward through the compacted cache ...
        nxt = state.score(build_tree(state.pending, torch.empty(1, 0, dtype=torch.long)))[0]
        # ... equals a fresh forward over the whole accepted sequence.
        seq = torch.cat([prompt, drafts[choice, :accepted][None], torch.tensor([[7]])], dim=1)
        fresh = model(input_ids=seq, attention_mask=torch.ones_like(seq)).logits[0, -1]
    torch.testing.assert_close(nxt, fresh, atol=1e-10, rtol=1e-10)


def test_prompt_of_one_token_has_empty_cache():
    model = tiny_model("llama", vocab_size=32, seed=5, dtype=torch.float64)
    state = TreeVerifier(model, torch.tensor([[3]]))
    assert state.past_length == 0 and state.forward_calls == 0
    with torch.no_grad():
        logits = state.score(build_tree(3, torch.tensor([[4, 5]])))
        fresh = model(input_ids=torch.tensor([[3, 4, 5]])).logits[0]
    torch.testing.assert_close(logits, fresh, atol=1e-10, rtol=1e-10)


def test_sliding_window_verifier_is_refused():
    model = tiny_model("qwen2", vocab_size=32, use_sliding_window=True, sliding_window=8, max_window_layers=0)
    cache = DynamicCache(config=model.config)
    if not any(type(layer).__name__ == "DynamicSlidingWindowLayer" for layer in cache.layers):
        pytest.skip("this transformers version builds no sliding-window layers for this config")
    with pytest.raises(ValueError, match="sliding-window"):
        TreeVerifier(model, torch.tensor([[1, 2]]))


class _NoCopy:
    """A TreeProbs that refuses to materialise K·(g+1)·V: rules must gather from the trie rows."""

    def __new__(cls, node_probs, index):
        from specdiff_lightning.decoding.tree import TreeProbs

        class Strict(TreeProbs):
            def dense(self):
                raise AssertionError("TreeProbs materialised")

        return Strict(node_probs, index)


@pytest.mark.parametrize("rule", ["greedy", "recursive", "standard"])
@pytest.mark.parametrize("seed", range(6))
def test_tree_probs_give_the_rules_path_probs_verdicts_without_copying(rule, seed):
    from specdiff_lightning.decoding import get_acceptance_rule, tree_probs

    gen = torch.Generator().manual_seed(seed)
    num_drafts = 1 if rule == "standard" else 5
    drafts = torch.randint(0, 3, (num_drafts, 4), generator=gen)  # small alphabet: shared prefixes
    tree = build_tree(1, drafts)
    node_probs = torch.softmax(torch.randn(tree.size, 6, generator=gen, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(1, 4, 6, generator=gen, dtype=torch.float64), -1).expand(num_drafts, -1, -1)
    dense = path_probs(node_probs, tree)
    lazy = tree_probs(node_probs, tree)
    assert lazy.shape == dense.shape and torch.equal(lazy.dense(), dense)
    assert torch.equal(lazy[2, 3], dense[2 % num_drafts, 3]) if num_drafts > 2 else True
    strict = _NoCopy(node_probs, lazy.index)
    for trial in range(20):
        a = get_acceptance_rule(rule).verify(drafts, q, dense, torch.Generator().manual_seed(trial))
        b = get_acceptance_rule(rule).verify(drafts, q, strict, torch.Generator().manual_seed(trial))
        assert a == b


def test_tree_probs_memory_is_the_trie_rows():
    from specdiff_lightning.decoding import tree_probs

    drafts = torch.zeros(8, 32, dtype=torch.long)  # 8 identical drafts: a 33-node chain
    tree = build_tree(0, drafts)
    lazy = tree_probs(torch.rand(tree.size, 1000), tree)
    assert lazy.node_probs.shape == (33, 1000) and lazy.shape == (8, 33, 1000)
    assert lazy.token_probs(drafts).shape == (8, 32)


def test_build_tree_gives_padding_past_a_shorter_draft_no_node():
    drafts = torch.tensor([[5, 6, 7], [5, 8, 0], [9, 0, 0]])
    tree = build_tree(3, drafts, torch.tensor([3, 2, 1]))
    assert tree.tokens.tolist() == [3, 5, 6, 7, 8, 9]
    assert tree.parents.tolist() == [0, 0, 1, 2, 1, 0]
    # past a draft's end its path repeats its last node
    assert tree.paths.tolist() == [[1, 2, 3], [1, 4, 4], [5, 5, 5]]
    assert tree.ancestors[4].nonzero().flatten().tolist() == [0, 1, 4]
