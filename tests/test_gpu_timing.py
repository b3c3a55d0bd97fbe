"""scripts/gpu_timing.py runs end to end on CPU at tiny shapes (the GPU run uses real shapes)."""

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "scripts" / "gpu_timing.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_timing", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_timing_runs_at_tiny_shapes(tmp_path, capsys):
    timing = _load()
    out = tmp_path / "timing.json"
    report = timing.main(
        ["--preset", "tiny", "--device", "cpu", "--scored", "1,4,8", "--draft-contexts", "8,24", "--context", "16",
         "--gamma", "3", "--num-drafts", "2", "--new-tokens", "5", "--repeats", "1", "--json", str(out)]
    )  # fmt: skip
    assert json.loads(out.read_text())["preset"] == "tiny"
    assert set(report["verifier_s_by_scored_tokens"]) == {1, 4, 8}
    assert all(t > 0 for t in report["verifier_s_by_scored_tokens"].values())
    assert set(report["drafter_s_by_context"]["uncached"]) == {8, 24}
    assert "cached" not in report["drafter_s_by_context"] or set(
        report["drafter_s_by_context"]["cached"]
    ) == {8, 24}
    assert report["loop"]["rounds"] >= 1 and report["loop"]["per_round_s"] > 0
    speedups = report["projection"]["speedup_by_tokens_per_call"]
    assert list(speedups) == [1, 2, 3, 4] and speedups[4] == 4 * speedups[1]


def test_presets_have_the_published_shapes():
    timing = _load()
    assert timing.SHAPES["qwen2.5-7b"][-1] == 152064 and timing.SHAPES["qwen2.5-0.5b"][-1] == 151936
    assert set(timing.PRESETS) >= {"qwen32b-diffucoder7b", "qwen7b-0.5b", "tiny"}
