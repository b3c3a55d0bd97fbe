"""Published diffusion-drafter families and how each loads into a *stock* transformers class.

No code shipped with a checkpoint runs unless the caller passes ``trust_remote_code=True``:

- ``dream`` (Dream-v0 / DiffuCoder): Qwen2 with bidirectional attention. Every tensor name and shape
  is ``Qwen2ForCausalLM``'s; the config is rebuilt as a ``Qwen2Config`` from Dream's own values
  (``use_sliding_window=False``) and the drafter runs it with ``is_causal=False``. Shifted logits.
- ``llada`` (LLaDA): Llama under OLMo-style names. The config is translated from LLaDA's field names
  (``d_model``, ``n_layers``, ...) into a ``LlamaConfig``, the tensors are renamed while loading
  (``from_pretrained(..., key_mapping=LLADA_KEY_MAPPING)``, no file conversion). Unshifted logits.
- ``diffullama`` (DiffuLLaMA): already a plain ``LlamaForCausalLM`` checkpoint. Shifted logits.

``family="auto"`` reads the raw ``config.json`` (no code executed) and picks the family from its
``model_type`` (``"Dream"``, ``"llada"``, ``"llama"``). Which *loader* runs is decided by the
checkpoint's format (its ``model_type``), not by the family: a fine-tuned drafter saved by
:meth:`DiffusionDrafter.save_pretrained` is a stock Qwen2/Llama checkpoint plus a sidecar with
the family settings, which plain ``AutoModelForCausalLM.from_pretrained`` also loads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from ..paths import give_user_modes

__all__ = [
    "DrafterFamily",
    "DRAFTER_FAMILIES",
    "LLADA_KEY_MAPPING",
    "SIDECAR_FILE",
    "dream_config",
    "llada_config",
    "family_for_model_type",
    "load_drafter_model",
    "read_sidecar",
    "save_drafter_model",
]

#: written next to ``config.json`` by :meth:`DiffusionDrafter.save_pretrained`
SIDECAR_FILE = "specdiff_drafter.json"


@dataclass(frozen=True)
class DrafterFamily:
    """How a published drafter family is read (METHOD.md §8).

    Attributes:
        mask_token_id: the published ``[MASK]`` id (a checkpoint's own ``config.mask_token_id``,
            when present, takes precedence).
        shift_logits: True for models adapted from AR LMs (the logit at i-1 predicts token i).
        stock_class: ``"qwen2"`` or ``"llama"``: the transformers architecture it runs as.
        model_types: ``config.json`` ``model_type`` values (lower-case) that ``family="auto"`` maps
            to this family.
    """

    mask_token_id: int
    shift_logits: bool
    stock_class: str = "llama"
    model_types: tuple[str, ...] = field(default=())


DRAFTER_FAMILIES: dict[str, DrafterFamily] = {
    # DiffuCoder / Dream: Qwen2 run bidirectionally, Qwen2.5 tokenizer, adapted from an AR LM.
    "dream": DrafterFamily(151666, True, "qwen2", ("dream",)),
    # DiffuLLaMA: a plain LlamaForCausalLM checkpoint run bidirectionally; mask = Llama-2 token 811.
    "diffullama": DrafterFamily(811, True, "llama", ("llama",)),
    # LLaDA: Llama under other tensor names, trained from scratch as an MDM, so unshifted.
    "llada": DrafterFamily(126336, False, "llama", ("llada",)),
}

# Published LLaDA tensor names -> LlamaForCausalLM's, applied in order by from_pretrained(key_mapping=...).
# Each rule is a regex searched in the key; the first three are anchored so that the top-level
# ``ff_out`` (the output head) is renamed before the per-block ``ff_out`` (down projection).
LLADA_KEY_MAPPING: dict[str, str] = {
    r"^model\.transformer\.wte\.": "model.embed_tokens.",
    r"^model\.transformer\.ln_f\.": "model.norm.",
    r"^model\.transformer\.ff_out\.": "lm_head.",
    r"^model\.transformer\.blocks\.": "model.layers.",
    r"\.attn_norm\.": ".input_layernorm.",
    r"\.q_proj\.": ".self_attn.q_proj.",
    r"\.k_proj\.": ".self_attn.k_proj.",
    r"\.v_proj\.": ".self_attn.v_proj.",
    r"\.attn_out\.": ".self_attn.o_proj.",
    r"\.ff_norm\.": ".post_attention_layernorm.",
    r"\.ff_proj\.": ".mlp.gate_proj.",
    r"\.up_proj\.": ".mlp.up_proj.",
    r"\.ff_out\.": ".mlp.down_proj.",
}

_TOKEN_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id")


def family_for_model_type(model_type: str) -> str | None:
    """The family whose checkpoints carry this ``config.json`` ``model_type`` (case-insensitive)."""
    model_type = str(model_type).lower()
    for name, spec in DRAFTER_FAMILIES.items():
        if model_type in spec.model_types:
            return name
    return None


def _rope_parameters(config: dict) -> dict:
    rope = dict(config.get("rope_scaling") or {})
    rope["rope_type"] = rope.pop("type", None) or rope.get("rope_type") or "default"
    rope["rope_theta"] = float(config.get("rope_theta", 10000.0))
    return rope


def _dtype(config: dict):
    return config.get("dtype") or config.get("torch_dtype")


def dream_config(config: dict):
    """A ``Qwen2Config`` from a Dream/DiffuCoder ``config.json`` (dict): same values, no sliding window."""
    from transformers import Qwen2Config

    keys = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "hidden_act",
        "max_position_embeddings",
        "initializer_range",
        "rms_norm_eps",
        "tie_word_embeddings",
        "attention_dropout",
        *_TOKEN_FIELDS,
    )
    kwargs = {k: config[k] for k in keys if config.get(k) is not None}
    out = Qwen2Config(**kwargs, rope_parameters=_rope_parameters(config), use_sliding_window=False)
    out.mask_token_id = config.get("mask_token_id")
    out.dtype = _dtype(config)
    return out


def llada_config(config: dict):
    """A ``LlamaConfig`` from a LLaDA ``config.json`` (dict, LLaDA/OLMo field names)."""
    from transformers import LlamaConfig

    unsupported = {
        "alibi": True,
        "include_bias": True,
        "include_qkv_bias": True,
        "weight_tying": True,
        "attention_layer_norm": True,
        "input_emb_norm": True,
        "scale_logits": True,
        "rope": False,
    }
    bad = [f"{k}={config[k]!r}" for k, v in unsupported.items() if k in config and bool(config[k]) == v]
    if config.get("block_type", "llama") != "llama":
        bad.append(f"block_type={config['block_type']!r}")
    if config.get("layer_norm_type", "rms") != "rms":
        bad.append(f"layer_norm_type={config['layer_norm_type']!r}")
    if bad:
        raise ValueError(
            f"this LLaDA checkpoint uses options the stock Llama route does not reproduce ({', '.join(bad)}); "
            f"load it with trust_remote_code=True if its remote code supports your transformers version"
        )
    d_model, n_heads = int(config["d_model"]), int(config["n_heads"])
    intermediate = config.get("mlp_hidden_size") or int(config.get("mlp_ratio", 4)) * d_model
    kwargs = {k: config[k] for k in _TOKEN_FIELDS if config.get(k) is not None}
    out = LlamaConfig(
        vocab_size=int(config.get("embedding_size") or config["vocab_size"]),
        hidden_size=d_model,
        intermediate_size=int(intermediate),
        num_hidden_layers=int(config["n_layers"]),
        num_attention_heads=n_heads,
        num_key_value_heads=int(config.get("n_kv_heads") or n_heads),
        hidden_act=config.get("activation_type", "silu"),
        max_position_embeddings=int(config.get("max_sequence_length", 4096)),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)),
        initializer_range=float(config.get("init_std", 0.02)),
        rope_parameters=_rope_parameters(config),
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=False,
        **kwargs,
    )
    out.mask_token_id = config.get("mask_token_id")
    out.dtype = _dtype(config)
    return out


#: native checkpoint formats (config.json model_type, lower-case) -> (stock class, config translation, key mapping)
_NATIVE_FORMATS: dict[str, tuple[str, Callable[[dict], object], dict | None]] = {
    "dream": ("qwen2", dream_config, None),
    "llada": ("llama", llada_config, LLADA_KEY_MAPPING),
}


def _stock_class(name: str):
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    return {"qwen2": Qwen2ForCausalLM, "llama": LlamaForCausalLM}[name]


def read_sidecar(path: str | os.PathLike) -> dict:
    """The settings :func:`save_drafter_model` wrote next to the weights ({} when there are none)."""
    sidecar = os.path.join(os.fspath(path), SIDECAR_FILE)
    if not os.path.isfile(sidecar):
        return {}
    with open(sidecar) as f:
        return json.load(f)


def _raw_config(path: str | os.PathLike, **kwargs) -> dict:
    from transformers import PretrainedConfig

    hub = {k: kwargs[k] for k in ("revision", "token", "cache_dir", "local_files_only") if k in kwargs}
    config_dict, _ = PretrainedConfig.get_config_dict(path, **hub)
    return config_dict


def resolve_family(
    path: str | os.PathLike,
    family: str,
    config_dict: dict,
    settings: dict,
    mask_token_id: int | None = None,
    shift_logits: bool | None = None,
) -> str | None:
    """``family`` itself, or for ``"auto"`` the sidecar's family, else the one of ``model_type``;
    None when no family is known but the mask id and logit shift are (given, or in the sidecar):
    a checkpoint of any stock ``model_type`` then loads with those."""
    if family == "auto":
        family = settings.get("family") or "auto"
    if family == "auto":
        model_type = str(config_dict.get("model_type", ""))
        found = family_for_model_type(model_type)
        if found is None:
            mask = mask_token_id if mask_token_id is not None else settings.get("mask_token_id")
            shift = shift_logits if shift_logits is not None else settings.get("shift_logits")
            if mask is not None and shift is not None:
                return None
            raise ValueError(
                f"cannot infer the drafter family of {os.fspath(path)!r} (model_type={model_type!r}); pass "
                f"family= one of {sorted(DRAFTER_FAMILIES)}, or both mask_token_id= and shift_logits="
            )
        family = found
    if family not in DRAFTER_FAMILIES:
        raise ValueError(
            f"unknown drafter family {family!r}; choose one of {sorted(DRAFTER_FAMILIES)} or 'auto'"
        )
    return family


def load_drafter_model(
    path: str | os.PathLike,
    family: str = "auto",
    trust_remote_code: bool | None = None,
    mask_token_id: int | None = None,
    shift_logits: bool | None = None,
    **model_kwargs,
) -> tuple[nn.Module, str | None, dict, dict]:
    """Load a drafter checkpoint without running its code.

    Returns ``(model, family, sidecar settings, raw config.json dict)``; the family is None for a
    checkpoint of no known family loaded with an explicit ``mask_token_id`` and ``shift_logits``
    (:func:`resolve_family`). With
    ``trust_remote_code=True`` (explicit only) the checkpoint's own classes are used through
    ``AutoModel``; if that fails, the error names the stock route.
    """
    from transformers import AutoModel, AutoModelForCausalLM

    settings = read_sidecar(path)
    config_dict = _raw_config(path, **model_kwargs)
    family = resolve_family(path, family, config_dict, settings, mask_token_id, shift_logits)
    model_type = str(config_dict.get("model_type", "")).lower()
    if trust_remote_code:
        try:
            model = AutoModel.from_pretrained(path, trust_remote_code=True, **model_kwargs)
        except Exception as err:  # noqa: BLE001 (re-raised with the way out)
            stock = DRAFTER_FAMILIES[family].stock_class if family else "transformers"
            raise RuntimeError(
                f"loading {os.fspath(path)!r} with its remote code failed ({type(err).__name__}: {err}). "
                f"No remote code is needed: DiffusionDrafter.from_pretrained(path, family={family!r}) without "
                f"trust_remote_code loads it as the stock {stock} class (see docs/drafters.md)."
            ) from err
    elif model_type in _NATIVE_FORMATS:
        stock, translate, key_mapping = _NATIVE_FORMATS[model_type]
        kwargs = dict(model_kwargs)
        kwargs.setdefault("config", translate(config_dict))
        if key_mapping is not None:
            kwargs.setdefault("key_mapping", key_mapping)
        model = _stock_class(stock).from_pretrained(path, **kwargs)
    else:
        kwargs = dict(model_kwargs)
        if trust_remote_code is not None:
            kwargs["trust_remote_code"] = trust_remote_code
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    return model.eval(), family, settings, config_dict


def save_drafter_model(model: nn.Module, path: str | os.PathLike, settings: dict, **kwargs) -> None:
    """``model.save_pretrained(path)`` in the stock format plus the sidecar ``settings``.

    A model loaded through a ``key_mapping`` (LLaDA) is saved under the stock tensor names
    (``save_original_format=False``), next to its stock ``config.json``: our loader and plain
    ``AutoModelForCausalLM.from_pretrained`` both reload it.
    """
    from transformers import PreTrainedModel

    if isinstance(model, PreTrainedModel):
        kwargs.setdefault("save_original_format", False)
    model.save_pretrained(path, **kwargs)
    with open(os.path.join(os.fspath(path), SIDECAR_FILE), "w") as f:
        json.dump(settings, f, indent=2)
    give_user_modes(path)  # transformers writes its weights 0600: an export is read by others
