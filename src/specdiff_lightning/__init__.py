"""specdiff-lightning: lossless speculative decoding with diffusion drafters (SpecDiff-2).

The public names are imported on first use (PEP 562), so ``python -m specdiff_lightning --help``
and the command table load without torch or transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS = {
    "AcceptanceRule": "specdiff_lightning.decoding",
    "DecodingStats": "specdiff_lightning.decoding",
    "GenerationOutput": "specdiff_lightning.decoding",
    "TokenDatastore": "specdiff_lightning.decoding",
    "speculative_generate": "specdiff_lightning.decoding",
    "verifier_generate": "specdiff_lightning.decoding",
    "AutoregressiveDrafter": "specdiff_lightning.models",
    "DFlashDrafter": "specdiff_lightning.models",
    "DiffusionDrafter": "specdiff_lightning.models",
    "load_drafter": "specdiff_lightning.models",
    "load_verifier": "specdiff_lightning.models",
    "streak_loss": "specdiff_lightning.training.losses",
    "load_pair": "specdiff_lightning.pairs",
    "SHIPPED_PAIRS": "specdiff_lightning.pairs",
}

__all__ = [
    "AcceptanceRule",
    "AutoregressiveDrafter",
    "DFlashDrafter",
    "DecodingStats",
    "DiffusionDrafter",
    "GenerationOutput",
    "SHIPPED_PAIRS",
    "TokenDatastore",
    "load_pair",
    "load_drafter",
    "load_verifier",
    "speculative_generate",
    "streak_loss",
    "verifier_generate",
]

if TYPE_CHECKING:
    from .decoding import (
        AcceptanceRule,
        DecodingStats,
        GenerationOutput,
        TokenDatastore,
        speculative_generate,
        verifier_generate,
    )
    from .models import (
        AutoregressiveDrafter,
        DFlashDrafter,
        DiffusionDrafter,
        load_drafter,
        load_verifier,
    )
    from .pairs import SHIPPED_PAIRS, load_pair
    from .training.losses import streak_loss


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specdiff_lightning' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
