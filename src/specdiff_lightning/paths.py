"""Where the project keeps what it computes once per machine (imports nothing heavy)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """``$SPECDIFF_CACHE`` or ``~/.cache/specdiff_lightning``: converted models, calibrations."""
    return Path(os.environ.get("SPECDIFF_CACHE", Path.home() / ".cache" / "specdiff_lightning"))
