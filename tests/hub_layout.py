"""Tiny checkpoints laid out like the published drafters, and a hand-written reference forward.

A directory written here looks like the hub one (/work/shared/reference/hub-configs): the family's own
``config.json`` field names, ``model_type``, ``architectures``, ``auto_map``, and safetensors under the
published tensor names. The remote-code files it names raise on import, so a test that loads one
proves that no checkpoint code ran. Weights are random tensors written directly (no model class
involved), and :func:`reference_logits` recomputes the bidirectional forward from those raw tensors.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

__all__ = [
    "write_dream",
    "write_llada",
    "write_diffullama",
    "write_dflash_zlab",
    "reference_logits",
    "HUB_WRITERS",
]

_POISON = 'raise RuntimeError("the checkpoint\'s remote code was executed")\n'


def _rand(gen, *shape, scale=0.3):
    return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale


def _norm_weight(gen, size):
    return 1.0 + _rand(gen, size, scale=0.1)


def _qwen_llama_tensors(gen, vocab, hidden, inter, layers, heads, kv_heads, qkv_bias, logit_scale):
    head_dim = hidden // heads
    t = {"model.embed_tokens.weight": _rand(gen, vocab, hidden, scale=1.0)}
    for i in range(layers):
        pre = f"model.layers.{i}."
        t[pre + "input_layernorm.weight"] = _norm_weight(gen, hidden)
        t[pre + "post_attention_layernorm.weight"] = _norm_weight(gen, hidden)
        for name, out in (("q", heads * head_dim), ("k", kv_heads * head_dim), ("v", kv_heads * head_dim)):
            t[pre + f"self_attn.{name}_proj.weight"] = _rand(gen, out, hidden)
            if qkv_bias:
                t[pre + f"self_attn.{name}_proj.bias"] = _rand(gen, out, scale=0.1)
        t[pre + "self_attn.o_proj.weight"] = _rand(gen, hidden, heads * head_dim)
        t[pre + "mlp.gate_proj.weight"] = _rand(gen, inter, hidden)
        t[pre + "mlp.up_proj.weight"] = _rand(gen, inter, hidden)
        t[pre + "mlp.down_proj.weight"] = _rand(gen, hidden, inter)
    t["model.norm.weight"] = _norm_weight(gen, hidden)
    t["lm_head.weight"] = _rand(gen, vocab, hidden, scale=logit_scale / math.sqrt(hidden))
    return t


def _write(directory: Path, config: dict, tensors: dict, shards: int, code_files: tuple[str, ...]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    for name in code_files:
        (directory / name).write_text(_POISON)
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
        return directory
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        save_file(part, str(directory / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return directory


def write_dream(
    directory, vocab=64, hidden=32, layers=2, heads=4, kv_heads=2, seed=0, logit_scale=8.0
) -> Path:
    """Dream-v0 / DiffuCoder layout (``model_type: "Dream"``, Qwen2 tensor names, q/k/v biases)."""
    gen = torch.Generator().manual_seed(seed)
    inter = hidden * 2
    config = {
        "architectures": ["DreamModel"],
        "attention_dropout": 0.0,
        "auto_map": {
            "AutoConfig": "configuration_dream.DreamConfig",
            "AutoModel": "modeling_dream.DreamModel",
        },
        "bos_token_id": 0,
        "eos_token_id": 0,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": inter,
        "mask_token_id": vocab - 1,
        "max_position_embeddings": 512,
        "max_window_layers": layers,
        "model_type": "Dream",
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float64",
        "transformers_version": "4.46.2",
        "use_cache": False,
        "use_sliding_window": False,
        "vocab_size": vocab,
    }
    tensors = _qwen_llama_tensors(gen, vocab, hidden, inter, layers, heads, kv_heads, True, logit_scale)
    code = ("configuration_dream.py", "modeling_dream.py", "generation_utils.py")
    return _write(Path(directory), config, tensors, 1, code)


_LLADA_NAMES = {
    "model.embed_tokens.": "model.transformer.wte.",
    "model.norm.": "model.transformer.ln_f.",
    "lm_head.": "model.transformer.ff_out.",
    "input_layernorm.": "attn_norm.",
    "self_attn.q_proj.": "q_proj.",
    "self_attn.k_proj.": "k_proj.",
    "self_attn.v_proj.": "v_proj.",
    "self_attn.o_proj.": "attn_out.",
    "post_attention_layernorm.": "ff_norm.",
    "mlp.gate_proj.": "ff_proj.",
    "mlp.up_proj.": "up_proj.",
    "mlp.down_proj.": "ff_out.",
}


def _llada_name(name: str) -> str:
    """Our (Llama) name -> the published LLaDA one, written out independently of the loader's map."""
    if name.startswith("model.layers."):
        _, _, index, rest = name.split(".", 3)
        for ours, theirs in _LLADA_NAMES.items():
            if rest.startswith(ours):
                return f"model.transformer.blocks.{index}.{theirs}{rest[len(ours) :]}"
        raise KeyError(name)
    for ours, theirs in _LLADA_NAMES.items():
        if name.startswith(ours):
            return theirs + name[len(ours) :]
    raise KeyError(name)


def write_llada(
    directory, vocab=64, hidden=32, layers=2, heads=4, kv_heads=4, seed=0, logit_scale=8.0
) -> Path:
    """LLaDA layout (``model_type: "llada"``, OLMo field names, ``model.transformer.blocks.N.*``, sharded)."""
    gen = torch.Generator().manual_seed(seed)
    inter = hidden * 3
    config = {
        "activation_type": "silu",
        "alibi": False,
        "alibi_bias_max": 8.0,
        "architectures": ["LLaDAModelLM"],
        "attention_dropout": 0.0,
        "attention_layer_norm": False,
        "attention_layer_norm_with_affine": True,
        "auto_map": {
            "AutoConfig": "configuration_llada.LLaDAConfig",
            "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
            "AutoModel": "modeling_llada.LLaDAModelLM",
        },
        "bias_for_layer_norm": False,
        "block_group_size": 1,
        "block_type": "llama",
        "d_model": hidden,
        "embedding_dropout": 0.0,
        "embedding_size": vocab,
        "eos_token_id": 0,
        "flash_attention": False,
        "include_bias": False,
        "include_qkv_bias": False,
        "init_cutoff_factor": None,
        "init_device": "meta",
        "init_fn": "mitchell",
        "init_std": 0.02,
        "input_emb_norm": False,
        "layer_norm_type": "rms",
        "layer_norm_with_affine": True,
        "mask_token_id": vocab - 1,
        "max_sequence_length": 512,
        "mlp_hidden_size": inter,
        "mlp_ratio": 4,
        "model_type": "llada",
        "multi_query_attention": None,
        "n_heads": heads,
        "n_kv_heads": kv_heads,
        "n_layers": layers,
        "pad_token_id": 0,
        "precision": "amp_bf16",
        "residual_dropout": 0.0,
        "rms_norm_eps": 1e-05,
        "rope": True,
        "rope_full_precision": True,
        "rope_theta": 500000.0,
        "scale_logits": False,
        "transformers_version": "4.46.3",
        "use_cache": False,
        "vocab_size": vocab,
        "weight_tying": False,
    }
    tensors = _qwen_llama_tensors(gen, vocab, hidden, inter, layers, heads, kv_heads, False, logit_scale)
    tensors = {_llada_name(n): t for n, t in tensors.items()}
    return _write(Path(directory), config, tensors, 2, ("configuration_llada.py", "modeling_llada.py"))


def write_diffullama(directory, vocab=1000, hidden=32, layers=2, heads=4, kv_heads=4, seed=0) -> Path:
    """DiffuLLaMA layout: a plain ``LlamaForCausalLM`` checkpoint (``model_type: "llama"``)."""
    gen = torch.Generator().manual_seed(seed)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": hidden * 2,
        "max_position_embeddings": 512,
        "model_type": "llama",
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float64",
        "vocab_size": vocab,
    }
    tensors = _qwen_llama_tensors(gen, vocab, hidden, hidden * 2, layers, heads, kv_heads, False, 8.0)
    return _write(Path(directory), config, tensors, 1, ())


def write_dflash_zlab(
    directory,
    vocab=48,
    hidden=32,
    layers=1,
    heads=4,
    kv_heads=2,
    target_layer_ids=(0, 2),
    num_target_layers=3,
    mask_token_id=47,
    block_size=5,
    seed=0,
    shards=1,
) -> Path:
    """z-lab's DFlash drafter layout (../shared/reference/hub-configs/dflash): a Qwen3-style config
    with ``dflash_config`` and an ``auto_map`` to ``modeling_dflash.py``; tensors ``fc`` / ``hidden_norm``
    / ``norm`` / ``layers.N.*`` (QK-norm), no embeddings and no head."""
    gen = torch.Generator().manual_seed(seed)
    head_dim, inter = hidden // heads, hidden * 2
    config = {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "modeling_dflash.DFlashDraftModel"},
        "block_size": block_size,
        "bos_token_id": None,
        "dflash_config": {
            "block_size": block_size,
            "mask_token_id": mask_token_id,
            "target_layer_ids": list(target_layer_ids),
        },
        "dtype": "float64",
        "eos_token_id": None,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": inter,
        "layer_types": ["full_attention"] * layers,
        "max_position_embeddings": 512,
        "max_window_layers": layers,
        "model_type": "qwen3",
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "num_target_layers": num_target_layers,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab,
    }
    t = {
        "fc.weight": _rand(gen, hidden, len(target_layer_ids) * hidden),
        "hidden_norm.weight": _norm_weight(gen, hidden),
        "norm.weight": _norm_weight(gen, hidden),
    }
    for i in range(layers):
        pre = f"layers.{i}."
        t[pre + "input_layernorm.weight"] = _norm_weight(gen, hidden)
        t[pre + "post_attention_layernorm.weight"] = _norm_weight(gen, hidden)
        for name, out in (("q", heads * head_dim), ("k", kv_heads * head_dim), ("v", kv_heads * head_dim)):
            t[pre + f"self_attn.{name}_proj.weight"] = _rand(gen, out, hidden)
        t[pre + "self_attn.o_proj.weight"] = _rand(gen, hidden, heads * head_dim)
        t[pre + "self_attn.q_norm.weight"] = _norm_weight(gen, head_dim)
        t[pre + "self_attn.k_norm.weight"] = _norm_weight(gen, head_dim)
        t[pre + "mlp.gate_proj.weight"] = _rand(gen, inter, hidden)
        t[pre + "mlp.up_proj.weight"] = _rand(gen, inter, hidden)
        t[pre + "mlp.down_proj.weight"] = _rand(gen, hidden, inter)
    return _write(Path(directory), config, t, shards, ("modeling_dflash.py",))


HUB_WRITERS = {"dream": write_dream, "llada": write_llada, "diffullama": write_diffullama}


# ---------------------------------------------------------------------------- reference forward
def _load_tensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for file in sorted(Path(directory).glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


def _rms(x, weight, eps):
    # Dream's (Qwen2's) and LLaDA's RMSNorm both normalise in float32 and cast back.
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rope(x, positions, theta):
    dim = x.shape[-1]
    # Both published implementations (Dream's Qwen2 code, LLaDA with rope_full_precision) build the
    # rotation in float32 whatever the model dtype, so the reference does too.
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    angles = positions[:, None].float() * inv[None]  # [L, dim/2]
    emb = torch.cat([angles, angles], -1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    half = dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def reference_logits(directory, tokens: torch.Tensor) -> torch.Tensor:
    """Bidirectional (no causal mask) forward of a hub-layout checkpoint from its raw tensors and its
    own config field names: ``tokens[L] -> logits[L, V]`` (float64)."""
    directory = Path(directory)
    cfg = json.loads((directory / "config.json").read_text())
    w = _load_tensors(directory)
    if cfg["model_type"] == "llada":
        layers, heads, kv_heads = cfg["n_layers"], cfg["n_heads"], cfg["n_kv_heads"]
        eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]

        def name(i, part):
            return f"model.transformer.blocks.{i}.{part}"

        emb, final, head = (
            "model.transformer.wte.weight",
            "model.transformer.ln_f.weight",
            "model.transformer.ff_out.weight",
        )
        parts = dict(
            attn_norm="attn_norm",
            q="q_proj",
            k="k_proj",
            v="v_proj",
            o="attn_out",
            ff_norm="ff_norm",
            gate="ff_proj",
            up="up_proj",
            down="ff_out",
        )
    else:
        layers, heads, kv_heads = (
            cfg["num_hidden_layers"],
            cfg["num_attention_heads"],
            cfg["num_key_value_heads"],
        )
        eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]

        def name(i, part):
            return f"model.layers.{i}.{part}"

        emb, final, head = "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"
        parts = dict(
            attn_norm="input_layernorm",
            q="self_attn.q_proj",
            k="self_attn.k_proj",
            v="self_attn.v_proj",
            o="self_attn.o_proj",
            ff_norm="post_attention_layernorm",
            gate="mlp.gate_proj",
            up="mlp.up_proj",
            down="mlp.down_proj",
        )

    def linear(x, i, part):
        y = x @ w[name(i, parts[part]) + ".weight"].T
        bias = w.get(name(i, parts[part]) + ".bias")
        return y if bias is None else y + bias

    length = tokens.shape[0]
    positions = torch.arange(length)
    h = w[emb][tokens]
    for i in range(layers):
        x = _rms(h, w[name(i, parts["attn_norm"]) + ".weight"], eps)
        q = linear(x, i, "q").reshape(length, heads, -1).transpose(0, 1)
        k = linear(x, i, "k").reshape(length, kv_heads, -1).transpose(0, 1)
        v = linear(x, i, "v").reshape(length, kv_heads, -1).transpose(0, 1)
        q, k = _rope(q, positions, theta), _rope(k, positions, theta)
        k = k.repeat_interleave(heads // kv_heads, dim=0)
        v = v.repeat_interleave(heads // kv_heads, dim=0)
        att = torch.softmax(
            q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1
        )  # no mask: bidirectional
        h = h + linear((att @ v).transpose(0, 1).reshape(length, -1), i, "o")
        x = _rms(h, w[name(i, parts["ff_norm"]) + ".weight"], eps)
        h = h + linear(torch.nn.functional.silu(linear(x, i, "gate")) * linear(x, i, "up"), i, "down")
    return _rms(h, w[final], eps) @ w[head].T
