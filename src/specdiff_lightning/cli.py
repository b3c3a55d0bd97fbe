"""Command line: ``python -m specdiff_lightning <command> --help``.

Commands (LightningCLI: YAML configs with class_path/init_args, ``--print_config``):
  fit              streak-distil a drafter against a frozen verifier
  validate         validation streak length / positional acceptance of a drafter
  generate-corpus  sample verifier continuations of prompts into corpus shards (resumable)
  export           write the trained drafter (LoRA merged) as a Hugging Face directory
  predict          self-selection speculative decoding of benchmark prompts -> JSONL + metrics
  bench            every decoding method side by side -> bench.json, bench.md, plots
  eval-budget      time-budgeted reasoning: accuracy vs thinking seconds, verifier vs SpecDiff-2
Other commands:
  demo             the built-in CPU pair end to end (what `make demo` runs)
  prepare-demo-data  stdlib corpus split + tokenizer + prompts for the built-in pair

Examples:
  python -m specdiff_lightning fit --config configs/tiny_fit.yaml
  python -m specdiff_lightning generate-corpus --config configs/tiny_fit.yaml --prompts p.jsonl --output_dir corpus/
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main", "run_cli", "build_parser"]

LIGHTNING_COMMANDS = {
    "fit",
    "validate",
    "test",
    "predict",
    "bench",
    "generate-corpus",
    "generate_corpus",
    "export",
}


def _lightning_cli(argv: list[str] | None):
    """Run LightningCLI; ``argv=None`` reads ``sys.argv`` (the ``generate-corpus`` alias is mapped
    to the Trainer method ``generate_corpus``)."""
    from lightning.pytorch.cli import LightningCLI

    from .trainer import SpecDiffTrainer

    class SpecDiffCLI(LightningCLI):
        @staticmethod
        def subcommands() -> dict[str, set[str]]:
            commands = LightningCLI.subcommands()
            commands["generate_corpus"] = {"model", "datamodule"}
            commands["export"] = {"model", "datamodule"}
            commands["bench"] = {"model", "datamodule"}
            commands["eval_budget"] = {"model", "datamodule"}
            return commands

    return SpecDiffCLI(
        None,  # any LightningModule by class_path: DrafterDistillation, CausalLMPretraining, ...
        None,  # any LightningDataModule by class_path: DistillationDataModule, PromptDataModule
        trainer_class=SpecDiffTrainer,
        args=argv,
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"prog": "python -m specdiff_lightning", "default_env": False},
    )


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(preset=args.preset, root=args.root, force_bench=args.force_bench, assets=args.assets)


def _prepare(args: argparse.Namespace) -> int:
    from .demo import prepare_demo_data

    print(prepare_demo_data(args.out, train_new_tokenizer=args.train_tokenizer))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m specdiff_lightning",
        description="Lossless speculative decoding with diffusion drafters (SpecDiff-2).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    for name in ("fit", "validate", "predict", "bench", "eval-budget", "generate-corpus", "export"):
        sub.add_parser(name, help=f"see `python -m specdiff_lightning {name} --help`", add_help=False)
    demo = sub.add_parser(
        "demo",
        help="the built-in CPU pair end to end: prepare, pretrain, distil, bench (reuses finished stages)",
        description="Build the built-in pair on the CPython standard library (verifier shipped in assets/demo), "
        "pretrain the AR and diffusion drafters, streak-distil, and benchmark every method side by side on "
        "held-out functions. Finished stages are reused on a rerun.",
    )
    demo.add_argument(
        "--preset", choices=("full", "smoke"), default="full", help="smoke: a minutes-long CI-sized run"
    )
    demo.add_argument("--root", default=None, help="output directory (default runs/demo, or runs/demo-smoke)")
    demo.add_argument(
        "--force-bench", action="store_true", help="rerun the benchmark even if bench.json exists"
    )
    demo.add_argument("--assets", default="assets/demo", help="where the shipped verifier and tokenizer live")
    demo.set_defaults(func=_demo)
    prep = sub.add_parser(
        "prepare-demo-data", help="stdlib corpus split, tokenizer, prompts for the built-in pair"
    )
    prep.add_argument("--out", default="runs/demo")
    prep.add_argument(
        "--train-tokenizer", action="store_true", help="train a new BPE instead of the shipped one"
    )
    prep.set_defaults(func=_prepare)
    return parser


def run_cli(argv: list[str] | None = None):
    """Run a LightningCLI command (``fit``, ``bench``...) and return the CLI object (its
    ``model``, ``datamodule``, ``trainer``); ``argv=None`` reads ``sys.argv``."""
    if argv is None:
        sys.argv[1] = sys.argv[1].replace("-", "_")
    else:
        argv = [argv[0].replace("-", "_"), *argv[1:]]
    return _lightning_cli(argv)


def main(argv: list[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words and words[0] in LIGHTNING_COMMANDS:
        run_cli(argv)
        return 0
    args = build_parser().parse_args(words)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
