"""How each kind of bench row decodes one prompt: a table of small functions.

Each runner takes ``(models, method, cfg, ids, generator, profiler)`` and returns either the new
token ids (HF ``generate`` peers) or a :class:`~specdiff_lightning.decoding.GenerationOutput` (our
loops, with per-round statistics).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from ..decoding.compiled import inductor_config, use_machine_inductor_cache
from ..decoding.config import DecodingConfig
from ..decoding.drafting import Drafter
from ..decoding.generate import speculative_generate, verifier_generate
from ..decoding.kernels import compiled_kernels, use_linear_kernels
from .methods import BenchMethod

__all__ = ["BenchModels", "RUNNERS", "hf_generate"]


@dataclass
class BenchModels:
    """The models one dtype's rows run on: the verifier and named drafters (``"main"``: the
    diffusion drafter; ``"ar"``: the AR drafter for SpS / HF assisted; others by name)."""

    verifier: nn.Module
    drafters: dict[str, Drafter] = field(default_factory=dict)

    def drafter(self, name: str | None) -> Drafter:
        name = name or "main"
        if name not in self.drafters:
            raise KeyError(f"the bench has no drafter named {name!r} (it has {sorted(self.drafters)})")
        return self.drafters[name]


def hf_generate(verifier: nn.Module, ids: torch.Tensor, cfg: DecodingConfig, **extra) -> list[int]:
    """``verifier.generate`` with the run's sampling settings and the verifier's own EOS."""
    eos = verifier.generation_config.eos_token_id
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


def _verifier(models, method, cfg, ids, generator, profiler):
    eos = models.verifier.generation_config.eos_token_id
    return verifier_generate(
        models.verifier, ids, **cfg.sampling_kwargs(), eos_token_id=eos, generator=generator
    )


def _hf(models, method, cfg, ids, generator, profiler):
    return hf_generate(models.verifier, ids, cfg)


#: the compiled peer's own model copy per verifier (a weak key: it goes with the verifier), so no
#: other row ever runs a compiled model; and the seconds its compilation took
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _compile_config():
    from transformers import CompileConfig

    config = CompileConfig(fullgraph=False, dynamic=None, mode="default")
    # transformers compiles on accelerators only unless asked; on a CPU inductor compiles C++
    config._compile_all_devices = True
    return config


def compiled_copy(verifier: nn.Module) -> tuple[nn.Module, float]:
    """``(a copy of verifier, compile seconds)``: the copy's ``generate`` runs a static cache and a
    ``torch.compile``d forward (transformers' ``CompileConfig``). It is warmed up on two prompt
    lengths (the second compiles shape-dynamic), so timed decodes of any length never recompile."""
    import copy
    import time

    if verifier in _COMPILED:
        return _COMPILED[verifier]
    use_machine_inductor_cache()
    # the copy computes as our compiled forward does (the formulation measured for a compiled graph,
    # decoding/kernels.py), so the peer is at least as fast as transformers' compiled path as shipped
    # where that formulation pays; the eager kernel table is Python a graph cannot dispatch on
    model = use_linear_kernels(copy.deepcopy(verifier), {}, compiled_kernels(verifier))
    start = time.perf_counter()
    device = next(model.parameters()).device
    for length in (17, 23):
        ids = torch.randint(
            0, int(model.config.vocab_size), (1, length), generator=torch.Generator().manual_seed(0)
        )
        with inductor_config(model):  # the GEMMs our compiled forward gets (decoding/compiled.py)
            model.generate(
                ids.to(device),
                attention_mask=torch.ones_like(ids).to(device),
                do_sample=False,
                max_new_tokens=8,
                pad_token_id=0,
                cache_implementation="static",
                compile_config=_compile_config(),
            )
    _COMPILED[verifier] = (model, time.perf_counter() - start)
    return _COMPILED[verifier]


def _hf_compiled(models, method, cfg, ids, generator, profiler):
    model, _ = compiled_copy(models.verifier)
    with inductor_config(model):
        return hf_generate(model, ids, cfg, cache_implementation="static", compile_config=_compile_config())


def _hf_prompt_lookup(models, method, cfg, ids, generator, profiler):
    return hf_generate(models.verifier, ids, cfg, prompt_lookup_num_tokens=cfg.gamma)


def _hf_assisted(models, method, cfg, ids, generator, profiler):
    return hf_generate(models.verifier, ids, cfg, assistant_model=models.drafter("ar").model)


def _hf_dflash(models, method, cfg, ids, generator, profiler):
    """transformers' own DFlash loop (a chain of the block's drafts) with the stock model our
    DFlash rows draft with: the same weights, HF's loop."""
    drafter = models.drafter(method.drafter)
    model = getattr(drafter, "model", None)
    if type(model).__name__ != "MuseGlimmerAssistantModel":
        raise ValueError(
            f"an hf_dflash row needs a DFlash drafter (DFlashDrafter); drafter {method.drafter!r} is "
            f"{type(drafter).__name__}"
        )
    return hf_generate(models.verifier, ids, cfg, assistant_model=model, speculation_type="dflash")


def _speculative(drafter: Drafter, models, cfg, ids, generator, profiler):
    eos = models.verifier.generation_config.eos_token_id
    return speculative_generate(
        models.verifier,
        drafter,
        ids,
        **cfg.generate_kwargs(),
        eos_token_id=eos,
        generator=generator,
        profiler=profiler,
    )


def _sps(models, method, cfg, ids, generator, profiler):
    return _speculative(models.drafter("ar"), models, cfg, ids, generator, profiler)


def _diffusion(models, method, cfg, ids, generator, profiler):
    drafter = models.drafter(method.drafter)
    if method.steps is not None:
        drafter = drafter.with_steps(method.steps)
    return _speculative(cfg.shape_drafter(drafter), models, cfg, ids, generator, profiler)


#: kind -> runner
RUNNERS: dict[str, Callable] = {
    "verifier": _verifier,
    "hf": _hf,
    "hf_compiled": _hf_compiled,
    "hf_prompt_lookup": _hf_prompt_lookup,
    "hf_assisted": _hf_assisted,
    "hf_dflash": _hf_dflash,
    "sps": _sps,
    "diffusion": _diffusion,
}


def method_config(cfg: DecodingConfig, method: BenchMethod) -> DecodingConfig:
    """The run's decoding settings with the row's overrides. A row shapes its draft tree (``tree``,
    ``lookup``) only as its own settings say: the run's shape (e.g. a predict config's) would turn
    the paper's rows and ablations (standard / recursive acceptance, K and step sweeps) into other
    methods, and some (standard acceptance, multi-step denoising) cannot take it at all. The
    same holds for the corpus copies (``datastore``): a row has them where it says so."""
    return replace(cfg, **{"tree": None, "lookup": False, "datastore": None, **method.decoding})
