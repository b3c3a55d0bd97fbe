"""The one rule for writing an export over an existing one: refuse, unless asked to overwrite.

An export is the artefact a run is for (a drafter directory that ``predict`` and ``bench`` load); a
resumed or repeated ``fit`` that wrote over an earlier one would lose it without a word. Like
Lightning's ``SaveConfigCallback``, the run stops before it starts and names the two ways on.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ExportExistsError", "export_exists", "check_export_dir"]


class ExportExistsError(FileExistsError):
    """``export_dir`` already holds files, and overwriting them was not asked for."""


def export_exists(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory holding anything (an earlier export), or a file."""
    p = Path(path)
    return p.is_file() or (p.is_dir() and any(p.iterdir()))


def check_export_dir(
    path: str | os.PathLike,
    overwrite: bool = False,
    dir_option: str = "--model.init_args.export_dir",
    overwrite_option: str = "--model.init_args.overwrite_export",
) -> None:
    """Raise :class:`ExportExistsError` when ``path`` already holds an export and ``overwrite`` is off;
    the message names the command line options to choose another directory or to overwrite."""
    if overwrite or not export_exists(path):
        return
    raise ExportExistsError(
        f"{str(path)!r} already holds an export (an earlier run's?); write this one elsewhere "
        f"({dir_option} <new dir>) or pass {overwrite_option} true to replace it"
    )
