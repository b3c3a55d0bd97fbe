"""A LightningDataModule that streams distillation corpora with ``datasets`` (``streaming`` style).

Pipeline per rank: records (validated, tokenized; one ``datasets`` shard per file) -> buffered
shuffle (same seed on every rank, reshuffled each epoch via ``set_epoch``) -> windows ->
``split_dataset_by_node`` (1 window in world_size, disjoint) -> the same number of windows on
every rank (floor(total / world_size), so DDP ranks never wait on unequal batch counts) -> batches.
"""

from __future__ import annotations

import functools
import random
import zlib
from collections.abc import Iterator

import lightning as L
from datasets import IterableDataset
from datasets.distributed import split_dataset_by_node
from torch.utils.data import DataLoader
from torch.utils.data import IterableDataset as TorchIterableDataset

from .records import CorpusError, expand_files, iter_records
from .tokenization import encode_prompt, load_tokenizer
from .windows import collate_windows, cut_windows

__all__ = ["DistillationDataModule", "tokenized_records"]


def tokenized_records(
    files: list[str], tokenizer: str | None = None, on_error: str = "skip"
) -> Iterator[dict]:
    """Valid records as ``{"id", "prompt_ids", "continuation_ids"}`` (text records are tokenized,
    prompts through the chat template when the tokenizer has one)."""
    for record in iter_records(files, on_error):
        if "continuation_ids" in record:
            yield {
                "id": record["id"],
                "prompt_ids": record["prompt_ids"],
                "continuation_ids": record["continuation_ids"],
            }
            continue
        if tokenizer is None:
            raise CorpusError(
                f"{record['id']}: text records need a tokenizer; pass `tokenizer: <path>` to the data module "
                f"(or store token ids as 'prompt_ids'/'continuation_ids')"
            )
        tok = load_tokenizer(tokenizer)
        yield {
            "id": record["id"],
            "prompt_ids": encode_prompt(tok, record["prompt"]),
            "continuation_ids": tok(record["continuation"], add_special_tokens=False)["input_ids"],
        }


def _usable(record: dict) -> bool:
    # A window needs a non-empty prefix and at least one target.
    return len(record["continuation_ids"]) >= (1 if record["prompt_ids"] else 2)


def _generate(files: list[str], tokenizer: str | None, on_error: str) -> Iterator[dict]:
    for record in tokenized_records(files, tokenizer, on_error):
        if _usable(record):
            yield record


class _EpochStream(TorchIterableDataset):
    """One pass per epoch over a ``datasets`` stream: ``set_epoch`` before each pass (Lightning
    builds one iterator per epoch but never calls ``set_epoch`` on an iterable dataset), at most
    ``limit`` items (equal counts on every rank), and resumable: a pass can start after the first
    ``skip`` items, which the deterministic order (seed, epoch) reproduces exactly."""

    def __init__(self, stream: IterableDataset, limit: int, epoch: int = 0, skip: int = 0):
        self.stream = stream
        self.limit = limit
        self.epoch = epoch
        self.skip = skip
        self.in_progress = False
        self.yielded = 0

    def __iter__(self):
        self.stream.set_epoch(self.epoch)
        skip, self.skip = self.skip, 0
        self.yielded = 0
        self.in_progress = True
        for item in self.stream:
            if self.yielded >= self.limit:
                break
            self.yielded += 1
            if self.yielded > skip:
                yield item
        self.in_progress = False
        self.epoch += 1


class DistillationDataModule(L.LightningDataModule):
    """Windows ``(s, x_1..x_gamma)`` cut from (prompt, verifier continuation) records.

    Args:
        train_files: corpus files, globs or directories (``.jsonl``/``.json``, ``.parquet``, ``.txt``).
        val_files: held-out files for validation (optional).
        tokenizer: tokenizer directory/hub id, needed for text records.
        gamma: window length (the drafter's draft window).
        windows_per_record: windows cut from each record per epoch (random offsets).
        max_prefix_tokens: keep only this many trailing prefix tokens (the drafter's prefix cap).
        batch_size: windows per batch.
        shuffle_buffer: records held in the shuffle buffer (0 disables shuffling).
        window_shuffle_buffer: windows held in a second buffer that mixes windows of different
            records within a batch (0 disables it).
        shuffle_seed: shuffling and window offsets (not ``seed``: a training module's ``seed`` is
            its own, and a logger records both modules' hyper-parameters under one set of names).
        on_bad_record: ``"skip"`` (warn with file and line) or ``"raise"``.
        pad_token_id: id used for left padding (masked out, so any id works).
    """

    def __init__(
        self,
        train_files: str | list[str] | None = None,
        val_files: str | list[str] | None = None,
        tokenizer: str | None = None,
        gamma: int = 8,
        windows_per_record: int = 4,
        max_prefix_tokens: int | None = None,
        batch_size: int = 8,
        shuffle_buffer: int = 1000,
        window_shuffle_buffer: int = 1024,
        shuffle_seed: int = 0,
        on_bad_record: str = "skip",
        pad_token_id: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if gamma < 1 or windows_per_record < 1 or batch_size < 1:
            raise ValueError("gamma, windows_per_record and batch_size must be >= 1")
        self._resume: dict = {}
        self._train: _EpochStream | None = None
        self.num_train_records: int | None = None

    # ------------------------------------------------------------------ setup
    def _rank_world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 0, 1
        return trainer.global_rank, trainer.world_size

    def _count(self, files: list[str]) -> int:
        count = sum(1 for _ in _generate(files, self.hparams.tokenizer, self.hparams.on_bad_record))
        if count == 0:
            raise CorpusError(
                f"the corpus {files} has no usable records (each needs a continuation, and a non-empty prompt or "
                f">= 2 continuation tokens); generate one with `python -m specdiff_lightning generate-corpus`"
            )
        return count

    def setup(self, stage: str | None = None) -> None:
        if stage in (None, "fit"):
            if self.hparams.train_files is None:
                raise CorpusError(
                    "no training corpus: set data.train_files (files, globs or a directory written by "
                    "`python -m specdiff_lightning generate-corpus`)"
                )
            self.train_files = expand_files(self.hparams.train_files)
            if self.num_train_records is None:
                self.num_train_records = self._count(self.train_files)
            _, world = self._rank_world()
            if self.num_train_records * self.hparams.windows_per_record < world * self.hparams.batch_size:
                raise CorpusError(
                    f"{self.num_train_records} records x {self.hparams.windows_per_record} windows cannot fill one "
                    f"batch of {self.hparams.batch_size} on each of {world} ranks; add records or lower batch_size"
                )
        if self.hparams.val_files is not None and stage in (None, "fit", "validate"):
            self.val_files = expand_files(self.hparams.val_files)
            self.num_val_records = self._count(self.val_files)

    # ------------------------------------------------------------------ streams
    def _records(self, files: list[str]) -> IterableDataset:
        return IterableDataset.from_generator(
            _generate,
            gen_kwargs={
                "files": list(files),
                "tokenizer": self.hparams.tokenizer,
                "on_error": self.hparams.on_bad_record,
            },
        )

    def _windows(self, batch: dict, epoch_of: callable) -> dict:
        out = {"id": [], "window_id": [], "prefix": [], "targets": []}
        for rid, prompt, cont in zip(
            batch["id"], batch["prompt_ids"], batch["continuation_ids"], strict=True
        ):
            rng = random.Random(zlib.crc32(f"{self.hparams.shuffle_seed}:{epoch_of()}:{rid}".encode()))
            windows = cut_windows(
                prompt,
                cont,
                self.hparams.gamma,
                self.hparams.windows_per_record,
                rng,
                self.hparams.max_prefix_tokens,
            )
            for j, w in enumerate(windows):
                out["id"].append(rid)
                out["window_id"].append(f"{rid}#w{j}")
                out["prefix"].append(w["prefix"])
                out["targets"].append(w["targets"])
        return out

    def train_stream(self) -> _EpochStream:
        stream = self._records(self.train_files)
        if self.hparams.shuffle_buffer > 0:
            stream = stream.shuffle(seed=self.hparams.shuffle_seed, buffer_size=self.hparams.shuffle_buffer)
        holder = _EpochStream(stream, 0, self._resume.get("epoch", 0), self._resume.get("consumed", 0))
        self._resume = {}
        # Window offsets follow the epoch of the pass being read.
        stream = stream.map(
            functools.partial(self._windows, epoch_of=lambda: holder.epoch),
            batched=True,
            remove_columns=["prompt_ids", "continuation_ids"],
        )
        if self.hparams.window_shuffle_buffer > 0:
            # A record's windows come out together; mix them so a batch is not one document.
            stream = stream.shuffle(
                seed=self.hparams.shuffle_seed + 1, buffer_size=self.hparams.window_shuffle_buffer
            )
        holder.stream, holder.limit = self._split(
            stream, self.num_train_records * self.hparams.windows_per_record
        )
        return holder

    def _split(self, stream: IterableDataset, total: int) -> tuple[IterableDataset, int]:
        """Disjoint windows per rank (``datasets`` applies the split at the end of the pipeline) and
        the count every rank can reach: floor(total / world_size)."""
        rank, world = self._rank_world()
        if world > 1:
            stream = split_dataset_by_node(stream, rank=rank, world_size=world, strategy="examples")
        return stream, total // world

    def _loader(self, dataset) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=self.hparams.batch_size,
            collate_fn=functools.partial(collate_windows, pad_token_id=self.hparams.pad_token_id),
            num_workers=self.hparams.num_workers,
        )

    def train_dataloader(self) -> DataLoader:
        self._train = self.train_stream()
        return self._loader(self._train)

    def val_dataloader(self) -> DataLoader | list:
        if self.hparams.val_files is None:
            return []
        stream = self._records(self.val_files).map(
            functools.partial(self._windows, epoch_of=lambda: 0),
            batched=True,
            remove_columns=["prompt_ids", "continuation_ids"],
        )
        stream, limit = self._split(stream, self.num_val_records * self.hparams.windows_per_record)
        return self._loader(_EpochStream(stream, limit))

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict:
        """The epoch and how many of its windows this rank has *trained on*: the loader prefetches
        ahead, so the count comes from the trainer's batch progress, not from what was read."""
        stream = self._train
        if stream is None:
            return {}
        if not stream.in_progress:
            return {"epoch": stream.epoch, "consumed": 0}
        consumed = stream.yielded
        if self.trainer is not None:
            batches = self.trainer.fit_loop.epoch_loop.batch_progress.current.processed
            consumed = min(consumed, batches * self.hparams.batch_size)
        return {"epoch": stream.epoch, "consumed": consumed}

    def load_state_dict(self, state: dict) -> None:
        self._resume = dict(state)
