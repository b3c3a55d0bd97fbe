"""Drafters cut from their verifier: the embeddings, the first N decoder layers, the final norm and
the (tied) head of a stock causal LM, as a model of the same class.

The embeddings (and a tied head) are the verifier's own tensors: shared in memory, never trained and
never stored twice. :func:`save_slice` writes only what differs (the N layers and the norm);
:func:`load_slice` rebuilds the full model around the verifier's embeddings.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import torch
from torch import nn

__all__ = ["slice_causal_lm", "save_slice", "load_slice", "slice_info", "SLICE_FILE"]

SLICE_FILE = "slice.json"
_WEIGHTS = "slice.safetensors"
_EXTRA = "extra."


def slice_causal_lm(verifier: nn.Module, num_layers: int) -> nn.Module:
    """A ``type(verifier)`` with the verifier's first ``num_layers`` layers (copies, trainable), its
    final norm (a copy) and its embeddings / tied head (shared, frozen).

    Args:
        verifier: a stock HF causal LM with ``.model.layers``, ``.model.norm``, ``.model.embed_tokens``.
        num_layers: N, 1 <= N <= the verifier's depth.
    """
    depth = len(verifier.model.layers)
    if not 1 <= num_layers <= depth:
        raise ValueError(f"num_layers must be in [1, {depth}] for this verifier, got {num_layers}")
    config = copy.deepcopy(verifier.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:num_layers]
    dtype = next(verifier.parameters()).dtype
    with torch.device("meta"):
        model = type(verifier)(config)
    model.model.embed_tokens = verifier.model.embed_tokens
    model.model.rotary_emb = copy.deepcopy(verifier.model.rotary_emb)
    model.model.layers = nn.ModuleList(copy.deepcopy(verifier.model.layers[i]) for i in range(num_layers))
    model.model.norm = copy.deepcopy(verifier.model.norm)
    if config.tie_word_embeddings:
        model.lm_head = verifier.lm_head
    else:
        model.lm_head = copy.deepcopy(verifier.lm_head)
    # The copies are the drafter's own (the verifier's may come frozen); the shared tensors stay frozen.
    model.model.layers.requires_grad_(True)
    model.model.norm.requires_grad_(True)
    if not config.tie_word_embeddings:
        model.lm_head.requires_grad_(True)
    model.model.embed_tokens.requires_grad_(False)
    if config.tie_word_embeddings:
        model.lm_head.requires_grad_(False)
    model.generation_config = copy.deepcopy(verifier.generation_config)
    return model.to(dtype).eval()


def _own_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a slice owns (everything but the shared embeddings / tied head)."""
    tied = bool(model.config.tie_word_embeddings)
    return {
        k: v
        for k, v in model.state_dict().items()
        if not k.startswith("model.embed_tokens.") and not (tied and k.startswith("lm_head."))
    }


def save_slice(
    model: nn.Module,
    path: str | os.PathLike,
    settings: dict,
    dtype: torch.dtype | None = None,
    extra: nn.Module | None = None,
) -> Path:
    """Write the slice's own tensors (safetensors) and ``slice.json`` (its depth plus ``settings``,
    e.g. the drafter's mask id and attention), atomically: a temporary directory renamed into place.
    ``extra``: a module trained with the slice (e.g. a feature fusion), stored as ``extra.*``."""
    import shutil
    import tempfile

    from safetensors.torch import save_file

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    own = dict(_own_state(model))
    if extra is not None:
        own.update({_EXTRA + k: v for k, v in extra.state_dict().items()})
    state = {k: (v.to(dtype) if dtype else v).detach().contiguous().cpu() for k, v in own.items()}
    save_file(state, tmp / _WEIGHTS)
    info = {"num_layers": len(model.model.layers), **settings}
    (tmp / SLICE_FILE).write_text(json.dumps(info, indent=2))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def slice_info(path: str | os.PathLike) -> dict:
    """The ``slice.json`` of a slice saved by :func:`save_slice` (its depth, kind and settings)."""
    directory = Path(path)
    if not (directory / SLICE_FILE).is_file():
        raise FileNotFoundError(f"{directory} is not a saved drafter slice (no {SLICE_FILE})")
    return json.loads((directory / SLICE_FILE).read_text())


def load_slice(
    verifier: nn.Module, path: str | os.PathLike, extra: nn.Module | None = None
) -> tuple[nn.Module, dict]:
    """Rebuild a slice saved by :func:`save_slice` around ``verifier``'s embeddings; returns
    ``(model, settings)``. The model takes the verifier's dtype. ``extra``: the module saved with it
    (``save_slice(extra=...)``), loaded in place (strictly) and cast to the verifier's dtype too."""
    from safetensors.torch import load_file

    directory = Path(path)
    info = slice_info(directory)
    model = slice_causal_lm(verifier, int(info["num_layers"]))
    state = load_file(directory / _WEIGHTS)
    extra_state = {k[len(_EXTRA) :]: state.pop(k) for k in list(state) if k.startswith(_EXTRA)}
    if bool(extra_state) != (extra is not None):
        raise ValueError(
            f"{directory}: the slice {'carries' if extra_state else 'has no'} extra tensors "
            f"(kind {info.get('kind')!r}); load it with the loader of its kind "
            f"(e.g. ConditionedDrafter.from_slice for kind 'conditioned')"
        )
    if extra is not None:
        extra.load_state_dict(extra_state, strict=True)
        extra.to(next(verifier.parameters()).dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    expected_missing = set(model.state_dict()) - set(_own_state(model))
    if unexpected or set(missing) - expected_missing:
        raise ValueError(
            f"{directory}: the slice does not fit this verifier (missing {sorted(set(missing) - expected_missing)[:4]}, "
            f"unexpected {unexpected[:4]}); was it trained against another verifier?"
        )
    return model.to(next(verifier.parameters()).dtype).eval(), info
