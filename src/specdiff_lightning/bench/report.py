"""``bench``: the same prompts decoded by every method, one after the other in one process.

Measures tokens/s, speed-up over verifier-only decoding (per prompt, side by side), accepted
tokens per verifier call and wall time; at temperature 0 it asserts every method's output equals
the verifier's. Writes ``bench.json``, ``bench.md`` and PNG plots.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from .decoding.config import DecodingConfig
from .decoding.generate import speculative_generate, verifier_generate
from .decoding.timing import RoundProfiler, now
from .models.autoregressive import AutoregressiveDrafter

__all__ = [
    "BenchMethod",
    "setting_methods",
    "default_methods",
    "extra_drafter_methods",
    "sweep_methods",
    "run_bench",
    "write_report",
]


@dataclass
class BenchMethod:
    """One row of the benchmark.

    ``kind``: ``verifier`` (our loop), ``hf`` (``generate()``), ``hf_assisted`` (``generate(assistant_model=
    AR drafter)``), ``hf_prompt_lookup``, ``sps`` (our loop, AR drafter), ``diffusion`` (our loop,
    diffusion drafter). ``decoding`` overrides the run's :class:`DecodingConfig`.
    """

    name: str
    kind: str
    decoding: dict = field(default_factory=dict)
    sweep: str | None = None  # which ablation this row belongs to (num_drafts, gamma, ...)
    steps: int | None = None  # denoising steps override (diffusion)
    drafter: str | None = None  # an extra drafter's name (run_bench(extra_drafters=...)); None: the main one


def default_methods(cfg: DecodingConfig, with_ar: bool) -> list[BenchMethod]:
    k = max(cfg.num_drafts, 1)
    methods = [
        BenchMethod("verifier (ours)", "verifier"),
        BenchMethod("HF generate", "hf"),
        BenchMethod("HF prompt lookup", "hf_prompt_lookup"),
    ]
    if with_ar:
        methods += [
            BenchMethod("HF assisted (AR drafter)", "hf_assisted"),
            BenchMethod(
                "SpS (AR drafter)",
                "sps",
                {"num_drafts": 1, "acceptance": "standard", "draft_temperature": 1.0},
            ),
        ]
    methods += [
        BenchMethod(
            "SpecDiff (K=1, standard)",
            "diffusion",
            {"num_drafts": 1, "acceptance": "standard", "draft_temperature": 1.0},
        ),
        BenchMethod("SpecDiff-2 (K=1, greedy)", "diffusion", {"num_drafts": 1, "acceptance": "greedy"}),
        BenchMethod(f"SpecDiff-2 (K={k}, greedy)", "diffusion", {"num_drafts": k, "acceptance": "greedy"}),
        BenchMethod(
            f"SpecDiff-2 (K={k}, recursive)", "diffusion", {"num_drafts": k, "acceptance": "recursive"}
        ),
    ]
    return methods


def setting_methods(settings: list[dict]) -> list[BenchMethod]:
    """Explicit SpecDiff-2 rows, each a dict of :class:`DecodingConfig` overrides (e.g. the best
    CPU setting ``{"num_drafts": 2, "gamma": 3}``)."""
    rows = []
    for setting in settings:
        setting = {"acceptance": "greedy", **setting}
        label = ", ".join(f"{'K' if k == 'num_drafts' else k}={v}" for k, v in setting.items())
        rows.append(BenchMethod(f"SpecDiff-2 ({label})", "diffusion", setting))
    return rows


def sweep_methods(
    cfg: DecodingConfig,
    num_drafts: list[int] = (),
    draft_temperature: list[float] = (),
    gamma: list[int] = (),
    steps: list[int] = (),
) -> list[BenchMethod]:
    """Ablation rows: K (Fig. 5), draft temperature, gamma (Fig. 10), denoising steps (Fig. 9)."""
    rows = [
        BenchMethod(f"K={k}", "diffusion", {"num_drafts": k, "acceptance": "greedy"}, "num_drafts")
        for k in num_drafts
    ]
    rows += [
        BenchMethod(
            f"T={t}", "diffusion", {"draft_temperature": t, "acceptance": "greedy"}, "draft_temperature"
        )
        for t in draft_temperature
    ]
    rows += [
        BenchMethod(f"gamma={g}", "diffusion", {"gamma": g, "acceptance": "greedy"}, "gamma") for g in gamma
    ]
    rows += [
        BenchMethod(f"steps={s}", "diffusion", {"acceptance": "greedy"}, "steps", steps=s) for s in steps
    ]
    return rows


def _hf_generate(verifier, ids, cfg: DecodingConfig, eos, **extra) -> list[int]:
    sample = cfg.temperature > 0
    kwargs = dict(
        do_sample=sample,
        max_new_tokens=cfg.max_new_tokens,
        eos_token_id=eos,
        pad_token_id=eos if isinstance(eos, int) else 0,
    )
    if sample:
        kwargs.update(temperature=cfg.temperature, top_k=cfg.top_k or 0, top_p=cfg.top_p or 1.0)
    out = verifier.generate(ids, attention_mask=torch.ones_like(ids), **kwargs, **extra)
    return out[0, ids.shape[1] :].tolist()


@dataclass
class _Sample:
    tokens: list[int]
    seconds: float
    verifier_calls: int | None = None
    accepted: int | None = None
    reached: list[int] | None = None
    accepted_at: list[int] | None = None


def extra_drafter_methods(name: str, cfg: DecodingConfig) -> list[BenchMethod]:
    """K = 1 and K = max(K, 8) SpecDiff-2 rows for another drafter (e.g. the undistilled one)."""
    k = max(cfg.num_drafts, 8)
    return [
        BenchMethod(
            f"SpecDiff-2 (K=1, greedy, {name})",
            "diffusion",
            {"num_drafts": 1, "acceptance": "greedy"},
            drafter=name,
        ),
        BenchMethod(
            f"SpecDiff-2 (K={k}, greedy, {name})",
            "diffusion",
            {"num_drafts": k, "acceptance": "greedy"},
            drafter=name,
        ),
    ]


def _runner(
    method: BenchMethod, verifier, drafter, ar_drafter, cfg: DecodingConfig, eos, profiler
) -> Callable:
    device = verifier.device

    def timed(fn):
        def run(ids, seed):
            generator = torch.Generator(device=device).manual_seed(seed)
            start = now(device)
            result = fn(ids, generator)
            seconds = now(device) - start
            if isinstance(result, list):
                return _Sample(result, seconds)
            s = result.stats
            return _Sample(
                result.sequences[0, ids.shape[1] :].tolist(),
                seconds,
                s.verifier_calls,
                s.accepted_tokens,
                s.position_reached.tolist(),
                s.position_accepted.tolist(),
            )

        return run

    kind = method.kind
    if kind == "verifier":
        return timed(
            lambda ids, g: verifier_generate(
                verifier, ids, **cfg.sampling_kwargs(), eos_token_id=eos, generator=g
            )
        )
    if kind == "hf":
        return timed(lambda ids, g: _hf_generate(verifier, ids, cfg, eos))
    if kind == "hf_prompt_lookup":
        return timed(lambda ids, g: _hf_generate(verifier, ids, cfg, eos, prompt_lookup_num_tokens=cfg.gamma))
    if kind == "hf_assisted":
        return timed(lambda ids, g: _hf_generate(verifier, ids, cfg, eos, assistant_model=ar_drafter.model))
    if kind in ("sps", "diffusion"):
        model = ar_drafter if kind == "sps" else drafter
        if method.steps is not None:
            model = replace_steps(drafter, method.steps)
        return timed(
            lambda ids, g: speculative_generate(
                verifier,
                model,
                ids,
                **cfg.generate_kwargs(),
                eos_token_id=eos,
                generator=g,
                profiler=profiler,
            )
        )
    raise ValueError(f"unknown bench method kind {kind!r}")


def replace_steps(drafter, steps: int):
    """A view of ``drafter`` with another number of denoising steps (same weights)."""
    clone = object.__new__(type(drafter))
    clone.__dict__.update(drafter.__dict__)
    clone.steps = steps
    return clone


def _machine() -> dict:
    import transformers

    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    return info


@torch.no_grad()
def run_bench(
    verifier: nn.Module,
    drafter,
    prompts: list[dict],
    cfg: DecodingConfig,
    methods: list[BenchMethod],
    *,
    ar_drafter: AutoregressiveDrafter | None = None,
    extra_drafters: dict | None = None,
    warmup: int = 1,
    profile: bool = False,
    progress: bool = True,
) -> dict:
    """Decode ``prompts`` (``[{"id", "prompt_ids"}]``) with every method; returns the report dict."""
    device = verifier.device
    eos = verifier.generation_config.eos_token_id
    rows = []
    reference: dict[str, list[int]] = {}
    baseline: dict[str, _Sample] = {}
    for method in tqdm(methods, desc="bench", unit="method", disable=not progress):
        mcfg = replace(cfg, **method.decoding)
        if method.kind in ("sps", "hf_assisted") and ar_drafter is None:
            continue
        profiler = RoundProfiler(device) if profile and method.kind in ("sps", "diffusion") else None
        method_drafter = drafter if method.drafter is None else (extra_drafters or {})[method.drafter]
        run = _runner(method, verifier, method_drafter, ar_drafter, mcfg, eos, None)
        for p in prompts[:warmup]:
            run(torch.tensor([p["prompt_ids"]], device=device), mcfg.seed)
        run = _runner(method, verifier, method_drafter, ar_drafter, mcfg, eos, profiler)
        samples = []
        for p in prompts:
            ids = torch.tensor([p["prompt_ids"]], device=device)
            samples.append(run(ids, mcfg.seed))
        identical = None
        if cfg.temperature == 0:
            if method.kind == "verifier" and not reference:
                reference = {p["id"]: s.tokens for p, s in zip(prompts, samples, strict=True)}
            identical = all(reference.get(p["id"]) == s.tokens for p, s in zip(prompts, samples, strict=True))
        if method.kind == "verifier" and not baseline:
            baseline = {p["id"]: s for p, s in zip(prompts, samples, strict=True)}
        rows.append(_row(method, mcfg, prompts, samples, baseline, identical, profiler))
    report = {
        "machine": _machine(),
        "decoding": asdict(cfg),
        "num_prompts": len(prompts),
        "warmup": warmup,
        "rows": rows,
    }
    return report


def _rate(n: int, t: float) -> float:
    return max(n - 1, 0) / t if t > 0 else float("nan")


def _row(method, cfg, prompts, samples, baseline, identical, profiler) -> dict:
    new_tokens = sum(len(s.tokens) for s in samples)
    seconds = sum(s.seconds for s in samples)
    rates = [_rate(len(s.tokens), s.seconds) for s in samples]
    speedups = [
        _rate(len(s.tokens), s.seconds) / _rate(len(baseline[p["id"]].tokens), baseline[p["id"]].seconds)
        for p, s in zip(prompts, samples, strict=True)
        if p["id"] in baseline and len(s.tokens) > 1 and len(baseline[p["id"]].tokens) > 1
    ]
    row = {
        "method": method.name,
        "kind": method.kind,
        "sweep": method.sweep,
        "settings": {**method.decoding, **({"steps": method.steps} if method.steps else {})},
        "drafter": method.drafter,
        "num_drafts": cfg.num_drafts,
        "gamma": cfg.gamma,
        "draft_temperature": cfg.draft_temperature,
        "acceptance": cfg.acceptance,
        "new_tokens": new_tokens,
        "wall_time_s": seconds,
        "tokens_per_s": sum(rates) / len(rates),
        "speedup": sum(speedups) / len(speedups) if speedups else None,
        "identical_to_verifier": identical,
    }
    if samples[0].verifier_calls is not None:
        calls = sum(s.verifier_calls for s in samples)
        accepted = sum(s.accepted for s in samples)
        reached = torch.tensor([s.reached for s in samples]).sum(0).double()
        acc = torch.tensor([s.accepted_at for s in samples]).sum(0).double()
        row.update(
            verifier_calls=calls,
            mean_accepted=accepted / max(calls, 1),
            tokens_per_call=new_tokens / max(calls, 1),
            positional_acceptance=[float(x) for x in (acc / reached.where(reached > 0, torch.nan)).tolist()],
        )
    if profiler is not None:
        row["profile"] = profiler.summary()
    return row


def write_report(report: dict, output_dir: str | os.PathLike) -> Path:
    """Write ``bench.json``, ``bench.md`` and the plots; returns the directory."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "bench.json.tmp"
    tmp.write_text(json.dumps(report, indent=2))
    os.replace(tmp, out / "bench.json")
    (out / "bench.md").write_text(markdown_table(report))
    _plots(report, out)
    return out


def _fmt(v, spec=".2f"):
    return "–" if v is None else format(v, spec)


def markdown_table(report: dict) -> str:
    d = report["decoding"]
    lines = [
        "# Benchmark",
        "",
        f"{report['num_prompts']} prompts, max_new_tokens={d['max_new_tokens']}, temperature={d['temperature']}, "
        f"gamma={d['gamma']}, warm-up {report['warmup']} prompt(s); machine: {report['machine']['platform']}, "
        f"{report['machine']['cpu_count']} CPUs, torch {report['machine']['torch']}, device "
        f"{report['machine']['cuda'] or 'cpu'}.",
        "",
        "| method | tokens/s | speed-up | accepted/call | tokens/call | wall (s) | identical | loop overhead |",
        "|---|---:|---:|---:|---:|---:|:-:|---:|",
    ]
    for r in report["rows"]:
        same = {True: "yes", False: "**NO**", None: "–"}[r["identical_to_verifier"]]
        overhead = r.get("profile", {}).get("overhead")
        lines.append(
            f"| {r['method']} | {r['tokens_per_s']:.1f} | {_fmt(r['speedup'])}x | {_fmt(r.get('mean_accepted'))} | "
            f"{_fmt(r.get('tokens_per_call'))} | {r['wall_time_s']:.2f} | {same} | "
            f"{_fmt(overhead * 100 if overhead is not None else None, '.1f')}{'%' if overhead is not None else ''} |"
        )
    lines += [
        "",
        "speed-up: mean over prompts of throughput / verifier-only throughput on the same prompt "
        "(throughput = (new tokens - 1) / wall time). accepted/call excludes the token each verifier "
        "call adds itself; tokens/call includes it.",
    ]
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
