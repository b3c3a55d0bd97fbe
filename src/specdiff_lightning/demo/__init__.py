"""``python -m specdiff_lightning demo``: end-to-end runs on this machine, one registry of presets.

- ``smollm2`` (the default, what ``make demo`` runs): the real SmolLM2-135M-Instruct verifier with the
  shipped drafters on HumanEval, every method side by side (``demo/smollm2.py``).
- ``builtin``: the built-in 12.6M pair on the CPython standard library, with the whole training path
  (corpus -> MDM adaptation -> streak-distillation) run end to end (``demo/builtin.py``).
- ``smoke`` / ``smollm2-smoke``: minute-scale versions of the two, for tests.

Light at import time (no torch): ``--help`` lists the presets from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .builtin import ASSETS, check_targets, prepare_demo_data, run_builtin_demo
from .smollm2 import SMOL_PRESETS, run_smollm2_demo

__all__ = ["DEMOS", "DEFAULT_DEMO", "run_demo", "prepare_demo_data", "check_targets", "ASSETS"]


@dataclass(frozen=True)
class Demo:
    summary: str
    run: Callable[..., int]


def _builtin(name: str) -> Callable[..., int]:
    def run(root=None, force_bench=False, assets=None, started=None):
        return run_builtin_demo(name, root=root, force_bench=force_bench, assets=assets or ASSETS)

    return run


def _smollm2(name: str) -> Callable[..., int]:
    def run(root=None, force_bench=False, assets=None, started=None):
        return run_smollm2_demo(name, root=root, started=started, **({"assets": assets} if assets else {}))

    return run


#: preset -> demo; the first is the default
DEMOS: dict[str, Demo] = {
    "smollm2": Demo(
        "SmolLM2-135M-Instruct + shipped drafters on HumanEval, every method (~15 min)", _smollm2("smollm2")
    ),
    "builtin": Demo(
        "the built-in stdlib pair, trained end to end, then benchmarked (~17 min)", _builtin("full")
    ),
    "smoke": Demo("the built-in pair's pipeline at minute scale (tests)", _builtin("smoke")),
    "smollm2-smoke": Demo("the SmolLM2 bench at minute scale (tests)", _smollm2("smollm2-smoke")),
}
DEFAULT_DEMO = next(iter(DEMOS))
assert set(SMOL_PRESETS) <= set(DEMOS)


def run_demo(
    preset: str = DEFAULT_DEMO,
    root: str | None = None,
    force_bench: bool = False,
    assets: str | Path | None = None,
    started: float | None = None,
) -> int:
    """Run demo ``preset``; ``started``: when its clock started (seconds since the epoch; the
    SmolLM2 demo sizes its bench to end by its deadline from then)."""
    if preset not in DEMOS:
        raise ValueError(f"unknown demo preset {preset!r}; choose one of {sorted(DEMOS)}")
    return DEMOS[preset].run(root=root, force_bench=force_bench, assets=assets, started=started)
