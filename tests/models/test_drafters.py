import importlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from specdiff_lightning import AutoregressiveDrafter, DiffusionDrafter
from specdiff_lightning.decoding import sample_from_marginals
from specdiff_lightning.models import DRAFTER_FAMILIES, tiny_model
from specdiff_lightning.models.diffusion import SIDECAR_FILE

V = 40
MASK = V - 1


def _position_wise_model(arch):
    """Zero decoder layers: the logit at position i is a function of token i alone, so we know
    exactly which input position each draft row was read from."""
    return tiny_model(arch, vocab_size=V, num_layers=0, seed=1, dtype=torch.float64)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_shifted_adapter_reads_last_prefix_position_first(arch):
    model = _position_wise_model(arch)
    prefix = torch.tensor([[3, 9, 17]])
    logits = DiffusionDrafter(model, MASK, shift_logits=True).draft_logits(prefix, gamma=4)
    assert logits.shape == (1, 4, V)
    with torch.no_grad():
        of_last = model(input_ids=torch.tensor([[17]])).logits[0, 0]
        of_mask = model(input_ids=torch.tensor([[MASK]])).logits[0, 0]
    torch.testing.assert_close(logits[0, 0], of_last)  # draft token 1 <- position |s|-1
    for j in range(1, 4):
        torch.testing.assert_close(logits[0, j], of_mask)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_unshifted_adapter_reads_mask_positions(arch):
    model = _position_wise_model(arch)
    logits = DiffusionDrafter(model, MASK, shift_logits=False).draft_logits(
        torch.tensor([[3, 9, 17]]), gamma=4
    )
    with torch.no_grad():
        of_mask = model(input_ids=torch.tensor([[MASK]])).logits[0, 0]
    for j in range(4):
        torch.testing.assert_close(logits[0, j], of_mask)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_attention_is_bidirectional(arch, attn):
    model = tiny_model(arch, vocab_size=V, seed=2, dtype=torch.float64, attn_implementation=attn)
    drafter = DiffusionDrafter(model, MASK, shift_logits=False)
    tokens = torch.tensor([[5, 6, 7, MASK, MASK, MASK]])
    changed = tokens.clone()
    changed[0, -1] = 11  # a later position
    a, b = drafter.denoise_logits(tokens), drafter.denoise_logits(changed)
    assert not torch.allclose(a[0, 3], b[0, 3])  # an earlier position sees it
    # ... while the same model run causally does not.
    with torch.no_grad():
        ca, cb = model(input_ids=tokens).logits, model(input_ids=changed).logits
    torch.testing.assert_close(ca[0, 3], cb[0, 3])


def test_sdpa_and_eager_masks_agree():
    sdpa = tiny_model("qwen2", vocab_size=V, seed=3, dtype=torch.float64, attn_implementation="sdpa")
    eager = tiny_model("qwen2", vocab_size=V, seed=3, dtype=torch.float64, attn_implementation="eager")
    prefix = torch.tensor([[1, 2, 3, 4]])
    a = DiffusionDrafter(sdpa, MASK, True).draft_logits(prefix, 5)
    b = DiffusionDrafter(eager, MASK, True).draft_logits(prefix, 5)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)  # eager softmaxes in float32


def test_padding_mask_hides_padded_prefix_tokens():
    drafter = DiffusionDrafter(tiny_model("llama", vocab_size=V, seed=4, dtype=torch.float64), MASK, True)
    plain = drafter.draft_logits(torch.tensor([[8, 9]]), 3)
    # A masked-out (padding) key must not influence the draft: its token value is irrelevant.
    padded_a = drafter.draft_logits(torch.tensor([[0, 8, 9]]), 3, attention_mask=torch.tensor([[0, 1, 1]]))
    padded_b = drafter.draft_logits(torch.tensor([[5, 8, 9]]), 3, attention_mask=torch.tensor([[0, 1, 1]]))
    torch.testing.assert_close(padded_a, padded_b)
    assert plain.shape == padded_a.shape


def test_prefix_cap_reads_only_trailing_tokens():
    model = tiny_model("qwen2", vocab_size=V, seed=5, dtype=torch.float64)
    capped = DiffusionDrafter(model, MASK, True, max_prefix_tokens=4)
    long_prefix = torch.arange(1, 20)[None]
    torch.testing.assert_close(
        capped.draft_logits(long_prefix, 3),
        DiffusionDrafter(model, MASK, True).draft_logits(long_prefix[:, -4:], 3),
    )


def test_sample_from_marginals_shapes_and_argmax():
    logits = torch.randn(1, 6, V, dtype=torch.float64)
    proposal = sample_from_marginals(
        logits, num_drafts=8, temperature=1.5, generator=torch.Generator().manual_seed(0)
    )
    assert proposal.tokens.shape == (1, 8, 6) and proposal.probs.shape == (1, 8, 6, V)
    torch.testing.assert_close(proposal.probs[0, 3], torch.softmax(logits[0] / 1.5, -1))
    greedy = sample_from_marginals(logits, num_drafts=3, temperature=0)
    assert (greedy.tokens[0] == logits[0].argmax(-1)).all()


def test_multistep_drafts_unmask_everything():
    drafter = DiffusionDrafter(
        tiny_model("llama", vocab_size=V, seed=6, dtype=torch.float64), MASK, True, steps=3
    )
    proposal = drafter.propose(
        torch.tensor([[1, 2, 3]]), gamma=7, num_drafts=4, generator=torch.Generator().manual_seed(0)
    )
    assert proposal.tokens.shape == (1, 4, 7) and not proposal.exact_q
    probs_of_tokens = proposal.probs[0].gather(-1, proposal.tokens[0][..., None])
    assert (probs_of_tokens > 0).all()  # every token was drawn from its recorded distribution


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(mask_token_id=V), "outside the drafter's vocabulary"),
        (dict(mask_token_id=-1), "outside the drafter's vocabulary"),
        (dict(mask_token_id=0, pad=0), "pad_token_id"),
        (dict(mask_token_id=2, eos=[1, 2]), "eos_token_id"),
        (dict(mask_token_id=MASK, steps=0), "steps"),
    ],
)
def test_bad_mask_ids_and_settings(kwargs, match):
    model = tiny_model(
        "llama",
        vocab_size=V,
        seed=7,
        pad_token_id=kwargs.pop("pad", None),
        eos_token_id=kwargs.pop("eos", None),
    )
    mask = kwargs.pop("mask_token_id")
    with pytest.raises(ValueError, match=match):
        DiffusionDrafter(model, mask, shift_logits=True, **kwargs)


def test_family_presets_match_the_published_checkpoints():
    assert (DRAFTER_FAMILIES["dream"].mask_token_id, DRAFTER_FAMILIES["dream"].shift_logits) == (151666, True)
    assert (DRAFTER_FAMILIES["diffullama"].mask_token_id, DRAFTER_FAMILIES["diffullama"].shift_logits) == (
        811,
        True,
    )
    assert (DRAFTER_FAMILIES["llada"].mask_token_id, DRAFTER_FAMILIES["llada"].shift_logits) == (
        126336,
        False,
    )


def test_diffullama_style_checkpoint_roundtrip(tmp_path):
    """A plain LlamaForCausalLM directory loads as a DiffuLLaMA-style (shifted) drafter."""
    model = tiny_model("llama", vocab_size=1000, seed=8, dtype=torch.float64)
    model.save_pretrained(tmp_path / "plain")
    drafter = DiffusionDrafter.from_pretrained(tmp_path / "plain", dtype=torch.float64)
    assert drafter.mask_token_id == 811 and drafter.shift_logits
    prefix = torch.tensor([[5, 6, 7]])
    torch.testing.assert_close(
        drafter.draft_logits(prefix, 4), DiffusionDrafter(model, 811, True).draft_logits(prefix, 4)
    )


def _umask() -> int:
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_save_pretrained_roundtrip_keeps_settings(tmp_path, arch):
    original = DiffusionDrafter(
        tiny_model(arch, vocab_size=V, seed=9, dtype=torch.float64), MASK, False, max_prefix_tokens=16
    )
    original.save_pretrained(tmp_path / "d")
    # readable by others (transformers writes its weights 0600): the umask's modes, 0644 at 022
    assert {f.stat().st_mode & 0o777 for f in (tmp_path / "d").iterdir()} == {0o666 & ~_umask()}
    settings = json.loads((tmp_path / "d" / SIDECAR_FILE).read_text())
    assert settings["mask_token_id"] == MASK and settings["shift_logits"] is False
    reloaded = DiffusionDrafter.from_pretrained(tmp_path / "d", dtype=torch.float64)
    assert (reloaded.mask_token_id, reloaded.shift_logits, reloaded.max_prefix_tokens) == (MASK, False, 16)
    assert isinstance(reloaded.model, type(original.model))
    prefix = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(reloaded.draft_logits(prefix, 4), original.draft_logits(prefix, 4))


def test_unknown_family_is_a_clear_error(tmp_path):
    tiny_model("qwen2", vocab_size=V, seed=10).save_pretrained(tmp_path / "q")
    with pytest.raises(ValueError, match="cannot infer the drafter family"):
        DiffusionDrafter.from_pretrained(tmp_path / "q")
    with pytest.raises(ValueError, match="unknown drafter family"):
        DiffusionDrafter.from_pretrained(tmp_path / "q", family="bert")
    drafter = DiffusionDrafter.from_pretrained(tmp_path / "q", family="diffullama", mask_token_id=MASK)
    assert drafter.mask_token_id == MASK


def test_autoregressive_drafter_cache_follows_the_context():
    model = tiny_model("qwen2", vocab_size=V, seed=11, dtype=torch.float64)
    drafter = AutoregressiveDrafter(model)
    ctx = torch.tensor([[1, 2, 3, 4]])
    first = drafter.propose(ctx, gamma=3, temperature=0)
    # A context that diverges from the drafted tokens: the cache is cropped and re-fed.
    ctx2 = torch.cat([ctx, torch.tensor([[int(first.tokens[0, 0, 0]), 7]])], dim=1)
    second = drafter.propose(ctx2, gamma=3, temperature=0)
    fresh = AutoregressiveDrafter(AutoModelForCausalLM.from_config(model.config).to(torch.float64))
    fresh.model.load_state_dict(model.state_dict())
    assert torch.equal(second.tokens, fresh.propose(ctx2, gamma=3, temperature=0).tokens)
    with torch.no_grad():
        ref = model(input_ids=ctx2).logits[0, -1]
    torch.testing.assert_close(second.probs[0, 0, 0], torch.nn.functional.one_hot(ref.argmax(), V).double())
    with pytest.raises(NotImplementedError, match="num_drafts=1"):
        drafter.propose(ctx, gamma=3, num_drafts=2)


REMOTE_CODE = Path(__file__).parents[1] / "fixtures" / "remote_code"


def _save_remote_code_model(directory, class_name, config_name, seed):
    sys.path.insert(0, str(REMOTE_CODE))
    try:
        configuration = importlib.import_module("configuration_tinydiff")
        modeling = importlib.import_module("modeling_tinydiff")
    finally:
        sys.path.remove(str(REMOTE_CODE))
    config = getattr(configuration, config_name)(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    config.auto_map = {
        "AutoConfig": f"configuration_tinydiff.{config_name}",
        "AutoModel": f"modeling_tinydiff.{class_name}",
    }
    torch.manual_seed(seed)
    model = getattr(modeling, class_name)(config).to(torch.float64).eval()
    model.save_pretrained(directory)
    for name in ("configuration_tinydiff.py", "modeling_tinydiff.py"):
        shutil.copy(REMOTE_CODE / name, directory / name)
    return model


@pytest.mark.parametrize(
    "class_name,config_name,family,shift",
    [("DreamModel", "DreamConfig", "dream", True), ("LLaDAModelLM", "LLaDAConfig", "llada", False)],
)
def test_explicit_remote_code_still_loads_with_family_settings(
    tmp_path, class_name, config_name, family, shift
):
    """The default route is the stock class (tests/models/test_families.py, hub-layout checkpoints);
    ``trust_remote_code=True``, passed explicitly, still runs a checkpoint's own classes through
    AutoModel with the family read from config.model_type. Their real mask ids exceed this tiny
    vocabulary, so it is overridden (and leaving it would be the clear out-of-vocabulary error)."""
    original = _save_remote_code_model(tmp_path, class_name, config_name, seed=12)
    with pytest.raises(
        ValueError, match=f"mask_token_id={DRAFTER_FAMILIES[family].mask_token_id} is outside"
    ):
        DiffusionDrafter.from_pretrained(tmp_path, dtype=torch.float64, trust_remote_code=True)
    drafter = DiffusionDrafter.from_pretrained(
        tmp_path, mask_token_id=MASK, dtype=torch.float64, trust_remote_code=True
    )
    assert type(drafter.model).__name__ == class_name and drafter.shift_logits is shift
    assert not drafter._stock  # runs through the model's own (bidirectional) attention
    prefix = torch.tensor([[4, 5, 6]])
    with torch.no_grad():
        full = original(torch.cat([prefix, torch.full((1, 3), MASK)], dim=1)).logits
    start = 2 if shift else 3
    torch.testing.assert_close(drafter.draft_logits(prefix, 3), full[:, start : start + 3])
