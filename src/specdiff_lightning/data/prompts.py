"""A LightningDataModule over benchmark prompts, for ``predict``."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader

from .benchmarks import load_benchmark
from .tokenization import encode_prompt, load_tokenizer

__all__ = ["PromptDataModule", "encode_prompts"]


def encode_prompts(
    rows: list[dict], tokenizer: str | None, max_prompt_tokens: int | None = None
) -> list[dict]:
    """Tokenize text prompts (chat template when the tokenizer has one); keep ``prompt_ids`` rows."""
    out = []
    for row in rows:
        if "prompt_ids" in row:
            ids = list(row["prompt_ids"])
        else:
            if tokenizer is None:
                raise ValueError(f"prompt {row['id']!r} is text: set `tokenizer` to the verifier's tokenizer")
            ids = encode_prompt(load_tokenizer(tokenizer), row["prompt"])
        if not ids:
            raise ValueError(f"prompt {row['id']!r} is empty")
        if max_prompt_tokens is not None:
            ids = ids[-max_prompt_tokens:]
        out.append({**row, "prompt_ids": ids})
    return out


def _collate(rows: list[dict]) -> dict:
    # Ids travel in the batch: iterable and map-style loaders alike, no batch indices needed.
    return {
        "ids": [r["id"] for r in rows],
        "input_ids": [torch.tensor(r["prompt_ids"], dtype=torch.long) for r in rows],
        "prompts": [r.get("prompt") for r in rows],
        "answers": [r.get("answer") for r in rows],
    }


class PromptDataModule(L.LightningDataModule):
    """Benchmark prompts for ``predict`` (rows are decoded one at a time inside each batch).

    Args:
        benchmark: ``math500``, ``humaneval``, ``gpqa``, ``mt_bench`` or ``prompts`` (a custom file).
        path: local JSONL/Parquet file (schemas in :mod:`specdiff_lightning.data.benchmarks`); None
            loads the hub dataset where a network exists.
        tokenizer: the verifier's tokenizer (for text prompts).
        limit: use the first ``limit`` prompts.
        max_prompt_tokens: keep the last tokens of longer prompts.
    """

    def __init__(
        self,
        benchmark: str = "prompts",
        path: str | None = None,
        tokenizer: str | None = None,
        limit: int | None = None,
        max_prompt_tokens: int | None = None,
        batch_size: int = 1,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.rows: list[dict] = []

    def setup(self, stage: str | None = None) -> None:
        hp = self.hparams
        rows = load_benchmark(hp.benchmark, hp.path, hp.limit)
        # Under DDP, Lightning shards this map-style list for predict without repeating rows.
        self.rows = encode_prompts(rows, hp.tokenizer, hp.max_prompt_tokens)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.rows, batch_size=self.hparams.batch_size, collate_fn=_collate, shuffle=False)
