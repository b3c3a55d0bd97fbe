"""Whole sequences (prompt ⊕ verifier continuation) for training drafters cut from their verifier.

Unlike the window corpus of streak-distillation (one (prefix, gamma targets) pair per example), each
example here is one record; the training module cuts many windows out of it in one forward
(``DiffusionDrafter.blocks_logits``). Records come from the same validated corpus files
(``data/records.py``: JSONL with ``prompt_ids`` / ``continuation_ids``).
"""

from __future__ import annotations

import functools
import random
import zlib
from collections import Counter

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from ..feature_store import FeatureStore
from .records import CorpusError, expand_files, iter_records

__all__ = ["SequenceDataModule", "collate_sequences", "answer_token_ranking"]


def _is_val(record_id: str, val_percent: int) -> bool:
    return zlib.crc32(record_id.encode()) % 100 < val_percent


class _Sequences(IterableDataset):
    def __init__(self, files, split, val_percent, max_length, min_continuation, shuffle, seed):
        self.files, self.split, self.val_percent = files, split, val_percent
        self.max_length, self.min_continuation = max_length, min_continuation
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        rows = []
        for i, record in enumerate(iter_records(self.files)):
            rid = str(record.get("id", i))
            if _is_val(rid, self.val_percent) != (self.split == "val"):
                continue
            prompt, cont = record["prompt_ids"], record["continuation_ids"]
            if len(cont) < self.min_continuation:
                continue
            # Keep the continuation whole where possible; the prompt loses its oldest tokens first.
            cont = cont[: self.max_length - 1]
            prompt = prompt[-(self.max_length - len(cont)) :]
            rows.append((prompt + cont, len(prompt)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(rows)
        yield from rows


def answer_token_ranking(data_files: str | list[str], val_percent: int = 5) -> list[int]:
    """The token ids of the training split's continuations (what the verifier wrote), most frequent
    first (ties by id): the ranking a drafter's decoding head takes its ids from
    (``DraftVocabulary.top``). The validation split is left out, as from training."""
    counts: Counter = Counter()
    for i, record in enumerate(iter_records(expand_files(data_files))):
        if not _is_val(str(record.get("id", i)), val_percent):
            counts.update(record["continuation_ids"])
    if not counts:
        raise CorpusError(f"the corpus {data_files!r} has no training continuations to count")
    return [token for token, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def collate_sequences(
    rows: list[tuple[list[int], int]], pad_id: int = 0, store: FeatureStore | None = None
) -> dict:
    """Right-padded ``input_ids[B, L]``, ``lengths[B]`` and ``cont_start[B]`` (first continuation
    index). With a ``store`` holding every row's features: also ``features[B, L, F]`` (bfloat16,
    zero on padding) and ``greedy[B, L]``, so the training module need not run the verifier."""
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, (seq, _) in enumerate(rows):
        ids[i, : len(seq)] = torch.tensor(seq)
    batch = {
        "input_ids": ids,
        "lengths": torch.tensor([len(seq) for seq, _ in rows]),
        "cont_start": torch.tensor([start for _, start in rows]),
    }
    stored = [store.get(seq) for seq, _ in rows] if store is not None else [None]
    if all(s is not None for s in stored):
        features = torch.zeros(len(rows), width, stored[0][0].shape[-1], dtype=stored[0][0].dtype)
        greedy = ids.clone()
        for i, (f, g) in enumerate(stored):
            features[i, : f.shape[0]], greedy[i, : g.shape[0]] = f, g
        # the directory too: the training module checks that it opened (and validated) this store
        batch.update(features=features, greedy=greedy, feature_store=str(store.root))
    return batch


class SequenceDataModule(L.LightningDataModule):
    """Train / validation sequences from corpus files (split by a hash of each record's id).

    Args:
        data_files: JSONL/Parquet corpus files or globs with ``prompt_ids`` and ``continuation_ids``.
        max_length: tokens per sequence (the prompt is cut from the left to fit).
        min_continuation: skip records whose continuation is shorter (EOS right away).
        shuffle_seed: the training order (not ``seed``: a training module's ``seed`` is its own, and
            a logger records both modules' hyper-parameters under one set of names).
        feature_store: a directory of the verifier's hidden states
            (:mod:`~specdiff_lightning.feature_store`), written by the training module on its first
            read of each sequence; batches whose sequences are all there carry them (``features``,
            ``greedy``, and the store's directory), and the verifier is not run. Linked from the
            model's ``feature_store`` by the CLI.
        gamma: the drafter's window (linked from the model by the CLI; the module cuts the windows).
    """

    def __init__(
        self,
        data_files: str | list[str],
        batch_size: int = 8,
        max_length: int = 448,
        val_percent: int = 5,
        min_continuation: int = 8,
        shuffle_seed: int = 0,
        gamma: int | None = None,
        feature_store: str | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self._files: list[str] | None = None

    def setup(self, stage: str | None = None) -> None:
        self._files = expand_files(self.hparams.data_files)
        if not any(True for _ in iter_records(self._files)):
            raise CorpusError(f"the corpus {self.hparams.data_files!r} has no valid records")

    def _loader(self, split: str) -> DataLoader:
        hp = self.hparams
        data = _Sequences(
            self._files,
            split,
            hp.val_percent,
            hp.max_length,
            hp.min_continuation,
            split == "train",
            hp.shuffle_seed,
        )
        if split == "train" and self.trainer is not None:
            data.set_epoch(self.trainer.current_epoch)
        store = FeatureStore(hp.feature_store) if hp.get("feature_store") else None
        collate = functools.partial(collate_sequences, store=store)
        return DataLoader(data, batch_size=hp.batch_size, collate_fn=collate)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def answer_token_ranking(self) -> list[int]:
        """:func:`answer_token_ranking` of this module's corpus and split."""
        return answer_token_ranking(self.hparams.data_files, self.hparams.val_percent)
