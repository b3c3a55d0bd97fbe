"""bench: every decoding method side by side, reports and plots."""

import pytest
import torch

from helpers import TINY_VOCAB, tiny_distillation, write_prompts
from specdiff_lightning.bench import default_methods, run_bench, sweep_methods, write_report
from specdiff_lightning.data import PromptDataModule
from specdiff_lightning.models import AutoregressiveDrafter, tiny_model


@pytest.mark.slow
def test_bench_runs_every_method_and_writes_reports(tmp_path):
    model = tiny_distillation()
    data = PromptDataModule(benchmark="prompts", path=str(write_prompts(tmp_path, n=3)))
    data.setup("predict")
    ar = AutoregressiveDrafter(
        tiny_model("qwen2", vocab_size=TINY_VOCAB, hidden_size=16, num_layers=1, seed=3, dtype=torch.float64)
    )
    cfg = model.decoding
    methods = default_methods(cfg, with_ar=True) + sweep_methods(cfg, [1, 2], [1.0], [2, 4], [1, 2])
    report = run_bench(
        model.verifier, model.drafter, data.rows, cfg, methods, ar_drafter=ar, profile=True, progress=False
    )
    kinds = {r["kind"] for r in report["rows"]}
    assert kinds == {"verifier", "hf", "hf_prompt_lookup", "hf_assisted", "sps", "diffusion"}
    assert all(r["identical_to_verifier"] for r in report["rows"])  # temperature 0: all lossless
    assert all(0 <= r["profile"]["overhead"] < 1 for r in report["rows"] if "profile" in r)
    out = write_report(report, tmp_path / "bench")
    for name in (
        "bench.json",
        "bench.md",
        "positional_acceptance.png",
        "speedup_vs_k.png",
        "speedup_vs_gamma.png",
    ):
        assert (out / name).stat().st_size > 0
    assert "| SpecDiff-2 (K=4, greedy) |" in (out / "bench.md").read_text()


def test_drafter_cost_curve_of_a_dflash_drafter():
    """The demo's cost curve for the shipped design: the drafter's cached round (the new tokens'
    features plus the block) and its training forward over the whole context, beside a verifier step."""
    from specdiff_lightning import DFlashDrafter
    from specdiff_lightning.bench.cost import drafter_cost_curve
    from specdiff_lightning.models import tiny_model

    verifier = tiny_model("llama", vocab_size=400, num_layers=3)
    drafter = DFlashDrafter.build(verifier, 1, (0, 2), 399, block_size=5)
    rows = drafter_cost_curve(verifier, drafter, [16, 32], gamma=4, repeats=1)
    assert [r["context"] for r in rows] == [16, 32]
    assert all(
        r[k] > 0 for r in rows for k in ("verifier_step_ms", "drafter_cached_ms", "drafter_uncached_ms")
    )


def test_bench_rows_shape_their_trees_only_as_their_own_settings_say():
    from specdiff_lightning.bench.methods import BenchMethod, setting_methods
    from specdiff_lightning.bench.runners import method_config
    from specdiff_lightning.decoding.config import DecodingConfig

    tree = {"min_confidence": 0.1, "siblings": [0]}
    (row,) = setting_methods([{"num_drafts": 1, "tree": tree, "lookup": True, "key": "shaped"}])
    assert row.key == "shaped" and "adaptive tree" in row.name and "+lookup" in row.name
    run = DecodingConfig(gamma=4, tree={"min_confidence": 0.5}, lookup={"num_lookups": 3})
    shaped = method_config(run, row)
    assert shaped.tree == tree and shaped.lookup is True
    plain = method_config(run, BenchMethod("K=2", "diffusion", {"num_drafts": 2}))
    assert plain.tree is None and plain.lookup is False and plain.num_drafts == 2
    # the row's drafts as drawn: the run's shape does not leak into the loop's own sizing either
    assert plain.generate_kwargs()["tree"] is None and "lookup" not in plain.generate_kwargs()


@pytest.mark.parametrize("k", [1, 2, 4])
def test_default_rows_have_one_key_each_at_every_k(k):
    """Issue 19, blocker 4: at K=1 the run's greedy row and the K=1 greedy row were two rows with
    one key; every row's key is unique whatever K, sweeps and settings the run has."""
    from specdiff_lightning.bench.methods import extra_drafter_methods, setting_methods
    from specdiff_lightning.decoding.config import DecodingConfig

    cfg = DecodingConfig(gamma=4, num_drafts=k)
    methods = default_methods(cfg, with_ar=True) + sweep_methods(
        cfg, [1, 2, 4, 8], [1.0, 1.5], [2, 4], [1, 2]
    )
    methods += setting_methods([{"num_drafts": 1, "draft_temperature": 0.0}, {"num_drafts": 1, "tree": {}}])
    methods += extra_drafter_methods("undistilled", cfg)
    keys = [m.key for m in methods]
    assert len(keys) == len(set(keys)), keys
    assert "specdiff2_k1" in keys and f"specdiff2_k{k}" in keys


def test_a_repeated_settings_row_is_refused_naming_the_fix():
    from specdiff_lightning.bench.methods import setting_methods

    model = tiny_distillation()
    rows = setting_methods([{"num_drafts": 2}, {"num_drafts": 2}])
    with pytest.raises(ValueError, match=r"name more than one row; give a repeated `settings` row a `key`"):
        run_bench(model.verifier, model.drafter, [{"id": "a", "prompt_ids": [1, 2]}], model.decoding, rows)


def test_repeats_past_the_first_run_only_where_the_measured_time_fits(tmp_path):
    """``budget_s``: the first repeat always runs; a later one only where its rows' measured first
    repeat fits what is left. Each row reports the repeats it got, the report and bench.md the cut."""
    from specdiff_lightning.bench.methods import BenchMethod

    model = tiny_distillation()
    prompts = [{"id": "a", "prompt_ids": [1, 2, 3]}, {"id": "b", "prompt_ids": [4, 5]}]
    rows = [BenchMethod("verifier", "verifier", key="v"), BenchMethod("HF generate", "hf", key="hf")]

    def bench(budget_s):
        return run_bench(
            model.verifier,
            model.drafter,
            prompts,
            model.decoding,
            rows,
            repeats=3,
            progress=False,
            budget_s=budget_s,
        )

    free = bench(None)
    assert [r["repeats"] for r in free["rows"]] == [3, 3] and free["repeats_cut"] is None
    tight = bench(0.0)
    assert [r["repeats"] for r in tight["rows"]] == [1, 1]
    assert tight["repeats_cut"]["after_repeat"] == 1 and tight["repeats_cut"]["needed_s"] > 0
    text = (write_report(tight, tmp_path / "bench") / "bench.md").read_text()
    assert "Repeats stopped after repeat 1" in text and "x1 |" in text
    # where its time went, the untimed work included: the budget's reader sees what it paid for
    assert set(tight["phases_s"]) == {"compile", "warmup", "references", "timed", "score"}
    assert "Where the bench's" in text and "timed passes" in text


def test_references_no_row_decodes_are_decoded_before_the_timed_passes():
    """A dtype without an eager HF generate row has its greedy references decoded before the timed
    passes (so a budget's check before a later repeat has paid for them), and its rows are still
    compared with them."""
    from specdiff_lightning.bench.methods import BenchMethod

    model = tiny_distillation()
    prompts = [{"id": "a", "prompt_ids": [1, 2, 3]}, {"id": "b", "prompt_ids": [4, 5]}]
    rows = [BenchMethod("verifier", "verifier", key="v")]
    report = run_bench(model.verifier, model.drafter, prompts, model.decoding, rows, progress=False)
    (row,) = report["rows"]
    assert row["identical_to_verifier"] and row["identical_rate"] == 1
    phases = list(report["phases_s"])
    assert phases.index("references") < phases.index("timed")


@pytest.mark.parametrize("bad", [dict(repeats=0), dict(repeats=1.5), dict(warmup=-1)])
def test_repeats_and_warmup_out_of_range_are_refused(bad):
    from specdiff_lightning.bench.methods import BenchMethod

    model = tiny_distillation()
    rows = [BenchMethod("verifier", "verifier", key="v")]
    with pytest.raises(ValueError, match="repeats >= 1 and warmup >= 0"):
        run_bench(
            model.verifier, model.drafter, [{"id": "a", "prompt_ids": [1, 2]}], model.decoding, rows, **bad
        )


@pytest.mark.slow
@pytest.mark.parametrize("gemm", ["stock", "autotune"])
def test_the_compiled_peer_runs_on_its_own_copy_and_matches_generate(gemm):
    """Issue 17: HF generate with a static cache and torch.compile, warmed up past its recompiles, on
    a copy of the verifier (no other row runs a compiled model); float32 output equals generate().
    With the CPU plan (weights frozen, inductor's GEMMs) the copy compiles as our verifier does, and
    a longer prompt (transformers makes a new, larger static cache) still decodes right: no cache's
    tensors are baked into the graph."""
    from types import SimpleNamespace

    from specdiff_lightning.bench.runners import _hf_compiled, compiled_copy, hf_generate
    from specdiff_lightning.decoding.compiled import inductor_options
    from specdiff_lightning.decoding.config import DecodingConfig
    from specdiff_lightning.decoding.kernels import cpp_gemm_available, use_linear_kernels
    from specdiff_lightning.models import tiny_model

    if gemm == "autotune" and not cpp_gemm_available():
        pytest.skip("inductor's C++ GEMM template needs a CPU with AVX2 or better")
    verifier = tiny_model("llama", vocab_size=64, hidden_size=32, num_layers=1, seed=3)
    use_linear_kernels(verifier, {}, {"gemm": gemm})
    model, seconds = compiled_copy(verifier)
    assert model is not verifier and seconds > 0 and compiled_copy(verifier)[0] is model
    assert bool(inductor_options(model)) == (gemm == "autotune")
    cfg = DecodingConfig(gamma=4, max_new_tokens=12)
    for length in (5, 9, 30):
        ids = torch.arange(1, length + 1)[None]
        compiled = _hf_compiled(SimpleNamespace(verifier=verifier), None, cfg, ids, None, None)
        assert compiled == hf_generate(verifier, ids, cfg)
    assert getattr(verifier, "_compiled_call", None) is None  # the shared verifier stays eager


def test_hf_dflash_and_our_loop_decode_with_the_same_dflash_drafter():
    """Issue 18: the ``hf_dflash`` row (transformers' generate(speculation_type="dflash")) and our
    loop's rows run the same DFlash drafter side by side; both greedy-identical to the verifier."""
    from specdiff_lightning.bench.methods import BenchMethod
    from specdiff_lightning.decoding.config import DecodingConfig
    from specdiff_lightning.models import DFlashDrafter

    verifier = tiny_model("llama", vocab_size=48, num_layers=3, seed=0, dtype=torch.float64)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        dflash = DFlashDrafter.build(verifier, 1, (0, 2), 47, block_size=5)
    cfg = DecodingConfig(gamma=4, max_new_tokens=10, temperature=0.0, draft_temperature=0.0)
    rows = [
        BenchMethod("verifier", "verifier", key="verifier"),
        BenchMethod("HF DFlash", "hf_dflash", key="hf_dflash", drafter="dflash"),
        BenchMethod("ours, chain", "diffusion", {"num_drafts": 1}, key="dflash_k1", drafter="dflash"),
        BenchMethod("ours, tree: auto", "diffusion", {"tree": "auto"}, key="dflash_auto", drafter="dflash"),
    ]
    prompts = [{"id": str(i), "prompt_ids": [1 + i, 5, 9, 2]} for i in range(2)]
    report = run_bench(
        verifier, None, prompts, cfg, rows, extra_drafters={"dflash": dflash}, warmup=0, progress=False
    )
    by_key = {r["key"]: r for r in report["rows"]}
    assert by_key["hf_dflash"]["role"] == "hf_dflash"
    assert all(r["identical_to_verifier"] for r in report["rows"])
    with pytest.raises(ValueError, match="needs a DFlash drafter"):
        ar = AutoregressiveDrafter(
            tiny_model("llama", vocab_size=48, num_layers=1, seed=2, dtype=torch.float64)
        )
        run_bench(
            verifier,
            None,
            prompts[:1],
            cfg,
            rows[1:2],
            extra_drafters={"dflash": ar},
            warmup=0,
            progress=False,
        )
