"""Time-budgeted reasoning (paper Sec. 7.2): think for b seconds, then answer.

For each budget b and each method (verifier alone, SpecDiff-2), decode the chain of thought for at
most b seconds, append "time is up, summarise your answer", decode a short answer greedily, and
score it against the reference (MATH-style: the last ``\\boxed{...}``, else the last number).
A faster decoder thinks further within the same budget.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .decoding.calibration import warn_if_slower_than_plain
from .decoding.config import DecodingConfig
from .decoding.generate import speculative_generate, verifier_generate

__all__ = ["extract_answer", "is_correct", "run_budget_eval", "write_budget_report", "TIME_UP"]

TIME_UP = "\n\nTime is up, summarise your answer. Final answer: "


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed{")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            if depth == 0:
                return text[i:j]
            depth -= 1
    return None


def extract_answer(text: str) -> str | None:
    """The last ``\\boxed{...}`` content, else the last number in ``text``."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    numbers = re.findall(r"-?\d+(?:\.\d+)?(?:/\d+)?", text)
    return numbers[-1] if numbers else None


def _normalise(answer: str) -> str:
    return (
        re.sub(r"\s+|\\left|\\right|\$|\\!|\.$", "", answer).replace("dfrac", "frac").replace("tfrac", "frac")
    )


def is_correct(prediction: str | None, reference: str | None) -> bool:
    return (
        prediction is not None and reference is not None and _normalise(prediction) == _normalise(reference)
    )


@torch.no_grad()
def run_budget_eval(
    verifier,
    drafter,
    tokenizer,
    rows: list[dict],
    budgets: list[float],
    cfg: DecodingConfig,
    answer_tokens: int = 32,
    max_thinking_tokens: int = 4096,
    progress: bool = True,
) -> dict:
    """Accuracy vs budget for the verifier alone and SpecDiff-2 (``cfg``). ``rows`` hold
    ``prompt_ids`` and ``answer``."""
    device = verifier.device
    eos = verifier.generation_config.eos_token_id
    suffix = tokenizer(TIME_UP, add_special_tokens=False)["input_ids"]
    limit = getattr(verifier.config, "max_position_embeddings", None)
    results = []
    for budget in tqdm(budgets, desc="eval-budget", unit="budget", disable=not progress):
        for method in ("verifier", "specdiff2"):
            correct, thought = 0, 0
            for row in rows:
                ids = torch.tensor([row["prompt_ids"]], device=device)
                room = (
                    max_thinking_tokens
                    if limit is None
                    else min(max_thinking_tokens, limit - ids.shape[1] - len(suffix) - answer_tokens)
                )
                if room < 1:
                    raise ValueError(
                        f"prompt {row['id']!r} leaves no room for thinking within the verifier's context"
                    )
                think_cfg = replace(cfg, max_new_tokens=room)
                if method == "verifier":
                    out = verifier_generate(
                        verifier, ids, **think_cfg.sampling_kwargs(), eos_token_id=eos, max_time=budget
                    )
                else:
                    out = speculative_generate(
                        verifier,
                        think_cfg.shape_drafter(drafter),
                        ids,
                        **think_cfg.generate_kwargs(),
                        eos_token_id=eos,
                        max_time=budget,
                    )
                    # (at least budget seconds passed: a decode flagged here was at least this slow)
                    warn_if_slower_than_plain(
                        out.stats.new_tokens / budget,
                        verifier,
                        ids.shape[1],
                        out.stats.mean_accepted,
                        tree_auto=think_cfg.tree == "auto",
                    )
                thinking = out.sequences[:, ids.shape[1] :]
                thought += thinking.shape[1]
                answer_prompt = torch.cat([out.sequences, torch.tensor([suffix], device=device)], dim=1)
                answer = verifier_generate(
                    verifier, answer_prompt, max_new_tokens=answer_tokens, temperature=0, eos_token_id=eos
                )
                text = (
                    tokenizer.decode(thinking[0])
                    + TIME_UP
                    + tokenizer.decode(answer.sequences[0, answer_prompt.shape[1] :])
                )
                correct += is_correct(extract_answer(text), row.get("answer"))
            results.append(
                {
                    "budget_s": budget,
                    "method": method,
                    "accuracy": correct / len(rows),
                    "mean_thinking_tokens": thought / len(rows),
                }
            )
    return {
        "decoding": cfg.__dict__,
        "num_prompts": len(rows),
        "answer_tokens": answer_tokens,
        "rows": results,
    }


def write_budget_report(report: dict, output_dir: str | os.PathLike) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval_budget.json").write_text(json.dumps(report, indent=2))
    lines = ["| budget (s) | method | accuracy | thinking tokens |", "|---:|---|---:|---:|"]
    lines += [
        f"| {r['budget_s']} | {r['method']} | {r['accuracy']:.3f} | {r['mean_thinking_tokens']:.1f} |"
        for r in report["rows"]
    ]
    (out / "eval_budget.md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for method in ("verifier", "specdiff2"):
        pts = [(r["budget_s"], r["accuracy"]) for r in report["rows"] if r["method"] == method]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method)
    ax.set_xlabel("thinking budget (s)")
    ax.set_ylabel("accuracy")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "accuracy_vs_budget.png", dpi=120)
    plt.close(fig)
    return out
