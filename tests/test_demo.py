"""The built-in pair: shipped assets, the stdlib corpus split, and the demo pipeline (smoke preset)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from specdiff_lightning.data.stdlib import build_stdlib_corpus, is_heldout
from specdiff_lightning.demo import check_targets, run_demo

ROOT = Path(__file__).parents[1]
ASSETS = ROOT / "assets" / "demo"


def test_shipped_verifier_is_small_and_loads():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    weights = ASSETS / "verifier" / "model.safetensors"
    assert weights.stat().st_size <= 30 * 2**20
    tok = AutoTokenizer.from_pretrained(ASSETS / "tokenizer")
    model = AutoModelForCausalLM.from_pretrained(ASSETS / "verifier", dtype=torch.float32)
    assert model.config.vocab_size == len(tok) and tok.mask_token_id is not None
    assert model.generation_config.eos_token_id == tok.eos_token_id


def test_stdlib_split_is_by_top_level_module(tmp_path):
    counts = build_stdlib_corpus(tmp_path)
    assert counts["train"] > 5 * counts["heldout"] > 0 and counts["prompts"] > 20
    held = {json.loads(line)["id"] for line in (tmp_path / "heldout.jsonl").read_text().splitlines()}
    train = {json.loads(line)["id"] for line in (tmp_path / "train.jsonl").read_text().splitlines()}
    assert not {m.split("/")[0] for m in held} & {m.split("/")[0] for m in train}
    assert all(is_heldout(m) for m in held)
    prompt = json.loads((tmp_path / "prompts.jsonl").read_text().splitlines()[0])
    assert prompt["id"].split(":")[0] in held
    assert '"""' in prompt["prompt"] or "'''" in prompt["prompt"]


@pytest.mark.slow
def test_demo_smoke_preset_end_to_end(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # configs/ and assets/ are read from the repository root
    assert run_demo(preset="smoke", root=str(tmp_path / "demo")) == 0
    for name in ("bench.json", "bench.md", "targets.md", "positional_acceptance.png"):
        assert (tmp_path / "demo" / name).stat().st_size > 0
    report = json.loads((tmp_path / "demo" / "bench.json").read_text())
    assert all(r["identical_to_verifier"] is not False for r in report["rows"])
    assert "lossless" in check_targets(report)
    # a rerun reuses every finished stage
    assert run_demo(preset="smoke", root=str(tmp_path / "demo")) == 0


def test_smollm2_rows_name_shipped_drafters_and_unique_keys():
    from specdiff_lightning.bench.methods import ROLES
    from specdiff_lightning.demo.smollm2 import _DRAFTERS, SMOL_PRESETS, smollm2_methods

    rows = smollm2_methods(SMOL_PRESETS["smollm2"])
    keys = [r.key for r in rows]
    assert len(keys) == len(set(keys))
    names = {name for name, _ in _DRAFTERS}
    for row in rows:
        assert row.role in ROLES
        if row.kind in ("diffusion", "hf_dflash"):
            assert (row.drafter or "main") in names, row.key
        if row.drafter == "dflash" and row.kind == "diffusion":  # SpecDiff-2 itself: the targets read it
            assert row.role == "specdiff2", row.key
    # issue 18: HF's DFlash loop and ours with the same DFlash weights, side by side
    assert {
        "hf_dflash_bf16",
        "specdiff2_dflash_auto_bf16",
        "specdiff2_dflash_auto_store_bf16",
        "specdiff2_dflash_auto_store_fp32",
        "specdiff2_dflash_auto_store_compiled_bf16",
        "specdiff2_dflash_k1_bf16",
        "specdiff2_dflash_k1_lookup_bf16",
        "specdiff2_dflash_k4_bf16",
    } <= set(keys)
    assert all(r.drafter == "dflash" for r in rows if "dflash" in r.key)
    # one feature-reading design (issue 18 item 3): the retired conditioned drafter has no rows
    assert not any(name == "conditioned" for name in names) and not any("_fc_" in k for k in keys)
    # the corpus copies: the shipped corpus, on the shipped pair's default rows, and an ablation
    # without them
    store_rows = [r for r in rows if r.decoding.get("datastore")]
    assert {r.key for r in store_rows} >= {
        "specdiff2_dflash_auto_store_bf16",
        "specdiff2_dflash_auto_store_fp32",
    }
    assert all(r.decoding["tree"] == "auto" for r in store_rows)
    assert all(Path(f).is_file() for r in store_rows for f in r.decoding["datastore"])
    # every float32 row of our loops is there to prove exactness: each has a bf16 twin that is timed
    assert {k.removesuffix("_fp32") for k in keys if k.endswith("_fp32")} - {"hf_generate", "verifier"} <= {
        k.removesuffix("_bf16") for k in keys
    }


def test_compiled_rows_run_in_the_compiled_forwards_fastest_dtype():
    """Where bf16 is emulated the eager forward's fastest dtype is float32 and the compiled one's can
    be bf16: the compiled rows run in the latter, the eager speed rows in the former, and our compiled
    plain decoding in every dtype loaded (the denominator is the fastest plain decoding of any)."""
    from specdiff_lightning.demo.smollm2 import SMOL_PRESETS, smollm2_methods

    p = SMOL_PRESETS["smollm2"]
    keys = {m.key: m for m in smollm2_methods(p, "float32", fast_compiled="bfloat16")}
    assert {"hf_generate_compiled_bf16", "specdiff2_dflash_auto_store_compiled_bf16"} <= set(keys)
    assert not {"hf_generate_compiled_fp32", "specdiff2_dflash_auto_store_compiled_fp32"} & set(keys)
    assert {"verifier_compiled_fp32", "verifier_compiled_bf16"} <= set(keys)
    assert {"hf_prompt_lookup_fp32", "specdiff2_dflash_auto_fp32"} <= set(keys)
    assert not {"hf_prompt_lookup_bf16", "specdiff2_dflash_auto_bf16"} & set(keys)
    # without a compiled choice, "fast" is the one dtype of every row
    same = {m.key for m in smollm2_methods(p, "bfloat16")}
    assert "specdiff2_dflash_auto_store_compiled_bf16" in same and "hf_generate_compiled_fp32" not in same


def test_compiled_rows_run_only_in_the_dtypes_the_run_compiled():
    """Where emulated bf16's eager request prices 1.6x float32's or more, the demo compiles float32
    alone: no compiled row asks for a bf16 forward that was never compiled (stop 43: 445 s of
    compiles on both), while the eager rows keep their dtypes."""
    from specdiff_lightning.demo.smollm2 import SMOL_PRESETS, smollm2_methods

    p = SMOL_PRESETS["smollm2"]
    keys = {
        m.key for m in smollm2_methods(p, "float32", fast_compiled="float32", compiled_dtypes=("float32",))
    }
    assert {
        "verifier_compiled_fp32",
        "hf_generate_compiled_fp32",
        "specdiff2_dflash_auto_store_compiled_fp32",
    } <= keys
    assert not {k for k in keys if "compiled" in k and k.endswith("_bf16")}
    both = {m.key for m in smollm2_methods(p, "float32", fast_compiled="float32")}
    assert both - keys == {"verifier_compiled_bf16"}


def test_the_smollm2_demo_is_sized_from_the_calibration_to_its_budget():
    """Issue 17: at least 10 problems x 128 tokens on any CPU; fewer repeats, then no ablations, where
    steps are slow; more problems where they are fast."""
    from specdiff_lightning.demo.smollm2 import (
        SMOL_PRESETS,
        estimate_seconds,
        size_to_budget,
        smollm2_methods,
    )

    p = replace(SMOL_PRESETS["smollm2"], bench_budget_s=900.0)  # stop 41's budget with the compiles
    full = smollm2_methods(p, "bfloat16")
    fast, problems, plan = size_to_budget(full, p, {"float32": 1.0, "bfloat16": 1.0})
    assert fast == full and problems == p.max_problems and not plan["reductions"]
    # an AVX2-only CPU: float32 is the fast dtype and a step costs ~80 ms
    slow_rows = smollm2_methods(replace(p, dtypes=("float32",)), "float32")
    rows, problems, plan = size_to_budget(slow_rows, replace(p, dtypes=("float32",)), {"float32": 80.0})
    assert problems >= p.problems and plan["reductions"]
    # what a slow machine keeps: the plain peers and the shipped pair's default decoding (tree: auto
    # with the corpus's continuations), eager and compiled; the corpus's ablation may go
    kept = {"hf_generate_fp32", "hf_generate_compiled_fp32", "specdiff2_dflash_auto_store_fp32"}
    assert len(rows) < len(slow_rows) and kept | {"specdiff2_dflash_auto_store_compiled_fp32"} <= {
        r.key for r in rows
    }
    assert estimate_seconds(rows, p, {"float32": 80.0}, problems) < estimate_seconds(
        slow_rows, p, {"float32": 80.0}, problems
    )


def test_the_demo_drops_the_dflash_ablations_before_rows_that_targets_compare():
    """The sliced drafter's K=1 / K=4 / MDM rows feed two targets; the DFlash ablations (copies,
    K=4) feed none, so a slow machine loses them first."""
    from specdiff_lightning.demo.smollm2 import SMOL_PRESETS, size_to_budget, smollm2_methods

    p = replace(SMOL_PRESETS["smollm2"], bench_budget_s=900.0)  # stop 41's budget with the compiles
    full = smollm2_methods(p, "bfloat16")
    ablations = {"specdiff2_dflash_k1_lookup_bf16", "specdiff2_dflash_k4_bf16"} & {m.key for m in full}
    compared = {"specdiff2_k1_bf16", "specdiff2_k4_bf16", "mdm_k1_bf16"} & {m.key for m in full}
    assert ablations and compared
    seen_partial = False
    for step in (x / 4 for x in range(40, 240)):  # 10-60 ms, finely: the window is narrow
        keys = {m.key for m in size_to_budget(full, p, {"float32": step, "bfloat16": step})[0]}
        if not compared <= keys:
            assert not ablations & keys, step
        seen_partial |= not ablations & keys and compared <= keys
    assert seen_partial  # some budget keeps the compared rows and only drops the ablations


def test_the_headline_rows_keep_their_repeats_longest():
    """The compiled peer and the best (compiled) row, whose ratio the speed target reads, never lose
    a repeat to the estimate (the bench runs their later repeats where the measured time allows:
    tests/bench): at every budget where any row keeps two, they keep theirs."""
    from specdiff_lightning.demo.smollm2 import SMOL_PRESETS, size_to_budget, smollm2_methods

    p = replace(SMOL_PRESETS["smollm2"], bench_budget_s=900.0)  # stop 41's budget with the compiles
    full = smollm2_methods(p, "bfloat16")
    headline = {"hf_generate_compiled_bf16", "specdiff2_dflash_auto_store_compiled_bf16"}
    assert headline <= {m.key for m in full}
    seen_alone = False
    for step in range(10, 120, 5):
        rows = size_to_budget(full, p, {"float32": float(step), "bfloat16": float(step)})[0]
        repeats = {m.key: p.repeats if m.repeats is None else m.repeats for m in rows}
        if max(repeats.values()) > 1:
            assert all(repeats[k] >= 2 for k in headline), step
        seen_alone |= all(repeats[k] >= 2 for k in headline) and repeats["hf_generate_bf16"] == 1
    assert seen_alone  # some budget keeps repeats for the headline pair only


def test_a_host_whose_compiles_take_most_of_the_budget_keeps_a_second_headline_pass():
    """Stop 41 (AMX Xeon): compiles left 343 s of the 900, and the first pass of every row took
    them, so the 2.10x was one pass. The estimate now counts two headline passes: rows read only as
    an eager twin of a compiled one go (our eager plain loop, the defaults' bf16 row eager), the
    compiled plain row of the dtype the calibration did not choose runs once (at 600 s) and at 343
    s goes (the last reduction: the estimate is still over), and every row a target reads stays
    (the peers, the chain, the float32 exactness row)."""
    from specdiff_lightning.demo.smollm2 import SMOL_PRESETS, size_to_budget, smollm2_methods

    p = replace(SMOL_PRESETS["smollm2"], bench_budget_s=343.0)
    steps = {"float32": 48.3, "bfloat16": 46.7, "compiled_float32": 37.5, "compiled_bfloat16": 24.5}
    rows = size_to_budget(smollm2_methods(p, "bfloat16", fast_compiled="bfloat16"), p, steps)[0]
    repeats = {m.key: p.repeats if m.repeats is None else m.repeats for m in rows}
    headline = (
        "hf_generate_compiled_bf16",
        "verifier_compiled_bf16",
        "specdiff2_dflash_auto_store_compiled_bf16",
    )
    assert all(repeats[k] == p.repeats for k in headline)
    assert "verifier_compiled_fp32" not in repeats
    roomier = replace(p, bench_budget_s=600.0)
    rows = size_to_budget(smollm2_methods(roomier, "bfloat16", fast_compiled="bfloat16"), roomier, steps)[0]
    assert {m.key: m.repeats for m in rows}["verifier_compiled_fp32"] == 1
    assert not {"verifier_fp32", "specdiff2_dflash_auto_store_bf16"} & set(repeats)
    read = {"hf_generate_fp32", "hf_generate_bf16", "hf_dflash_bf16", "hf_prompt_lookup_bf16"}
    assert read | {"specdiff2_dflash_k1_bf16", "specdiff2_dflash_auto_store_fp32"} <= set(repeats)


def test_the_bench_gets_what_the_deadline_leaves():
    """Stop 42's AVX2-emulated demo took 20:53: its bench had 900 s less the compiles, whatever the
    install, loading and the cost curve had taken. It now gets what the deadline (from `make demo`'s
    start) leaves when it starts, capped by an explicit budget; none left is the minimum run."""
    from specdiff_lightning.demo.smollm2 import SMOL_PRESETS, bench_budget

    p = SMOL_PRESETS["smollm2"]
    assert p.deadline_s is not None and p.deadline_s < 20 * 60
    assert bench_budget(p, 700.0) == pytest.approx(p.deadline_s - 700.0)
    assert bench_budget(p, p.deadline_s + 5) == 0.0
    assert bench_budget(replace(p, bench_budget_s=100.0), 700.0) == 100.0
    assert bench_budget(replace(p, deadline_s=None, bench_budget_s=None), 700.0) is None
    assert bench_budget(SMOL_PRESETS["smollm2-smoke"], 700.0) is None  # the smoke run: as given


def test_where_nothing_else_fits_the_unchosen_dtypes_compiled_plain_row_goes():
    """Last of the reductions: our compiled plain loop in the dtype the compiled calibration did not
    choose (its forward is priced in the calibration table); the chosen dtype's row and every
    row a target reads stay. Above that budget it stays."""
    from specdiff_lightning.demo.smollm2 import SMOL_PRESETS, size_to_budget, smollm2_methods

    steps = {"float32": 53.2, "bfloat16": 43.1, "compiled_float32": 42.4, "compiled_bfloat16": 38.2}
    p = replace(SMOL_PRESETS["smollm2"], bench_budget_s=1.0)
    full = smollm2_methods(p, "float32", fast_compiled="float32")
    keys = {m.key for m in size_to_budget(full, p, steps)[0]}
    assert "verifier_compiled_bf16" not in keys and "verifier_compiled_fp32" in keys
    assert {
        "hf_generate_compiled_fp32",
        "hf_generate_fp32",
        "specdiff2_dflash_auto_store_compiled_fp32",
    } <= keys
    roomy = {m.key for m in size_to_budget(full, replace(p, bench_budget_s=900.0), steps)[0]}
    assert "verifier_compiled_bf16" in roomy


def test_compiled_rows_are_estimated_at_the_compiled_step():
    """A compiled row decodes at the compiled forward's step where the demo measured it (counted at
    the eager step, about twice as long on a CPU, the estimate cut rows the budget had room for)."""
    from specdiff_lightning.demo.smollm2 import SMOL_PRESETS, estimate_seconds, smollm2_methods

    p = SMOL_PRESETS["smollm2"]
    full = smollm2_methods(p, "bfloat16")
    compiled = [m for m in full if m.kind == "hf_compiled" or m.decoding.get("compile")]
    eager = {"float32": 55.0, "bfloat16": 52.0}
    assert compiled
    both = {**eager, "compiled_float32": 27.5, "compiled_bfloat16": 26.0}  # each dtype's own
    assert {m.dtype for m in compiled} == {"float32", "bfloat16"}  # our compiled plain loop in both
    assert estimate_seconds(compiled, p, both, 10) == pytest.approx(
        estimate_seconds(compiled, p, eager, 10) / 2
    )
    eager_rows = [m for m in full if m not in compiled]
    assert estimate_seconds(eager_rows, p, both, 10) == estimate_seconds(eager_rows, p, eager, 10)


def test_the_speed_targets_follow_the_machine_class_torch_kernels_use():
    """Issue 17: >= 2.0x plain and >= 1.2x prompt lookup with fast bf16; >= 1.3x plain (and not
    losing to prompt lookup) on the AVX2 class."""
    from specdiff_lightning.demo.smollm2 import smollm2_targets

    def bounds(machine):
        targets = {t.name: t.bound for t in smollm2_targets(4, machine)}
        plain = next(b for n, b in targets.items() if n.startswith("best SpecDiff-2 vs the fastest plain"))
        return plain, targets["best SpecDiff-2 vs fastest HF prompt lookup"]

    flags = ["avx2", "avx512f", "avx512_bf16"]
    assert bounds({"cpu_flags": flags, "cpu_capability": "AVX512"}) == (2.0, 1.2)
    assert bounds({"cpu_flags": flags, "cpu_capability": "AVX2"}) == (1.3, 1.0)  # the AVX2 emulation
    assert bounds({"cpu_flags": ["avx2"], "cpu_capability": "AVX2"}) == (1.3, 1.0)


def test_the_speed_targets_divide_by_the_fastest_plain_decoding_of_any_kind():
    """Our compiled plain decoding is plain decoding too: where it beats HF's compiled generate, the
    speed-up targets divide by it (a stricter denominator, never a weaker one)."""
    from specdiff_lightning.bench.targets import check_targets
    from specdiff_lightning.demo.smollm2 import smollm2_targets

    def row(key, role, tps):
        return {"key": key, "method": key, "role": role, "sweep": None, "tokens_per_s": tps}

    report = {
        "fast_dtype": "bfloat16",
        "rows": [
            row("hf_generate_compiled_bf16", "hf_generate", 27.4),
            row("verifier_compiled_bf16", "verifier", 31.3),
            row("specdiff2_dflash_auto_store_bf16", "specdiff2", 33.0),
            row("specdiff2_dflash_auto_store_compiled_bf16", "specdiff2", 66.5),
        ],
    }
    machine = {"cpu_flags": ["avx512_bf16"], "cpu_capability": "AVX512"}
    _, results = check_targets(report, smollm2_targets(4, machine)[:2])
    assert [round(r["figure"], 3) for r in results] == [round(66.5 / 31.3, 3), round(33.0 / 31.3, 3)]
    assert all(r["reference"][1] == "verifier_compiled_bf16" for r in results)


def test_never_slower_reads_the_row_load_pair_runs_at_its_defaults():
    """Issue 17's "never slower" is about ``load_pair(...).generate`` at its defaults, not the
    fastest row: the target reads the ``tree: auto`` + corpus row in the run's fast dtype, compiled
    where the run records that ``compile="auto"`` compiles (``pair_defaults``), eager in a report
    from before that record; and that row decodes with the shipped pair's settings."""
    from specdiff_lightning.bench.targets import check_targets
    from specdiff_lightning.decoding.config import DecodingConfig
    from specdiff_lightning.demo.smollm2 import SMOL_PRESETS, smollm2_methods, smollm2_targets
    from specdiff_lightning.pairs import SHIPPED_PAIRS

    def row(key, role, tps):
        return {"key": key, "method": key, "role": role, "sweep": None, "tokens_per_s": tps}

    report = {
        "fast_dtype": "bfloat16",
        "rows": [
            row("hf_generate_compiled_bf16", "hf_generate", 50.0),
            row("specdiff2_dflash_auto_store_bf16", "specdiff2", 49.0),
            row("specdiff2_dflash_auto_store_fp32", "specdiff2", 30.0),
            row("specdiff2_dflash_auto_store_compiled_bf16", "specdiff2", 100.0),
        ],
    }
    target = smollm2_targets(4, {"cpu_flags": []})[1:2]
    (result,) = check_targets(report, target)[1]
    assert result["value"][1] == "specdiff2_dflash_auto_store_bf16" and result["figure"] == 49.0 / 50.0
    assert result["met"]
    for compiles, key in (
        (True, "specdiff2_dflash_auto_store_compiled_bf16"),
        (False, "specdiff2_dflash_auto_store_bf16"),
    ):
        (result,) = check_targets({**report, "pair_defaults": {"compile": compiles}}, target)[1]
        assert result["value"][1] == key
    # bf16 emulated: the eager forward's fastest dtype is float32, the compiled one's bf16, and the
    # compiled defaults decode in the compiled one's (load_pair's dtype "auto" compares that forward)
    emulated = {
        **report,
        "fast_dtype": "float32",
        "fast_compiled_dtype": "bfloat16",
        "rows": [*report["rows"], row("specdiff2_dflash_auto_store_compiled_fp32", "specdiff2", 80.0)],
    }
    for compiles, key in (
        (True, "specdiff2_dflash_auto_store_compiled_bf16"),
        (False, "specdiff2_dflash_auto_store_fp32"),
    ):
        (result,) = check_targets({**emulated, "pair_defaults": {"compile": compiles}}, target)[1]
        assert result["value"][1] == key

    p = SMOL_PRESETS["smollm2"]
    spec = SHIPPED_PAIRS["smollm2-135m-instruct"]
    for compiles, key in (
        (True, "specdiff2_dflash_auto_store_compiled_bf16"),
        (False, "specdiff2_dflash_auto_store_bf16"),
    ):
        (method,) = [m for m in smollm2_methods(p) if m.key == key]
        bench_cfg = DecodingConfig(max_new_tokens=p.max_new_tokens, gamma=p.gamma, **method.decoding)
        pair_cfg = DecodingConfig(max_new_tokens=p.max_new_tokens, **spec.decoding, compile=compiles)
        fields = ("gamma", "acceptance", "tree", "num_drafts", "draft_temperature", "lookup", "compile")
        assert {f: getattr(bench_cfg, f) for f in fields} == {f: getattr(pair_cfg, f) for f in fields}
        assert [Path(f).name for f in method.decoding["datastore"]] == [Path(f).name for f in spec.datastore]
    assert p.head_vocab == spec.drafter_options["head_vocab"]


def test_the_defaults_note_states_the_first_calls_compile():
    from specdiff_lightning.demo.smollm2 import _defaults_note

    note = _defaults_note({"compile": True, "first_call_compile_s": 188.4})
    assert "compiled forward in each dtype" in note and "188 s in this run" in note
    assert "decode eagerly here" in _defaults_note({"compile": False, "first_call_compile_s": None})
