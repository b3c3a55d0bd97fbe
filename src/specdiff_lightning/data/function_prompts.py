"""Code prompts at scale, disjoint from HumanEval: functions with docstrings from the interpreter's
standard library (its training modules, :func:`~.stdlib.is_heldout` excluded) and installed packages.

A prompt is a function's header and docstring; the verifier writes the body. Disjointness from the
benchmarks we report is checked, not assumed (:func:`humaneval_disjoint`): a prompt is dropped when
its function's name is a HumanEval entry point or when it shares any 8-gram of words with a HumanEval
prompt or canonical solution.
"""

from __future__ import annotations

import importlib.util
import re
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from .stdlib import _function_prompts, is_heldout, stdlib_files

__all__ = ["function_prompts", "humaneval_disjoint", "PACKAGES", "NGRAM"]

#: installed packages whose functions join the standard library's (all dependencies of this project,
#: so every machine that runs it has them, at the versions the Makefile pins)
PACKAGES = ("torch", "transformers", "datasets", "lightning", "jinja2", "click", "dateutil", "jsonargparse")
#: the n of the word n-gram overlap check
NGRAM = 8

_WORD = re.compile(r"\w+")


def _package_files(name: str) -> list[tuple[str, Path]]:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return []
    root = Path(next(iter(spec.submodule_search_locations)))
    skip = {"tests", "test", "testing", "_vendor", "__pycache__"}
    return sorted(
        (f"{name}/{f.relative_to(root)}", f)
        for f in root.rglob("*.py")
        if not (skip & set(f.relative_to(root).parts))
    )


def function_prompts(
    packages: Sequence[str] = PACKAGES, max_chars: int = 900, limit: int | None = None, stdlib: bool = True
) -> list[dict]:
    """``[{"id", "prompt"}]``: header + docstring of every documented function (at least 3 body
    lines, at most ``max_chars`` of prompt) in the standard library's training modules and
    ``packages``, spread deterministically over modules (ordered by a hash of the id), then cut to
    ``limit``. Not yet filtered against HumanEval: see :func:`humaneval_disjoint`."""
    files = [(m, f) for m, f in stdlib_files() if not is_heldout(m)] if stdlib else []
    for name in packages:
        files += _package_files(name)
    out, seen = [], set()
    for module, path in files:
        try:
            source = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for p in _function_prompts(module, source):
            # The same function vendored twice (copies across packages) is one prompt.
            if len(p["prompt"]) <= max_chars and p["prompt"] not in seen:
                seen.add(p["prompt"])
                out.append({"id": p["id"], "prompt": p["prompt"]})
    out.sort(key=lambda p: (zlib.crc32(p["id"].encode()), p["id"]))
    return out[:limit]


def _ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    words = _WORD.findall(text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def humaneval_disjoint(
    prompts: Iterable[dict], problems: Sequence[dict] | None = None, n: int = NGRAM
) -> tuple[list[dict], dict]:
    """``prompts`` less any that overlap HumanEval, and a report ``{"kept", "dropped_name",
    "dropped_ngram", "ngram"}``. ``problems``: HumanEval's (default: the installed wheel's).

    Overlap: the prompt's function name is a HumanEval ``entry_point``, or the prompt shares a word
    ``n``-gram (lower-cased ``\\w+`` runs) with any problem's prompt or canonical solution."""
    if problems is None:
        from .humaneval import load_humaneval

        problems = load_humaneval()
    names = {p["entry_point"] for p in problems}
    grams: set[tuple[str, ...]] = set()
    for p in problems:
        grams |= _ngrams(p["prompt"] + "\n" + p.get("canonical_solution", ""), n)
    kept, by_name, by_gram = [], 0, 0
    for p in prompts:
        match = re.search(r"def\s+(\w+)", p["prompt"])
        if match and match.group(1) in names:
            by_name += 1
        elif _ngrams(p["prompt"], n) & grams:
            by_gram += 1
        else:
            kept.append(p)
    return kept, {"kept": len(kept), "dropped_name": by_name, "dropped_ngram": by_gram, "ngram": n}
