"""Bench reports: ``bench.json`` (written atomically), ``bench.md`` and PNG plots."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..paths import atomic_write

__all__ = ["write_report", "markdown_table"]


def write_report(report: dict, output_dir: str | os.PathLike) -> Path:
    """Write ``bench.json``, ``bench.md`` and the plots; returns the directory."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "bench.json", lambda tmp: Path(tmp).write_text(json.dumps(report, indent=2)))
    (out / "bench.md").write_text(markdown_table(report))
    _plots(report, out)
    return out


def _fmt(v, spec=".2f"):
    return "–" if v is None else format(v, spec)


def markdown_table(report: dict) -> str:
    d, mach = report["decoding"], report["machine"]
    lines = [
        "# Benchmark",
        "",
        f"verifier {report.get('verifier') or '?'}, benchmark {report.get('benchmark') or 'custom prompts'}: "
        f"{report['num_prompts']} prompts, max_new_tokens={d['max_new_tokens']}, temperature={d['temperature']}, "
        f"gamma={d['gamma']}; each method timed up to {report.get('repeats', 1)}x per prompt (its own count: "
        f"the xN after its spread), interleaved, after "
        f"{report['warmup']} warm-up prompt(s); machine: {mach['platform']}, {mach['cpu_count']} CPUs, "
        f"torch {mach['torch']} on {mach.get('torch_threads', '?')} threads, device {mach['cuda'] or 'cpu'}.",
        "",
        "| method | role | dtype | tokens/s (median [min–max]) | speed-up | vs verifier loop | accepted/call "
        "| tokens/call | identical | pass@1 | loop overhead |",
        "|---|---|---|---:|---:|---:|---:|---:|:-:|---:|---:|",
    ]
    cut = report.get("repeats_cut")
    if cut:
        lines[4:4] = [
            f"Repeats stopped after repeat {cut['after_repeat']}: the next needed {cut['needed_s']:.0f} s "
            f"(its rows' first repeat) and did not fit the bench's {cut['budget_s']:.0f} s.",
            "",
        ]
    phases = report.get("phases_s")
    if phases:
        named = {
            "compile": "compiling rows",
            "warmup": "warm-ups",
            "references": "references decoded",
            "timed": "timed passes",
            "score": "scoring",
        }
        spent = ", ".join(f"{named.get(k, k)} {v:.0f} s" for k, v in phases.items())
        lines[4:4] = [f"Where the bench's {sum(phases.values()):.0f} s went: {spent}.", ""]
    for r in report["rows"]:
        rate = r.get("identical_rate")
        same = "–" if rate is None else ("yes" if rate == 1 else f"**{rate:.0%}**")
        lo, hi = r.get("tokens_per_s_spread", [r["tokens_per_s"]] * 2)
        overhead = r.get("profile", {}).get("overhead")
        lines.append(
            f"| {r['method']} | {r.get('role', '–')} | {r.get('dtype', '–')} | {r['tokens_per_s']:.1f} [{lo:.1f}–{hi:.1f}] x{r.get('repeats', 1)} "
            f"| {_fmt(r['speedup'])}x | {_fmt(r.get('speedup_vs_verifier'))}x | {_fmt(r.get('mean_accepted'))} "
            f"| {_fmt(r.get('tokens_per_call'))} | {same} | {_fmt(r.get('pass_at_1'), '.2f')} "
            f"| {_fmt(overhead * 100 if overhead is not None else None, '.1f')}{'%' if overhead is not None else ''} |"
        )
    warnings = [(r["method"], w) for r in report["rows"] for w in r.get("warnings", [])]
    lines += [
        "",
        "tokens/s: (new tokens - 1) / wall time summed over the prompts, median over repeats. speed-up: over "
        "the fastest plain decoding of any dtype (HF `generate`, compiled or not, or our verifier loop: "
        f"`{report['rows'][0].get('speedup_denominator', '?') if report['rows'] else '?'}`); "
        "vs verifier loop: over our own verifier-only loop in the same dtype. accepted/call excludes the token "
        "each verifier call adds itself; tokens/call includes it. identical: share of prompts whose output "
        "equals the verifier's own greedy `generate()` in the same dtype.",
    ]
    if warnings:
        lines += ["", "Warnings:"] + [f"- {name}: {text}" for name, text in warnings]
    return "\n".join(lines) + "\n" + profile_table(report)


def profile_table(report: dict) -> str:
    """Where a round of our loops spends its time (``profile=True``, first repeat): ms per round
    by phase, and tokens emitted per round."""
    rows = [r for r in report["rows"] if r.get("profile") and r["profile"].get("rounds")]
    if not rows:
        return ""
    phases = ("draft", "tree", "verify", "accept", "cache")
    lines = [
        "",
        "## Profile of our loops (ms per round, first repeat)",
        "",
        "| method | rounds | tokens/round | " + " | ".join(phases) + " | other | round |",
        "|---|---:|---:|" + "---:|" * (len(phases) + 2),
    ]
    for r in rows:
        prof = r["profile"]
        n = prof["rounds"]
        parts = [1000 * prof[f"{p}_s"] / n for p in phases]
        total = 1000 * prof["round_s"] / n
        lines.append(
            f"| {r['method']} | {n} | {_fmt(r.get('tokens_per_call'))} | "
            + " | ".join(f"{x:.1f}" for x in parts)
            + f" | {total - sum(parts):.1f} | {total:.1f} |"
        )
    return "\n".join(lines) + "\n"


def _plots(report: dict, out: Path) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["rows"] if r.get("positional_acceptance") and r["sweep"] is None]
    if rows:
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for r in rows:
            curve = r["positional_acceptance"]
            ax.plot(range(1, len(curve) + 1), curve, marker="o", ms=3, label=r["method"])
        ax.set_xlabel("draft position j")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_ylabel(r"$\gamma_j$")
        ax.set_ylim(0, 1.05)
        ax.set_title("Positional acceptance")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "positional_acceptance.png", dpi=120)
        plt.close(fig)
    for sweep, xkey, fname in (
        ("num_drafts", "num_drafts", "speedup_vs_k.png"),
        ("gamma", "gamma", "speedup_vs_gamma.png"),
    ):
        pts = sorted(
            (r[xkey], r["speedup"], r.get("mean_accepted"))
            for r in report["rows"]
            if r["sweep"] == sweep and r["speedup"]
        )
        if not pts:
            continue
        fig, ax = plt.subplots(figsize=(5, 3.4))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label="speed-up")
        ax.set_xlabel("K (drafts)" if sweep == "num_drafts" else r"$\gamma$ (draft window)")
        ax.set_ylabel("speed-up over verifier")
        ax2 = ax.twinx()
        ax2.plot(
            [p[0] for p in pts], [p[2] for p in pts], marker="s", color="tab:orange", label="accepted/call"
        )
        ax2.set_ylabel("accepted tokens / call", color="tab:orange")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=120)
        plt.close(fig)
    main = [r for r in report["rows"] if r["sweep"] is None]
    if main:
        fig, ax = plt.subplots(figsize=(7, 0.35 * len(main) + 1.2))
        colors = {
            role: plt.cm.tab10(i) for i, role in enumerate(sorted({r.get("role", "other") for r in main}))
        }
        for i, r in enumerate(main):
            lo, hi = r.get("tokens_per_s_spread", [r["tokens_per_s"]] * 2)
            ax.barh(
                i,
                r["tokens_per_s"],
                color=colors[r.get("role", "other")],
                xerr=[[r["tokens_per_s"] - lo], [hi - r["tokens_per_s"]]],
            )
        ax.set_yticks(range(len(main)), [r["method"] for r in main], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("tokens / s (median over repeats, bars: min–max)")
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
        ax.legend(handles, list(colors), fontsize=6, loc="lower right")
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "throughput.png", dpi=120)
        plt.close(fig)
