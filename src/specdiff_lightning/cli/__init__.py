"""Command line: ``python -m specdiff_lightning <command> --help``.

Every command comes from one table (:mod:`specdiff_lightning.cli.commands`). LightningCLI commands
take YAML configs (``class_path``/``init_args``, ``--print_config``); the others are plain argparse.
Nothing heavy is imported before a command runs, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import sys

from .commands import COMMANDS, Command, find_command

__all__ = ["COMMANDS", "Command", "main", "run_cli", "build_parser"]

EXAMPLES = """Examples:
  python -m specdiff_lightning fit --config configs/tiny_fit.yaml
  python -m specdiff_lightning generate-corpus --config configs/tiny_fit.yaml --prompts p.jsonl --output_dir corpus/
  python -m specdiff_lightning predict --config configs/tiny_predict.yaml --ckpt_path last.ckpt
  python -m specdiff_lightning eval-budget --config configs/tiny_predict.yaml --help"""


def run_cli(argv: list[str] | None = None, **kwargs):
    """Run a LightningCLI command and return the CLI object (see
    :func:`specdiff_lightning.cli.lightning_cli.run_cli`)."""
    from .lightning_cli import run_cli as _run_cli

    return _run_cli(argv, **kwargs)


# ---------------------------------------------------------------------- plain commands
def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    from ..demo import DEFAULT_DEMO, DEMOS

    parser.description = "Run an end-to-end demo on this machine. Presets:\n" + "\n".join(
        f"  {name:14s} {demo.summary}" for name, demo in DEMOS.items()
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--preset", choices=tuple(DEMOS), default=DEFAULT_DEMO, help=f"default: {DEFAULT_DEMO}"
    )
    parser.add_argument(
        "--root", default=None, help="output directory (default runs/demo, or the preset's own)"
    )
    parser.add_argument(
        "--force-bench", action="store_true", help="builtin: rerun the benchmark even if bench.json exists"
    )
    parser.add_argument(
        "--assets",
        default=None,
        help="where the shipped models live (assets/smollm2, assets/demo for builtin)",
    )
    parser.add_argument(
        "--started",
        type=float,
        default=None,
        metavar="UNIX_TIME",
        help="smollm2: when the run's 20-minute clock started, in seconds since the epoch (default: "
        "now). `make demo` passes its own start, so the bench is sized to what installing the "
        "environment and compiling left of the 20 minutes.",
    )


def _demo(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    return run_demo(
        preset=args.preset,
        root=args.root,
        force_bench=args.force_bench,
        assets=args.assets,
        started=args.started,
    )


def _prepare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/demo")
    parser.add_argument(
        "--train-tokenizer", action="store_true", help="train a new BPE instead of the shipped one"
    )


def _prepare(args: argparse.Namespace) -> int:
    from ..demo import prepare_demo_data

    print(prepare_demo_data(args.out, train_new_tokenizer=args.train_tokenizer))
    return 0


#: plain command name -> (add its arguments, run it)
_PLAIN = {
    "demo": (_demo_arguments, _demo),
    "prepare-demo-data": (_prepare_arguments, _prepare),
}


# ---------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    """The top-level parser (``--help`` and the plain commands), derived from :data:`COMMANDS`."""
    lightning = ", ".join(c.name for c in COMMANDS if c.lightning)
    epilog = (
        f"LightningCLI commands take YAML configs (class_path/init_args) and --print_config;\n"
        f"`<command> --help` lists their arguments: {lightning}.\n\n{EXAMPLES}"
    )
    parser = argparse.ArgumentParser(
        prog="python -m specdiff_lightning",
        description="Lossless speculative decoding with diffusion drafters (SpecDiff-2).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=epilog,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    for command in COMMANDS:
        if command.lightning:
            # Parsed by LightningCLI (main() hands these over before argparse runs).
            sub.add_parser(command.name, help=command.summary, add_help=False)
            continue
        add_arguments, run = _PLAIN[command.name]
        plain_parser = sub.add_parser(command.name, help=command.summary, description=command.summary)
        add_arguments(plain_parser)
        plain_parser.set_defaults(func=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a command; a user's mistake prints ``error: ...`` and returns non-zero (a bug, or any error
    with ``SPECDIFF_DEBUG=1``, raises with its traceback)."""
    from .errors import report

    words = list(sys.argv[1:] if argv is None else argv)
    command = find_command(words[0]) if words else None
    try:
        if command is not None and command.lightning:
            run_cli(argv)
            return 0
        args = build_parser().parse_args(words)
        return args.func(args)
    except Exception as exc:
        status = report(exc, command.name if command else None)
        if status is None:
            raise
        return status


if __name__ == "__main__":
    sys.exit(main())
