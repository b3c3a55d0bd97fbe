"""One loading path for every drafter the project ships or saves (load_drafter and each class's
from_pretrained read our slice.json), specs that fail at once with the known names, and the errors
a new user meets on the way."""

import json
import time
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch

from helpers import reference_greedy, smollm2_verifier
from specdiff_lightning import speculative_generate
from specdiff_lightning.data.tokenization import encode_prompt
from specdiff_lightning.models import (
    AutoregressiveDrafter,
    DiffusionDrafter,
    load_drafter,
    load_tokenizer,
    load_verifier,
    tiny_model,
)
from specdiff_lightning.models.slicing import save_slice, slice_causal_lm
from specdiff_lightning.models.specs import hub_reachable

ROOT = Path(__file__).parents[2]
ASSETS = ROOT / "assets" / "smollm2"
#: every drafter shipped in assets/smollm2 and the class its slice.json kind loads into
SHIPPED = {
    "drafter": DiffusionDrafter,
    "drafter_mdm": DiffusionDrafter,
    "ar_drafter": AutoregressiveDrafter,
}
KNOWN = r"\(smollm2-135m-instruct, tiny-qwen2, tiny-llama\)"


# ---------------------------------------------------------------- the shipped SmolLM2 drafters
@pytest.fixture(scope="module")
def smollm2():
    return smollm2_verifier(torch.float32)


def test_shipped_folders_are_the_ones_tested():
    assert sorted(p.name for p in ASSETS.iterdir() if (p / "slice.json").is_file()) == sorted(SHIPPED)


@pytest.mark.parametrize("folder", sorted(SHIPPED))
def test_every_shipped_drafter_loads_and_decodes_as_the_verifier(smollm2, folder):
    """load_drafter and the class's own from_pretrained give the class of the slice's kind, built
    around the verifier's embeddings (shared, not copied), and decode greedily token for token as
    the verifier's own generate()."""
    path = ASSETS / folder
    cls = SHIPPED[folder]
    drafter = load_drafter(str(path), verifier=smollm2)
    assert type(drafter) is cls
    assert drafter.model.model.embed_tokens is smollm2.model.embed_tokens
    assert next(drafter.model.parameters()).dtype == torch.float32  # the verifier's, not the file's bf16
    assert type(cls.from_pretrained(path, verifier=smollm2)) is cls
    tokenizer = load_tokenizer("smollm2-135m-instruct")  # a named verifier is a tokenizer spec too
    ids = torch.tensor([encode_prompt(tokenizer, "def add(a, b):")])
    out = speculative_generate(
        smollm2, drafter, ids, max_new_tokens=6, gamma=4, temperature=0, draft_temperature=0
    )
    assert torch.equal(out.sequences, reference_greedy(smollm2, ids, 6))


def test_shipped_slices_without_their_verifier_name_it():
    for folder, cls in SHIPPED.items():
        for load in (lambda p: load_drafter(str(p)), lambda p, cls=cls: cls.from_pretrained(p)):
            with pytest.raises(
                ValueError,
                match=r"is a slice of its verifier.*pass verifier=load_verifier\('smollm2-135m-instruct'\)",
            ):
                load(ASSETS / folder)


def test_a_slice_is_not_a_verifier():
    with pytest.raises(ValueError, match=r"is a drafter slice .*load_drafter\("):
        load_verifier(str(ASSETS / "drafter"))


# ---------------------------------------------------------------- slices of a tiny verifier
def _verifier(**kwargs):
    return load_verifier("tiny-llama", dtype=torch.float64, tiny={"num_layers": 2, **kwargs})


def _diffusion_slice(verifier, path):
    settings = {"kind": "diffusion", "verifier": "tiny-llama", "mask_token_id": 63, "shift_logits": True}
    save_slice(slice_causal_lm(verifier, 1), path, {**settings, "attention": "block_causal"})
    return path


def _ar_slice(verifier, path):
    save_slice(slice_causal_lm(verifier, 1), path, {"kind": "autoregressive", "verifier": "tiny-llama"})
    return path


def test_a_slice_of_another_kind_names_its_loader(tmp_path):
    verifier = _verifier()
    _ar_slice(verifier, tmp_path / "a")
    _diffusion_slice(verifier, tmp_path / "d")
    with pytest.raises(
        ValueError, match=r"holds a 'autoregressive' drafter, not a 'diffusion' one.*load_drafter"
    ):
        DiffusionDrafter.from_pretrained(tmp_path / "a", verifier=verifier)
    with pytest.raises(ValueError, match=r"holds a 'diffusion' drafter, not a 'autoregressive' one"):
        load_drafter(str(tmp_path / "d"), verifier=verifier, kind="autoregressive")
    assert isinstance(AutoregressiveDrafter.from_pretrained("tiny-llama"), AutoregressiveDrafter)


def test_a_retired_kind_names_what_replaces_it(tmp_path):
    """Issue 18: the feature-conditioned slice drafter was retired for the DFlash family; a slice an
    earlier version saved (or a config asking for the kind) says so and names the way forward."""
    verifier = _verifier()
    _diffusion_slice(verifier, tmp_path / "c")
    info = json.loads((tmp_path / "c" / "slice.json").read_text())
    (tmp_path / "c" / "slice.json").write_text(json.dumps({**info, "kind": "conditioned"}))
    with pytest.raises(
        ValueError,
        match=r"holds a 'conditioned' drafter, which this version no longer loads.*DFlash.*drafter_dflash.yaml",
    ):
        load_drafter(str(tmp_path / "c"), verifier=verifier)
    with pytest.raises(ValueError, match=r"kind='conditioned' is retired.*DFlashDrafter.from_pretrained"):
        load_drafter("tiny-llama", kind="conditioned")


def test_options_and_dtypes_that_do_not_apply_are_clear_errors(tmp_path):
    verifier = _verifier()
    path = str(_diffusion_slice(verifier, tmp_path / "d"))
    with pytest.raises(ValueError, match=r"\['head_vocab'\] do not apply to a 'diffusion' drafter"):
        load_drafter(path, verifier=verifier, head_vocab=8)
    with pytest.raises(ValueError, match=r"takes the verifier's dtype \(torch.float64\), not torch.bfloat16"):
        load_drafter(path, verifier=verifier, dtype="bfloat16")
    with pytest.raises(ValueError, match="drop family"):
        load_drafter(path, verifier=verifier, family="dream")
    with pytest.raises(ValueError, match=r"head_vocab applies to DFlash drafters.*tiny-llama is not one"):
        load_drafter("tiny-llama", head_vocab=4)
    drafter = load_drafter(path, verifier=verifier, dtype="float64", steps=2, max_prefix_tokens=9)
    assert (drafter.mask_token_id, drafter.attention, drafter.steps, drafter.max_prefix_tokens) == (
        63,
        "block_causal",
        2,
        9,
    )


def test_missing_weights_and_a_slice_of_another_verifier_are_one_line_errors(tmp_path):
    verifier = _verifier()
    path = _diffusion_slice(verifier, tmp_path / "d")
    wider = _verifier(hidden_size=48)
    with pytest.raises(
        ValueError,
        match=r"does not fit this verifier \(\S+ is \(64, 32\) in the slice, \(64, 48\) here\); it was cut from 'tiny-llama'",
    ):
        load_drafter(str(path), verifier=wider)
    save_slice(
        slice_causal_lm(verifier, 2), tmp_path / "deep", {"verifier": "tiny-llama", "mask_token_id": 63}
    )
    with pytest.raises(ValueError, match=r"has 2 layers, this verifier 1; it was cut from 'tiny-llama'"):
        load_drafter(str(tmp_path / "deep"), verifier=_verifier(num_layers=1))
    (path / "slice.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="has a slice.json but no slice.safetensors"):
        load_drafter(str(path), verifier=verifier)
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        ValueError, match=r"neither a Hugging Face checkpoint \(no config.json\) nor a saved drafter slice"
    ):
        load_drafter(str(tmp_path / "empty"))


def test_casting_a_slice_alone_is_refused_before_decoding():
    """The slice shares the verifier's embeddings: casting it casts them in the verifier too, which
    the next decode refuses in one line (naming why) instead of failing inside a matmul."""
    verifier = load_verifier("tiny-llama", dtype=torch.float32)
    drafter = DiffusionDrafter(slice_causal_lm(verifier, 1), 63, True, attention="block_causal")
    drafter.model.to(torch.bfloat16)
    assert verifier.model.embed_tokens.weight.dtype == torch.bfloat16  # what sharing means
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(
        ValueError, match=r"embeddings are torch.bfloat16 but its other weights torch.float32.*together"
    ):
        speculative_generate(verifier, drafter, ids, max_new_tokens=4, gamma=2, temperature=0)
    verifier.to(torch.bfloat16)  # both together: fine
    out = speculative_generate(verifier, drafter, ids, max_new_tokens=4, gamma=2, temperature=0)
    assert out.sequences.shape[1] == 7


# ---------------------------------------------------------------- Hugging Face checkpoints
def test_the_family_hint_is_true(tmp_path):
    """A checkpoint of no known family (model_type qwen2) loads as the hint says: with both
    mask_token_id= and shift_logits=; its save reloads without them."""
    tiny_model("qwen2", vocab_size=64, seed=3, dtype=torch.float64).save_pretrained(tmp_path / "q")
    with pytest.raises(
        ValueError, match=r"cannot infer the drafter family.*or both mask_token_id= and shift_logits="
    ):
        DiffusionDrafter.from_pretrained(tmp_path / "q", mask_token_id=63)
    drafter = load_drafter(str(tmp_path / "q"), mask_token_id=63, shift_logits=False, dtype="float64")
    assert (drafter.mask_token_id, drafter.shift_logits, drafter.family) == (63, False, None)
    drafter.save_pretrained(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "specdiff_drafter.json").read_text())["family"] is None
    again = DiffusionDrafter.from_pretrained(tmp_path / "saved", dtype=torch.float64)
    assert (again.mask_token_id, again.shift_logits) == (63, False)


# ---------------------------------------------------------------- specs
def test_unknown_names_fail_at_once_listing_the_known_ones(monkeypatch, tmp_path):
    """Offline, a spec that is neither a known name nor a directory fails in well under a second
    (transformers alone spends ~45 s in retries), for verifiers, tokenizers and drafters alike."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for load, what in ((load_verifier, "verifier"), (load_tokenizer, "tokenizer"), (load_drafter, "drafter")):
        start = time.perf_counter()
        with pytest.raises(
            ValueError, match=rf"{what} 'smollm2-360m-instruct' is neither a known name {KNOWN}.*offline"
        ):
            load("smollm2-360m-instruct")
        assert time.perf_counter() - start < 2.0
    with pytest.raises(
        ValueError, match=rf"neither a known name {KNOWN} nor a local directory \(no such directory\)"
    ):
        load_verifier(str(tmp_path / "no" / "such" / "dir"))
    with pytest.raises(ValueError, match="tiny preset, which has no tokenizer"):
        load_tokenizer("tiny-qwen2")


def test_an_unreachable_hub_fails_at_once(monkeypatch):
    """No offline flag, but the endpoint refuses connections: one short HEAD request decides."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # the discard port
    hub_reachable.cache_clear()
    try:
        start = time.perf_counter()
        with pytest.raises(ValueError, match=r"no Hugging Face hub is reachable"):
            load_verifier("someone/smollm2-360m-instruct")
        assert time.perf_counter() - start < 5.0
    finally:
        hub_reachable.cache_clear()


def test_a_hub_id_in_the_local_hub_cache_loads_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = tmp_path / "models--someone--tiny"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    tiny_model("llama", vocab_size=64, seed=5).save_pretrained(repo / "snapshots" / commit)
    model = load_verifier("someone/tiny", cache_dir=str(tmp_path), dtype=torch.float32)
    assert model.config.vocab_size == 64 and not model.training
