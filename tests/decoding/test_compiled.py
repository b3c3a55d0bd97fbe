"""The compiled verifier over a static cache (decoding/compiled.py): the same logits as the eager
dynamic-cache verifier round after round, greedy identity and sampling exactness through
``speculative_generate(compile=True)``, its calibration, its warm-up, and its refusals.

One model per dtype is compiled for the whole module (a fixture): each compile costs tens of
seconds on 2 cores, the runs after it milliseconds.
"""

import os
from collections import Counter

import pytest
import torch

from helpers import NoisyOracleDrafter, reference_greedy
from specdiff_lightning import DiffusionDrafter, speculative_generate, verifier_generate
from specdiff_lightning.decoding import TreeVerifier, build_tree
from specdiff_lightning.decoding.compiled import (
    CAPACITY_STEP,
    StaticTreeVerifier,
    cache_capacity,
    compiled_forward,
    warm_compiled,
)
from specdiff_lightning.decoding.config import DecodingConfig
from specdiff_lightning.decoding.kernels import cpp_gemm_available
from specdiff_lightning.models import tiny_model
from specdiff_lightning.testing import chi_square_test, exact_sequence_probs, perturb, sample_counts

VOCAB = 48


@pytest.fixture(scope="module")
def verifier32():
    """float32, as a CPU user compiles; warmed once (every graph the loop runs)."""
    model = tiny_model("llama", vocab_size=VOCAB, seed=11, dtype=torch.float32)
    warm_compiled(model)
    return model


def _rounds(state, gen, rounds=6):
    """Score random trees (shared prefixes, branches; every third a root alone, as plain decoding
    sends) and commit paths that are not contiguous; yields each round's logits."""
    for r in range(rounds):
        drafts = torch.randint(0, 3, (4, 3), generator=gen)  # a small alphabet: a branching trie
        if r % 3 == 0:
            drafts = drafts[:, :0]
        tree = build_tree(state.pending, drafts)
        logits = state.score(tree)
        k = int(torch.randint(0, 4, (1,), generator=gen))
        accepted = int(torch.randint(0, 4, (1,), generator=gen))
        kept = torch.cat([torch.zeros(1, dtype=torch.long), tree.paths[k, :accepted]])
        state.commit(tree, kept, next_token=int(torch.randint(0, VOCAB, (1,), generator=gen)))
        yield logits, tree


def _assert_same_rounds(reference, state, seed: int, tol: float) -> None:
    """``state`` scores and commits the same random rounds as ``reference``: logits and the new
    features equal to ``tol`` round by round, the same lengths."""
    with torch.no_grad():
        for (a, ta), (b, tb) in zip(
            _rounds(reference, torch.Generator().manual_seed(seed)),
            _rounds(state, torch.Generator().manual_seed(seed)),
            strict=True,
        ):
            assert ta.size == tb.size and state.past_length == reference.past_length
            torch.testing.assert_close(b, a, atol=tol, rtol=tol)
            torch.testing.assert_close(state.new_features, reference.new_features, atol=tol, rtol=tol)


def _assert_compiled_decodes_are_greedy_identical(model, prompt, seed: int) -> None:
    """A tree decode and plain decoding through the compiled verifier equal ``generate()``."""
    ref = reference_greedy(model, prompt, 20, eos_token_id=model.generation_config.eos_token_id)
    oracle = NoisyOracleDrafter(model, noise=0.3, seed=seed)
    out = speculative_generate(model, oracle, prompt, max_new_tokens=20, gamma=4, temperature=0, compile=True)
    assert out.sequences.tolist() == ref.tolist()
    plain = verifier_generate(model, prompt, max_new_tokens=20, temperature=0, compile=True)
    assert plain.sequences.tolist() == ref.tolist()


@pytest.mark.parametrize("capacity", [512, 12])
def test_static_cache_verifier_equals_the_dynamic_one(capacity):
    """Eager over the static cache, float64: the same logits and features as TreeVerifier for every
    round, through non-contiguous commits; a capacity of 12 forces the cache to grow mid-decode."""
    model = tiny_model("qwen2", vocab_size=VOCAB, seed=3, dtype=torch.float64)
    prompt = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(0))
    dynamic = TreeVerifier(model, prompt, feature_layers=(0, 2))
    static = StaticTreeVerifier(model, prompt, feature_layers=(0, 2), capacity=capacity, compile=False)
    torch.testing.assert_close(static.new_features, dynamic.new_features, atol=1e-12, rtol=1e-12)
    _assert_same_rounds(dynamic, static, seed=1, tol=1e-10)
    assert static._capacity >= max(capacity, static.past_length)


def test_compiled_verifier_equals_the_eager_one(verifier32):
    """The compiled forward, float32: the eager dynamic-cache logits to float rounding, with the
    features a DFlash drafter reads (all hidden states requested when compiled)."""
    prompt = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(2))
    eager = TreeVerifier(verifier32, prompt, feature_layers=(1, 2))
    compiled = StaticTreeVerifier(verifier32, prompt, feature_layers=(1, 2))
    _assert_same_rounds(eager, compiled, seed=3, tol=1e-4)


def test_compiled_formulations_equal_the_eager_verifier():
    """The other compiled plan (linear layers as ``W @ x^T``, a one-node graph of its own rather
    than a dummy second node): the same logits as the eager verifier round by round, root-only
    rounds included, and greedy identity with generate()."""
    from specdiff_lightning.decoding.kernels import compiled_kernels, use_linear_kernels

    model = tiny_model("qwen2", vocab_size=VOCAB, seed=12, dtype=torch.float32)
    use_linear_kernels(model, {}, {"kernel": "transposed", "one_node": True})
    assert compiled_kernels(model) == {"kernel": "transposed", "one_node": True, "gemm": "stock"}
    prompt = torch.randint(0, VOCAB - 1, (1, 11), generator=torch.Generator().manual_seed(5))
    eager = TreeVerifier(model, prompt, feature_layers=(2,))
    compiled = StaticTreeVerifier(model, prompt, feature_layers=(2,))
    _assert_same_rounds(eager, compiled, seed=6, tol=1e-4)
    _assert_compiled_decodes_are_greedy_identical(model, prompt, seed=1)


@pytest.mark.skipif(
    not cpp_gemm_available(), reason="inductor's C++ GEMM template needs a CPU with AVX2 or better"
)
def test_autotuned_gemms_equal_the_eager_verifier_and_freeze_the_weights():
    """The CPU plan (``gemm: "autotune"``: weights frozen into the graph, every GEMM inductor's C++
    template or ATen's, measured at compile time): float32 logits as the eager verifier's round by
    round, greedy identity with generate(), plain decoding too; a verifier whose weights change
    afterwards is refused, not decoded with the old ones."""
    from specdiff_lightning.decoding.compiled import inductor_options
    from specdiff_lightning.decoding.kernels import use_linear_kernels

    model = tiny_model("llama", vocab_size=VOCAB, seed=13, dtype=torch.float32)
    use_linear_kernels(model, {}, {"kernel": "linear", "one_node": False, "gemm": "autotune"})
    assert (
        inductor_options(model)["freezing"] and inductor_options(tiny_model("llama", vocab_size=VOCAB)) == {}
    )
    prompt = torch.randint(0, VOCAB - 1, (1, 11), generator=torch.Generator().manual_seed(7))
    eager = TreeVerifier(model, prompt, feature_layers=(2,))
    # the compiled rounds run on a static cache, the decodes after them on new ones: none may read
    # an earlier cache (freezing baked the first into the graph before caches were kept plain inputs)
    _assert_same_rounds(eager, StaticTreeVerifier(model, prompt, feature_layers=(2,)), seed=8, tol=1e-4)
    _assert_compiled_decodes_are_greedy_identical(model, prompt, seed=2)
    # another model of the class, its own weights frozen in: its graphs are its own (each compiled
    # model has a code object of its own and no module guards, compiled._own_forward), never the
    # first model's, though they share forward's code and the first is still alive
    other = tiny_model("llama", vocab_size=VOCAB, seed=14, dtype=torch.float32)
    use_linear_kernels(other, {}, {"kernel": "linear", "one_node": False, "gemm": "autotune"})
    assert reference_greedy(other, prompt, 20).tolist() != reference_greedy(model, prompt, 20).tolist()
    _assert_compiled_decodes_are_greedy_identical(other, prompt, seed=3)
    _assert_compiled_decodes_are_greedy_identical(model, prompt, seed=4)
    with torch.no_grad():
        model.lm_head.weight.mul_(1.5)
    with pytest.raises(RuntimeError, match="weights changed.*reload the verifier"):
        verifier_generate(model, prompt, max_new_tokens=4, temperature=0, compile=True)


def test_warmed_verifier_never_compiles_while_decoding(verifier32):
    """warm_compiled compiles every graph the loop runs: a decode after it (chains, trees of every
    size tree: auto picks, plain decoding) compiles nothing, so no timed decode pays a compile."""
    from torch._dynamo.utils import counters

    drafter = NoisyOracleDrafter(verifier32, noise=0.2, seed=0)
    prompt = torch.randint(0, VOCAB - 1, (1, 30), generator=torch.Generator().manual_seed(4))
    # the first tree: auto decode measures the compiled forward's cost model (no new graph either)
    speculative_generate(verifier32, drafter, prompt, max_new_tokens=8, gamma=4, temperature=0, compile=True)
    frames = dict(counters["frames"])  # frames dynamo tried to compile: a cache hit counts none
    for num_drafts in (1, 3, 8):
        speculative_generate(
            verifier32,
            drafter,
            prompt,
            max_new_tokens=20,
            gamma=6,
            num_drafts=num_drafts,
            temperature=0,
            tree=None,
            compile=True,
        )
    verifier_generate(verifier32, prompt, max_new_tokens=5, temperature=0, compile=True)
    assert dict(counters["frames"]) == frames, "a decode after warm_compiled compiled a graph"


def test_a_longer_cache_reuses_the_warmed_graphs(verifier32, monkeypatch):
    """The static cache's length is a dynamic dimension of the warmed graphs: a prompt whose cache
    is longer than any warmed one (and a decode that grows its cache) compiles nothing, and stays
    greedy-identical. Before, each graph was specialised to 512 slots and the first prompt that
    needed more compiled every graph again mid-decode (10 s on SmolLM2, 2-core Xeon)."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(verifier32.config, "max_position_embeddings", 2048)  # RoPE: any position
    drafter = NoisyOracleDrafter(verifier32, noise=0.2, seed=1)
    prompt = torch.randint(0, VOCAB - 1, (1, 600), generator=torch.Generator().manual_seed(5))
    ref = reference_greedy(verifier32, prompt, 20, eos_token_id=verifier32.generation_config.eos_token_id)
    frames = dict(counters["frames"])
    out = speculative_generate(
        verifier32, drafter, prompt, max_new_tokens=20, gamma=4, temperature=0, tree=None, compile=True
    )
    with torch.no_grad():
        state = StaticTreeVerifier(verifier32, prompt[:, :509], capacity=1)
        assert state._capacity == 512
        for _ in range(3):  # the cache grows between two rounds
            tree = build_tree(state.pending, torch.randint(0, VOCAB, (1, 3)))
            state.score(tree)
            state.commit(tree, torch.arange(4), next_token=1)
    assert dict(counters["frames"]) == frames, "a longer cache compiled a graph"
    assert out.sequences.tolist() == ref.tolist()
    assert state._capacity == 512 + CAPACITY_STEP


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compiled_decoding_is_greedy_identical(verifier32, seed):
    """float32 through the compiled forward: token for token the verifier's own generate(), with
    tree: auto (sized from the compiled forward's cost model), drafts as drawn (K = 1 and 4, every
    rule that takes them) and plain decoding."""
    prompt = torch.randint(0, VOCAB - 1, (1, 7 + seed), generator=torch.Generator().manual_seed(seed))
    # EOS as generate() would stop at it (the loops read the verifier's generation_config)
    ref = reference_greedy(verifier32, prompt, 30, eos_token_id=verifier32.generation_config.eos_token_id)
    oracle = NoisyOracleDrafter(verifier32, noise=0.25, seed=seed)
    diffusion = DiffusionDrafter(
        tiny_model("qwen2", vocab_size=VOCAB, seed=100 + seed, dtype=torch.float32),
        mask_token_id=VOCAB - 1,
        shift_logits=True,
    )
    runs = [
        (oracle, dict(tree="auto")),
        (diffusion, dict(tree="auto")),
        (oracle, dict(tree=None, num_drafts=4)),
        (diffusion, dict(tree=None, acceptance="standard")),
        (diffusion, dict(tree=None, acceptance="recursive", num_drafts=4)),
    ]
    for drafter, options in runs:
        out = speculative_generate(
            verifier32, drafter, prompt, max_new_tokens=30, gamma=5, temperature=0, compile=True, **options
        )
        assert out.sequences.tolist() == ref.tolist(), options
    plain = verifier_generate(verifier32, prompt, max_new_tokens=30, temperature=0, compile=True)
    assert plain.sequences.tolist() == ref.tolist()


def test_trees_beyond_the_compiled_graph_compile_another(verifier32):
    """A fixed tree larger than the graph's node range (K = 8 drafts of 10: up to 81 nodes, stock
    SDPA) compiles a graph of its own on first use and stays greedy-identical."""
    prompt = torch.randint(0, VOCAB - 1, (1, 9), generator=torch.Generator().manual_seed(7))
    ref = reference_greedy(verifier32, prompt, 25, eos_token_id=verifier32.generation_config.eos_token_id)
    drafter = NoisyOracleDrafter(verifier32, noise=0.5, seed=7)
    out = speculative_generate(
        verifier32,
        drafter,
        prompt,
        max_new_tokens=25,
        gamma=10,
        num_drafts=8,
        tree=None,
        temperature=0,
        compile=True,
    )
    assert out.sequences.tolist() == ref.tolist()
    assert max(r.tree_size for r in out.stats.rounds) > 64


@pytest.mark.slow
def test_compiled_sampling_is_exact():
    """Sampling through the compiled forward (float64, tree: auto, greedy acceptance, K = 2): the
    first three tokens are distributed as the verifier's, and the same counts reject a 2% bias."""
    prompt, length = torch.tensor([[1, 2, 0]]), 3
    verifier = tiny_model("qwen2", vocab_size=5, seed=0, dtype=torch.float64, hidden_size=16, num_layers=1)
    drafter = DiffusionDrafter(
        tiny_model("llama", vocab_size=5, seed=100, dtype=torch.float64, hidden_size=16, num_layers=1),
        mask_token_id=4,
        shift_logits=True,
    )
    generator = torch.Generator().manual_seed(0)

    def draw():
        out = speculative_generate(
            verifier,
            drafter,
            prompt,
            max_new_tokens=length,
            gamma=length,
            num_drafts=2,
            draft_temperature=1.2,
            generator=generator,
            compile=True,
        )
        return tuple(out.sequences[0, prompt.shape[1] :].tolist())

    counts = sample_counts(draw, 6000)
    probs = exact_sequence_probs(verifier, prompt, length)
    assert chi_square_test(counts, probs).pvalue > 1e-3
    assert chi_square_test(counts, perturb(probs, 0.02)).pvalue < 1e-3
    assert isinstance(counts, Counter) and sum(counts.values()) == 6000


def test_compiled_cost_model_is_its_own(verifier32, tmp_path):
    """tree: auto sizes compiled decodes from the compiled forward's cost: a cost model keyed by the
    forward, cached in a file of its own beside the eager one."""
    from specdiff_lightning.decoding.calibration import calibration_key, cost_model_for

    eager = cost_model_for(verifier32, directory=tmp_path, nodes=(1, 2, 4), contexts=(8, 32), repeats=1)
    compiled = cost_model_for(
        verifier32, directory=tmp_path, compiled=True, nodes=(1, 2, 4), contexts=(8, 32), repeats=1
    )
    assert eager.key["forward"] == "eager" and compiled.key["forward"] == "compiled"
    assert compiled.key == calibration_key(verifier32, compiled=True)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 2 and sum("-compiled-" in n for n in names) == 1, names
    # read back from disk, not measured again
    assert cost_model_for(verifier32, directory=tmp_path, compiled=True) is compiled


def test_cache_capacity_rounds_up_to_its_step():
    """Static caches are sized to what they hold, rounded up to a step (every slot costs attention)."""
    assert cache_capacity(1) == CAPACITY_STEP == cache_capacity(CAPACITY_STEP)
    assert cache_capacity(CAPACITY_STEP + 1) == 2 * CAPACITY_STEP
    assert 5000 <= cache_capacity(5000) < 5000 + CAPACITY_STEP


def test_compiled_forward_is_memoised_per_model(verifier32):
    assert compiled_forward(verifier32) is compiled_forward(verifier32)


def test_bad_compile_values_are_refused(verifier32):
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="compile must be True"):
        verifier_generate(verifier32, prompt, max_new_tokens=2, compile="yes")
    with pytest.raises(ValueError, match="decoding.compile must be true or false"):
        DecodingConfig(gamma=4, compile="auto")
    assert DecodingConfig(gamma=4, compile=True).generate_kwargs()["compile"] is True


def test_sliding_window_verifier_is_refused_when_compiled():
    from transformers import StaticCache

    model = tiny_model("qwen2", vocab_size=32, use_sliding_window=True, sliding_window=8, max_window_layers=0)
    cache = StaticCache(config=model.config, max_cache_len=16)
    if all(type(layer).__name__ == "StaticLayer" for layer in cache.layers):
        pytest.skip("this transformers version builds no sliding-window layers for this config")
    with pytest.raises(ValueError, match="StaticLayer caches only"):
        StaticTreeVerifier(model, torch.tensor([[1, 2]]))


def test_inductor_kernels_are_kept_per_machine(monkeypatch, tmp_path):
    """Compiled kernels go to a directory per machine and kernel level under the cache root, unless
    the user chose one; inductor's own default (which it writes into the environment when lightning
    is imported) is not a choice."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from specdiff_lightning.decoding.calibration import machine_info
    from specdiff_lightning.decoding.compiled import use_machine_inductor_cache

    monkeypatch.setenv("SPECDIFF_CACHE", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    use_machine_inductor_cache()
    chosen = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    assert chosen.startswith(str(tmp_path / "inductor" / machine_info()["cpu_capability"]))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    use_machine_inductor_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")
