"""Speed and acceptance targets checked on a bench report, rows looked up by role and key."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Target", "check_targets", "best_row", "find_row"]


def find_row(report: dict, key: str) -> dict | None:
    """The row with this stable key (never a display label)."""
    return next((r for r in report["rows"] if r.get("key") == key), None)


def best_row(report: dict, role: str, where: Callable[[dict], bool] = lambda r: True) -> dict | None:
    """The fastest row of a role (tokens/s), optionally filtered."""
    rows = [r for r in report["rows"] if r.get("role") == role and r.get("sweep") is None and where(r)]
    return max(rows, key=lambda r: r["tokens_per_s"]) if rows else None


@dataclass(frozen=True)
class Target:
    """``value(report) / reference(report) >= ratio``; ``value``/``reference`` return (figure, row label)."""

    name: str
    value: Callable[[dict], tuple[float, str] | None]
    reference: Callable[[dict], tuple[float, str] | None]
    ratio: float
    unit: str = "x"


def check_targets(report: dict, targets: list[Target]) -> tuple[str, list[dict]]:
    """A markdown section and a list of ``{name, met, ratio, target, value, reference}``."""
    results, lines = [], ["## Targets", ""]
    for t in targets:
        v, ref = t.value(report), t.reference(report)
        if v is None or ref is None or not ref[0]:
            results.append({"name": t.name, "met": None, "ratio": None, "target": t.ratio})
            lines.append(f"- **not measured** — {t.name}: a row it needs is missing from this run")
            continue
        ratio = v[0] / ref[0]
        met = ratio >= t.ratio
        results.append(
            {"name": t.name, "met": met, "ratio": ratio, "target": t.ratio, "value": v, "reference": ref}
        )
        verdict = "met" if met else f"**MISSED** by {(t.ratio - ratio) / t.ratio:.0%}"
        lines.append(
            f"- {verdict} — {t.name}: {ratio:.2f}{t.unit} (target ≥ {t.ratio}{t.unit}); "
            f"{v[1]} {v[0]:.3g} vs {ref[1]} {ref[0]:.3g}"
        )
    return "\n".join(lines) + "\n", results
