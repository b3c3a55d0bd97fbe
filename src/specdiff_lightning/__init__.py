"""specdiff-lightning: lossless speculative decoding with diffusion drafters (SpecDiff-2)."""

from .decoding import (
    AcceptanceRule,
    DecodingStats,
    GenerationOutput,
    speculative_generate,
    verifier_generate,
)
from .models import AutoregressiveDrafter, DiffusionDrafter
from .training.losses import streak_loss

__version__ = "0.1.0"

__all__ = [
    "AcceptanceRule",
    "AutoregressiveDrafter",
    "DecodingStats",
    "DiffusionDrafter",
    "GenerationOutput",
    "speculative_generate",
    "streak_loss",
    "verifier_generate",
]
