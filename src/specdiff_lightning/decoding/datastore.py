"""Corpus copies: what followed the context's last n-gram in a corpus of the verifier's own answers.

Context copies (:mod:`.lookup`) reuse the prompt and the answer so far. A *datastore* extends them
to a corpus, as retrieval drafting does (REST, He et al. 2023): the distillation corpus holds the
verifier's greedy answers to thousands of prompts, so the idioms it writes (``for i in
range(len(``, ``return result``, docstring closers) sit there with their usual continuations. A
round looks up the longest suffix of the context (up to ``max_ngram`` tokens) that occurs in the
corpus, samples up to ``sample`` of its occurrences evenly, and offers the trie of what followed
them, each node with its count. Under ``tree: auto`` those nodes join the drafter's and the
context's in the same verifier forward, rated by calibrated acceptance like every other node
(:mod:`.autotree`); greedy acceptance keeps the output exact whatever is proposed (METHOD.md §4).

The index is a suffix array cut to ``window`` tokens: every corpus position sorted by the
``window`` tokens from it, packed into 64-bit keys (four 16-bit ids a key where the vocabulary
fits 16 bits, as SmolLM2's and Llama-2's do; three 21-bit ids where it does not, as Qwen's and
Llama-3's), so a lookup is two binary searches per key. Building it for 1.1M tokens takes about a
second.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["StoreMatch", "TokenDatastore", "load_datastore"]

#: bits an id is packed in: the narrower where the ids fit (one more key bit per id is the end mark)
_ID_BITS = (16, 21)


@dataclass(frozen=True)
class StoreMatch:
    """A lookup's result: the suffix length matched (``ngram``), the occurrences sampled
    (``total``), and the continuation trie as ``{path: count}`` (``path`` a tuple of token ids; a
    path's count is the number of sampled occurrences followed by it)."""

    ngram: int
    total: int
    counts: dict[tuple[int, ...], int]

    def parent_count(self, path: tuple[int, ...]) -> int:
        """The count of ``path[:-1]`` (``total`` for a one-token path)."""
        return self.total if len(path) == 1 else self.counts[path[:-1]]


class TokenDatastore:
    """A suffix index over token sequences (e.g. a corpus's ``continuation_ids``).

    Args:
        sequences: the token-id sequences; a match never runs across two of them.
        window: the longest suffix a lookup can match (the index's key length).
        source: where the sequences came from (shown in errors and reports).
    """

    def __init__(
        self, sequences: Iterable[Sequence[int]], window: int = 8, source: str = "<sequences>"
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        seqs = [[int(t) for t in seq] for seq in sequences]
        top = max((max(seq) for seq in seqs if seq), default=0)
        low = min((min(seq) for seq in seqs if seq), default=0)
        if low < 0:
            raise ValueError(f"datastore {source}: token ids must be >= 0, found {low}")
        bits = next((b for b in _ID_BITS if top < (1 << b) - 1), None)
        if bits is None:
            raise ValueError(f"datastore {source}: token id {top} exceeds the {_ID_BITS[-1]}-bit packing")
        self._bits, self._per_key = bits, 64 // bits
        #: the id that marks a sequence's end (above every id stored)
        self.end = (1 << bits) - 1
        width = -(-window // self._per_key) * self._per_key  # the window in whole keys
        flat: list[int] = []
        for seq in seqs:
            flat += seq
            flat.append(self.end)
        tokens = np.asarray(flat + [self.end] * width, dtype=np.int64)
        self.source = source
        self.window = window
        self.tokens = tokens
        self.num_tokens = sum(map(len, seqs))
        #: one more than the largest id stored (0 when empty): checked against the verifier's vocabulary
        self.vocab_limit = top + 1 if self.num_tokens else 0
        n = len(tokens) - width
        keys = []
        for k in range(0, width, self._per_key):
            key = np.zeros(n, dtype=np.uint64)
            for j in range(k, k + self._per_key):
                key = (key << np.uint64(bits)) | tokens[j : j + n].astype(np.uint64)
            keys.append(key)
        order = np.lexsort(tuple(reversed(keys)))
        order = order[tokens[order] != self.end]  # positions that start a sequence's suffix
        self._order = order
        self._keys = [key[order] for key in keys]

    def __len__(self) -> int:
        return self.num_tokens

    def _pack(self, ids: Sequence[int], fill: int) -> np.uint64:
        value = 0
        for t in list(ids) + [fill] * (self._per_key - len(ids)):
            value = (value << self._bits) | t
        return np.uint64(value)

    def _range(self, suffix: Sequence[int]) -> tuple[int, int]:
        """Where positions followed by ``suffix`` sit in the sorted order: ``[lo, hi)``."""
        lo, hi = 0, len(self._order)
        for k in range(0, len(suffix), self._per_key):
            part = suffix[k : k + self._per_key]
            keys = self._keys[k // self._per_key][lo:hi]
            lo, hi = (
                lo + int(np.searchsorted(keys, self._pack(part, 0), "left")),
                lo + int(np.searchsorted(keys, self._pack(part, self.end), "right")),
            )
            if hi <= lo:
                break
        return lo, hi

    def lookup(
        self,
        context: Sequence[int],
        depth: int,
        sample: int = 64,
        max_ngram: int | None = None,
        min_ngram: int = 1,
    ) -> StoreMatch | None:
        """The continuations, up to ``depth`` tokens, of the longest suffix of ``context`` (from
        ``max_ngram`` (default: the window) down to ``min_ngram`` tokens) found in the store; up
        to ``sample`` occurrences, spread evenly over all of them. None when no suffix occurs."""
        longest = min(self.window if max_ngram is None else max_ngram, self.window, len(context))
        # a suffix holding an id the store cannot hold never occurs: only the ids after it can match
        for i in range(1, longest + 1):
            if not 0 <= context[-i] < self.end:
                longest = i - 1
                break
        if depth < 1:
            return None
        for n in range(longest, min_ngram - 1, -1):
            lo, hi = self._range(context[len(context) - n :])
            if hi > lo:
                break
        else:
            return None
        picks = np.unique(np.linspace(lo, hi - 1, min(sample, hi - lo)).astype(np.int64))
        starts = self._order[picks] + n
        # past the last sequence's end mark the array holds end marks only: clip, never overrun
        at = np.minimum(starts[:, None] + np.arange(depth)[None, :], len(self.tokens) - 1)
        runs = self.tokens[at].tolist()
        counts: dict[tuple[int, ...], int] = {}
        for run in runs:
            for d, token in enumerate(run):
                if token == self.end:
                    break
                path = tuple(run[: d + 1])
                counts[path] = counts.get(path, 0) + 1
        return StoreMatch(n, len(runs), counts) if counts else None

    @classmethod
    def from_corpus(
        cls,
        path: str | os.PathLike | Sequence[str | os.PathLike],
        field: str = "continuation_ids",
        window: int = 8,
    ) -> TokenDatastore:
        """The ``field`` sequences of one corpus file or several (``.parquet`` or ``.jsonl``
        records, as ``generate-corpus`` writes), in one index: the verifier's answers, by default."""
        paths = _as_paths(path)
        if not paths:
            raise ValueError("datastore: no corpus file given; name one or more, or set datastore to null")
        sequences = [s for p in paths for s in _corpus_sequences(p, field) if s]
        return cls(sequences, window=window, source=" + ".join(str(p) for p in paths))


def _as_paths(path: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """One corpus file or several, as a list of paths."""
    return [Path(path)] if isinstance(path, str | os.PathLike) else [Path(p) for p in path]


def _corpus_sequences(path: Path, field: str) -> list[list[int]]:
    """The ``field`` column of one corpus file; errors name the file (and the line of a JSONL)."""
    if not path.is_file():
        raise FileNotFoundError(
            f"datastore corpus {str(path)!r} does not exist; point decoding.datastore at a corpus "
            f"file (.parquet or .jsonl with {field!r}, as generate-corpus writes), or set it to null"
        )
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        names = pq.read_schema(path).names
        if field not in names:
            raise ValueError(f"datastore corpus {path}: no {field!r} column (it has {names})")
        return pq.read_table(path, columns=[field]).column(field).to_pylist()
    if path.suffix in (".jsonl", ".json"):
        sequences = []
        with open(path, encoding="utf-8") as fh:
            for line_no, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    sequences.append(json.loads(line)[field])
                except (json.JSONDecodeError, KeyError, TypeError) as err:
                    raise ValueError(
                        f"datastore corpus {path}, line {line_no}: not a record with {field!r} ({err})"
                    ) from None
        return sequences
    raise ValueError(f"datastore corpus {path}: expected a .parquet or .jsonl file")


_LOADED: dict[tuple, TokenDatastore] = {}


def load_datastore(
    path: str | os.PathLike | Sequence[str | os.PathLike] | TokenDatastore,
) -> TokenDatastore:
    """The datastore of one corpus file or several (one index over all of them), built once per
    process and file versions (a store passes through)."""
    if isinstance(path, TokenDatastore):
        return path
    resolved = [p.resolve() for p in _as_paths(path)]
    key = tuple(_version(p) for p in resolved)
    if key not in _LOADED:
        _LOADED[key] = TokenDatastore.from_corpus(resolved)
    return _LOADED[key]


def _version(path: Path) -> tuple:
    """A file's identity for the cache: its path, modification time and size (None: missing)."""
    stat = path.stat() if path.is_file() else None
    return str(path), stat.st_mtime_ns if stat else None, stat.st_size if stat else None
