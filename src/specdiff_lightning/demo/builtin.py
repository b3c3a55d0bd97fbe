"""``demo --preset builtin``: the built-in CPU pair end to end, training included.

Stages (each reused when its output exists):
  1. prepare    stdlib corpus split by module, held-out function prompts, distillation prompts
  2. verifier   shipped in ``assets/demo/verifier`` (reproduce: ``configs/demo/verifier.yaml``)
  3. ar_drafter AR pretraining of a small Qwen2 (SpS baseline; initialises the diffusion drafter)
  4. drafter_base  AR -> masked-diffusion adaptation with the MDM loss (the undistilled drafter)
  5. corpus     the verifier's continuations of train snippets (``generate-corpus``)
  6. drafter    streak-distillation of the diffusion drafter against the verifier
  7. bench      every method side by side on held-out prompts -> bench.json, bench.md, plots
Every training stage is a ``fit`` of a config in ``configs/demo/`` (copied, with the run's paths
and step counts, into ``<root>/configs/`` so the exact recipe is on disk next to its output).
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["run_builtin_demo", "prepare_demo_data", "PRESETS", "ASSETS", "check_targets"]

ASSETS = Path("assets/demo")
CONFIGS = Path("configs/demo")


@dataclass(frozen=True)
class Preset:
    root: str
    ar_steps: int
    mdm_steps: int
    distill_steps: int
    distill_prompts: int
    bench_prompts: int
    max_new_tokens: int
    sweep_num_drafts: str
    sweep_gamma: str


PRESETS = {
    "full": Preset("runs/demo", 300, 400, 800, 768, 10, 80, "[2, 4]", "[2, 4]"),
    "smoke": Preset("runs/demo-smoke", 3, 3, 3, 8, 2, 12, "[1, 2]", "[2]"),
}


def _tokenizer_dir(root: Path, assets: Path = ASSETS) -> Path:
    return assets / "tokenizer" if (assets / "tokenizer" / "tokenizer.json").exists() else root / "tokenizer"


def prepare_demo_data(
    root: str | Path,
    train_new_tokenizer: bool = False,
    distill_prompts: int = 384,
    seed: int = 0,
    assets: Path = ASSETS,
) -> dict:
    """Corpus split, tokenizer (the shipped one unless asked), and distillation prompts: snippets
    of 16-64 tokens cut at random points of train-split modules."""
    from transformers import AutoTokenizer

    from ..data.stdlib import build_stdlib_corpus, train_tokenizer

    root = Path(root)
    data = root / "data"
    counts = {}
    if not (data / "prompts.jsonl").exists():
        counts = build_stdlib_corpus(data)
    tok_dir = root / "tokenizer" if train_new_tokenizer else _tokenizer_dir(root, assets)
    if not (tok_dir / "tokenizer.json").exists():
        train_tokenizer(data / "train.jsonl", tok_dir)
    out = data / "distill_prompts.jsonl"
    if not out.exists():
        tok = AutoTokenizer.from_pretrained(tok_dir)
        rng = random.Random(seed)
        with open(data / "train.jsonl") as f:
            sources = [json.loads(line)["continuation"] for line in f]
        with open(out.with_suffix(".tmp"), "w") as f:
            for i in range(distill_prompts):
                ids = tok(rng.choice(sources), add_special_tokens=False)["input_ids"]
                length = rng.randint(16, 64)
                start = rng.randrange(0, max(1, len(ids) - length))
                f.write(json.dumps({"id": f"s{i}", "prompt_ids": ids[start : start + length]}) + "\n")
        out.with_suffix(".tmp").replace(out)
    counts["tokenizer"] = str(tok_dir)
    return counts


def _config(name: str, root: Path, tokenizer: Path, assets: Path) -> str:
    """The stage's config with this run's paths, saved under ``<root>/configs``."""
    text = (CONFIGS / name).read_text().replace("runs/demo", str(root))
    text = text.replace("assets/demo/tokenizer", str(tokenizer)).replace("assets/demo", str(assets))
    path = root / "configs" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def _banner(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def _fit_and_export(config: str, out: Path, steps: int, extra: list[str] = ()) -> None:
    from ..cli.lightning_cli import run_cli

    cli = run_cli(["fit", "--config", config, "--trainer.max_steps", str(steps), *extra])
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    cli.model.export(tmp)
    tmp.rename(out)  # a stage counts as finished only once its export is complete


def run_builtin_demo(
    preset: str = "full", root: str | None = None, force_bench: bool = False, assets: str | Path = ASSETS
) -> int:
    from ..cli.lightning_cli import run_cli

    p = PRESETS[preset]
    root = Path(root or p.root)
    assets_dir = Path(assets)
    start = time.perf_counter()
    if not (assets_dir / "verifier" / "config.json").exists():
        raise SystemExit(
            f"the built-in verifier is missing ({assets_dir / 'verifier'}): run `make demo` from the repository root, or "
            f"rebuild it with configs/demo/verifier.yaml (see the commands at its top)"
        )
    _banner("1/7 prepare: stdlib corpus, tokenizer, prompts")
    print(prepare_demo_data(root, distill_prompts=p.distill_prompts, assets=assets_dir))
    tokenizer = _tokenizer_dir(root, assets_dir)
    steps = {"ar_drafter": p.ar_steps, "drafter_base": p.mdm_steps, "drafter": p.distill_steps}
    total = {"ar_drafter": "--model.init_args.total_steps", "drafter_base": "--model.init_args.total_steps"}
    for i, (stage, config, what) in enumerate(
        [
            ("ar_drafter", "ar_drafter.yaml", "AR drafter pretraining"),
            ("drafter_base", "drafter_mdm.yaml", "AR -> diffusion adaptation (MDM loss)"),
        ],
        start=3,
    ):
        _banner(f"{i}/7 {stage}: {what}")
        if (root / stage / "config.json").exists():
            print(f"reusing {root / stage}")
            continue
        _fit_and_export(
            _config(config, root, tokenizer, assets_dir),
            root / stage,
            steps[stage],
            [total[stage], str(steps[stage])],
        )
    _banner("5/7 corpus: verifier continuations at temperature 1.0")
    distill = _config("distill.yaml", root, tokenizer, assets_dir)
    run_cli(
        [
            "generate-corpus",
            "--config",
            distill,
            "--prompts",
            str(root / "data" / "distill_prompts.jsonl"),
            "--output_dir",
            str(root / "corpus"),
            "--num_continuations",
            "2",
            "--max_new_tokens",
            "64",
            "--batch_size",
            "32",
            "--val_fraction",
            "0.1",
        ]
    )
    _banner("6/7 drafter: streak-distillation")
    if (root / "drafter" / "config.json").exists():
        print(f"reusing {root / 'drafter'}")
    else:
        _fit_and_export(distill, root / "drafter", steps["drafter"])
    _banner("7/7 bench: held-out prompts, every method side by side")
    if (root / "bench.json").exists() and not force_bench:
        print(f"reusing {root / 'bench.json'} (--force-bench reruns it)")
        print((root / "bench.md").read_text())
    else:
        run_cli(
            [
                "bench",
                "--config",
                _config("bench.yaml", root, tokenizer, assets_dir),
                "--data.init_args.limit",
                str(p.bench_prompts),
                "--model.init_args.decoding.max_new_tokens",
                str(p.max_new_tokens),
                "--sweep_num_drafts",
                p.sweep_num_drafts,
                "--sweep_gamma",
                p.sweep_gamma,
            ]
        )
    report = json.loads((root / "bench.json").read_text())
    targets = check_targets(report)
    (root / "targets.md").write_text(targets)
    print(targets)
    print(f"demo finished in {time.perf_counter() - start:.0f} s; outputs in {root}/")
    return 0


def check_targets(report: dict) -> str:
    """The built-in pair's targets, rows looked up by role and key (never by label)."""
    from ..bench.targets import Target, best_row, find_row
    from ..bench.targets import check_targets as check

    def accepted(key):
        return lambda r: (lambda row: row and (row["mean_accepted"], row["method"]))(find_row(r, key))

    def fastest(role):
        return lambda r: (lambda row: row and (row["tokens_per_s"], row["method"]))(best_row(r, role))

    k = max((row["num_drafts"] for row in report["rows"] if row.get("role") == "specdiff2"), default=8)
    targets = [
        Target(
            "streak-distillation vs undistilled, accepted/call (K=1)",
            accepted("specdiff2_k1"),
            accepted("specdiff2_k1_undistilled"),
            1.3,
        ),
        Target(
            f"self-selection K={k} vs K=1, accepted/call",
            accepted(f"specdiff2_k{k}"),
            accepted("specdiff2_k1"),
            1.15,
        ),
        Target("best SpecDiff-2 vs verifier-only, tokens/s", fastest("specdiff2"), fastest("verifier"), 1.5),
        Target("best SpecDiff-2 vs HF assisted, tokens/s", fastest("specdiff2"), fastest("hf_assisted"), 1.0),
    ]
    text, _ = check(report, targets)
    same = all(r.get("identical") is not False for r in report["rows"])
    return (
        text
        + f"- lossless: {'every' if same else 'NOT every'} method's temperature-0 output equals the verifier's\n"
    )
