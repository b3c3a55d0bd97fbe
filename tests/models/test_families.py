"""The paper's drafter families load from hub-layout checkpoints into stock classes, without their code.

Each checkpoint is written by ``hub_layout`` the way the published one looks (its own config field
names, ``model_type``, ``auto_map``, published tensor names); the remote-code files it names raise
on import. Marginals are checked against a forward computed by hand from the raw tensors.
"""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM, Qwen2ForCausalLM

from helpers import reference_greedy, tree_for
from hub_layout import reference_logits, write_diffullama, write_dream, write_llada
from specdiff_lightning import DiffusionDrafter, speculative_generate
from specdiff_lightning.models import DRAFTER_FAMILIES, tiny_model
from specdiff_lightning.models.families import (
    LLADA_KEY_MAPPING,
    SIDECAR_FILE,
    dream_config,
    family_for_model_type,
    llada_config,
)

V = 64
WRITERS = {"dream": (write_dream, Qwen2ForCausalLM, True), "llada": (write_llada, LlamaForCausalLM, False)}


@pytest.fixture(scope="module", params=sorted(WRITERS))
def hub(request, tmp_path_factory):
    family = request.param
    writer, cls, shift = WRITERS[family]
    return family, writer(tmp_path_factory.mktemp(family), vocab=V, seed=3), cls, shift


def test_auto_family_loads_the_stock_class_without_remote_code(hub):
    family, path, cls, shift = hub
    drafter = DiffusionDrafter.from_pretrained(path, dtype=torch.float64)  # family="auto"
    assert type(drafter.model) is cls and drafter._stock
    assert drafter.family == family and drafter.shift_logits is shift
    assert drafter.mask_token_id == V - 1  # the checkpoint's own config.mask_token_id
    assert drafter.model.dtype == torch.float64
    assert not getattr(drafter.model.config, "use_sliding_window", False)
    # Every published tensor was used: nothing left at its random init.
    from safetensors.torch import load_file

    raw = {}
    for f in sorted(path.glob("*.safetensors")):
        raw.update(load_file(str(f)))
    assert len(raw) == len(drafter.model.state_dict())


@pytest.mark.parametrize("prefix_len,gamma", [(1, 4), (5, 3), (9, 8)])
def test_marginals_match_a_direct_bidirectional_forward(hub, prefix_len, gamma):
    family, path, _, shift = hub
    drafter = DiffusionDrafter.from_pretrained(path, dtype=torch.float64)
    prefix = torch.randint(0, V - 1, (1, prefix_len), generator=torch.Generator().manual_seed(prefix_len))
    tokens = torch.cat([prefix[0], torch.full((gamma,), V - 1)])
    full = reference_logits(path, tokens)
    start = prefix_len - 1 if shift else prefix_len  # Dream shifted, LLaDA not
    torch.testing.assert_close(drafter.draft_logits(prefix, gamma)[0], full[start : start + gamma])
    # and the proposal's q is the softmax of exactly those rows
    proposal = drafter.propose(prefix, gamma, num_drafts=3, temperature=1.5, generator=torch.Generator())
    torch.testing.assert_close(proposal.probs[0, 0], torch.softmax(full[start : start + gamma] / 1.5, -1))


@pytest.mark.parametrize(
    "acceptance,num_drafts", [("greedy", 1), ("greedy", 4), ("recursive", 4), ("standard", 1)]
)
def test_speculative_generate_is_greedy_exact(hub, acceptance, num_drafts):
    family, path, _, _ = hub
    drafter = DiffusionDrafter.from_pretrained(path, dtype=torch.float64)
    verifier = tiny_model(
        "qwen2" if family == "dream" else "llama", vocab_size=V, seed=11, dtype=torch.float64
    )
    prompt = torch.randint(0, V - 1, (1, 6), generator=torch.Generator().manual_seed(4))
    ref = reference_greedy(verifier, prompt, 20)
    out = speculative_generate(
        verifier,
        drafter,
        prompt,
        max_new_tokens=20,
        gamma=5,
        num_drafts=num_drafts,
        acceptance=acceptance,
        temperature=0,
        draft_temperature=1.5,
        generator=torch.Generator().manual_seed(0),
        tree=tree_for(acceptance),
    )
    assert out.sequences.tolist() == ref.tolist()


def test_saved_drafter_reloads_with_our_loader_and_plain_transformers(hub, tmp_path):
    family, path, cls, shift = hub
    drafter = DiffusionDrafter.from_pretrained(path, dtype=torch.float64, max_prefix_tokens=32)
    with torch.no_grad():  # "fine-tune": change a weight, so the reload must carry it
        drafter.model.model.layers[0].mlp.down_proj.weight.mul_(1.5)
    drafter.save_pretrained(tmp_path / "ft")
    saved = json.loads((tmp_path / "ft" / "config.json").read_text())
    assert saved["model_type"] == ("qwen2" if family == "dream" else "llama") and "auto_map" not in saved
    settings = json.loads((tmp_path / "ft" / SIDECAR_FILE).read_text())
    assert settings["family"] == family and settings["mask_token_id"] == V - 1

    prefix = torch.tensor([[3, 4, 5, 6]])
    expected = drafter.draft_logits(prefix, 4)
    reloaded = DiffusionDrafter.from_pretrained(tmp_path / "ft", dtype=torch.float64)
    assert type(reloaded.model) is cls and reloaded.shift_logits is shift and reloaded.max_prefix_tokens == 32
    torch.testing.assert_close(reloaded.draft_logits(prefix, 4), expected)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "ft", dtype=torch.float64)
    assert type(plain) is cls
    torch.testing.assert_close(DiffusionDrafter(plain, V - 1, shift).draft_logits(prefix, 4), expected)


def test_explicit_remote_code_failure_names_the_stock_route(hub):
    family, path, _, _ = hub
    with pytest.raises(RuntimeError, match=rf"No remote code is needed.*family='{family}'"):
        DiffusionDrafter.from_pretrained(path, trust_remote_code=True, dtype=torch.float64)


def test_explicit_family_and_overrides(hub):
    family, path, _, shift = hub
    drafter = DiffusionDrafter.from_pretrained(
        path, family=family, mask_token_id=V - 2, shift_logits=not shift, dtype=torch.float64
    )
    assert drafter.mask_token_id == V - 2 and drafter.shift_logits is (not shift)


def test_diffullama_is_a_plain_llama_checkpoint(tmp_path):
    path = write_diffullama(tmp_path / "dl", vocab=1000)
    drafter = DiffusionDrafter.from_pretrained(path, dtype=torch.float64)
    assert type(drafter.model) is LlamaForCausalLM and drafter.family == "diffullama"
    assert (drafter.mask_token_id, drafter.shift_logits) == (811, True)
    prefix = torch.tensor([[5, 6, 7]])
    full = reference_logits(path, torch.cat([prefix[0], torch.full((4,), 811)]))
    torch.testing.assert_close(drafter.draft_logits(prefix, 4)[0], full[2:6])


def test_published_configs_translate_to_the_right_shapes():
    """The real config.json files (reference data) translate to Qwen2.5-7B / LLaDA-8B shapes."""
    from pathlib import Path

    ref = Path("/work/shared/reference/hub-configs")
    if not ref.is_dir():
        pytest.skip("reference hub configs not available")
    dream = dream_config(json.loads((ref / "dream" / "config.json").read_text()))
    assert (dream.hidden_size, dream.num_hidden_layers, dream.num_key_value_heads, dream.vocab_size) == (
        3584,
        28,
        4,
        152064,
    )
    assert dream.use_sliding_window is False and dream.rope_parameters["rope_theta"] == 1e6
    assert dream.mask_token_id == DRAFTER_FAMILIES["dream"].mask_token_id
    llada = llada_config(json.loads((ref / "llada" / "config.json").read_text()))
    assert (llada.hidden_size, llada.intermediate_size, llada.num_hidden_layers, llada.vocab_size) == (
        4096,
        12288,
        32,
        126464,
    )
    assert llada.mask_token_id == DRAFTER_FAMILIES["llada"].mask_token_id
    # every published tensor name maps onto a LlamaForCausalLM parameter name
    import re

    index = json.loads((ref / "llada" / "model.safetensors.index.json").read_text())
    with torch.device("meta"):
        names = set(
            LlamaForCausalLM(
                llada_config(json.loads((ref / "llada" / "config.json").read_text()))
            ).state_dict()
        )
    mapped = set()
    for key in index["weight_map"]:
        for pattern, target in LLADA_KEY_MAPPING.items():
            key = re.sub(pattern, target, key, count=1)
        mapped.add(key)
    assert mapped == names


def test_unsupported_llada_options_are_a_clear_error():
    with pytest.raises(ValueError, match="include_qkv_bias"):
        llada_config({"d_model": 8, "n_heads": 2, "n_layers": 1, "vocab_size": 10, "include_qkv_bias": True})


def test_model_type_detection():
    assert family_for_model_type("Dream") == "dream"
    assert family_for_model_type("llada") == "llada"
    assert family_for_model_type("llama") == "diffullama"
    assert family_for_model_type("qwen2") is None
