"""DFlash drafter checkpoints on disk: transformers' layout and z-lab's, read into and written from the
stock class (``MuseGlimmerAssistantModel``, transformers 5.24).

The two layouts hold the same tensors:

- **transformers'** (``layout="hf"``): ``config.json`` of ``model_type`` ``muse_glimmer_assistant`` with
  top-level ``block_size`` / ``mask_token_id`` / ``target_layer_ids``; the context projection is
  ``encoder.fc`` / ``encoder.output_norm_enc``. Written by the stock ``save_pretrained``.
- **z-lab's** (``layout="zlab"``, what vLLM / SGLang and the ``dflash`` package read): a Qwen3-style
  ``config.json`` (``model_type`` ``qwen3``, ``architectures`` ``DFlashDraftModel``, ``rope_theta``)
  with the DFlash fields in ``dflash_config`` (or top level); the projection is ``fc`` / ``hidden_norm``.

Neither stores embeddings or an LM head: a drafter uses its verifier's. Either may hold
``draft_vocab.json`` beside them, which no other tool reads: the token ids ranked by how often the
verifier wrote them in the drafter's training answers (:func:`read_vocab_ranking`), from which
``head_vocab`` takes the ids a decoding head scores. Only safetensors are read,
and no checkpoint code is ever imported: an ``auto_map`` is ignored (with a warning), and the
weights go into the stock class.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch
from torch import nn

from ..paths import give_user_modes

__all__ = [
    "LAYOUTS",
    "ZLAB_RENAMES",
    "dflash_layout",
    "read_dflash_config",
    "read_dflash_tensors",
    "write_dflash",
    "dflash_config_for",
    "VOCAB_RANKING_FILE",
    "read_vocab_ranking",
    "write_vocab_ranking",
]

#: the layouts :func:`write_dflash` writes and :func:`read_dflash_config` reads
LAYOUTS = ("hf", "zlab")
#: z-lab tensor name -> the stock class's (every other name is the same in both layouts)
ZLAB_RENAMES = {"fc.weight": "encoder.fc.weight", "hidden_norm.weight": "encoder.output_norm_enc.weight"}
_STOCK_TYPE = "muse_glimmer_assistant"
_DFLASH_FIELDS = ("block_size", "mask_token_id", "target_layer_ids")
#: the architecture fields both configs share, under the same names
_SHARED = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "max_position_embeddings",
    "attention_dropout",
    "hidden_act",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "vocab_size",
)
_WEIGHTS = "model.safetensors"
_INDEX = "model.safetensors.index.json"
#: a drafter directory's token ranking (most frequent first), when it has one
VOCAB_RANKING_FILE = "draft_vocab.json"


def _raw_config(path: Path) -> dict:
    file = path / "config.json"
    if not file.is_file():
        raise FileNotFoundError(
            f"{path} has no config.json: a DFlash drafter checkpoint is a directory with one"
        )
    return json.loads(file.read_text())


def dflash_layout(path: str | os.PathLike) -> str | None:
    """``"hf"`` or ``"zlab"`` for a DFlash checkpoint directory, None for anything else."""
    path = Path(path)
    if not (path / "config.json").is_file():
        return None
    raw = _raw_config(path)
    if raw.get("model_type") == _STOCK_TYPE:
        return "hf"
    if "dflash_config" in raw or "DFlashDraftModel" in (raw.get("architectures") or []):
        return "zlab"
    if "target_layer_ids" in raw and "block_size" in raw:  # z-lab's older configs: top-level fields only
        return "zlab"
    return None


def _dflash_fields(raw: dict, path: Path) -> dict:
    """``block_size``, ``mask_token_id``, ``target_layer_ids``: from ``dflash_config``, else top level;
    each is required (the stock config would silently fill in another model's defaults)."""
    nested = raw.get("dflash_config") or {}
    fields = {}
    for name in _DFLASH_FIELDS:
        value = nested.get(name, raw.get(name))
        if value is None:
            raise ValueError(
                f"{path}/config.json has no {name} (in dflash_config or at top level), which a DFlash drafter "
                f"needs: add the {name} the drafter was trained with"
            )
        fields[name] = value
    return fields


#: z-lab fields (in dflash_config or at top level) that the stock class does not apply: loadable only
#: when neutral
_ZLAB_SCALES = ("input_embedding_scale", "output_multiplier", "final_logit_softcapping")
#: fields of z-lab's DFlash2 (dynamic convolutions, a candidate selector): another architecture
_DFLASH2 = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def _check_zlab_variant(raw: dict, path: Path) -> None:
    """Refuse z-lab variants that the stock class would run differently (rather than draft silently
    worse): scaled embeddings or logits, a logit softcap, DFlash2, causal or sliding attention (z-lab's
    reference attends causally in sliding layers; the stock class bidirectionally)."""
    nested = raw.get("dflash_config") or {}

    def value(name):
        return nested.get(name, raw.get(name))

    for name in _DFLASH2:
        if value(name) is not None:
            raise ValueError(
                f"{path}/config.json has {name}: a DFlash2 drafter (dynamic convolutions, a candidate selector), "
                f"which the stock DFlash class cannot run; only DFlash drafters load"
            )
    for name in _ZLAB_SCALES:
        given = value(name)
        # z-lab's reference applies a softcap only when > 0, the scales when != 1
        neutral = given is None or (
            float(given) <= 0 if name == "final_logit_softcapping" else float(given) == 1
        )
        if not neutral:
            raise ValueError(
                f"{path}/config.json sets {name}={value(name)}, which the stock DFlash class does not apply; "
                f"this drafter cannot be loaded without changing its drafts"
            )
    if (
        raw.get("is_causal")
        or raw.get("use_sliding_window")
        or "sliding_attention" in (raw.get("layer_types") or [])
    ):
        raise ValueError(
            f"{path}/config.json has causal or sliding-window attention layers, which z-lab's reference runs "
            f"causally and the stock DFlash class bidirectionally; only full-attention drafters load"
        )


def _zlab_to_stock(raw: dict, path: Path) -> dict:
    """The stock config's kwargs for a z-lab (Qwen3-style) config."""
    _check_zlab_variant(raw, path)
    if raw.get("attention_bias"):
        raise ValueError(
            f"{path}/config.json sets attention_bias=true, but the stock DFlash class has no attention biases; "
            f"this checkpoint cannot be loaded without changing its outputs"
        )
    # a token id stated as null stays None (the stock config's defaults are another model's ids)
    kwargs = {
        name: raw[name]
        for name in _SHARED
        if raw.get(name) is not None or (name.endswith("_token_id") and name in raw)
    }
    if "head_dim" not in kwargs:
        kwargs["head_dim"] = int(raw["hidden_size"]) // int(raw["num_attention_heads"])
    if raw.get("rope_parameters"):
        kwargs["rope_parameters"] = dict(raw["rope_parameters"])
    else:
        # legacy names; the config standardises them into rope_parameters
        kwargs["rope_theta"] = raw.get("rope_theta", 10000.0)
        if raw.get("rope_scaling"):
            kwargs["rope_scaling"] = dict(raw["rope_scaling"])
    kwargs["layer_types"] = ["full_attention"] * int(raw["num_hidden_layers"])  # checked above
    return kwargs


def read_dflash_config(path: str | os.PathLike):
    """The stock ``MuseGlimmerAssistantConfig`` of a DFlash checkpoint in either layout, and its layout.

    Returns:
        ``(config, layout)``; ``config.vocab_size`` is the checkpoint's, when it states one.
    """
    from transformers import MuseGlimmerAssistantConfig

    path = Path(path)
    layout = dflash_layout(path)
    raw = _raw_config(path)
    if layout is None:
        raise ValueError(
            f"{path} is not a DFlash drafter: its config.json has model_type={raw.get('model_type')!r}, neither "
            f"{_STOCK_TYPE!r} (transformers' layout) nor a dflash_config / DFlashDraftModel (z-lab's)"
        )
    fields = _dflash_fields(raw, path)
    if raw.get("auto_map"):
        warnings.warn(
            f"{path}: config.json's auto_map {raw['auto_map']} is ignored; the drafter is loaded through the "
            f"stock transformers class MuseGlimmerAssistantModel (no checkpoint code is run)",
            stacklevel=3,
        )
    if layout == "hf":
        raw = {k: v for k, v in raw.items() if k != "auto_map"}
        return MuseGlimmerAssistantConfig.from_dict(raw), layout
    return MuseGlimmerAssistantConfig(**_zlab_to_stock(raw, path), **fields), layout


def _weight_files(path: Path) -> list[Path]:
    if (path / _WEIGHTS).is_file():
        return [path / _WEIGHTS]
    if (path / _INDEX).is_file():
        shards = sorted(set(json.loads((path / _INDEX).read_text())["weight_map"].values()))
        return [path / shard for shard in shards]
    found = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
    hint = f" (it holds {found}: pickles, which can run code and are never read)" if found else ""
    raise FileNotFoundError(f"{path} has no {_WEIGHTS} or {_INDEX}{hint}; save the drafter as safetensors")


def read_dflash_tensors(path: str | os.PathLike, layout: str) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under the stock class's names (z-lab's two projection keys renamed)."""
    from safetensors import safe_open

    tensors = {}
    for file in _weight_files(Path(path)):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has keys(), not iteration)
                stock = ZLAB_RENAMES.get(name, name) if layout == "zlab" else name
                tensors[stock] = f.get_tensor(name)
    return tensors


def _rope_theta_and_scaling(config) -> tuple[float, dict | None]:
    rope = dict(config.rope_parameters or {})
    if set(rope) & set(config.layer_types or ()):
        raise ValueError(
            "per-layer-type rope_parameters have no z-lab (Qwen3) equivalent; save with layout='hf'"
        )
    theta = float(rope.pop("rope_theta", config.default_theta))
    scaling = rope if rope.get("rope_type", "default") != "default" else None
    return theta, scaling


def _zlab_config(config, num_target_layers: int, dtype: torch.dtype) -> dict:
    """z-lab's ``config.json`` for a stock config (the fields their published drafters carry)."""
    theta, scaling = _rope_theta_and_scaling(config)
    if "sliding_attention" in config.layer_types:
        raise ValueError(
            "sliding-window layers (attended bidirectionally here) run causally in z-lab's reference: "
            "no z-lab equivalent, save with layout='hf'"
        )
    dflash = {name: getattr(config, name) for name in _DFLASH_FIELDS}
    out = {name: getattr(config, name, None) for name in _SHARED}
    out.update(
        architectures=["DFlashDraftModel"],
        model_type="qwen3",
        attention_bias=False,
        block_size=config.block_size,
        dflash_config={**dflash, "target_layer_ids": list(dflash["target_layer_ids"])},
        dtype=str(dtype).removeprefix("torch."),
        layer_types=list(config.layer_types),
        max_window_layers=config.num_hidden_layers,
        num_target_layers=int(num_target_layers),
        rope_scaling=scaling,
        rope_theta=theta,
        sliding_window=None,
        tie_word_embeddings=False,
        use_cache=True,
        use_sliding_window=False,
    )
    return out


def write_dflash(model: nn.Module, path: str | os.PathLike, layout: str, num_target_layers: int) -> None:
    """Write a stock DFlash model in ``layout`` (``"hf"``: the stock ``save_pretrained``; ``"zlab"``:
    z-lab's config and tensor names, no ``auto_map``: there is no code to point at)."""
    from safetensors.torch import save_file

    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not a DFlash layout; choose one of {list(LAYOUTS)}")
    path = Path(path)
    if layout == "hf":
        model.save_pretrained(path)
        give_user_modes(path)  # transformers writes its weights 0600
        return
    path.mkdir(parents=True, exist_ok=True)
    inverse = {stock: zlab for zlab, stock in ZLAB_RENAMES.items()}
    state = {inverse.get(k, k): v.detach().contiguous() for k, v in model.state_dict().items()}
    dtype = next(model.parameters()).dtype
    config = _zlab_config(model.config, num_target_layers, dtype)
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file(state, path / _WEIGHTS, metadata={"format": "pt"})
    give_user_modes(path)


def read_vocab_ranking(path: str | os.PathLike, vocab_size: int) -> list[int] | None:
    """The token ids of ``path``'s :data:`VOCAB_RANKING_FILE`, most frequent first, or None where
    the directory has none. A file that is unreadable, or whose ids repeat or fall outside
    ``[0, vocab_size)``, is an error naming it."""
    file = Path(path) / VOCAB_RANKING_FILE
    if not file.is_file():
        return None
    try:
        ranking = json.loads(file.read_text())["ranking"]
        ids = [int(i) for i in ranking]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(
            f'{file} is unreadable ({err}); it should be {{"ranking": [token ids, most frequent first]}}. '
            f"Delete it to draft over the first head_vocab ids, or write it again"
        ) from err
    if not ids or min(ids) < 0 or max(ids) >= vocab_size or len(set(ids)) != len(ids):
        raise ValueError(
            f"{file}: its ranking must list distinct token ids in [0, {vocab_size}) (the verifier's "
            f"vocabulary); is it another verifier's? Delete it or write it again"
        )
    return ids


def write_vocab_ranking(path: str | os.PathLike, ranking: list[int], source: str = "") -> None:
    """Write ``ranking`` (token ids, most frequent first) as ``path``'s :data:`VOCAB_RANKING_FILE`,
    atomically; ``source``: where the counts came from (kept for the reader)."""
    from ..paths import atomic_write

    text = json.dumps({"source": source, "ranking": [int(i) for i in ranking]}) + "\n"
    atomic_write(Path(path) / VOCAB_RANKING_FILE, lambda tmp: Path(tmp).write_text(text))


def _single_id(config, name: str) -> int | None:
    # the stock config takes one id; a verifier may list several EOS ids (the drafter never reads them)
    value = getattr(config, name, None)
    return value if isinstance(value, int) else None


def dflash_config_for(
    verifier: nn.Module,
    num_layers: int,
    target_layer_ids: tuple[int, ...],
    mask_token_id: int,
    block_size: int,
):
    """A stock DFlash config sized like ``verifier`` (its width, heads, MLP and RoPE), ``num_layers``
    deep, full attention: what a fresh drafter for it is built from."""
    from transformers import MuseGlimmerAssistantConfig

    v = verifier.config
    heads = int(v.num_attention_heads)
    rope = getattr(v, "rope_parameters", None)
    return MuseGlimmerAssistantConfig(
        hidden_size=int(v.hidden_size),
        intermediate_size=int(v.intermediate_size),
        num_hidden_layers=int(num_layers),
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(v, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(v, "head_dim", None) or int(v.hidden_size) // heads),
        rms_norm_eps=float(getattr(v, "rms_norm_eps", 1e-6)),
        rope_parameters=dict(rope) if rope else {"rope_type": "default", "rope_theta": 10000.0},
        max_position_embeddings=int(v.max_position_embeddings),
        layer_types=["full_attention"] * int(num_layers),
        hidden_act=str(getattr(v, "hidden_act", "silu")),
        bos_token_id=_single_id(v, "bos_token_id"),
        eos_token_id=_single_id(v, "eos_token_id"),
        pad_token_id=_single_id(v, "pad_token_id"),
        block_size=int(block_size),
        mask_token_id=int(mask_token_id),
        target_layer_ids=[int(i) for i in target_layer_ids],
        vocab_size=int(v.vocab_size),
    )
