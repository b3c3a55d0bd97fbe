"""``config.yaml``: the run's full config, saved with the run's outputs.

Lightning saves it in ``trainer.log_dir``, which is the working directory when a config sets
``logger: false`` and no ``default_root_dir`` (every predict and bench config does): each run there
replaced the last one's without a word. Here it goes where the command writes its outputs, and a
different earlier ``config.yaml`` is replaced only with a note saying so (or, with
``overwrite=False``, refused, as Lightning does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.cli import LightningArgumentParser, Namespace, SaveConfigCallback
from lightning.pytorch.utilities import rank_zero_info

from ..paths import atomic_write

__all__ = ["RunConfigCallback"]


class RunConfigCallback(SaveConfigCallback):
    """Save the config as ``config.yaml`` in the run's output directory:

    * the command's ``output_dir`` (``bench``, ``eval-budget``, ``generate-corpus``);
    * ``predict``: the prediction writer's ``output_dir`` (``JsonlPredictionWriter``);
    * otherwise ``trainer.log_dir`` (``fit``, ``validate``, ``test``), as Lightning does.

    ``overwrite``: replace a ``config.yaml`` holding another config, saying so; when False, refuse to.
    """

    def __init__(
        self,
        parser: LightningArgumentParser,
        config: Namespace,
        config_filename: str = "config.yaml",
        overwrite: bool = False,
        **kwargs: Any,
    ) -> None:
        kwargs["save_to_log_dir"] = False  # where it goes is decided here
        super().__init__(parser, config, config_filename, overwrite, **kwargs)
        self._directory: str | None = None

    def run_dir(self, trainer: Trainer, stage: str | None) -> str:
        """Where this run's outputs (and so its config) go."""
        output_dir = self.config.get("output_dir") if hasattr(self.config, "get") else None
        if output_dir:
            return str(output_dir)
        if stage == "predict":
            for callback in trainer.callbacks:
                if isinstance(callback, BasePredictionWriter) and getattr(callback, "output_dir", None):
                    return str(callback.output_dir)
        return trainer.log_dir  # broadcasts under DDP: every rank gets here (setup)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Only where it goes, here (log_dir broadcasts: every rank must ask); it is written when the
        # loop starts, after the module's own setup, so a run that refuses to start (e.g. over an
        # earlier export) leaves the earlier config.yaml as it was.
        if self._directory is None:
            self._directory = self.run_dir(trainer, stage)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._save(trainer, "fit")

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._save(trainer, "validate")  # during fit: saved at on_fit_start already

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._save(trainer, "test")

    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._save(trainer, "predict")

    def save_now(self, trainer: Trainer, stage: str) -> None:
        """Save after a command that runs no Lightning loop (``bench``...), which calls no hook."""
        if self._directory is None:
            self._directory = self.run_dir(trainer, stage)
        self._save(trainer, stage)

    def _save(self, trainer: Trainer, stage: str) -> None:
        if not self.already_saved and trainer.is_global_zero:
            self.save_config(trainer, None, stage)
        self.already_saved = True

    def save_config(self, trainer, pl_module, stage: str) -> None:
        path = Path(self._directory) / self.config_filename
        text = self.parser.dump(self.config, skip_none=False)
        earlier = path.read_text() if path.is_file() else None
        if earlier is not None and earlier != text:
            if not self.overwrite:
                raise RuntimeError(
                    f"{path} holds the config of another run; delete it, or write this run's outputs elsewhere"
                )
            rank_zero_info(f"{path}: replacing an earlier run's config with this run's")
        atomic_write(path, lambda tmp: Path(tmp).write_text(text))
