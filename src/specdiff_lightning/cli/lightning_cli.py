"""LightningCLI for the project's Trainer subcommands (defined at module level: ``ddp_spawn`` pickles
what the CLI hands to Lightning, and a class local to a function cannot be pickled)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from ..trainer import SpecDiffTrainer
from .commands import find_command, lightning_subcommands

__all__ = ["SpecDiffCLI", "run_cli", "DECODING_SUBCOMMANDS", "DECODING_HPARAMS"]

#: subcommands that decode: their decoding settings come from the config / command line only
DECODING_SUBCOMMANDS = ("predict", "bench", "eval_budget")
#: model arguments that are decoding settings, never taken from a checkpoint's hyper-parameters
DECODING_HPARAMS = ("decoding", "baseline")


class SpecDiffCLI(LightningCLI):
    """LightningCLI with the project's Trainer and subcommands.

    * Any LightningModule / LightningDataModule by ``class_path`` (``DrafterDistillation``,
      ``CausalLMPretraining``, ``DistillationDataModule``, ``PromptDataModule``...).
    * One ``gamma``: ``data.init_args.gamma`` follows ``model.init_args.gamma`` (where both exist).
    * ``--ckpt_path`` restores the model's architecture from the checkpoint's hyper-parameters, as
      LightningCLI does, but never its decoding settings for ``predict``, ``bench`` and
      ``eval-budget``: those come from the config and the command line.
    """

    def __init__(self, args: Any = None, **kwargs: Any) -> None:
        kwargs.setdefault("trainer_class", SpecDiffTrainer)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("parser_kwargs", {"prog": "python -m specdiff_lightning", "default_env": False})
        super().__init__(None, None, args=args, **kwargs)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return lightning_subcommands(LightningCLI.subcommands())

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # Skipped by jsonargparse where the chosen classes lack the argument (pretraining modules,
        # PromptDataModule).
        parser.link_arguments("model.init_args.gamma", "data.init_args.gamma")

    def _parse_ckpt_path(self) -> None:
        subcommand = self.config.get("subcommand")
        if subcommand not in DECODING_SUBCOMMANDS:
            super()._parse_ckpt_path()
            return
        ckpt_path = self.config[subcommand].get("ckpt_path")
        if not ckpt_path or not Path(ckpt_path).is_file():
            return
        hparams = torch.load(ckpt_path, weights_only=True, map_location="cpu").get("hyper_parameters", {})
        hparams.pop("_instantiator", None)
        for key in DECODING_HPARAMS:
            hparams.pop(key, None)
        if not hparams:
            return
        if "_class_path" in hparams:
            hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
        try:
            self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)
        except SystemExit:
            sys.stderr.write("Parsing of ckpt_path hyperparameters failed!\n")
            raise


def run_cli(argv: list[str] | None = None, **kwargs: Any) -> SpecDiffCLI:
    """Run a LightningCLI command (``fit``, ``bench``...) and return the CLI object (its ``model``,
    ``datamodule``, ``trainer``); ``argv=None`` reads ``sys.argv``. ``generate-corpus`` and
    ``eval-budget`` name the Trainer methods ``generate_corpus`` and ``eval_budget``."""
    words = sys.argv[1:] if argv is None else list(argv)
    command = find_command(words[0]) if words else None
    if command is None or not command.lightning:
        raise ValueError(f"not a LightningCLI command: {words[:1]}")
    if argv is None:
        sys.argv[1] = command.method  # LightningCLI reads sys.argv itself
        return SpecDiffCLI(**kwargs)
    return SpecDiffCLI(args=[command.method, *words[1:]], **kwargs)
