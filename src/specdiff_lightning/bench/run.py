"""``run_bench``: every method on every prompt, repeated and interleaved, in one process.

Machines are noisy, so each prompt is decoded by every method in turn (the order rotating between
repeats) ``repeats`` times; a row reports the median throughput over repeats and its spread. The
reference output of each dtype is the verifier's own greedy ``generate()`` in that dtype, computed
once, untimed, before any timing, so "identical" never depends on which row ran first.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from tqdm.auto import tqdm

from ..decoding.calibration import slowdown_text
from ..decoding.compiled import warm_compiled
from ..decoding.config import DecodingConfig
from ..decoding.stats import GenerationOutput
from ..decoding.timing import RoundProfiler, throughput, timed
from .methods import BenchMethod
from .runners import RUNNERS, BenchModels, hf_generate, method_config

__all__ = ["run_bench", "timed_generate", "Sample"]

log = logging.getLogger(__name__)


@dataclass
class Sample:
    """One timed decode: the new tokens, seconds, and (our loops) per-round counts."""

    tokens: list[int]
    seconds: float
    verifier_calls: int | None = None
    accepted: int | None = None
    reached: list[int] | None = None
    accepted_at: list[int] | None = None


def timed_generate(fn: Callable, ids: torch.Tensor, seed: int, device) -> Sample:
    """Run ``fn(ids, generator)`` seeded with ``seed`` between two synchronised clock reads."""
    result, seconds = timed(lambda generator: fn(ids, generator), device, seed)
    if not isinstance(result, GenerationOutput):
        return Sample(list(result), seconds)
    s = result.stats
    return Sample(
        result.sequences[0, ids.shape[1] :].tolist(),
        seconds,
        s.verifier_calls,
        s.accepted_tokens,
        s.position_reached.tolist(),
        s.position_accepted.tolist(),
    )


def _dtype_name(model) -> str:
    return str(next(model.parameters()).dtype).removeprefix("torch.")


@torch.no_grad()
def run_bench(
    verifier,
    drafter,
    prompts: list[dict],
    cfg: DecodingConfig,
    methods: list[BenchMethod],
    *,
    ar_drafter=None,
    extra_drafters: dict | None = None,
    models: dict[str, BenchModels] | None = None,
    warmup: int = 1,
    repeats: int = 1,
    profile: bool = False,
    progress: bool = True,
    score: Callable[[dict, list[int]], bool] | None = None,
    verifier_name: str | None = None,
    benchmark: str | None = None,
    budget_s: float | None = None,
) -> dict:
    """Decode ``prompts`` (``[{"id", "prompt_ids"}]``) with every method; returns the report dict
    (``bench.json``'s content, see ``bench.report``).

    Args:
        verifier, drafter, ar_drafter, extra_drafters: the models of a single-dtype run (drafters
            named ``"main"``, ``"ar"`` and by their keys); or pass ``models`` instead: dtype name ->
            :class:`BenchModels` (rows pick theirs by ``BenchMethod.dtype``; None: the first).
        repeats: timed decodes of every (method, prompt), interleaved across methods.
        warmup: prompts decoded once per method, untimed, first.
        profile: split our loops' rounds into draft / tree / verify / accept / cache.
        score: ``score(prompt_row, new_tokens) -> passed`` (e.g. HumanEval execution); rows then
            report ``pass_at_1``.
        budget_s: seconds this call may take. The first repeat always runs; each later one starts
            only if its rows, at their own first repeat's measured seconds, fit in what is left
            (else no row gets it: each row reports the repeats it got, the report the cut).
    """
    start = time.perf_counter()
    if int(repeats) != repeats or repeats < 1 or int(warmup) != warmup or warmup < 0:
        raise ValueError(
            f"bench takes repeats >= 1 and warmup >= 0 (whole numbers), got repeats={repeats}, "
            f"warmup={warmup}; to keep a run short, lower repeats or set budget_s"
        )
    if models is None:
        drafters = {"main": drafter, **(extra_drafters or {})}
        if ar_drafter is not None:
            drafters["ar"] = ar_drafter
        models = {
            _dtype_name(verifier): BenchModels(verifier, {k: v for k, v in drafters.items() if v is not None})
        }
    default_dtype = next(iter(models))
    methods = [m for m in methods if _runnable(m, models.get(m.dtype or default_dtype))]
    keys = [m.key for m in methods]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise ValueError(
            f"bench rows need distinct keys, and {repeated} name more than one row; give a repeated "
            f"`settings` row a `key` of its own (or drop the repeat)"
        )

    def pair(m: BenchMethod) -> BenchModels:
        return models[m.dtype or default_dtype]

    profilers = {
        m.key: RoundProfiler(pair(m).verifier.device) if profile and m.kind in ("sps", "diffusion") else None
        for m in methods
    }

    def runner(m: BenchMethod, prof):
        mcfg = method_config(cfg, m)
        fn = RUNNERS[m.kind]
        return lambda ids, g: fn(pair(m), m, mcfg, ids, g, prof)

    def ids_of(p, m):
        return torch.tensor([p["prompt_ids"]], device=pair(m).verifier.device)

    # Rows that decode through a compiled verifier compile its graphs first, untimed (reported as
    # the row's compile_s, as the compiled HF peer's compilation is): no timed decode compiles.
    phases: dict[str, float] = {}  # the untimed work's seconds too, so a budget's reader sees where it went
    clock = time.perf_counter()

    def phase(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        phases[name] = now - clock
        clock = now

    compile_s: dict[str, float] = {}
    for m in methods:
        if m.kind in ("verifier", "sps", "diffusion") and method_config(cfg, m).compile:
            drafter = pair(m).drafter(m.drafter) if m.kind == "diffusion" else None
            compile_s[m.key] = warm_compiled(pair(m).verifier, drafter=drafter)
    phase("compile")
    for m in methods:
        for p in prompts[:warmup]:
            timed_generate(runner(m, None), ids_of(p, m), cfg.seed, pair(m).verifier.device)
    phase("warmup")
    # the references no row decodes are decoded before the timed passes (untimed), so that the
    # budget's check before each later repeat has already paid for them
    greedy = cfg.temperature == 0
    references = _decoded_references(models, methods, default_dtype, prompts, cfg) if greedy else {}
    phase("references")

    samples: dict[str, dict[str, list[Sample]]] = {m.key: {p["id"]: [] for p in prompts} for m in methods}
    reps = {m.key: m.repeats or repeats for m in methods}
    total = sum(reps.values()) * len(prompts)
    bar = tqdm(total=total, desc="bench", unit="decode", disable=not progress)
    cut = None
    for rep in range(max(reps.values(), default=0)):
        active = [m for m in methods if reps[m.key] > rep]
        if rep and budget_s is not None:
            need = sum(samples[m.key][p["id"]][0].seconds for m in active for p in prompts)
            if time.perf_counter() - start + need > budget_s:
                cut = {"after_repeat": rep, "budget_s": budget_s, "needed_s": need}
                break
        for i, p in enumerate(prompts):
            shift = (rep + i) % len(active)
            for m in active[shift:] + active[:shift]:
                run = runner(m, profilers[m.key] if rep == 0 else None)
                samples[m.key][p["id"]].append(
                    timed_generate(run, ids_of(p, m), method_config(cfg, m).seed, pair(m).verifier.device)
                )
                bar.update()
    bar.close()
    phase("timed")
    if greedy:
        references.update(_read_references(methods, default_dtype, prompts, samples))
    passed_cache: dict[tuple[str, tuple[int, ...]], bool] = {}

    def passed(p, tokens):
        key = (p["id"], tuple(tokens))
        if key not in passed_cache:
            passed_cache[key] = bool(score(p, tokens))
        return passed_cache[key]

    rows = []
    for m in methods:
        dtype = m.dtype or default_dtype
        rows.append(
            _row(
                m,
                dtype,
                method_config(cfg, m),
                prompts,
                samples[m.key],
                references.get(dtype),
                profilers[m.key],
                passed if score else None,
            )
        )
    for row in rows:
        if row["kind"] == "hf_compiled":  # the compiled peer: what its compilation (untimed warm-up) took
            from .runners import compiled_copy

            row["compile_s"] = compiled_copy(models[row["dtype"]].verifier)[1]
        elif row["key"] in compile_s:
            row["compile_s"] = compile_s[row["key"]]
    _speedups(rows)
    phase("score")
    for row in rows:
        for warning in row["warnings"]:
            log.warning("bench row %r: %s", row["method"], warning)
    return {
        "verifier": verifier_name
        or getattr(next(iter(models.values())).verifier.config, "_name_or_path", None),
        "benchmark": benchmark,
        "machine": _machine(),
        "decoding": asdict(cfg),
        "num_prompts": len(prompts),
        "repeats": repeats,
        "repeats_cut": cut,
        "phases_s": phases,
        "warmup": warmup,
        "dtypes": list(models),
        "rows": rows,
    }


def _reference_row(methods, default_dtype, dtype) -> BenchMethod | None:
    """The row whose decoding is the verifier's own greedy ``generate()`` in ``dtype`` (eager HF
    ``generate``, no settings), if the run has one."""
    return next(
        (m for m in methods if m.kind == "hf" and (m.dtype or default_dtype) == dtype and not m.decoding),
        None,
    )


def _dtypes(methods, default_dtype) -> list[str]:
    return list(dict.fromkeys(m.dtype or default_dtype for m in methods))


def _decoded_references(models, methods, default_dtype, prompts, cfg) -> dict[str, dict[str, list[int]]]:
    """The verifier's own greedy ``generate()`` output per prompt, decoded here (untimed), in each
    dtype whose rows include no eager HF ``generate`` row to read it off."""
    references = {}
    for dtype in _dtypes(methods, default_dtype):
        if _reference_row(methods, default_dtype, dtype) is None:
            v = models[dtype].verifier
            references[dtype] = {
                p["id"]: hf_generate(v, torch.tensor([p["prompt_ids"]], device=v.device), cfg)
                for p in prompts
            }
    return references


def _read_references(methods, default_dtype, prompts, samples) -> dict[str, dict[str, list[int]]]:
    """The references of the dtypes with an eager HF ``generate`` row: its first repeat's tokens
    (it is that decoding)."""
    references = {}
    for dtype in _dtypes(methods, default_dtype):
        row = _reference_row(methods, default_dtype, dtype)
        if row is not None:
            references[dtype] = {p["id"]: samples[row.key][p["id"]][0].tokens for p in prompts}
    return references


def _runnable(m: BenchMethod, pair: BenchModels | None) -> bool:
    if pair is None:
        return False
    if m.kind in ("sps", "hf_assisted"):
        return "ar" in pair.drafters
    if m.kind in ("diffusion", "hf_dflash"):
        return (m.drafter or "main") in pair.drafters
    return True


def _row(m, dtype, cfg, prompts, samples, reference, profiler, passed) -> dict:
    per_rep = []
    repeats = len(next(iter(samples.values())))
    for r in range(repeats):
        tokens = sum(max(len(samples[p["id"]][r].tokens) - 1, 0) for p in prompts)
        seconds = sum(samples[p["id"]][r].seconds for p in prompts)
        per_rep.append(tokens / seconds if seconds > 0 else float("nan"))
    first = {p["id"]: samples[p["id"]][0] for p in prompts}
    same = None
    if reference is not None:
        same = [reference[p["id"]] == first[p["id"]].tokens for p in prompts]
    per_prompt = []
    for p in prompts:
        s = samples[p["id"]]
        entry = {
            "id": p["id"],
            "new_tokens": len(s[0].tokens),
            "seconds": [x.seconds for x in s],
            "tokens_per_s": statistics.median(throughput(len(x.tokens), x.seconds) for x in s),
            "identical": None if reference is None else reference[p["id"]] == s[0].tokens,
            "deterministic": all(x.tokens == s[0].tokens for x in s),
        }
        if passed is not None:
            entry["passed"] = passed(p, s[0].tokens)
        per_prompt.append(entry)
    new_tokens = sum(len(first[p["id"]].tokens) for p in prompts)
    row = {
        "method": m.name,
        "key": m.key,
        "role": m.role,
        "kind": m.kind,
        "dtype": dtype,
        "sweep": m.sweep,
        "drafter": m.drafter,
        "tree": cfg.tree if m.kind == "diffusion" else None,  # only diffusion rows shape their drafts
        "lookup": cfg.lookup if m.kind == "diffusion" else False,
        "settings": {**m.decoding, **({"steps": m.steps} if m.steps else {})},
        "num_drafts": cfg.num_drafts,
        "gamma": cfg.gamma,
        "draft_temperature": cfg.draft_temperature,
        "acceptance": cfg.acceptance,
        "new_tokens": new_tokens,
        "wall_time_s": statistics.median(
            sum(samples[p["id"]][r].seconds for p in prompts) for r in range(repeats)
        ),
        "tokens_per_s": statistics.median(per_rep),
        "tokens_per_s_repeats": per_rep,
        "repeats": repeats,
        "tokens_per_s_spread": [min(per_rep), max(per_rep)],
        "identical": None if same is None else all(same),
        "identical_rate": None if same is None else sum(same) / len(same),
        "pass_at_1": None if passed is None else sum(e["passed"] for e in per_prompt) / len(per_prompt),
        "per_prompt": per_prompt,
        "warnings": [],
        "compiled": m.kind == "hf_compiled" or bool(getattr(cfg, "compile", False)),
    }
    row["identical_to_verifier"] = row["identical"]
    if first[prompts[0]["id"]].verifier_calls is not None:
        calls = sum(s.verifier_calls for s in first.values())
        accepted = sum(s.accepted for s in first.values())
        reached = torch.tensor([s.reached for s in first.values()]).sum(0).double()
        acc = torch.tensor([s.accepted_at for s in first.values()]).sum(0).double()
        row.update(
            verifier_calls=calls,
            mean_accepted=accepted / max(calls, 1),
            tokens_per_call=new_tokens / max(calls, 1),
            positional_acceptance=[float(x) for x in (acc / reached.where(reached > 0, torch.nan)).tolist()],
        )
    if profiler is not None:
        row["profile"] = profiler.summary()
    return row


def _speedups(rows: list[dict]) -> None:
    """``speedup``: over the fastest plain decoding of any dtype (HF ``generate``, compiled or not, and
    our verifier loop);
    ``speedup_vs_verifier``: over our verifier loop in the same dtype. Flags implausible rows: one
    verifier call per round costs at least a one-token step, so our loops cannot beat the same-dtype
    verifier loop by more than their tokens per call; and speculative rows slower than plain decoding."""
    plain = [r for r in rows if r["role"] in ("hf_generate", "verifier")]
    denominator = max(plain, key=lambda r: r["tokens_per_s"]) if plain else None
    ours = {r["dtype"]: r for r in rows if r["role"] == "verifier"}
    for r in rows:
        r["speedup"] = r["tokens_per_s"] / denominator["tokens_per_s"] if denominator else None
        r["speedup_denominator"] = denominator["key"] if denominator else None
        base = ours.get(r["dtype"])
        r["speedup_vs_verifier"] = r["tokens_per_s"] / base["tokens_per_s"] if base else None
        if r["role"] in ("specdiff", "specdiff2", "sps") and r["speedup"] is not None and r["speedup"] < 1.0:
            accepted = r.get("mean_accepted")
            cause = (
                f"its drafts are rarely accepted ({accepted:.2f} draft tokens per verifier call)"
                if accepted is not None and accepted < 0.5
                else "its rounds (drafting + the tree's forward) cost more than the tokens they add here"
            )
            r["warnings"].append(
                f"slower than plain decoding: {r['tokens_per_s']:.1f} tok/s is {slowdown_text(1 / r['speedup'])} "
                f"than {denominator['method']} ({denominator['tokens_per_s']:.1f}); likely cause: {cause} "
                f"(tree: auto sizes trees for this machine; dtype: auto picks its fastest dtype)"
            )
        tpc = r.get("tokens_per_call")
        if tpc and r["speedup_vs_verifier"] and r["speedup_vs_verifier"] > 1.15 * tpc:
            r["warnings"].append(
                f"speed-up over the verifier loop {r['speedup_vs_verifier']:.2f}x exceeds its {tpc:.2f} tokens per "
                f"verifier call: the timing is suspect (noise, or a warm cache the verifier row lacked)"
            )


def _machine() -> dict:
    import os
    import platform

    import transformers

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),  # decoding speed depends on it (docs/concepts.md)
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
