"""DrafterDistillation with a drafter built around its verifier (a slice ``export`` writes, a DFlash
drafter; both ship in assets/smollm2): built around the module's own verifier, decoded by predict;
fit refuses the DFlash one, which trains with its own module."""

import lightning as L
import pytest
import torch

from helpers import reference_greedy, write_prompts
from specdiff_lightning.data import PromptDataModule
from specdiff_lightning.decoding.config import DecodingConfig
from specdiff_lightning.models import DFlashDrafter, DiffusionDrafter
from specdiff_lightning.training import DrafterDistillation
from specdiff_lightning.training.dflash import DFlashDrafterTraining
from specdiff_lightning.training.slice_drafter import SliceDrafterTraining

TINY = "tiny-llama"  # default tiny sizes: the slice-training modules' verifier is the same model


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    out = tmp_path_factory.mktemp("exports")
    SliceDrafterTraining(verifier=TINY, num_layers=1, gamma=4, mask_token_id=63).export(str(out / "sliced"))
    DFlashDrafterTraining(
        verifier=TINY, num_layers=1, target_layer_ids=(0, 1), block_size=5, mask_token_id=63
    ).export(str(out / "dflash"))
    return out


def _module(drafter, **drafter_kwargs):
    decoding = DecodingConfig(max_new_tokens=8, num_drafts=1, draft_temperature=0.0, temperature=0.0)
    return DrafterDistillation(
        verifier=TINY,
        verifier_kwargs={"dtype": "float32"},
        drafter=str(drafter),
        drafter_kwargs=drafter_kwargs,
        gamma=4,
        decoding=decoding,
        baseline=False,
    )


@pytest.mark.parametrize("kind", ["sliced", "dflash"])
def test_predict_decodes_with_a_drafter_built_around_the_modules_verifier(exports, tmp_path, kind):
    module = _module(exports / kind, **({"head_vocab": 32} if kind == "dflash" else {}))
    assert type(module.drafter) is (DFlashDrafter if kind == "dflash" else DiffusionDrafter)
    embeddings = module.verifier.get_input_embeddings()
    if kind == "dflash":
        assert module.drafter.embeddings is embeddings and module.drafter.head_vocab == 32
    else:
        assert module.drafter.model.model.embed_tokens is embeddings
    # Registered with the module: moved and cast with it.
    module.to(torch.float64)
    assert {p.dtype for p in module.drafter_model.parameters()} == {torch.float64}
    prompts = write_prompts(tmp_path, n=2)
    trainer = L.Trainer(
        accelerator="cpu",
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    rows = [
        r for batch in trainer.predict(module, datamodule=PromptDataModule(path=str(prompts))) for r in batch
    ]
    eos = module.verifier.generation_config.eos_token_id
    data = PromptDataModule(path=str(prompts))
    data.setup("predict")
    for row, prompt in zip(rows, data.rows, strict=True):
        ids = torch.tensor([prompt["prompt_ids"]])
        expected = reference_greedy(module.verifier, ids, 8, eos_token_id=eos)[0, ids.shape[1] :].tolist()
        assert row["completion"] == expected


def test_fit_and_export_refuse_a_dflash_drafter_clearly(exports, tmp_path):
    module = _module(exports / "dflash")
    with pytest.raises(
        TypeError,
        match=r"fit and validate of DrafterDistillation need a diffusion drafter.*DFlashDrafter.*DFlashDrafterTraining",
    ):
        module(torch.tensor([[1, 2, 3]]))
    with pytest.raises(TypeError, match="export of DrafterDistillation need a diffusion drafter"):
        module.export(tmp_path / "unused")
    assert not (tmp_path / "unused").exists()


def test_export_of_a_sliced_drafter_stands_alone(exports, tmp_path):
    """DrafterDistillation's export writes the whole drafter (a plain HF directory): it reloads
    without the verifier, with the slice's mask id and block-causal attention."""
    module = _module(exports / "sliced")
    module.export(tmp_path / "hf")
    again = DiffusionDrafter.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    assert (again.mask_token_id, again.shift_logits, again.attention) == (63, True, "block_causal")
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(again.draft_logits(ids, 4), module.drafter.draft_logits(ids, 4))
