"""Speed and acceptance targets checked on a bench report, rows looked up by role and key."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Target", "check_targets", "best_row", "find_row", "figure"]

#: a figure read off a report: (value, what it is), or None when the rows it needs are missing
Figure = tuple[float, str] | None


def find_row(report: dict, key: str) -> dict | None:
    """The row with this stable key (never a display label)."""
    return next((r for r in report["rows"] if r.get("key") == key), None)


def best_row(report: dict, role: str, where: Callable[[dict], bool] = lambda r: True) -> dict | None:
    """The fastest main (non-sweep) row of a role (tokens/s), optionally filtered."""
    rows = [r for r in report["rows"] if r.get("role") == role and r.get("sweep") is None and where(r)]
    return max(rows, key=lambda r: r["tokens_per_s"]) if rows else None


#: the roles of plain decoding (no drafts): HF ``generate``, compiled or not, and our verifier loop,
#: eager or compiled; a speed-up is over the fastest of them
PLAIN_ROLES = ("hf_generate", "verifier")


def fastest_plain(report: dict) -> dict | None:
    """The fastest main row of plain decoding (:data:`PLAIN_ROLES`), in any dtype."""
    rows = [x for x in (best_row(report, role) for role in PLAIN_ROLES) if x is not None]
    return max(rows, key=lambda r: r["tokens_per_s"]) if rows else None


def figure(row: dict | None, field: str) -> Figure:
    """``(row[field], row's label)`` or None."""
    return None if row is None or row.get(field) is None else (float(row[field]), row["method"])


@dataclass(frozen=True)
class Target:
    """``value / reference`` (or ``value`` alone when ``reference`` is None) compared with ``bound``:
    at least it, or at most it when ``at_most``."""

    name: str
    value: Callable[[dict], Figure]
    reference: Callable[[dict], Figure] | None
    bound: float
    at_most: bool = False
    unit: str = "x"


def check_targets(report: dict, targets: list[Target]) -> tuple[str, list[dict]]:
    """A markdown section stating every figure, and ``[{name, met, figure, bound, value, reference}]``."""
    results, lines = [], ["## Targets", ""]
    for t in targets:
        v = t.value(report)
        ref = t.reference(report) if t.reference is not None else (1.0, "")
        if v is None or ref is None or not ref[0]:
            results.append({"name": t.name, "met": None, "figure": None, "bound": t.bound})
            lines.append(f"- **not measured** — {t.name}: a row it needs is missing or zero in this run")
            continue
        fig = v[0] / ref[0]
        met = fig <= t.bound if t.at_most else fig >= t.bound
        results.append(
            {"name": t.name, "met": met, "figure": fig, "bound": t.bound, "value": v, "reference": ref}
        )
        verdict = "met" if met else f"**MISSED** by {abs(fig - t.bound) / t.bound:.0%}"
        sign = "≤" if t.at_most else "≥"
        source = f"{v[1]} {v[0]:.3g}" + (f" vs {ref[1]} {ref[0]:.3g}" if t.reference is not None else "")
        lines.append(f"- {verdict} — {t.name}: {fig:.2f}{t.unit} (target {sign} {t.bound}{t.unit}); {source}")
    return "\n".join(lines) + "\n", results
