"""Distillation corpus records: reading JSONL / Parquet / text files, validated line by line.

A record is a (prompt, continuation) pair, either as token ids
``{"prompt_ids": [...], "continuation_ids": [...]}`` or as text ``{"prompt": "...",
"continuation": "..."}`` (an optional ``"id"`` travels along). A ``.txt`` file holds one document
per line: an empty prompt and the line as continuation. Bad records are reported with file and
line and either skipped or raised, as configured.

Parquet and text files stream through ``datasets.load_dataset(..., streaming=True)``. JSONL is read
line by line here instead: ``datasets``' JSON builder parses blocks with pyarrow and casts them to
one schema, so a malformed or mistyped line fails the whole file without naming the line, where
the corpus tools skip (or report) exactly that record.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "CorpusError",
    "iter_records",
    "expand_files",
    "validate_record",
    "validate_prompt_record",
    "read_jsonl",
    "SUFFIXES",
]

log = logging.getLogger(__name__)

SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}


class CorpusError(ValueError):
    """A corpus file or record is unusable; the message names the file, line and fix."""


def expand_files(data_files: str | list[str]) -> list[str]:
    """Expand globs/directories into a sorted list of corpus files; fail clearly when none exist."""
    patterns = [data_files] if isinstance(data_files, (str, os.PathLike)) else list(data_files)
    files: list[str] = []
    for pattern in patterns:
        path = Path(pattern)
        if path.is_dir():
            files += sorted(str(p) for p in path.iterdir() if p.suffix in SUFFIXES)
        elif any(ch in str(pattern) for ch in "*?["):
            files += sorted(glob.glob(str(pattern), recursive=True))
        elif path.is_file():
            files.append(str(path))
        else:
            raise CorpusError(
                f"corpus file {pattern!r} does not exist; write it first (`generate-corpus`, or the "
                f"command in the recipe's header) or point the data module's files at an existing corpus"
            )
    unknown = [f for f in files if Path(f).suffix not in SUFFIXES]
    if unknown:
        raise CorpusError(f"unsupported corpus file type: {unknown[:3]}; use one of {sorted(SUFFIXES)}")
    if not files:
        raise CorpusError(
            f"no corpus files match {patterns}; generate one with `generate-corpus` or fix the path"
        )
    return files


def _is_id_list(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    )


def validate_record(record, where: str) -> dict:
    """Return a normalised record or raise :class:`CorpusError` naming ``where`` (file:line)."""
    if not isinstance(record, dict):
        raise CorpusError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "continuation_ids" in record:
        prompt, cont = record.get("prompt_ids", []), record["continuation_ids"]
        if not _is_id_list(prompt) or not _is_id_list(cont):
            raise CorpusError(
                f"{where}: 'prompt_ids' and 'continuation_ids' must be lists of non-negative ints"
            )
        if not cont:
            raise CorpusError(f"{where}: empty continuation")
        out = {"prompt_ids": prompt, "continuation_ids": cont}
    elif "continuation" in record:
        prompt, cont = record.get("prompt", ""), record["continuation"]
        if not isinstance(prompt, str) or not isinstance(cont, str):
            raise CorpusError(f"{where}: 'prompt' and 'continuation' must be strings")
        if not cont.strip():
            raise CorpusError(f"{where}: empty continuation")
        out = {"prompt": prompt, "continuation": cont}
    else:
        raise CorpusError(
            f"{where}: a record needs 'continuation_ids' (token ids) or 'continuation' (text); got keys {sorted(record)}"
        )
    out["id"] = str(record.get("id", where))
    return out


def validate_prompt_record(record, where: str) -> dict:
    """Return ``record`` when it is a usable prompt (``prompt``: non-empty text, or ``prompt_ids``:
    non-empty token ids), else raise :class:`CorpusError` naming ``where`` and what it lacks."""
    if not isinstance(record, dict):
        raise CorpusError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if record.get("prompt_ids") is not None:
        ids = record["prompt_ids"]
        if not (_is_id_list(ids) and ids):
            raise CorpusError(f"{where}: 'prompt_ids' must be a non-empty list of non-negative ints")
    elif record.get("prompt") is not None:
        if not isinstance(record["prompt"], str) or not record["prompt"].strip():
            raise CorpusError(f"{where}: 'prompt' must be non-empty text")
    else:
        keys = sorted(k for k, v in record.items() if v is not None)
        raise CorpusError(
            f"{where}: a prompt record needs 'prompt' (text) or 'prompt_ids' (token ids); got keys {keys}"
        )
    return record


def read_jsonl(path: str | os.PathLike) -> Iterator[tuple[object, str]]:
    """``(value, "file:line")`` for every line of a JSONL file, in order: the parsed JSON, None for a
    blank line, or a :class:`CorpusError` naming the line for malformed JSON (yielded, not raised, so
    a reader that skips bad records goes on)."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            if not line.strip():
                yield None, where
                continue
            try:
                yield json.loads(line), where
            except json.JSONDecodeError as err:
                yield CorpusError(f"{where}: malformed JSON ({err.msg} at column {err.colno})"), where


def _streamed(kind: str, path: str) -> Iterator[dict]:
    """Rows of one file in order, streamed by ``datasets`` (no cache, no conversion pass)."""
    from datasets import load_dataset
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    yield from load_dataset(kind, data_files=[path], split="train", streaming=True)


def _raw_records(path: str) -> Iterator[tuple[object, str]]:
    kind = SUFFIXES[Path(path).suffix]
    if kind == "parquet":
        for row, record in enumerate(_streamed("parquet", path), start=1):
            yield record, f"{path}:row {row}"
        return
    if kind == "text":
        for lineno, record in enumerate(_streamed("text", path), start=1):
            if record["text"].strip():  # blank lines separate documents; they are not errors
                yield {"prompt": "", "continuation": record["text"]}, f"{path}:{lineno}"
        return
    yield from read_jsonl(path)


def iter_records(files: list[str], on_error: str = "skip") -> Iterator[dict]:
    """Yield valid records from ``files`` in order.

    Args:
        on_error: ``"skip"`` logs a warning naming file and line and goes on; ``"raise"`` stops.
    """
    if on_error not in ("skip", "raise"):
        raise ValueError(f"on_error must be 'skip' or 'raise', got {on_error!r}")
    for path in files:
        for raw, where in _raw_records(path):
            try:
                if raw is None:
                    raise CorpusError(f"{where}: empty line")
                if isinstance(raw, CorpusError):
                    raise raw
                yield validate_record(raw, where)
            except CorpusError as err:
                if on_error == "raise":
                    raise
                log.warning("skipping bad corpus record: %s", err)
