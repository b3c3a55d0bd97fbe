"""The command table: the one list from which the top-level parser, ``--help`` and LightningCLI's
subcommands are derived (tests check that every command named in the README answers ``--help``).

Pure data, no heavy imports: ``python -m specdiff_lightning --help`` reads it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Command", "COMMANDS", "find_command", "lightning_subcommands"]

#: what LightningCLI skips in a Trainer method's signature (added as ``--model``/``--data`` instead)
_COMPONENTS = frozenset({"model", "datamodule"})


@dataclass(frozen=True)
class Command:
    """One command line verb.

    Args:
        name: as typed (``generate-corpus``).
        summary: one line for ``--help``.
        lightning: a LightningCLI subcommand (a method of
            :class:`~specdiff_lightning.trainer.SpecDiffTrainer`) with YAML configs; otherwise a plain
            argparse command defined in :mod:`specdiff_lightning.cli`.
    """

    name: str
    summary: str
    lightning: bool = True

    @property
    def method(self) -> str:
        """The Trainer method / LightningCLI subcommand name (``generate_corpus``)."""
        return self.name.replace("-", "_")


COMMANDS: tuple[Command, ...] = (
    Command("fit", "streak-distil a drafter against a frozen verifier"),
    Command("validate", "validation streak length / positional acceptance of a drafter"),
    Command("test", "run the model's test loop"),
    Command("generate-corpus", "sample verifier continuations of prompts into corpus shards (resumable)"),
    Command("export", "write the trained drafter (LoRA merged) as a Hugging Face directory"),
    Command("predict", "self-selection speculative decoding of benchmark prompts -> JSONL + metrics"),
    Command("bench", "every decoding method side by side -> bench.json, bench.md, plots"),
    Command("eval-budget", "time-budgeted reasoning: accuracy vs thinking seconds, verifier vs SpecDiff-2"),
    Command(
        "demo",
        "end-to-end CPU demos: SmolLM2-135M + the shipped drafters on HumanEval (what `make demo` runs), "
        "or --preset builtin: the stdlib pair trained from scratch",
        lightning=False,
    ),
    Command(
        "prepare-demo-data",
        "stdlib corpus split + tokenizer + prompts for the built-in pair",
        lightning=False,
    ),
)


def find_command(word: str) -> Command | None:
    """The command spelled ``word`` (``generate_corpus`` and ``generate-corpus`` alike), or None."""
    return next((c for c in COMMANDS if c.method == word.replace("-", "_")), None)


def lightning_subcommands(builtin: dict[str, set[str]]) -> dict[str, set[str]]:
    """LightningCLI's ``subcommands()`` table: ``builtin`` (fit, validate, test, predict) plus the
    project's Trainer methods, in table order."""
    return {c.method: set(builtin.get(c.method, _COMPONENTS)) for c in COMMANDS if c.lightning}
