"""Bench rows: which method, on which drafter and dtype, with which decoding settings.

Every row carries a stable ``role`` (what kind of method it is, for target checks and plots) and a
``key`` (which row it is); display names are for people only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..decoding.config import DecodingConfig

__all__ = [
    "ROLES",
    "BenchMethod",
    "default_methods",
    "setting_methods",
    "sweep_methods",
    "extra_drafter_methods",
]

#: the roles a row may have (bench.json ``rows[].role``)
ROLES = (
    "verifier",
    "hf_generate",
    "hf_prompt_lookup",
    "hf_assisted",
    "hf_dflash",
    "sps",
    "specdiff",
    "specdiff2",
    "other",
)

# The runner each kind uses decides the role a row gets when none is given.
_DEFAULT_ROLE = {
    "verifier": "verifier",
    "hf": "hf_generate",
    "hf_compiled": "hf_generate",  # plain decoding too: the denominator is the fastest of them
    "hf_prompt_lookup": "hf_prompt_lookup",
    "hf_assisted": "hf_assisted",
    "hf_dflash": "hf_dflash",
    "sps": "sps",
    "diffusion": "specdiff2",
}


@dataclass
class BenchMethod:
    """One row of the benchmark.

    Attributes:
        name: the label shown in tables and plots.
        kind: which runner decodes it (a key of ``bench.runners.RUNNERS``): ``verifier`` (our loop,
            no drafter), ``hf`` (``generate()``), ``hf_compiled`` (``generate()`` with a static cache
            and a compiled forward, on its own model copy), ``hf_prompt_lookup``, ``hf_assisted`` (``generate(assistant_model=
            the AR drafter)``), ``hf_dflash`` (``generate(assistant_model=the DFlash drafter's stock
            model, speculation_type="dflash")``, the row's ``drafter``), ``sps`` (our loop, AR drafter), ``diffusion`` (our loop, a diffusion drafter).
        decoding: overrides of the run's :class:`DecodingConfig` (diffusion rows also shape their
            draft trees through its ``tree`` and ``lookup``).
        sweep: the ablation this row belongs to (``num_drafts``, ``gamma``, ...), None for main rows.
        steps: denoising steps override (diffusion).
        drafter: which diffusion drafter (a key of the bench's drafters; None: ``"main"``).
        role: one of :data:`ROLES`; None: from ``kind`` (``specdiff`` for K=1 ``standard``).
        key: a stable identifier, unique in a run (None: derived from name); target checks, plots
            and the report look rows up by role and key, never by name.
        dtype: run in this dtype's copy of the models (None: the run's first dtype).
        repeats: timed decodes per prompt for this row (None: the run's); fewer for rows read for
            their acceptance or exactness rather than their speed.
    """

    name: str
    kind: str
    decoding: dict = field(default_factory=dict)
    sweep: str | None = None
    steps: int | None = None
    drafter: str | None = None
    role: str | None = None
    key: str | None = None
    dtype: str | None = None
    repeats: int | None = None

    def __post_init__(self) -> None:
        if self.role is None:
            role = _DEFAULT_ROLE.get(self.kind, "other")
            if self.kind == "diffusion" and (
                self.decoding.get("acceptance") == "standard" or self.drafter not in (None, "main")
            ):
                role = "specdiff" if self.decoding.get("acceptance") == "standard" else "other"
            if self.sweep is not None:
                role = "other"
            self.role = role
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if self.key is None:
            self.key = _slug(self.name)

    def with_dtype(self, dtype: str) -> BenchMethod:
        from dataclasses import replace

        return replace(
            self, dtype=dtype, key=f"{self.key}@{dtype}", name=f"{self.name} [{short_dtype(dtype)}]"
        )


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text.lower()).strip("_").replace("__", "_")


def short_dtype(dtype: str) -> str:
    """The short name bench keys and labels give a dtype (``"bfloat16"`` -> ``"bf16"``)."""
    return {"float32": "fp32", "bfloat16": "bf16", "float64": "fp64", "float16": "fp16"}.get(dtype, dtype)


def default_methods(cfg: DecodingConfig, with_ar: bool) -> list[BenchMethod]:
    k = max(cfg.num_drafts, 1)
    methods = [
        BenchMethod("verifier (ours)", "verifier", key="verifier"),
        BenchMethod("HF generate", "hf", key="hf_generate"),
        BenchMethod("HF prompt lookup", "hf_prompt_lookup", key="hf_prompt_lookup"),
    ]
    if with_ar:
        methods += [
            BenchMethod("HF assisted (AR drafter)", "hf_assisted", key="hf_assisted"),
            BenchMethod(
                "SpS (AR drafter)",
                "sps",
                {"num_drafts": 1, "acceptance": "standard", "draft_temperature": 1.0},
                key="sps",
            ),
        ]
    methods += [
        BenchMethod(
            "SpecDiff (K=1, standard)",
            "diffusion",
            {"num_drafts": 1, "acceptance": "standard", "draft_temperature": 1.0},
            key="specdiff_k1_standard",
        ),
        BenchMethod(
            "SpecDiff-2 (tree: auto)",
            "diffusion",
            {"acceptance": "greedy", "tree": "auto"},
            key="specdiff2_auto",
        ),
        BenchMethod(
            "SpecDiff-2 (K=1, greedy)",
            "diffusion",
            {"num_drafts": 1, "acceptance": "greedy"},
            key="specdiff2_k1",
        ),
    ]
    if k > 1:  # at K=1 the run's greedy row is the K=1 row above: one row, one key
        methods.append(
            BenchMethod(
                f"SpecDiff-2 (K={k}, greedy)",
                "diffusion",
                {"num_drafts": k, "acceptance": "greedy"},
                key=f"specdiff2_k{k}",
            )
        )
    methods.append(
        BenchMethod(
            f"SpecDiff-2 (K={k}, recursive)",
            "diffusion",
            {"num_drafts": k, "acceptance": "recursive"},
            key=f"specdiff2_k{k}_recursive",
        )
    )
    return methods


def setting_methods(settings: list[dict]) -> list[BenchMethod]:
    """Explicit SpecDiff-2 rows, each a dict of :class:`DecodingConfig` overrides (``tree`` and
    ``lookup`` among them) plus optional ``key``, ``dtype`` and ``drafter``."""
    rows = []
    for setting in settings:
        setting = {"acceptance": "greedy", **setting}
        extra = {name: setting.pop(name) for name in ("key", "dtype", "drafter") if name in setting}
        plain = {k: v for k, v in setting.items() if k not in ("tree", "lookup")}
        label = ", ".join(f"{'K' if k == 'num_drafts' else k}={v}" for k, v in plain.items())
        if setting.get("tree") == "auto":
            label += ", tree auto"
        elif setting.get("tree"):
            label += ", adaptive tree"
        if setting.get("lookup"):
            label += ", +lookup"
        if extra.get("drafter") not in (None, "main"):
            label += f", {extra['drafter']}"
        extra.setdefault("key", _setting_key(setting, extra.get("drafter")))
        rows.append(BenchMethod(f"SpecDiff-2 ({label})", "diffusion", setting, **extra))
    return rows


def _setting_key(setting: dict, drafter: str | None) -> str:
    """A key read off the settings themselves (not the label, which may change): equal settings get
    equal keys, which ``run_bench`` refuses, so a repeated row needs a ``key`` of its own."""
    spelled = json.dumps(setting, sort_keys=True) + ("" if drafter in (None, "main") else f" {drafter}")
    return "settings_" + _slug(spelled)


def sweep_methods(
    cfg: DecodingConfig,
    num_drafts: list[int] = (),
    draft_temperature: list[float] = (),
    gamma: list[int] = (),
    steps: list[int] = (),
) -> list[BenchMethod]:
    """Ablation rows: K (Fig. 5), draft temperature, gamma (Fig. 10), denoising steps (Fig. 9)."""
    rows = [
        BenchMethod(
            f"K={k}", "diffusion", {"num_drafts": k, "acceptance": "greedy"}, "num_drafts", key=f"sweep_k{k}"
        )
        for k in num_drafts
    ]
    rows += [
        BenchMethod(
            f"T={t}",
            "diffusion",
            {"draft_temperature": t, "acceptance": "greedy"},
            "draft_temperature",
            key=f"sweep_t{t}",
        )
        for t in draft_temperature
    ]
    rows += [
        BenchMethod(
            f"gamma={g}", "diffusion", {"gamma": g, "acceptance": "greedy"}, "gamma", key=f"sweep_gamma{g}"
        )
        for g in gamma
    ]
    rows += [
        BenchMethod(
            f"steps={s}", "diffusion", {"acceptance": "greedy"}, "steps", steps=s, key=f"sweep_steps{s}"
        )
        for s in steps
    ]
    return rows


def extra_drafter_methods(name: str, cfg: DecodingConfig) -> list[BenchMethod]:
    """K = 1 and K = max(K, 8) SpecDiff-2 rows for another drafter (e.g. the undistilled one)."""
    k = max(cfg.num_drafts, 8)
    return [
        BenchMethod(
            f"SpecDiff-2 (K=1, greedy, {name})",
            "diffusion",
            {"num_drafts": 1, "acceptance": "greedy"},
            drafter=name,
            key=f"specdiff2_k1_{name}",
        ),
        BenchMethod(
            f"SpecDiff-2 (K={k}, greedy, {name})",
            "diffusion",
            {"num_drafts": k, "acceptance": "greedy"},
            drafter=name,
            key=f"specdiff2_k{k}_{name}",
        ),
    ]
