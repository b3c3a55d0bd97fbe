"""Benchmark prompt loaders (MATH-500, HumanEval, GPQA, MT-Bench) on local files."""

import json

import pytest

from specdiff_lightning.data import CorpusError, load_benchmark


def test_benchmark_loaders_read_local_files(tmp_path):
    files = {
        "math500": {"problem": "1+1?", "answer": "2", "unique_id": "m/1"},
        "humaneval": {"task_id": "HumanEval/0", "prompt": "def f():\n"},
        "gpqa": {
            "Question": "Q?",
            "Correct Answer": "yes",
            "Incorrect Answer 1": "a",
            "Incorrect Answer 2": "b",
            "Incorrect Answer 3": "c",
        },
        "mt_bench": {"question_id": 81, "prompt": ["Write a poem.", "Shorter."]},
    }
    for name, row in files.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text(json.dumps(row) + "\n")
        (rec,) = load_benchmark(name, str(path))
        assert rec["id"] and rec["prompt"]
    assert "\\boxed{}" in load_benchmark("math500", str(tmp_path / "math500.jsonl"))[0]["prompt"]
    gpqa = load_benchmark("gpqa", str(tmp_path / "gpqa.jsonl"))[0]
    assert f"({gpqa['answer']}) yes" in gpqa["prompt"]
    assert load_benchmark("mt_bench", str(tmp_path / "mt_bench.jsonl"))[0]["prompt"] == "Write a poem."
    with pytest.raises(CorpusError, match="missing field"):
        load_benchmark("math500", str(tmp_path / "humaneval.jsonl"))
    with pytest.raises(CorpusError, match="does not exist"):
        load_benchmark("gpqa", str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match="unknown benchmark"):
        load_benchmark("mmlu")
