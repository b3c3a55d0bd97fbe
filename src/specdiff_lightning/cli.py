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
  demo             decode with small models, every acceptance mode side by side

Examples:
  python -m specdiff_lightning fit --config configs/tiny_fit.yaml
  python -m specdiff_lightning generate-corpus --config configs/tiny_fit.yaml --prompts p.jsonl --output_dir corpus/
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

__all__ = ["main", "build_parser"]

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
    from .training.module import DrafterDistillation

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
        DrafterDistillation,
        None,  # any LightningDataModule by class_path: DistillationDataModule, PromptDataModule
        trainer_class=SpecDiffTrainer,
        args=argv,
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"prog": "python -m specdiff_lightning", "default_env": False},
    )


def _demo(args: argparse.Namespace) -> int:
    from . import AutoregressiveDrafter, DiffusionDrafter, speculative_generate, verifier_generate
    from .models import tiny_model

    torch.manual_seed(args.seed)
    vocab = args.vocab_size
    print(f"Building small random-weight models (Qwen2 verifier, Llama diffusion drafter, vocab {vocab}) ...")
    verifier = tiny_model("qwen2", vocab_size=vocab, hidden_size=128, num_layers=4, seed=args.seed)
    drafter = DiffusionDrafter(
        tiny_model("llama", vocab_size=vocab, hidden_size=64, num_layers=1, seed=args.seed + 1),
        mask_token_id=vocab - 1,
        shift_logits=True,
    )
    ar_drafter = AutoregressiveDrafter(
        tiny_model("qwen2", vocab_size=vocab, hidden_size=64, num_layers=1, seed=args.seed + 2)
    )
    prompt = torch.randint(0, vocab - 1, (1, 16), generator=torch.Generator().manual_seed(args.seed))
    common = dict(max_new_tokens=args.max_new_tokens, temperature=0)
    k = args.num_drafts
    methods = {
        "verifier only": lambda: verifier_generate(verifier, prompt, **common),
        "SpS (AR drafter)": lambda: speculative_generate(
            verifier, ar_drafter, prompt, gamma=args.gamma, acceptance="standard", **common
        ),
        "SpecDiff K=1 standard": lambda: speculative_generate(
            verifier, drafter, prompt, gamma=args.gamma, acceptance="standard", **common
        ),
        f"SpecDiff-2 K={k} greedy": lambda: speculative_generate(
            verifier, drafter, prompt, gamma=args.gamma, num_drafts=k, draft_temperature=2.0, **common
        ),
        f"SpecDiff-2 K={k} recursive": lambda: speculative_generate(
            verifier, drafter, prompt, gamma=args.gamma, num_drafts=k, acceptance="recursive", **common
        ),
    }
    reference = None
    rows = []
    for name, run in methods.items():
        start = time.perf_counter()
        out = run()
        seconds = time.perf_counter() - start
        reference = out.sequences if reference is None else reference
        rows.append((name, out.stats, seconds, torch.equal(out.sequences, reference)))
    print(f"\n{'method':<28} {'new':>5} {'calls':>6} {'accepted/call':>14} {'tok/s':>8}  identical")
    for name, stats, seconds, same in rows:
        print(
            f"{name:<28} {stats.new_tokens:>5} {stats.verifier_calls:>6} {stats.mean_accepted:>14.2f} "
            f"{stats.new_tokens / seconds:>8.1f}  {'yes' if same else 'NO'}"
        )
    print(
        "\nRandom-weight models barely agree, so few drafts are accepted; what this shows is that every "
        "mode reproduces the verifier's greedy output exactly."
    )
    return 0 if all(row[3] for row in rows) else 1


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
    demo = sub.add_parser("demo", help="decode with small models; compare every mode with greedy decoding")
    demo.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate (default 64)")
    demo.add_argument("--gamma", type=int, default=8, help="draft window (default 8)")
    demo.add_argument("--num-drafts", type=int, default=4, help="K drafts for self-selection (default 4)")
    demo.add_argument(
        "--vocab-size", type=int, default=256, help="vocabulary of the small models (default 256)"
    )
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words and words[0] in LIGHTNING_COMMANDS:
        if argv is None:
            sys.argv[1] = sys.argv[1].replace("-", "_")
        else:
            argv = [argv[0].replace("-", "_"), *argv[1:]]
        _lightning_cli(argv)
        return 0
    args = build_parser().parse_args(words)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
