"""tree='auto': the machine's cost model (cache, stale and corrupt files), the sizing, the fall back
to plain decoding when nodes are expensive, and exactness (greedy identity) over auto-sized trees."""

import json

import pytest
import torch

from helpers import NoisyOracleDrafter, make_pair, reference_greedy
from specdiff_lightning import speculative_generate
from specdiff_lightning.decoding.autotree import AutoTreeDrafter, DraftGate, TreeChoice, choose_tree_size
from specdiff_lightning.decoding.calibration import (
    calibration_key,
    cost_model_for,
    load_cost_model,
    measure_cost_model,
    save_cost_model,
    stale_step,
)
from specdiff_lightning.decoding.config import DecodingConfig
from specdiff_lightning.decoding.costmodel import CostModel, isotonic
from specdiff_lightning.models import tiny_model

#: a one-token step of 10 s: a cost model in which the drafter's *measured* round (a tiny model's
#: forward, milliseconds, more on a loaded machine) is negligible, so the sizing these tests check
#: does not depend on how busy the machine is
SLOW_STEP_MS = 10_000.0


def _flat(step_ms: float, per_node_ms: float, key=None) -> CostModel:
    nodes = [1, 2, 4, 8, 16, 32, 64]
    row = [step_ms + per_node_ms * (n - 1) for n in nodes]
    return CostModel(nodes, [16, 512], [row, row], key or {})


def test_isotonic_makes_a_noisy_cost_curve_non_decreasing():
    assert isotonic([1.0, 1.5, 1.4, 2.0]) == [1.0, 1.45, 1.45, 2.0]
    assert isotonic([3.0, 2.0, 1.0]) == [2.0, 2.0, 2.0]


def test_cost_model_interpolates_and_round_trips():
    cost = _flat(10.0, 1.0)
    assert cost.verifier_cost(1, 100) == pytest.approx(10.0)
    assert cost.verifier_cost(3, 100) == pytest.approx(12.0)
    assert cost.verifier_cost(128, 100) == pytest.approx(137.0)  # extended linearly
    assert CostModel.from_dict(json.loads(json.dumps(cost.to_dict()))) == cost
    with pytest.raises(ValueError, match="start at 1"):
        CostModel([2, 4], [16], [[1.0, 2.0]])


def test_choose_tree_size_pays_only_for_likely_nodes():
    cheap, dear = _flat(10.0, 0.1), _flat(10.0, 20.0)
    probs = [0.9, 0.8, 0.6, 0.3, 0.1, 0.01]
    assert choose_tree_size(probs, cheap, 100, drafting_ms=1.0).nodes >= 4
    plain = choose_tree_size(probs, dear, 100, drafting_ms=1.0)
    assert plain.nodes == 0 and plain.gain < 1.0
    # A slow drafting round (a busy machine) is charged to the drafted trees, not to plain decoding:
    # a tree its own model says is slower than plain decoding is never chosen.
    slow = choose_tree_size([0.6, 0.5], _flat(10.0, 10.0), 16, drafting_ms=40.0)
    assert slow.nodes == 0 and slow.gain < 1.0 and slow.rate == pytest.approx(1 / 10.0)
    assert choose_tree_size([], cheap, 100, drafting_ms=1.0) == TreeChoice(0, 1.0, 1 / 10.0, 0.0)


def test_cost_model_is_measured_once_cached_and_rebuilt_when_stale_or_corrupt(tmp_path):
    model = tiny_model("llama", vocab_size=32, hidden_size=16, num_layers=1)
    kwargs = dict(directory=tmp_path, nodes=(1, 2, 4), contexts=(8,), repeats=1)
    first = cost_model_for(model, **kwargs)
    (path,) = tmp_path.glob("*.json")
    assert load_cost_model(path, calibration_key(model)) == first
    assert cost_model_for(model, **kwargs) is first  # memoised in the process
    other = {**calibration_key(model), "dtype": "bfloat16"}
    assert load_cost_model(path, other) is None  # another dtype's key: not this model's
    path.write_text("{not json")
    with pytest.warns(UserWarning, match="unreadable"):
        assert load_cost_model(path, calibration_key(model)) is None
    rebuilt = cost_model_for(model, refresh=True, **kwargs)
    assert load_cost_model(path, calibration_key(model)) == rebuilt
    stale = {**rebuilt.to_dict(), "version": -1}
    path.write_text(json.dumps(stale))
    with pytest.warns(UserWarning, match="version"):
        assert load_cost_model(path) is None
    save_cost_model(rebuilt, path)  # atomic: no temporary files left behind
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def _cached_copy(source, target, scale: float):
    """The one cost model file in ``source`` copied into ``target`` with every time ``scale``-d."""
    (path,) = source.glob("*.json")
    data = json.loads(path.read_text())
    data["verifier_ms"] = [[v * scale for v in row] for row in data["verifier_ms"]]
    target.mkdir()
    (target / path.name).write_text(json.dumps(data))
    return target / path.name


def test_a_cached_cost_model_slower_than_the_machine_is_measured_again(tmp_path):
    """A calibration taken while another process shared the cores (or on a slower host of the same
    CPU model) would choose every later process's dtype and trees: the machine beating its cached
    step by far rebuilds it. One faster than the machine is now is kept (the machine may be busy
    now, and measuring then would record the load)."""
    model = tiny_model("llama", vocab_size=32, hidden_size=16, num_layers=1)
    kwargs = dict(nodes=(1, 2, 4), contexts=(8,), repeats=1)
    cost_model_for(model, directory=tmp_path / "measured", **kwargs)
    slow = _cached_copy(tmp_path / "measured", tmp_path / "slow", 1000.0)
    cached = load_cost_model(slow, calibration_key(model))
    assert "busy" in stale_step(cached, model)
    with pytest.warns(UserWarning, match="what this machine takes now.*measuring again"):
        rebuilt = cost_model_for(model, directory=tmp_path / "slow", **kwargs)
    assert rebuilt.step_cost(8) < cached.step_cost(8) / 100
    assert load_cost_model(slow, calibration_key(model)) == rebuilt  # the cache holds the new one
    fast = _cached_copy(tmp_path / "measured", tmp_path / "fast", 1e-3)
    kept = load_cost_model(fast, calibration_key(model))
    assert stale_step(kept, model) is None
    assert cost_model_for(model, directory=tmp_path / "fast", **kwargs) == kept


def test_a_measurement_the_machine_beats_at_once_is_taken_again(tmp_path, monkeypatch):
    """A measurement slowed while it ran (another process, a first use's page faults) is checked
    against the machine before it is cached, and measured once more: the cache holds the second."""
    from specdiff_lightning.decoding import calibration

    model = tiny_model("llama", vocab_size=32, hidden_size=16, num_layers=1)
    kwargs = dict(nodes=(1, 2, 4), contexts=(8,), repeats=1)
    measure, calls = calibration.measure_cost_model, []

    def slowed_once(*args, **kw):
        cost = measure(*args, **kw)
        calls.append(cost)
        if len(calls) == 1:  # as if the machine had run 1000x slower during the first measurement
            cost = CostModel(
                cost.nodes, cost.contexts, [[v * 1e3 for v in r] for r in cost.verifier_ms], cost.key
            )
        return cost

    monkeypatch.setattr(calibration, "measure_cost_model", slowed_once)
    with pytest.warns(UserWarning, match="just measured.*what this machine takes now.*measuring again"):
        cost = cost_model_for(model, directory=tmp_path, **kwargs)
    assert len(calls) == 2 and cost == calls[1]
    (path,) = tmp_path.glob("*.json")
    assert load_cost_model(path, calibration_key(model)) == cost


def test_the_memo_follows_the_calibration_directory(tmp_path, monkeypatch):
    """A process that points $SPECDIFF_CALIBRATION_DIR elsewhere reads that directory's file, not
    the cost model it memoised for the first one."""
    model = tiny_model("llama", vocab_size=32, hidden_size=16, num_layers=1)
    kwargs = dict(nodes=(1, 2, 4), contexts=(8,), repeats=1)
    monkeypatch.setenv("SPECDIFF_CALIBRATION_DIR", str(tmp_path / "first"))
    first = cost_model_for(model, **kwargs)
    other = _cached_copy(tmp_path / "first", tmp_path / "second", 1e-3)  # faster: kept, not stale
    monkeypatch.setenv("SPECDIFF_CALIBRATION_DIR", str(tmp_path / "second"))
    read = cost_model_for(model, **kwargs)
    assert read == load_cost_model(other, calibration_key(model)) and read != first


def test_dtype_auto_compares_the_forward_that_will_decode(tmp_path, monkeypatch):
    """Where bf16 is emulated (AVX2-only CPUs) its eager multi-token forwards lose to float32's while
    its compiled ones win: ``in_fastest_dtype`` reads the cost models of the forward asked for. Cached
    compiled files are read without timing the model (that would compile a dtype it may not decode
    in), and that unchecked read is not memoised: the chosen model is checked when it decodes."""
    from specdiff_lightning.decoding import calibration

    monkeypatch.setenv("SPECDIFF_CALIBRATION_DIR", str(tmp_path))
    model = tiny_model("llama", vocab_size=32, hidden_size=16, num_layers=1)

    def cache(dtype, compiled, step_ms, per_node_ms):  # times far below the machine's: never stale
        # a cast copy's key names the kernels chosen for it (cached on disk, as the copy will read)
        as_measured = calibration.in_dtype(model, dtype)
        key = calibration_key(as_measured, compiled=compiled)
        nodes = [1, 2, 4, 8, 16]
        row = [step_ms + per_node_ms * n for n in nodes]
        save_cost_model(CostModel(nodes, [16, 512], [row, row], key), calibration._path(key, None))

    cache(torch.float32, False, 1e-6, 1e-7)
    cache(torch.bfloat16, False, 1e-6, 1.2e-7)  # eager: float32 wins, within COMPILED_DTYPE_MARGIN
    cache(torch.float32, True, 1e-4, 0.0)
    cache(torch.bfloat16, True, 5e-5, 0.0)  # compiled rounds: bf16's cost half (the prefill is eager)
    assert calibration.in_fastest_dtype(model) is model
    chosen = calibration.in_fastest_dtype(model, compiled=True)
    assert chosen is not model and chosen.dtype == torch.bfloat16 and model.dtype == torch.float32
    assert calibration.fastest_dtype(model, compiled=True) == torch.bfloat16
    path = calibration._path(calibration_key(chosen, compiled=True), None)
    assert str(path) not in calibration._MEMO  # unchecked: not memoised


def test_a_dtype_far_slower_eagerly_is_never_compiled_to_be_compared(tmp_path, monkeypatch):
    """Compiling a verifier costs minutes on 2 cores. A dtype whose eager request prices
    COMPILED_DTYPE_MARGIN times the cheapest or more (emulated bf16: 1.74-2.12x on three hosts, stops 40-43) is
    left out: ``in_fastest_dtype(compiled=True)`` returns the one left without compiling it (its
    decode does) and writes no compiled cost model; within the margin both are compared."""
    from specdiff_lightning.decoding import calibration

    monkeypatch.setenv("SPECDIFF_CALIBRATION_DIR", str(tmp_path))
    model = tiny_model("llama", vocab_size=32, hidden_size=16, num_layers=1)
    for dtype, per_node_ms in ((torch.float32, 1e-7), (torch.bfloat16, 4e-7)):
        key = calibration_key(calibration.in_dtype(model, dtype))
        row = [1e-6 + per_node_ms * n for n in (1, 2, 4, 8, 16)]
        save_cost_model(CostModel([1, 2, 4, 8, 16], [16, 512], [row, row], key), calibration._path(key, None))
    prices = {
        d: calibration.dtype_request_cost(cost_model_for(calibration.in_dtype(model, d)))
        for d in (torch.float32, torch.bfloat16)
    }
    assert prices[torch.bfloat16] >= calibration.COMPILED_DTYPE_MARGIN * prices[torch.float32]
    assert calibration.compiled_candidates(prices) == [torch.float32]
    assert calibration.in_fastest_dtype(model, compiled=True) is model
    assert not list(tmp_path.glob("*-compiled-*.json"))  # nothing compiled, nothing measured
    close = {"float32": 1.0, "bfloat16": 1.5}
    assert calibration.compiled_candidates(close) == ["float32", "bfloat16"]
    assert calibration.compiled_candidates({"float32": 1.7, "bfloat16": 1.0}) == ["bfloat16"]


def test_the_compiled_calibration_reports_the_dtypes_it_did_not_compile():
    """Stop 40's AVX2-emulated eager cost models (Zen 4; bf16's request 1.76x float32's): the report compares
    the compiled float32 forward alone and says why bf16 was not compiled."""
    from pathlib import Path

    from specdiff_lightning.bench.calibrate import calibration_report, calibration_table

    run = json.loads((Path(__file__).parents[1] / "fixtures" / "calibration_avx2_emulated.json").read_text())
    eager = {d: CostModel.from_dict(c) for d, c in run["eager"].items()}
    compiled = {"float32": CostModel.from_dict(run["compiled"]["float32"])}
    report = calibration_report(eager, compiled)
    assert report["fastest_dtype"] == "float32" and set(report["request_ms"]) == {"float32"}
    assert set(report["not_compiled"]) == {"bfloat16"} and report["not_compiled"]["bfloat16"] > 1.6
    assert "Not compiled: bfloat16" in calibration_table(report)


def test_a_model_in_another_dtype_is_a_cast_copy_with_that_dtypes_kernels(tmp_path, monkeypatch):
    """What a dtype's cost model measures and what then decodes in it: one function makes it, for
    ``dtype: auto`` and ``bench --calibrate`` alike."""
    from specdiff_lightning.decoding import calibration

    monkeypatch.setenv("SPECDIFF_CALIBRATION_DIR", str(tmp_path))
    model = tiny_model("llama", vocab_size=32, hidden_size=16, num_layers=1)
    assert calibration.in_dtype(model, torch.float32) is model
    cast = calibration.in_dtype(model, torch.bfloat16)
    assert cast is not model and cast.dtype == torch.bfloat16 and model.dtype == torch.float32
    assert hasattr(cast, "linear_kernels") and not hasattr(model, "linear_kernels")
    bare = calibration.in_dtype(model, torch.bfloat16, prepare=False)
    assert bare.dtype == torch.bfloat16 and not hasattr(bare, "linear_kernels")


def test_the_dtype_is_priced_by_a_request_whose_prefill_runs_eagerly():
    """Measured under AVX2 emulation (stop 40): the compiled bf16 forward verifies a 4-node tree
    faster than float32's, and a choice by that forward alone took bf16; but both forwards prefill
    eagerly, where emulated bf16 is compute-bound, and there plain compiled decoding ran 45.9 tok/s
    in bf16 against 48.9 in float32. The request's price (prefill + rounds) chooses float32."""
    from pathlib import Path

    from specdiff_lightning.bench.calibrate import calibration_report
    from specdiff_lightning.decoding.calibration import COMPILED_DTYPE_TREE_NODES, DTYPE_CONTEXT

    run = json.loads((Path(__file__).parents[1] / "fixtures" / "calibration_avx2_emulated.json").read_text())
    eager = {d: CostModel.from_dict(c) for d, c in run["eager"].items()}
    compiled = {d: CostModel.from_dict(c) for d, c in run["compiled"].items()}
    rounds_only = {d: c.verifier_cost(COMPILED_DTYPE_TREE_NODES, DTYPE_CONTEXT) for d, c in compiled.items()}
    assert min(rounds_only, key=rounds_only.get) == "bfloat16"  # the forward alone misleads
    measured = run["measured"]["plain_compiled_tok_s"]
    assert max(measured, key=measured.get) == "float32"
    assert calibration_report(eager, compiled)["fastest_dtype"] == "float32"
    assert calibration_report(eager)["fastest_dtype"] == "float32"


def test_the_machine_names_its_cpu_family_and_model(tmp_path, monkeypatch):
    """Two CPUs a VM names alike ("AMD EPYC": a Zen 1 and a Zen 4) never share a cost model."""
    from specdiff_lightning.decoding import calibration

    info = "model name\t: AMD EPYC\ncpu family\t: 25\nmodel\t\t: 17\nflags\t\t: fpu avx2 avx512f\n"
    (tmp_path / "cpuinfo").write_text(info * 2)  # one block per core
    real = calibration.Path

    def fake_path(p):
        return real(tmp_path / "cpuinfo") if str(p) == "/proc/cpuinfo" else real(p)

    monkeypatch.setattr(calibration, "Path", fake_path)
    calibration._cpuinfo.cache_clear()
    try:
        name, flags = calibration._cpuinfo()
    finally:
        calibration._cpuinfo.cache_clear()
    assert name == "AMD EPYC (family 25 model 17)" and {"avx2", "avx512f"} <= flags


def test_bf16_is_native_only_with_bf16_instructions_at_an_avx512_kernel_level():
    """The Zen 3 of stop 47 (AVX2 only) and the AVX2 emulation on an AMX Xeon (flags present,
    kernels capped) both emulate bf16; a record from before the kernel level was kept goes by flags."""
    from specdiff_lightning.decoding.calibration import native_bf16

    amx = ["avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"]
    assert native_bf16({"cpu_flags": amx, "cpu_capability": "AVX512"})
    assert native_bf16({"cpu_flags": ["avx2", "avx512f", "avx512_bf16"], "cpu_capability": "AVX512"})  # Zen 4
    assert not native_bf16({"cpu_flags": amx, "cpu_capability": "AVX2"})  # the emulation
    assert not native_bf16({"cpu_flags": ["avx2"], "cpu_capability": "AVX2"})  # Zen 1, Zen 3
    assert native_bf16({"cpu_flags": amx}) and not native_bf16({"cpu_flags": ["avx2"]})
    assert not native_bf16({})
    assert isinstance(native_bf16(), bool)  # this machine's


def test_a_measured_cost_model_is_positive_and_non_decreasing():
    model = tiny_model("qwen2", vocab_size=32, hidden_size=16, num_layers=1)
    cost = measure_cost_model(model, nodes=(1, 2, 8), contexts=(4, 16), repeats=2)
    assert cost.key["dtype"] == "float32" and cost.key["machine"]["cpu"]
    for row in cost.verifier_ms:
        assert all(a <= b for a, b in zip(row, row[1:], strict=False)) and row[0] > 0


def test_expensive_nodes_fall_back_to_plain_decoding_and_stay_exact():
    """A cost model in which every node costs a whole step: nothing pays, every round verifies the
    pending token alone, the drafter is skipped after a few rounds, and the output is unchanged."""
    verifier = tiny_model("qwen2", vocab_size=48, seed=3, dtype=torch.float64)
    prompt = torch.tensor([[1, 5, 9, 2, 7]])
    ref = reference_greedy(verifier, prompt, 30)
    drafter = AutoTreeDrafter(NoisyOracleDrafter(verifier, noise=0.3), _flat(10.0, 10.0))
    out = speculative_generate(
        verifier, drafter, prompt, max_new_tokens=30, gamma=6, temperature=0, eos_token_id=[]
    )
    assert torch.equal(out.sequences, ref)
    assert all(r.tree_size == 1 for r in out.stats.rounds)  # plain decoding: the root alone
    assert drafter.counts["drafted"] == 0 and drafter.counts["skipped"] > 0  # the drafter stopped being asked
    # the stats count the drafter's forwards, not the rounds: the skipped rounds ran none
    assert 0 < out.stats.drafter_calls == drafter.drafter_calls < out.stats.verifier_calls


def test_cheap_nodes_grow_trees_and_learn_the_acceptance():
    verifier = tiny_model("qwen2", vocab_size=48, seed=4, dtype=torch.float64)
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    ref = reference_greedy(verifier, prompt, 40)
    # the sizing alone (the gate, which would spend rounds trying the context's drafts alone, is
    # tested apart below)
    drafter = AutoTreeDrafter(
        NoisyOracleDrafter(verifier, noise=0.1), _flat(SLOW_STEP_MS, 0.01), gate_drafter=False
    )
    out = speculative_generate(
        verifier, drafter, prompt, max_new_tokens=40, gamma=6, temperature=0, eos_token_id=[]
    )
    assert torch.equal(out.sequences, ref)
    assert max(r.tree_size for r in out.stats.rounds) > 2 and out.stats.mean_accepted > 1.0
    reached = sum(c[1] for c in drafter.calibration.cells.values())
    assert reached > 0  # it learnt from the verdicts


def test_candidates_over_a_proposals_support_are_those_over_its_full_rows():
    """The drafter's candidates (mode chain, runner-ups, the K drafts) read log q from compact logits
    where the proposal has a support: the same tokens and the same probabilities as from full rows."""
    from specdiff_lightning.decoding.autotree import _Trie
    from specdiff_lightning.decoding.drafting import sample_from_marginals

    gen = torch.Generator().manual_seed(3)
    vocab, width, gamma = 64, 20, 5
    support = torch.randperm(vocab, generator=gen)[:width].sort().values
    small = torch.randn(1, gamma, width, generator=gen, dtype=torch.float64)
    logits = torch.full((1, gamma, vocab), float("-inf"), dtype=torch.float64).index_copy_(2, support, small)
    verifier, drafter = make_pair("llama", "llama", seed=0)
    tries = []
    for given, rows in ((support, small), (None, logits)):
        auto = AutoTreeDrafter(drafter, _flat(SLOW_STEP_MS, 0.01))
        proposal = sample_from_marginals(rows, 4, 1.0, torch.Generator().manual_seed(0), given, vocab)
        trie = _Trie()
        auto._drafter_candidates(trie, proposal)
        tries.append([(n.parent, n.token, n.prob) for n in trie.nodes])
    assert [n[:2] for n in tries[0]] == [n[:2] for n in tries[1]] and len(tries[0]) > gamma
    # log q is taken in float32 (the loop's precision): the sums differ in their order only
    assert [n[2] for n in tries[0]] == pytest.approx([n[2] for n in tries[1]], rel=1e-5)


@pytest.mark.parametrize("pair", [("qwen2", "llama"), ("llama", "qwen2")])
@pytest.mark.parametrize("num_drafts", [1, 4])
def test_auto_trees_of_a_diffusion_drafter_are_greedy_exact(pair, num_drafts):
    verifier, drafter = make_pair(*pair, seed=2)
    prompt = torch.tensor([[4, 8, 15, 16, 23, 4, 8]])
    ref = reference_greedy(verifier, prompt, 32)
    # a cost model where nodes are nearly free: big trees, runner-ups, samples and copies all join
    auto = AutoTreeDrafter(drafter, _flat(SLOW_STEP_MS, 0.01))
    out = speculative_generate(
        verifier, auto, prompt, max_new_tokens=32, gamma=6, num_drafts=num_drafts, draft_temperature=1.5,
        temperature=0, generator=torch.Generator().manual_seed(0), eos_token_id=[],
    )  # fmt: skip
    assert torch.equal(out.sequences, ref)
    assert max(r.tree_size for r in out.stats.rounds) > 6  # a branching tree, not a chain


def test_auto_is_refused_with_rules_that_read_q():
    with pytest.raises(
        ValueError, match=r"acceptance='standard'.*tree: null|acceptance='standard'.*tree=None"
    ):
        DecodingConfig(gamma=4, acceptance="standard")
    DecodingConfig(gamma=4, acceptance="standard", tree=None)  # drafts as drawn: accepted
    verifier, drafter = make_pair("qwen2", "llama", seed=1)
    with pytest.raises(ValueError, match="recursive"):
        speculative_generate(
            verifier, drafter, torch.tensor([[1, 2]]), max_new_tokens=3, gamma=2, acceptance="recursive"
        )
    with pytest.raises(ValueError, match="tree must be"):
        speculative_generate(verifier, drafter, torch.tensor([[1, 2]]), max_new_tokens=3, gamma=2, tree="big")
    with pytest.raises(ValueError, match="lookup"):
        DecodingConfig(gamma=4, lookup=True)


def test_a_decode_slower_than_calibrated_plain_decoding_is_named_with_its_cause():
    from specdiff_lightning.decoding.calibration import SlowerThanPlainWarning, warn_if_slower_than_plain

    model = tiny_model("llama", vocab_size=32, hidden_size=16, num_layers=1)
    assert warn_if_slower_than_plain(1e9, model, 32) is False  # faster than any plain step: silent
    with pytest.warns(
        SlowerThanPlainWarning, match=r"x slower than plain decoding.*rarely accepted.*tree='auto'"
    ):
        assert warn_if_slower_than_plain(1e-3, model, 32, mean_accepted=0.1) is True
    # Measured on the same prompt in the run (a busy machine slows both): compared with that, and a
    # decode that already sized its trees is not told to turn tree='auto' on.
    assert warn_if_slower_than_plain(1e-3, model, 32, plain_tokens_per_s=1e-3) is False
    with pytest.warns(
        SlowerThanPlainWarning, match=r"2.00x slower than plain decoding of the same prompt"
    ) as w:
        warn_if_slower_than_plain(1.0, model, 32, plain_tokens_per_s=2.0, tree_auto=True)
    assert "already falls back to plain decoding" in str(w[0].message) and "use tree=" not in str(
        w[0].message
    )


def test_bench_flags_speculative_rows_slower_than_plain_decoding():
    from specdiff_lightning.bench.run import _speedups

    def row(key, role, tps, accepted=None):
        return {"key": key, "method": key, "role": role, "dtype": "float32", "tokens_per_s": tps,
                "mean_accepted": accepted, "tokens_per_call": None, "warnings": []}  # fmt: skip

    rows = [
        row("hf_generate", "hf_generate", 20.0),
        row("slow", "specdiff2", 15.0, 0.2),
        row("fast", "specdiff2", 30.0),
        row("barely", "specdiff2", 19.95),
    ]
    _speedups(rows)
    assert (
        "slower than plain decoding" in rows[1]["warnings"][0] and "rarely accepted" in rows[1]["warnings"][0]
    )
    assert "1.33x slower" in rows[1]["warnings"][0]
    assert rows[2]["warnings"] == []
    # a row a hair slower is said so in percent, never as "1.00x slower" (a demo printed that)
    assert "is 0.3% slower than hf_generate (20.0)" in rows[3]["warnings"][0]


def test_the_gate_tries_both_arms_then_takes_the_faster_and_still_explores():
    gate = DraftGate(tries=2, explore=4)
    t, length = 0.0, 10

    def round_of(drafted, tokens, ms):
        nonlocal t, length
        gate.start(1, drafted, length, t)
        t, length = t + ms / 1e3, length + tokens
        gate.settle(length, t)

    assert gate.choose(1) is True  # the drafter first
    for _ in range(2):
        round_of(True, 3, 30.0)  # 0.1 tokens/ms
    assert gate.choose(1) is False  # then the context's drafts alone, as often
    for _ in range(2):
        round_of(False, 2, 10.0)  # 0.2 tokens/ms: faster
    picks = [gate.choose(1) for _ in range(8)]
    assert picks.count(False) == 6 and picks.count(True) == 2  # the faster arm, the other every 4th
    assert gate.rate(1, False) == pytest.approx(0.2) and gate.rate(2, True) is None
    gate.start(1, True, length, t)
    gate.clear()  # a new sequence: the gap is not a round
    gate.settle(length + 50, t + 1.0)
    assert gate.rate(1, True) == pytest.approx(0.1)


def test_the_drafters_first_call_in_a_sequence_prices_no_round(monkeypatch):
    """The drafter's first call in a sequence reads the whole prompt (a DFlash drafter's prefix
    cache), whichever round the gate first lets it draft in: it is kept out of the drafting-cost
    estimate and of the gate's rates, which price a typical drafting round."""
    from specdiff_lightning.decoding import autotree

    clock = [0.0]

    def fake_now(device=None):  # time flows with the calls, so every round takes some
        clock[0] += 1e-4
        return clock[0]

    monkeypatch.setattr(autotree, "now", fake_now)

    class SlowFirstRead(NoisyOracleDrafter):
        def reset(self):
            self.read = False

        def propose(self, *args, **kwargs):
            clock[0] += 0.001 if self.read else 1.0  # a 1 s prompt read, then 1 ms a round
            self.read = True
            return super().propose(*args, **kwargs)

    class SkipFirstRound(DraftGate):  # every sequence's first round undrafted, the rest drafted
        def clear(self):
            super().clear()
            self.new = True

        def choose(self, bucket):
            new, self.new = self.new, False
            return not new

    verifier = tiny_model("qwen2", vocab_size=48, seed=4, dtype=torch.float64)
    drafter = AutoTreeDrafter(SlowFirstRead(verifier, noise=0.1), _flat(SLOW_STEP_MS, 0.01))
    drafter.gate = SkipFirstRound()
    for prompt in ([3, 1, 4, 1, 5], [2, 7, 1, 8, 2], [1, 6, 1, 8, 0]):
        prompt = torch.tensor([prompt])
        out = speculative_generate(
            verifier, drafter, prompt, max_new_tokens=24, gamma=4, temperature=0, eos_token_id=[]
        )
        assert torch.equal(out.sequences, reference_greedy(verifier, prompt, 24))
        # each sequence's second round read the prompt: it did not raise the estimate
        assert drafter.counts["drafted"] > 1 and drafter.drafting_ms < 10.0
    drafted = [ms for (_, was_drafted), (_, ms) in drafter.gate.rates.items() if was_drafted]
    assert drafted and max(drafted) < 100.0  # no 1,000 ms round in the drafted arm's rates


def test_a_gated_auto_tree_stays_exact_and_counts_its_rounds():
    verifier = tiny_model("qwen2", vocab_size=48, seed=4, dtype=torch.float64)
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 3, 1, 4]])
    ref = reference_greedy(verifier, prompt, 60)
    drafter = AutoTreeDrafter(NoisyOracleDrafter(verifier, noise=0.1), _flat(SLOW_STEP_MS, 0.01))
    out = speculative_generate(
        verifier, drafter, prompt, max_new_tokens=60, gamma=6, temperature=0, eos_token_id=[]
    )
    assert torch.equal(out.sequences, ref)
    assert drafter.counts["drafted"] > 0 and sum(drafter.gate.rounds.values()) > 0
