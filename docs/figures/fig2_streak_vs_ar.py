"""Regenerates docs/figures/fig2_streak_vs_ar.png: the setting of
tests/training/test_distillation.py::test_streak_distillation_raises_streak_and_beats_ar_distillation
(tiny Qwen2 verifier, tiny Llama diffusion drafter pretrained with masked CE, then fine-tuned with
the streak objective or AR-distillation), positional acceptance on the validation split.

    .venv/bin/python docs/figures/fig2_streak_vs_ar.py
"""

import json
import random
import sys
import tempfile
from pathlib import Path

import lightning as L
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from specdiff_lightning.data import DistillationDataModule, generate_corpus
from specdiff_lightning.training import DrafterDistillation

V = 64
VERIFIER = dict(vocab_size=V, hidden_size=64, num_layers=2, seed=0, initializer_range=0.1)
DRAFTER = dict(vocab_size=V, hidden_size=64, num_layers=2, seed=1)
QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, enable_checkpointing=False)


def module(**kw):
    return DrafterDistillation(verifier="tiny-qwen2", drafter="tiny-llama", verifier_kwargs={"tiny": VERIFIER},
                               drafter_kwargs={"tiny": DRAFTER}, gamma=8, **kw)


def main(out: Path) -> dict:
    corpus = Path(tempfile.mkdtemp())
    rng = random.Random(0)
    prompts = [{"id": f"p{i}", "prompt_ids": [rng.randrange(0, V - 1) for _ in range(6)]} for i in range(240)]
    generate_corpus(module().verifier, prompts, corpus, num_continuations=4, max_new_tokens=24, batch_size=32, val_fraction=0.15, progress=False)

    def data():
        return DistillationDataModule(str(corpus / "train-*.jsonl"), str(corpus / "val-*.jsonl"), gamma=8, windows_per_record=4, batch_size=32, shuffle_buffer=500)

    def validate(m):
        r = L.Trainer(**QUIET).validate(m, data(), verbose=False)[0]
        return {"streak": r["val/streak"], "gamma": [r[f"val/gamma_{j}"] for j in range(1, 9)]}

    torch.manual_seed(0)
    base = module(loss="masked_ce", lr=3e-3)
    L.Trainer(max_epochs=4, **QUIET).fit(base, data())
    results = {"base (masked CE)": validate(base)}
    for loss, label in (("streak", "streak-distillation"), ("ar_distillation", "AR-distillation")):
        torch.manual_seed(0)
        m = module(loss=loss, lr=1e-3)
        m.drafter_model.load_state_dict(base.drafter_model.state_dict())
        L.Trainer(max_epochs=3, **QUIET).fit(m, data())
        results[label] = validate(m)
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for label, r in results.items():
        ax.plot(range(1, 9), r["gamma"], marker="o", label=f"{label} (streak {r['streak']:.2f})")
    ax.set_xlabel("draft position j")
    ax.set_ylabel(r"$\gamma_j$ = P(accept j | accepted < j)")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Validation positional acceptance (tiny pair)")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).with_name("fig2_streak_vs_ar"))), indent=2))
