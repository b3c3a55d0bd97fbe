"""Load verifiers, tokenizers and drafters from a spec string: a named verifier, a tiny preset, a
local directory (a Hugging Face checkpoint, or a drafter slice saved by this project) or a hub id.

``"tiny-qwen2"`` / ``"tiny-llama"`` build small random models of the real classes (``tiny`` kwargs
set their sizes), so every config in ``configs/`` runs on a laptop with the real paths swapped in.
What a spec names is decided in one place, :func:`~specdiff_lightning.models.specs.resolve_pretrained`.
"""

from __future__ import annotations

import os

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from ..decoding.attention import GROUPED_SDPA
from ..decoding.drafting import Drafter
from .dflash import DFLASH_KIND, DFlashDrafter
from .dflash_format import dflash_layout
from .diffusion import DiffusionDrafter
from .kinds import DRAFTER_KINDS, RETIRED_KINDS, load_slice_drafter
from .slicing import SLICE_FILE, is_slice
from .specs import NAMED_VERIFIERS, TINY_PREFIX, resolve_pretrained
from .tiny import tiny_model

__all__ = [
    "load_verifier",
    "load_tokenizer",
    "load_drafter",
    "resolve_dtype",
    "resolve_pretrained",
    "TINY_PREFIX",
    "NAMED_VERIFIERS",
    "DRAFTER_KINDS",
]


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | str | None:
    """``"bfloat16"`` -> ``torch.bfloat16``; ``"auto"`` and None pass through."""
    if dtype is None or isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    resolved = getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use e.g. 'float32', 'bfloat16', 'float64' or 'auto'")
    return resolved


def _tiny(spec: str, tiny: dict | None, dtype, attn_implementation: str) -> PreTrainedModel:
    kwargs = dict(tiny or {})
    kwargs.setdefault("attn_implementation", attn_implementation)
    if isinstance(dtype, torch.dtype):
        kwargs.setdefault("dtype", dtype)
    return tiny_model(spec[len(TINY_PREFIX) :], **kwargs)


def load_verifier(
    spec: str,
    *,
    dtype: str | torch.dtype | None = "auto",
    attn_implementation: str = GROUPED_SDPA,
    tiny: dict | None = None,
    kernels: str | None = "auto",
    compiled: bool = False,
    **model_kwargs,
) -> PreTrainedModel:
    """A frozen causal LM in eval mode with gradients off.

    Args:
        spec: a name in :data:`NAMED_VERIFIERS` (``"smollm2-135m-instruct"``), ``"tiny-qwen2"`` /
            ``"tiny-llama"``, a local directory or a hub id (``AutoModelForCausalLM.from_pretrained``).
            A spec that is none of these, or a hub id while no hub is reachable, fails at once
            naming the known specs (:func:`~specdiff_lightning.models.specs.resolve_pretrained`).
        attn_implementation: ``"sdpa_grouped"`` (default: SDPA that reads each cached key once for
            the few masked queries of a draft tree, :mod:`specdiff_lightning.decoding.attention`),
            ``"sdpa"`` or ``"eager"``.
        tiny: sizes for a tiny preset (``vocab_size``, ``hidden_size``, ``num_layers``, ``seed``...).
        dtype: a dtype, or ``"auto"`` (default): the one this machine runs the model fastest in
            (:func:`~specdiff_lightning.decoding.calibration.in_fastest_dtype`: on a CPU float32 or
            bfloat16 by the time their measured cost models predict for a typical request, an
            eager prefill and rounds of small trees, cached per machine; on a GPU bfloat16 where
            supported). Tiny presets are test models: "auto" is float32 for them.
            ``model.dtype_choice`` says what "auto" chose.
        compiled: with ``dtype="auto"``, price the rounds by the compiled forward, for a model
            that will decode compiled (``speculative_generate(..., compile=True)``). Its first use
            on a machine compiles the model in each dtype (minutes on a CPU; cached after).
        kernels: ``"auto"`` (default): the linear layers compute few-row products with the kernel
            measured faster here (:mod:`~specdiff_lightning.decoding.kernels`: ``W @ x^T`` where
            float32 ``F.linear``'s small-M path is slow; chosen once per machine, model and dtype);
            None: stock ``F.linear``. Tiny presets always use stock kernels.
        model_kwargs: passed to ``from_pretrained`` (``device_map``, ``revision``...).
    """
    from ..decoding.calibration import check_dtype_runs, in_fastest_dtype, prepare_kernels
    from ..decoding.kernels import use_linear_kernels

    dtype = resolve_dtype(dtype)
    auto = dtype == "auto" or dtype is None
    spec = os.fspath(spec)
    if spec.startswith(TINY_PREFIX):
        model = _tiny(spec, tiny, torch.float32 if auto else dtype, attn_implementation)
        auto = False
    else:
        if is_slice(spec):
            raise ValueError(
                f"{spec} is a drafter slice ({SLICE_FILE}), not a verifier: load it with "
                f"load_drafter({spec!r}, verifier=...)"
            )
        model = AutoModelForCausalLM.from_pretrained(
            resolve_pretrained(spec, "verifier", **model_kwargs),
            dtype=dtype,
            attn_implementation=attn_implementation,
            **model_kwargs,
        )
    model.eval()
    model.requires_grad_(False)
    if kernels == "auto" and not spec.startswith(TINY_PREFIX):
        prepare_kernels(model)
    if auto:
        own = model.dtype
        model = in_fastest_dtype(model, compiled=compiled)
        if model.dtype != own and kernels != "auto":
            use_linear_kernels(model, set())  # the measured copy's kernels, back to stock
        forward = "compiled forward" if compiled else "eager forward"
        model.dtype_choice = (
            f"auto: {str(model.dtype).removeprefix('torch.')} (fastest measured here, {forward})"
        )
    else:
        check_dtype_runs(next(model.parameters()).dtype, next(model.parameters()).device)
    return model


def load_tokenizer(spec: str, **kwargs):
    """The tokenizer of a verifier spec: a name in :data:`NAMED_VERIFIERS` (its converted
    directory), a local directory or a hub id (``AutoTokenizer.from_pretrained``)."""
    from transformers import AutoTokenizer

    spec = os.fspath(spec)
    if spec.startswith(TINY_PREFIX):
        raise ValueError(
            f"tokenizer {spec!r} is a tiny preset, which has no tokenizer: give prompts as prompt_ids, "
            f"or a tokenizer directory / verifier name"
        )
    return AutoTokenizer.from_pretrained(
        resolve_pretrained(spec, "tokenizer", "tokenizer_config.json", **kwargs), **kwargs
    )


def load_drafter(
    spec: str,
    *,
    verifier: torch.nn.Module | None = None,
    kind: str = "auto",
    family: str = "auto",
    mask_token_id: int | None = None,
    shift_logits: bool | None = None,
    max_prefix_tokens: int | None = None,
    steps: int | None = None,
    dtype: str | torch.dtype | None = "auto",
    tiny: dict | None = None,
    head_vocab: int | None = None,
    **model_kwargs,
) -> Drafter:
    """Any drafter this project ships, saves or reads, from its spec.

    - a slice saved by this project (a directory with ``slice.json``: ``assets/smollm2/*``, what
      ``export`` writes for the slice-training modules): the class of its ``kind``
      (:data:`DRAFTER_KINDS`: :class:`DiffusionDrafter`, :class:`AutoregressiveDrafter`), rebuilt
      around ``verifier``, which it needs (its embeddings are the verifier's, shared: the drafter
      takes the verifier's dtype and device);
    - a Hugging Face checkpoint (directory or hub id): a :class:`DiffusionDrafter`
      (:meth:`DiffusionDrafter.from_pretrained`: ``family``, ``mask_token_id``, ``shift_logits``),
      or with ``kind="autoregressive"`` an :class:`AutoregressiveDrafter` (named verifiers too);
    - a DFlash checkpoint (transformers' or z-lab's layout): a :class:`DFlashDrafter` around
      ``verifier`` (:meth:`DFlashDrafter.from_pretrained`);
    - a tiny preset: a random :class:`DiffusionDrafter` (mask id the last vocabulary id, logits
      shifted) or, with ``kind="autoregressive"``, an AR drafter.

    Args:
        kind: ``"auto"`` or the kind the caller needs (``"diffusion"``, ``"autoregressive"``,
            ``"dflash"``); a checkpoint of another kind is a clear error.
        steps, max_prefix_tokens, mask_token_id, shift_logits: diffusion drafters' options.
        head_vocab: a DFlash drafter's head over ``head_vocab`` ids when decoding: the most frequent
            of its ``draft_vocab.json``, else ids ``[0, head_vocab)``
            (:class:`~specdiff_lightning.models.dflash.DFlashDrafter`).
        dtype: the model's dtype; a slice takes its verifier's (another one is an error).
        model_kwargs: ``from_pretrained`` kwargs of a checkpoint (``device_map``, ``revision``...);
            for a diffusion slice only ``attention`` / ``prefix_cache``.
    """
    dtype = resolve_dtype(dtype)
    spec = os.fspath(spec)
    diffusion = {"mask_token_id": mask_token_id, "shift_logits": shift_logits, "steps": steps}
    diffusion = {
        k: v for k, v in {**diffusion, "max_prefix_tokens": max_prefix_tokens}.items() if v is not None
    }
    if kind in RETIRED_KINDS:
        raise ValueError(f"kind={kind!r} is retired: {RETIRED_KINDS[kind]}")
    if kind not in ("auto", DFLASH_KIND, *DRAFTER_KINDS):
        raise ValueError(
            f"unknown drafter kind {kind!r}; choose 'auto' or one of {sorted([*DRAFTER_KINDS, DFLASH_KIND])}"
        )
    if kind in ("auto", DFLASH_KIND) and not spec.startswith(TINY_PREFIX) and dflash_layout(spec) is not None:
        given = sorted({**diffusion, **model_kwargs}) + (["family"] if family != "auto" else [])
        if given or tiny is not None:
            raise ValueError(
                f"{spec} is a DFlash drafter, which names its own settings (config.json); drop {given or ['tiny']}"
            )
        return DFlashDrafter.from_pretrained(spec, verifier=verifier, dtype=dtype, head_vocab=head_vocab)
    if kind == DFLASH_KIND:
        raise ValueError(
            f"{spec} is not a DFlash drafter (a directory whose config.json is transformers' "
            f"muse_glimmer_assistant or z-lab's DFlashDraftModel); load it with kind='auto'"
        )
    if not spec.startswith(TINY_PREFIX) and is_slice(spec):
        if family != "auto":
            raise ValueError(
                f"family={family!r} applies to Hugging Face checkpoints; {spec} is a saved slice that names "
                f"its own settings ({SLICE_FILE}): drop family"
            )
        if tiny is not None:
            raise ValueError(f"tiny= sizes a tiny preset; {spec} is a saved slice: drop tiny")
        # options a slice's kind does not take (head_vocab: DFlash's) are named there
        dflash_only = {} if head_vocab is None else {"head_vocab": head_vocab}
        return load_slice_drafter(spec, verifier, kind, dtype, **diffusion, **dflash_only, **model_kwargs)
    if head_vocab is not None:
        raise ValueError(
            f"head_vocab applies to DFlash drafters (a directory whose config.json is transformers' "
            f"muse_glimmer_assistant or z-lab's DFlashDraftModel); {spec} is not one: drop head_vocab"
        )
    if kind == "autoregressive":
        if diffusion:
            raise ValueError(f"{sorted(diffusion)} configure diffusion drafters, not the AR drafter {spec}")
        from .autoregressive import AutoregressiveDrafter

        return AutoregressiveDrafter(load_verifier(spec, dtype=dtype, tiny=tiny, **model_kwargs))
    if spec.startswith(TINY_PREFIX):
        model = _tiny(spec, tiny, dtype, model_kwargs.get("attn_implementation", "sdpa"))
        return DiffusionDrafter(
            model,
            mask_token_id=model.config.vocab_size - 1 if mask_token_id is None else mask_token_id,
            shift_logits=True if shift_logits is None else shift_logits,
            steps=1 if steps is None else steps,
            max_prefix_tokens=max_prefix_tokens,
        )
    return DiffusionDrafter.from_pretrained(spec, family=family, dtype=dtype, **diffusion, **model_kwargs)
