"""Which drafter class a saved slice rebuilds into: the ``kind`` in its ``slice.json``.

A slice (``models/slicing.py``) stores only the layers it does not share with its verifier, so every
kind loads around a verifier the caller already holds: :func:`load_slice_drafter` is the one way in,
used by :func:`~specdiff_lightning.models.loading.load_drafter` and each class's ``from_pretrained``.
"""

from __future__ import annotations

import inspect
import os

import torch
from torch import nn

from ..decoding.drafting import Drafter
from .autoregressive import AutoregressiveDrafter
from .diffusion import DiffusionDrafter
from .slicing import require_verifier, slice_info

__all__ = ["DRAFTER_KINDS", "DEFAULT_KIND", "slice_kind", "load_slice_drafter"]

#: ``slice.json`` kind -> the drafter class (its ``from_slice(verifier, path, **options)`` loads it)
DRAFTER_KINDS: dict[str, type[Drafter]] = {
    "diffusion": DiffusionDrafter,
    "autoregressive": AutoregressiveDrafter,
}
#: kinds earlier versions saved and this one no longer loads -> what replaces them
RETIRED_KINDS = {
    "conditioned": (
        "the feature-conditioned slice drafter was retired for the DFlash family, which reads the same "
        "verifier features in the format transformers, vLLM and SGLang load (issue 18; docs/drafters.md): "
        "train one with `python -m specdiff_lightning fit --config configs/smollm2/drafter_dflash.yaml` "
        "or load a published one with DFlashDrafter.from_pretrained(path, verifier=...)"
    ),
}
#: the kind of a slice whose ``slice.json`` names none (the first slices were all diffusion ones)
DEFAULT_KIND = "diffusion"


def slice_kind(path: str | os.PathLike) -> str:
    """The kind of the slice saved at ``path`` (a key of :data:`DRAFTER_KINDS`)."""
    kind = slice_info(path).get("kind", DEFAULT_KIND)
    if kind in RETIRED_KINDS:
        raise ValueError(
            f"{os.fspath(path)} holds a {kind!r} drafter, which this version no longer loads: {RETIRED_KINDS[kind]}"
        )
    if kind not in DRAFTER_KINDS:
        raise ValueError(
            f"{os.fspath(path)} holds a drafter of kind {kind!r}, which this version cannot load "
            f"(known kinds: {sorted(DRAFTER_KINDS)})"
        )
    return kind


def _options_of(cls: type[Drafter]) -> list[str]:
    params = list(inspect.signature(cls.from_slice).parameters)
    return [p for p in params if p not in ("verifier", "path")]


def load_slice_drafter(
    path: str | os.PathLike,
    verifier: nn.Module | None,
    kind: str = "auto",
    dtype: torch.dtype | str | None = None,
    **options,
) -> Drafter:
    """The drafter saved at ``path`` (a ``slice.json`` directory), rebuilt around ``verifier``.

    Args:
        verifier: the verifier it was cut from; its embeddings are shared, not copied, and the
            drafter takes its dtype and device.
        kind: ``"auto"`` (the slice's own), or the kind the caller needs (an error names the loader
            when the slice holds another).
        dtype: None / ``"auto"``, or the verifier's dtype (a slice cannot have another: it shares
            the verifier's tensors).
        options: the kind's ``from_slice`` options (e.g. ``steps``, ``max_prefix_tokens``,
            ``attention`` for ``diffusion``).
    """
    require_verifier(path, verifier)
    found = slice_kind(path)
    cls = DRAFTER_KINDS[found]
    if kind not in ("auto", found):
        raise ValueError(
            f"{os.fspath(path)} holds a {found!r} drafter, not a {kind!r} one: load it with "
            f"load_drafter(path, verifier=...) or {cls.__name__}.from_pretrained(path, verifier=...)"
        )
    verifier_dtype = next(verifier.parameters()).dtype
    if dtype not in (None, "auto"):
        from .loading import resolve_dtype

        if resolve_dtype(dtype) != verifier_dtype:
            raise ValueError(
                f"a slice shares its verifier's tensors, so it takes the verifier's dtype ({verifier_dtype}), "
                f"not {dtype}: load the verifier in that dtype instead (load_verifier(dtype=...), or "
                f"verifier_kwargs.dtype in a config) and drop the drafter's dtype"
            )
    allowed = _options_of(cls)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"{unknown} do not apply to a {found!r} drafter ({os.fspath(path)}); it takes "
            f"{allowed if allowed else 'no options'}"
        )
    return cls.from_slice(verifier, path, **options)
