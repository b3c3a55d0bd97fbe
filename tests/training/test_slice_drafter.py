"""Training drafters sliced from the verifier: block-diffusion adaptation, streak-distillation, AR."""

import lightning as L
import pytest
import torch

from helpers import fit_briefly, reference_greedy
from helpers import random_sequence_corpus as _corpus
from specdiff_lightning import DiffusionDrafter, speculative_generate
from specdiff_lightning.constants import IGNORE_INDEX
from specdiff_lightning.data.sequences import SequenceDataModule
from specdiff_lightning.models import AutoregressiveDrafter
from specdiff_lightning.models.loading import load_verifier
from specdiff_lightning.models.slicing import load_slice
from specdiff_lightning.training.slice_drafter import SliceDrafterTraining, block_targets, sample_block_starts

TINY = "tiny-llama"


def test_block_starts_and_targets_stay_inside_the_continuation():
    cont = torch.tensor([0, 5, 3])
    lengths = torch.tensor([4, 9, 20])
    starts = sample_block_starts(cont, lengths, 50, torch.Generator().manual_seed(0))
    assert (starts >= cont.clamp_min(1)[:, None]).all() and (starts < lengths[:, None]).all()
    ids = torch.arange(20)[None].repeat(3, 1)
    targets = block_targets(ids, lengths, torch.tensor([[2], [7], [18]]), 4)
    assert targets[0, 0].tolist() == [2, 3, IGNORE_INDEX, IGNORE_INDEX]
    assert targets[1, 0].tolist() == [7, 8, IGNORE_INDEX, IGNORE_INDEX]
    assert targets[2, 0].tolist() == [18, 19, IGNORE_INDEX, IGNORE_INDEX]


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a GPU (the batch on it, the generator on the CPU)"
)
def test_block_starts_of_a_gpu_batch_come_from_the_modules_cpu_generator():
    # A training module's generator lives on the CPU while Lightning moves its batches to the GPU;
    # drawing on the batch's device with it fails, and a seed must give the same anchors anywhere.
    cont, lengths = torch.tensor([0, 5, 3]), torch.tensor([4, 9, 20])
    on_cpu = sample_block_starts(cont, lengths, 50, torch.Generator().manual_seed(0))
    on_gpu = sample_block_starts(cont.cuda(), lengths.cuda(), 50, torch.Generator().manual_seed(0))
    assert on_gpu.device.type == "cuda" and torch.equal(on_gpu.cpu(), on_cpu)


@pytest.mark.parametrize("objective", ["masked_ce", "streak", "ar"])
def test_fit_export_reload_and_decode_losslessly(tmp_path, objective):
    corpus = _corpus(tmp_path / "corpus.jsonl")
    export = tmp_path / "export"
    module = SliceDrafterTraining(
        verifier=TINY,
        num_layers=1,
        objective=objective,
        gamma=4,
        blocks=4,
        mask_token_id=63,
        export_dir=str(export),
    )
    before = {k: v.clone() for k, v in module.drafter_model.model.layers.state_dict().items()}
    fit_briefly(module, corpus, tmp_path, max_steps=3)
    after = module.drafter_model.model.layers.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained
    assert "embed_tokens" not in " ".join(module.state_dict())  # the verifier's tensors are not checkpointed
    verifier = load_verifier(TINY, dtype=torch.float32)
    model, info = load_slice(verifier, export)
    assert info["kind"] == ("autoregressive" if objective == "ar" else "diffusion")
    model = model.float()
    drafter = (
        AutoregressiveDrafter(model)
        if objective == "ar"
        else DiffusionDrafter(model, info["mask_token_id"], info["shift_logits"], attention=info["attention"])
    )
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    out = speculative_generate(
        verifier, drafter, ids, max_new_tokens=12, gamma=4, temperature=0, eos_token_id=[]
    )
    assert torch.equal(out.sequences, reference_greedy(verifier, ids, 12))


def test_empty_corpus_fails_at_setup(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="no valid records|no corpus|empty"):
        SequenceDataModule(str(tmp_path / "empty.jsonl")).setup("fit")


@pytest.mark.parametrize("objective", ["streak", "ar"])
def test_export_is_shareable_and_loads_through_load_drafter(tmp_path, objective):
    """What export writes (slice.json + slice.safetensors, 0755 / 0644 at umask 022) loads through the
    one loading path into the class of its kind, around the verifier, and decodes losslessly."""
    import os
    import stat

    from specdiff_lightning.models.loading import load_drafter

    module = SliceDrafterTraining(verifier=TINY, num_layers=1, objective=objective, gamma=4, mask_token_id=63)
    export = tmp_path / "export"
    umask = os.umask(0o022)
    try:
        module.export(str(export))
    finally:
        os.umask(umask)
    assert sorted(p.name for p in export.iterdir()) == ["slice.json", "slice.safetensors"]
    assert stat.S_IMODE(export.stat().st_mode) == 0o755
    assert {stat.S_IMODE(p.stat().st_mode) for p in export.iterdir()} == {0o644}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("export.")]  # no temporary left
    verifier = load_verifier(TINY, dtype=torch.float32)
    drafter = load_drafter(str(export), verifier=verifier)
    cls = AutoregressiveDrafter if objective == "ar" else DiffusionDrafter
    assert type(drafter) is cls and type(cls.from_pretrained(export, verifier=verifier)) is cls
    if objective != "ar":
        assert (drafter.mask_token_id, drafter.attention) == (63, "block_causal")
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    out = speculative_generate(
        verifier, drafter, ids, max_new_tokens=10, gamma=4, temperature=0, eos_token_id=[]
    )
    assert torch.equal(out.sequences, reference_greedy(verifier, ids, 10))


class _StopAfter(L.Callback):
    """Ends a fit after ``steps`` steps, as max_time would."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_train_batch_end(self, trainer, *args) -> None:
        trainer.should_stop = trainer.global_step >= self.steps


def test_a_run_stopped_before_its_cosine_has_decayed_says_so(tmp_path, recwarn):
    """The learning rate decays over max_steps: a run that stops early (max_time) exports weights
    taken at a high rate, which is warned about naming the step, the rate and the fix; a run that
    reaches max_steps is not."""
    corpus = _corpus(tmp_path / "corpus.jsonl")

    def module():
        return SliceDrafterTraining(
            verifier=TINY, num_layers=1, gamma=4, blocks=4, mask_token_id=63, warmup_steps=1
        )

    with pytest.warns(
        UserWarning, match=r"stopped at step 2 of max_steps 100 .*not annealed.*--trainer.max_steps"
    ):
        fit_briefly(module(), corpus, tmp_path, max_steps=100, callbacks=[_StopAfter(2)], limit_val_batches=0)
    recwarn.clear()
    fit_briefly(module(), corpus, tmp_path, max_steps=3, limit_val_batches=0)
    assert not [w for w in recwarn if "not annealed" in str(w.message)]


def test_a_run_logs_the_seconds_a_step_takes(tmp_path):
    """train/batch_s and train/elapsed_s are what size max_steps to a time budget (the GPU session's
    probe reads the slope of elapsed_s): positive, and elapsed_s grows by the batches' times."""
    module = SliceDrafterTraining(verifier=TINY, num_layers=1, gamma=4, blocks=4, mask_token_id=63)
    fit_briefly(module, _corpus(tmp_path / "corpus.jsonl"), tmp_path, max_steps=3, limit_val_batches=0)
    metrics = module.trainer.callback_metrics
    assert float(metrics["train/batch_s"]) > 0
    assert float(metrics["train/elapsed_s"]) >= float(metrics["train/batch_s"])
