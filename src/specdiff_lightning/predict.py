"""Prediction-side Lightning glue: a JSONL writer and a metrics callback.

Lightning forbids ``self.log`` in ``predict_step``, so decoding metrics are computed here from
the rows ``predict_step`` returns, reduced across ranks by torchmetrics, logged to the run's logger
and printed as a summary table.
"""

from __future__ import annotations

import json
import os

import torch
from lightning.pytorch.callbacks import BasePredictionWriter, Callback

from .metrics import PositionalAcceptance, Speedup, StreakLength, Throughput

__all__ = ["JsonlPredictionWriter", "DecodingMetrics", "summary_table"]


class JsonlPredictionWriter(BasePredictionWriter):
    """Write one JSON line per prompt to ``<output_dir>/predictions-rank<r>.jsonl`` after every
    batch (flushed: an interrupted run keeps what it finished). A run replaces the file of an
    earlier run; it never appends to it.

    ``completion`` is what ``predict_step`` returns (text when the model has a tokenizer, else token
    ids); ``text`` is always the decoded completion when any tokenizer is configured (the model's,
    else the data module's), None otherwise.
    """

    FIELDS = (
        "id",
        "prompt",
        "completion",
        "text",
        "new_tokens",
        "verifier_calls",
        "mean_accepted",
        "wall_time",
        "baseline_wall_time",
        "speedup",
        "config_hash",
    )

    def __init__(self, output_dir: str = "runs/predict") -> None:
        super().__init__(write_interval="batch")
        self.output_dir = output_dir

    def path(self, rank: int) -> str:
        return os.path.join(self.output_dir, f"predictions-rank{rank}.jsonl")

    def on_predict_start(self, trainer, pl_module) -> None:
        os.makedirs(self.output_dir, exist_ok=True)
        open(self.path(trainer.global_rank), "w").close()  # replace an earlier run's rows
        self._tokenizer = _configured_tokenizer(trainer, pl_module)

    def write_on_batch_end(
        self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx
    ):
        tokenizer = getattr(self, "_tokenizer", None)
        with open(self.path(trainer.global_rank), "a", encoding="utf-8") as f:
            for row in prediction:
                out = {k: row.get(k) for k in self.FIELDS}
                completion = row.get("completion")
                if isinstance(completion, str):
                    out["text"] = completion
                elif tokenizer is not None and completion is not None:
                    out["text"] = tokenizer.decode(completion)
                f.write(json.dumps(out) + "\n")
            f.flush()


def _configured_tokenizer(trainer, pl_module):
    """The model's tokenizer, else the data module's (``PromptDataModule(tokenizer=...)``), or None."""
    tokenizer = getattr(pl_module, "tokenizer", None)
    if tokenizer is not None:
        return tokenizer
    hparams = getattr(getattr(trainer, "datamodule", None), "hparams", None) or {}
    path = hparams.get("tokenizer")
    if path is None:
        return None
    from .data.tokenization import load_tokenizer

    return load_tokenizer(path)


class DecodingMetrics(Callback):
    """Streak length, positional acceptance, throughput and speed-up over a predict run."""

    def __init__(self, gamma: int | None = None) -> None:
        self.gamma = gamma
        self.results: dict[str, float] = {}

    def on_predict_start(self, trainer, pl_module) -> None:
        gamma = self.gamma or pl_module.decoding.gamma
        device = pl_module.device
        self.streak = StreakLength().to(device)
        self.positional = PositionalAcceptance(gamma).to(device)
        self.throughput = Throughput().to(device)
        self.speedup = Speedup().to(device)
        self.baseline_throughput = Throughput().to(device)

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        for row in outputs:
            self.streak.update(row["accepted_tokens"], row["verifier_calls"], row["new_tokens"])
            self.positional.update(
                torch.tensor(row["position_accepted"]), torch.tensor(row["position_reached"])
            )
            self.throughput.update(row["new_tokens"], row["wall_time"])
            if row.get("baseline_wall_time") is not None:
                self.baseline_throughput.update(row["baseline_new_tokens"], row["baseline_wall_time"])
                self.speedup.update(
                    row["new_tokens"], row["wall_time"], row["baseline_new_tokens"], row["baseline_wall_time"]
                )

    def on_predict_end(self, trainer, pl_module) -> None:
        results = {
            "predict/mean_accepted": float(self.streak.compute()),
            "predict/tokens_per_call": float(self.streak.compute_with_bonus()),
            "predict/throughput": float(self.throughput.compute()),
        }
        if self.speedup.count > 0 or trainer.world_size > 1:
            results["predict/speedup"] = float(self.speedup.compute())
            results["predict/baseline_throughput"] = float(self.baseline_throughput.compute())
        curve = self.positional.compute()
        results.update({f"predict/gamma_{j + 1}": float(v) for j, v in enumerate(curve)})
        self.results = results
        if trainer.logger is not None:
            trainer.logger.log_metrics(results)
        if trainer.is_global_zero:
            print(summary_table(results))


def summary_table(results: dict[str, float]) -> str:
    rows = [(k.removeprefix("predict/"), v) for k, v in results.items() if not k.startswith("predict/gamma_")]
    curve = [f"{v:.2f}" for k, v in results.items() if k.startswith("predict/gamma_")]
    width = max(len(k) for k, _ in rows)
    lines = ["", "Decoding summary", "-" * (width + 14)]
    lines += [f"{k:<{width}}  {v:>12.3f}" for k, v in rows]
    lines.append(f"{'gamma_j':<{width}}  {' '.join(curve)}")
    return "\n".join(lines)
