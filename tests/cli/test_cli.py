"""The command table: every README command answers --help, --help is instant, the parser,
LightningCLI and the Trainer agree on one list of commands."""

import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specdiff_lightning.cli import COMMANDS, build_parser, main

ROOT = Path(__file__).parents[2]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return sorted(set(re.findall(r"python -m specdiff_lightning ([a-z][a-z_-]*)", text)))


def test_readme_commands_are_in_the_table():
    names = {c.name for c in COMMANDS}
    readme = _readme_commands()
    assert len(readme) >= 7
    assert set(readme) <= names, set(readme) - names


@pytest.mark.parametrize("command", _readme_commands())
def test_every_readme_command_answers_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_eval_budget_takes_a_config(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval-budget", "--config", str(ROOT / "configs" / "tiny_predict.yaml"), "--help"])
    assert exit_info.value.code == 0
    assert "--budgets" in capsys.readouterr().out


def test_parser_lightning_and_trainer_agree_with_the_table():
    from specdiff_lightning.cli.lightning_cli import SpecDiffCLI
    from specdiff_lightning.trainer import SpecDiffTrainer

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    assert list(sub.choices) == [c.name for c in COMMANDS]
    lightning = [c.method for c in COMMANDS if c.lightning]
    assert list(SpecDiffCLI.subcommands()) == lightning
    assert all(callable(getattr(SpecDiffTrainer, method)) for method in lightning)
    # ddp_spawn pickles what the CLI hands to Lightning: the class is importable by name.
    assert pickle.loads(pickle.dumps(SpecDiffCLI)) is SpecDiffCLI


def test_top_level_help_imports_no_framework():
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "specdiff_lightning", "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert "eval-budget" in out.stdout and "prepare-demo-data" in out.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert not imported & {"torch", "transformers", "lightning", "datasets"}


def test_subcommand_help_speaks_the_tables_words(capsys):
    """Issue 19: usage said generate_corpus, descriptions were Lightning docstrings cut mid-sentence,
    --model listed only lightning.LightningModule, export --dtype had no description."""
    from specdiff_lightning.cli.commands import find_command

    for name in ("generate-corpus", "export", "predict"):
        with pytest.raises(SystemExit) as exit_info:
            main([name, "--help"])
        assert exit_info.value.code == 0
        out = capsys.readouterr().out
        flat = "".join(out.split())  # argparse wraps long names across lines
        assert out.startswith(f"usage: python -m specdiff_lightning {name} [--config CONFIG]")
        assert "".join(find_command(name).summary.split()) in flat
        assert f"{name}arguments:" in flat and "Usefulto" not in flat
        for module in (
            "DrafterDistillation",
            "SliceDrafterTraining",
            "DFlashDrafterTraining",
        ):
            assert module in flat
        assert "SequenceDataModule" in flat and "SharedEmbeddingDrafterTraining" not in flat
        if name == "export":
            assert "--dtypeDTYPEcasttothisdtypefirst" in flat


@pytest.mark.parametrize(
    ("max_epochs", "max_steps", "title"), [(-1, 40, "Epoch 3 · 40 steps max"), (5, -1, "Epoch 3/4")]
)
def test_the_progress_bar_names_the_step_budget(tmp_path, max_epochs, max_steps, title):
    """Issue 19: a run bounded by max_steps (max_epochs -1) read "Epoch 9/-2"; the CLI's Trainer
    gets this bar in place of Lightning's rich one."""
    import lightning as L

    from specdiff_lightning.cli.lightning_cli import SpecDiffCLI
    from specdiff_lightning.cli.progress import StepBoundProgressBar

    trainer = L.Trainer(max_epochs=max_epochs, max_steps=max_steps, logger=False, default_root_dir=tmp_path)
    bar = StepBoundProgressBar()
    bar.setup(trainer, None, "fit")
    assert bar._get_train_description(3).strip() == title
    config = {"model": {"class_path": "specdiff_lightning.training.DrafterDistillation"}}
    config["trainer"] = {"max_steps": 40, "logger": False, "default_root_dir": str(tmp_path)}
    cli = SpecDiffCLI(args=config, run=False, save_config_callback=None)
    assert isinstance(cli.trainer.progress_bar_callback, StepBoundProgressBar)
