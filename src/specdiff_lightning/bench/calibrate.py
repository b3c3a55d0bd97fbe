"""``bench --calibrate``: this machine's cost model of the verifier in each dtype, as a table and a plot.

What ``tree: auto`` and ``dtype: auto`` read (:mod:`specdiff_lightning.decoding.calibration`): the
verifier's forward time over n new tokens, relative to a one-token step, per dtype.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from ..decoding.calibration import (
    COMPILED_DTYPE_MARGIN,
    COMPILED_DTYPE_TREE_NODES,
    DTYPE_CONTEXT,
    DTYPE_NEW_TOKENS,
    DTYPE_TOKENS_PER_ROUND,
    DTYPE_TREE_NODES,
    compiled_candidates,
    cost_model_for,
    dtype_request_cost,
    in_dtype,
    machine_info,
)

__all__ = [
    "calibrate_verifier",
    "calibration_report",
    "calibration_table",
    "plot_calibration",
    "write_calibration",
]


def calibrate_verifier(
    verifier: nn.Module,
    dtypes: tuple[str, ...] = ("float32", "bfloat16"),
    refresh: bool = False,
    compiled: bool = False,
) -> dict:
    """``{"machine", "context", "fastest_dtype", "request_ms", "cost_models": {dtype: CostModel
    dict}}`` for ``verifier`` cast to each of ``dtypes`` (cached cost models are reused unless
    ``refresh``). ``compiled``: ``cost_models`` are the compiled forward's, compiled in the dtypes
    that ``dtype: auto`` would compile
    (:func:`~specdiff_lightning.decoding.calibration.compiled_candidates`), and
    ``eager_cost_models`` the eager one's, which prices the prefill; ``request_ms`` is each
    compared dtype's :func:`~specdiff_lightning.decoding.calibration.dtype_request_cost`, whose
    least is ``fastest_dtype``."""
    # a verifier whose kernels were chosen for its own dtype: its copies get their dtype's
    prepare = hasattr(verifier, "linear_kernels")
    models = {name: in_dtype(verifier, getattr(torch, name), prepare=prepare) for name in dtypes}
    eager = {name: cost_model_for(model, refresh=refresh) for name, model in models.items()}
    fast = {}
    if compiled:
        for name in compiled_candidates({d: dtype_request_cost(m) for d, m in eager.items()}):
            fast[name] = cost_model_for(models[name], refresh=refresh, compiled=True)
    return calibration_report(eager, fast or None, next(verifier.parameters()).device)


def calibration_report(eager: dict, compiled: dict | None = None, device: str | torch.device = "cpu") -> dict:
    """The report of :func:`calibrate_verifier` from cost models already measured (dtype name ->
    :class:`~specdiff_lightning.decoding.costmodel.CostModel`, eager and, optionally, compiled).
    ``compiled`` may hold fewer dtypes than ``eager`` (those
    :func:`~specdiff_lightning.decoding.calibration.compiled_candidates` leaves): the others are
    listed under ``"not_compiled"`` with their eager price over the cheapest."""
    request = {d: dtype_request_cost(eager[d], compiled[d] if compiled else None) for d in compiled or eager}
    report = {
        "machine": machine_info(device),
        "context": DTYPE_CONTEXT,
        "forward": "compiled" if compiled else "eager",
        "fastest_dtype": min(request, key=request.get),
        "request_ms": request,
        "cost_models": {d: m.to_dict() for d, m in (compiled or eager).items()},
    }
    if compiled:
        report["eager_cost_models"] = {d: m.to_dict() for d, m in eager.items()}
        prices = {d: dtype_request_cost(m) for d, m in eager.items()}
        cheapest = min(prices.values())
        report["not_compiled"] = {d: prices[d] / cheapest for d in eager if d not in compiled}
    return report


def calibration_table(report: dict) -> str:
    """Markdown: per dtype, the one-token step and the relative cost of each measured tree size."""
    from ..decoding.costmodel import CostModel

    context = report["context"]
    models = {d: CostModel.from_dict(m) for d, m in report["cost_models"].items()}
    nodes = next(iter(models.values())).nodes
    compiled = next(iter(models.values())).key.get("forward") == "compiled"
    machine = report["machine"]
    lines = [
        f"## Calibration{' of the compiled forward' if compiled else ''}: {machine['cpu']} "
        f"({', '.join(machine['cpu_flags']) or 'no AVX flags'}; "
        f"torch kernels {machine['cpu_capability']}, {machine['threads']} threads"
        + (f"; env {machine['env']}" if machine.get("env") else "")
        + ")",
        "",
        f"Verifier{' compiled' if compiled else ''} forward over n new tokens after {context} cached ones, "
        "as a multiple of a one-token step (medians, non-decreasing); fastest dtype here: "
        f"**{report['fastest_dtype']}**, by the time of a request of a {DTYPE_CONTEXT}-token prompt "
        f"(prefilled eagerly) and {DTYPE_NEW_TOKENS} new tokens in rounds of "
        f"{COMPILED_DTYPE_TREE_NODES if compiled else DTYPE_TREE_NODES}-node trees adding "
        f"{DTYPE_TOKENS_PER_ROUND:g} tokens each"
        + (
            " (" + ", ".join(f"{d} {ms / 1e3:.2f} s" for d, ms in report["request_ms"].items()) + ")."
            if report.get("request_ms")
            else "."
        )
        + "".join(
            f" Not compiled: {d}, whose eager request priced {ratio:.2f}x the cheapest dtype's (compiling "
            f"is left to dtypes under {COMPILED_DTYPE_MARGIN:g}x)."
            for d, ratio in report.get("not_compiled", {}).items()
        ),
        "",
        "| dtype | 1 token | "
        + " | ".join(str(n) for n in nodes[1:])
        + " | kernels other than F.linear (rows) |",
        "|---|---:|" + "---:|" * (len(nodes) - 1) + "---|",
    ]
    for dtype, model in models.items():
        rel = model.relative(context)
        cells = " | ".join(f"{rel[n]:.2f}x" for n in nodes[1:])
        rows = _kernel_cell(model.key.get("model", {}).get("linear_kernels"))
        lines.append(f"| {dtype} | {model.step_cost(context):.1f} ms | {cells} | {rows} |")
    return "\n".join(lines) + "\n"


def _kernel_cell(choice) -> str:
    """``{"packed": [1, 2, 3, 8]}`` (:func:`~specdiff_lightning.decoding.kernels.linear_kernel_choice`)
    as ``packed 1-3, 8``."""
    if not choice:
        return "none"
    parts = []
    for kernel, rows in choice.items():
        runs, start = [], None
        for i, r in enumerate(rows):
            if start is None:
                start = r
            if i + 1 == len(rows) or rows[i + 1] != r + 1:
                runs.append(str(r) if r == start else f"{start}-{r}")
                start = None
        parts.append(f"{kernel} {', '.join(runs)}")
    return "; ".join(parts)


def plot_calibration(report: dict, path: str | Path) -> None:
    """Milliseconds against tree size, one line per dtype."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..decoding.costmodel import CostModel

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for dtype, data in report["cost_models"].items():
        model = CostModel.from_dict(data)
        ax.plot(
            model.nodes,
            [model.verifier_cost(n, report["context"]) for n in model.nodes],
            marker="o",
            label=dtype,
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tree nodes (new tokens in one verifier forward)")
    ax.set_ylabel("ms (median)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    forward = "compiled verifier" if report.get("forward") == "compiled" else "Verifier"
    ax.set_title(f"{forward.capitalize()} cost on {report['machine']['cpu'][:40]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_calibration(report: dict, output_dir: str | Path) -> Path:
    """``calibration.json``, ``calibration.md`` and ``calibration.png`` in ``output_dir``."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.json").write_text(json.dumps(report, indent=1))
    (out / "calibration.md").write_text(calibration_table(report))
    plot_calibration(report, out / "calibration.png")
    return out
