"""LightningCLI for the project's Trainer subcommands (defined at module level: ``ddp_spawn`` pickles
what the CLI hands to Lightning, and a class local to a function cannot be pickled)."""

from __future__ import annotations

import importlib
import sys
from argparse import ArgumentError
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, Namespace
from lightning.pytorch.utilities import rank_zero_info

# The project's LightningModules and data modules, imported so that `--help` lists them as known
# subclasses (jsonargparse lists the subclasses it has seen) and class names resolve without a path.
from .. import training  # noqa: F401
from ..data import sequences  # noqa: F401
from ..trainer import SpecDiffTrainer
from ..training import dflash, slice_drafter  # noqa: F401
from .commands import find_command, lightning_subcommands
from .errors import condense
from .progress import StepBoundProgressBar
from .run_config import RunConfigCallback

__all__ = ["SpecDiffCLI", "run_cli", "DECODING_SUBCOMMANDS", "DECODING_HPARAMS"]

#: subcommands that decode: their decoding settings come from the config / command line only
DECODING_SUBCOMMANDS = ("predict", "bench", "eval_budget")
#: model arguments that are decoding settings, never taken from a checkpoint's hyper-parameters
DECODING_HPARAMS = ("decoding", "baseline")
#: permissions a run gives itself, never inherited from a checkpoint by the run that resumes it
RUN_HPARAMS = ("overwrite_export",)
#: subcommands that run no Lightning loop and write an ``output_dir``: config.yaml joins it at the end
#: (``export`` writes none: its directory is the exported model, nothing else)
CONFIG_AFTER_RUN = ("bench", "eval_budget", "generate_corpus")


class SpecDiffCLI(LightningCLI):
    """LightningCLI with the project's Trainer and subcommands.

    * Any LightningModule / LightningDataModule by ``class_path`` (``DrafterDistillation``,
      ``CausalLMPretraining``, ``DistillationDataModule``, ``PromptDataModule``...).
    * One ``gamma``: ``data.init_args.gamma`` follows ``model.init_args.gamma`` (where both exist).
    * ``--ckpt_path`` restores the model's architecture from the checkpoint's hyper-parameters over
      the config files', as LightningCLI does, but never over what the command line says
      (``--model.init_args.export_dir new`` wins), and never its decoding settings for ``predict``,
      ``bench`` and ``eval-budget``: those come from the config and the command line.
    * ``config.yaml`` goes with the run's outputs (:class:`~.run_config.RunConfigCallback`).
    * Parse errors raise (``exit_on_error=False``): :func:`specdiff_lightning.cli.main` prints them
      as one line (:mod:`.errors`).
    """

    def __init__(self, args: Any = None, **kwargs: Any) -> None:
        kwargs.setdefault("trainer_class", SpecDiffTrainer)
        kwargs.setdefault("save_config_callback", RunConfigCallback)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        # exit_on_error=False: a parse error raises, and main() prints it as one line, not the usage block.
        kwargs.setdefault(
            "parser_kwargs",
            {"prog": "python -m specdiff_lightning", "default_env": False, "exit_on_error": False},
        )
        # What was typed (None for a dict of arguments): it wins over a checkpoint's hyper-parameters.
        self._command_line = (
            sys.argv[1:] if args is None else list(args) if isinstance(args, (list, tuple)) else None
        )
        super().__init__(None, None, args=args, **kwargs)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return lightning_subcommands(LightningCLI.subcommands())

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs: Any) -> None:
        """LightningCLI's, but only the parser of the command being run (each of the eight costs
        introspecting the Trainer; the command is known from the first word), described by the
        command table and used under its typed name (``generate-corpus``), not the method's."""
        self._subcommand_parsers: dict[str, LightningArgumentParser] = {}
        subcommands = parser.add_subcommands()
        first = self._command_line[0] if self._command_line else None
        chosen = [find_command(first)] if first and find_command(first) else None
        for command in chosen or [find_command(name) for name in self.subcommands()]:
            prog = f"python -m specdiff_lightning {command.name}"
            sub_kwargs = {
                "description": command.summary,
                "usage": f"{prog} [--config CONFIG] [--print_config] [--<key> VALUE ...]",
                **kwargs.get(command.method, {}),
            }
            sub = self._prepare_subcommand_parser(self.trainer_class, command.method, **sub_kwargs)
            subcommands.add_subcommand(command.method, sub, help=command.summary)
            sub.prog = prog  # add_subcommand sets "<prog> [options] <method>"
            _retitle(sub, command)
            self._subcommand_parsers[command.method] = sub

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # Skipped by jsonargparse where the chosen classes lack the argument (pretraining modules,
        # PromptDataModule).
        parser.link_arguments("model.init_args.gamma", "data.init_args.gamma")
        # the training module writes the verifier's features there, the data module reads them back
        parser.link_arguments("model.init_args.feature_store", "data.init_args.feature_store")

    def instantiate_trainer(self, **kwargs: Any) -> SpecDiffTrainer:
        trainer = super().instantiate_trainer(**kwargs)
        # Lightning's default rich bar read "Epoch 9/-2" in step-bound runs: ours, in its place.
        for i, callback in enumerate(trainer.callbacks):
            if type(callback) is RichProgressBar:
                trainer.callbacks[i] = StepBoundProgressBar()
        return trainer

    def before_instantiate_classes(self) -> None:
        subcommand = self.config.get("subcommand")
        if subcommand in DECODING_SUBCOMMANDS:
            _check_decodes(subcommand, self.config[subcommand].get("model"))

    def _run_subcommand(self, subcommand: str) -> None:
        super()._run_subcommand(subcommand)
        # Lightning's loops save config.yaml as they start; commands without one, once they are done.
        if subcommand in CONFIG_AFTER_RUN:
            for callback in self.trainer.callbacks:
                if isinstance(callback, RunConfigCallback):
                    callback.save_now(self.trainer, subcommand)

    def _parse_ckpt_path(self) -> None:
        """``--ckpt_path``: the checkpoint's hyper-parameters rebuild the model it was trained as, over
        the config files' (LightningCLI's rule), but never over the command line's: an argument typed
        there (``--model.init_args.export_dir new``) wins. Decoding settings never come from it."""
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        ckpt_path = self.config[subcommand].get("ckpt_path")
        if not ckpt_path or not Path(ckpt_path).is_file():
            return
        hparams = torch.load(ckpt_path, weights_only=True, map_location="cpu").get("hyper_parameters", {})
        hparams.pop("_instantiator", None)
        for key in RUN_HPARAMS:
            hparams.pop(key, None)
        if subcommand in DECODING_SUBCOMMANDS:
            for key in DECODING_HPARAMS:
                hparams.pop(key, None)
        if not hparams:
            return
        if "_class_path" in hparams:
            hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
        try:
            merged = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)
            merged = self._typed_over(subcommand, merged)
        except ArgumentError as err:
            raise ValueError(
                f"--ckpt_path {ckpt_path}: its hyper-parameters do not fit this command's model ({condense(err)}); "
                f"is it a checkpoint of this model's class?"
            ) from err
        replaced = _changed(self.config[subcommand].get("model"), merged[subcommand].get("model"))
        if replaced:
            rank_zero_info(
                f"--ckpt_path: the checkpoint's hyper-parameters replace the config's "
                f"{', '.join('model.' + k for k in replaced)}; give them on the command line to override it"
            )
        self.config = merged

    def _typed_over(self, subcommand: str, merged: Any) -> Any:
        """``merged`` with what the command line's ``--model...`` options set put back over it: each
        init arg they touch (all of ``decoding`` for ``--model.init_args.decoding.num_drafts 3``)
        takes its value from the parse before the checkpoint; ``--model OtherClass``, the whole model."""
        args = _typed_model_args(self._command_line or [])
        model = merged[subcommand].get("model")
        class_path = model.get("class_path") if model is not None else None
        if not args or not class_path:
            return merged
        typed = self.parser.parse_args([subcommand, "--model", class_path, *args], defaults=False)
        typed = typed[subcommand]["model"]
        parsed = self.config[subcommand]["model"]
        if typed.get("class_path") != class_path:
            merged[subcommand]["model"] = parsed
        else:
            for key in vars(typed.get("init_args") or Namespace()):  # top-level init args only
                merged[subcommand]["model"]["init_args"][key] = parsed["init_args"][key]
        return self.parser.parse_object({}, merged)  # links (data.gamma follows model.gamma), checks


def _retitle(parser: LightningArgumentParser, command: Any) -> None:
    """Group titles of our own words: jsonargparse titles a group by its class's or method's
    docstring, cut at its first line ('... compute predictions. Useful to')."""
    titles = {
        command.method: f"{command.name} arguments",
        "model": "--model: a LightningModule, by class_path + init_args (--model.help CLASS: its arguments)",
        "data": "--data: a LightningDataModule, by class_path + init_args (--data.help CLASS: its arguments)",
        "trainer": "--trainer: lightning.Trainer arguments",
        "optimizer": "--optimizer: replaces the model's own optimizer (optional)",
        "lr_scheduler": "--lr_scheduler: replaces the model's own schedule (optional)",
    }
    for name, title in titles.items():
        group = getattr(parser, "groups", {}).get(name)
        if group is not None:
            group.title = title


def _check_decodes(subcommand: str, model: Any) -> None:
    """Refuse, before anything loads, a model class that cannot decode (a training config given to
    ``predict``), which Lightning would report as 'requires forward method to run'."""
    class_path = getattr(model, "class_path", None)
    if not class_path:
        return
    module, _, name = class_path.rpartition(".")
    cls = getattr(importlib.import_module(module), name, None)
    if (
        isinstance(cls, type)
        and issubclass(cls, LightningModule)
        and cls.predict_step is LightningModule.predict_step
    ):
        command = find_command(subcommand).name
        raise ValueError(
            f"{command} decodes prompts, and {name} is a training module that does not; use a decoding "
            f"config (e.g. configs/smollm2/predict.yaml, class DrafterDistillation) with the trained drafter "
            f"as model.init_args.drafter"
        )


def _changed(before: Any, after: Any) -> list[str]:
    """The dotted keys whose values differ between two (nested) model configs."""
    flat = [_flatten(x.as_dict() if hasattr(x, "as_dict") else x or {}) for x in (before, after)]
    return sorted(k for k in flat[0].keys() | flat[1].keys() if flat[0].get(k) != flat[1].get(k))


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _typed_model_args(args: list[str]) -> list[str]:
    """The ``--model...`` options of a command line, with their values: what re-parsing applies over
    a checkpoint's hyper-parameters (only the model's; nothing else is re-applied, e.g. appended
    callbacks)."""
    out, keep = [], False
    for arg in args:
        if arg.startswith("-") and not _is_number(arg):
            option = arg.split("=", 1)[0]
            keep = option == "--model" or option.startswith("--model.")
            if keep:
                out.append(arg)
        elif keep:
            out.append(arg)
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


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
