"""``bench``: the same prompts decoded by every method, side by side in one process.

``methods`` (rows: role, key, dtype, settings), ``runners`` (how each kind decodes), ``run``
(repeated, interleaved timing; references; pass@1), ``report`` (bench.json / bench.md / plots),
``targets`` (checks by role and key).
"""

from .methods import (
    ROLES,
    BenchMethod,
    default_methods,
    extra_drafter_methods,
    setting_methods,
    sweep_methods,
)
from .report import markdown_table, write_report
from .run import Sample, run_bench, timed_generate
from .runners import RUNNERS, BenchModels
from .targets import Target, best_row, check_targets, find_row

__all__ = [
    "ROLES",
    "RUNNERS",
    "BenchMethod",
    "BenchModels",
    "Sample",
    "Target",
    "best_row",
    "check_targets",
    "default_methods",
    "extra_drafter_methods",
    "find_row",
    "markdown_table",
    "run_bench",
    "setting_methods",
    "sweep_methods",
    "timed_generate",
    "write_report",
]
