"""The progress bar the CLI's Trainer shows: Lightning's rich bar without "Epoch 9/-2".

Lightning titles the bar ``Epoch {e}/{max_epochs - 1}``; a run bounded by ``max_steps`` alone has
``max_epochs == -1`` (unbounded), so the bar read ``Epoch 9/-2``. Here such a run reads
``Epoch 9 · 120 steps max``.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import RichProgressBar

__all__ = ["StepBoundProgressBar"]


class StepBoundProgressBar(RichProgressBar):
    """``RichProgressBar`` whose title names the step budget when epochs are unbounded."""

    def _get_train_description(self, current_epoch: int) -> str:
        trainer = self.trainer
        if trainer.max_epochs is None or trainer.max_epochs >= 0:
            return super()._get_train_description(current_epoch)
        title = f"Epoch {current_epoch}"
        if trainer.max_steps is not None and trainer.max_steps > 0:
            title += f" · {trainer.max_steps} steps max"
        if len(self.validation_description) > len(title):  # as Lightning pads it: no flicker
            title = f"{title:{len(self.validation_description)}}"
        return title
