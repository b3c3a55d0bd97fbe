"""Drafters cut from their verifier: the embeddings, the first N decoder layers, the final norm and
the (tied) head of a stock causal LM, as a model of the same class.

The embeddings (and a tied head) are the verifier's own tensors: shared in memory, never trained and
never stored twice. :func:`save_slice` writes only what differs (the N layers and the norm);
:func:`load_slice` rebuilds the full model around the verifier's embeddings.

Sharing means one tensor in two models: casting or moving the slice (``slice.to(torch.bfloat16)``)
casts or moves the verifier's embeddings too, and the verifier then refuses to decode (its layers
and embeddings disagree; :func:`~specdiff_lightning.decoding.validation.check_verifier_dtypes`
says so). Load the verifier in the dtype and on the device wanted, then the slice around it, or
cast both together.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import torch
from torch import nn

from ..paths import give_user_modes

__all__ = [
    "slice_causal_lm",
    "save_slice",
    "load_slice",
    "slice_info",
    "is_slice",
    "require_verifier",
    "SLICE_FILE",
    "SLICE_WEIGHTS",
]

SLICE_FILE = "slice.json"
SLICE_WEIGHTS = "slice.safetensors"
_WEIGHTS = SLICE_WEIGHTS


def slice_causal_lm(verifier: nn.Module, num_layers: int) -> nn.Module:
    """A ``type(verifier)`` with the verifier's first ``num_layers`` layers (copies, trainable), its
    final norm (a copy) and its embeddings / tied head (shared, frozen: casting the slice casts them
    in the verifier too, see the module docstring).

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
) -> Path:
    """Write the slice's own tensors (safetensors) and ``slice.json`` (its depth plus ``settings``,
    e.g. the drafter's mask id and attention), atomically: a temporary directory renamed into place."""
    import shutil
    import tempfile

    from safetensors.torch import save_file

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    own = dict(_own_state(model))
    state = {k: (v.to(dtype) if dtype else v).detach().contiguous().cpu() for k, v in own.items()}
    info = {"num_layers": len(model.model.layers), **settings}
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        save_file(state, tmp / _WEIGHTS)
        (tmp / SLICE_FILE).write_text(json.dumps(info, indent=2))
        give_user_modes(tmp)  # mkdtemp's directory is private (0700)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def is_slice(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory written by :func:`save_slice` (it has a ``slice.json``)."""
    return (Path(path) / SLICE_FILE).is_file()


def slice_info(path: str | os.PathLike) -> dict:
    """The ``slice.json`` of a slice saved by :func:`save_slice` (its depth, kind and settings)."""
    directory = Path(path)
    if not (directory / SLICE_FILE).is_file():
        raise FileNotFoundError(f"{directory} is not a saved drafter slice (no {SLICE_FILE})")
    try:
        info = json.loads((directory / SLICE_FILE).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{directory / SLICE_FILE} is not valid JSON ({err}); export the drafter again"
        ) from None
    if not isinstance(info, dict) or "num_layers" not in info:
        raise ValueError(f"{directory / SLICE_FILE} has no num_layers: it was not written by save_slice")
    return info


def _cut_from(info: dict) -> str:
    return f"it was cut from {info['verifier']!r}" if info.get("verifier") else "was it cut from another one?"


def require_verifier(path: str | os.PathLike, verifier) -> None:
    """Refuse to load a slice without the verifier whose embeddings it shares."""
    if verifier is None:
        info = slice_info(path)
        spec = info.get("verifier")
        hint = f"verifier=load_verifier({spec!r})" if spec else "verifier=<the verifier it was cut from>"
        raise ValueError(
            f"{os.fspath(path)} is a slice of its verifier (it stores only the layers it does not share "
            f"with it); pass {hint}"
        )


def load_slice(verifier: nn.Module, path: str | os.PathLike) -> tuple[nn.Module, dict]:
    """Rebuild a slice saved by :func:`save_slice` around ``verifier``'s embeddings; returns
    ``(model, settings)``. The model takes the verifier's dtype and devices."""
    from safetensors.torch import load_file

    directory = Path(path)
    info = slice_info(directory)
    if not (directory / _WEIGHTS).is_file():
        raise FileNotFoundError(
            f"{directory} has a {SLICE_FILE} but no {_WEIGHTS}: the slice is incomplete; copy it again "
            f"with both files, or export it again"
        )
    depth = len(verifier.model.layers)
    if not 1 <= int(info["num_layers"]) <= depth:
        raise ValueError(
            f"{directory}: the slice has {info['num_layers']} layers, this verifier {depth}; {_cut_from(info)}"
        )
    model = slice_causal_lm(verifier, int(info["num_layers"]))
    state = load_file(directory / _WEIGHTS)
    _check_shapes(directory, info, model.state_dict(), state)
    missing, unexpected = model.load_state_dict(state, strict=False)
    expected_missing = set(model.state_dict()) - set(_own_state(model))
    if unexpected or set(missing) - expected_missing:
        raise ValueError(
            f"{directory}: the slice does not fit this verifier (missing {sorted(set(missing) - expected_missing)[:4]}, "
            f"unexpected {unexpected[:4]}); {_cut_from(info)}"
        )
    return model.to(next(verifier.parameters()).dtype).eval(), info


def _check_shapes(directory: Path, info: dict, expected: dict, stored: dict) -> None:
    """One line naming the first tensor whose shape differs (load_state_dict would print them all)."""
    for name, tensor in stored.items():
        if name in expected and tuple(expected[name].shape) != tuple(tensor.shape):
            raise ValueError(
                f"{directory}: the slice does not fit this verifier ({name} is {tuple(tensor.shape)} in the "
                f"slice, {tuple(expected[name].shape)} here); {_cut_from(info)}"
            )
