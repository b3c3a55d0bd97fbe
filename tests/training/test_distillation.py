"""The LightningModule fit through the real Trainer: the streak objective, checkpoints, export, LoRA, DDP."""

import os
import random
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from specdiff_lightning import DiffusionDrafter, speculative_generate
from specdiff_lightning.data import DistillationDataModule, generate_corpus
from specdiff_lightning.training import DrafterDistillation

V = 64
VERIFIER = dict(
    vocab_size=V, hidden_size=64, num_layers=2, seed=0, initializer_range=0.1
)  # a peaked, LM-like p
DRAFTER = dict(vocab_size=V, hidden_size=64, num_layers=2, seed=1)
#: the Fig. 2 comparison's verifier: less peaked, so that acceptance past the first positions is not
#: saturated near 0.9 for every drafter (with VERIFIER's it was, and the objectives' later-position
#: difference, ~2%, was within the spread of CPU kernels and thread counts)
FIG2_VERIFIER = dict(VERIFIER, initializer_range=0.07)
QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)


def _module(**kwargs):
    args = dict(
        verifier="tiny-qwen2",
        drafter="tiny-llama",
        verifier_kwargs={"tiny": VERIFIER},
        drafter_kwargs={"tiny": DRAFTER},
        gamma=8,
    )
    args.update(kwargs)
    return DrafterDistillation(**args)


def _sample_corpus(out: Path, seed: int = 0, verifier: dict = VERIFIER) -> Path:
    """The tiny verifier's sampled continuations of 240 random prompts (``seed``: the sample;
    ``verifier``: its tiny config)."""
    rng = random.Random(0)
    prompts = [{"id": f"p{i}", "prompt_ids": [rng.randrange(0, V - 1) for _ in range(6)]} for i in range(240)]
    generate_corpus(
        _module(verifier_kwargs={"tiny": verifier}).verifier,
        prompts,
        out,
        num_continuations=4,
        max_new_tokens=24,
        batch_size=32,
        val_fraction=0.15,
        seed=seed,
        progress=False,
    )
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return _sample_corpus(tmp_path_factory.mktemp("corpus"))


def _data(corpus, **kwargs):
    args = dict(gamma=8, windows_per_record=4, batch_size=32, shuffle_buffer=500)
    args.update(kwargs)
    return DistillationDataModule(str(corpus / "train-*.jsonl"), str(corpus / "val-*.jsonl"), **args)


def _validate(model, data, root):
    result = L.Trainer(default_root_dir=root, **QUIET).validate(model, data, verbose=False)[0]
    return result["val/streak"], [result[f"val/gamma_{j}"] for j in range(1, 9)]


def _fig2_run(corpus: Path, root: Path) -> tuple[float, tuple, tuple]:
    """The base drafter (masked CE on the corpus), then 3 epochs of each objective from it:
    ``(base streak, (streak, gamma_j) after streak-distillation, the same after AR-distillation)``."""
    torch.manual_seed(0)
    fig2 = {"verifier_kwargs": {"tiny": FIG2_VERIFIER}}
    base = _module(loss="masked_ce", lr=3e-3, **fig2)
    L.Trainer(max_epochs=4, default_root_dir=root, **QUIET).fit(base, _data(corpus))
    base_streak, _ = _validate(base, _data(corpus), root)
    results = {}
    for loss in ("streak", "ar_distillation"):
        torch.manual_seed(0)
        model = _module(loss=loss, lr=1e-3, **fig2)
        model.drafter_model.load_state_dict(base.drafter_model.state_dict())
        L.Trainer(max_epochs=3, default_root_dir=root, **QUIET).fit(model, _data(corpus))
        results[loss] = _validate(model, _data(corpus), root)
    return base_streak, results["streak"], results["ar_distillation"]


@pytest.mark.slow
def test_streak_distillation_raises_streak_and_beats_ar_distillation(tmp_path):
    """The base drafter is pretrained with masked cross-entropy on the corpus; fine-tuning it with
    the streak objective raises the validation streak, and more so on later positions than the
    AR-distillation baseline trained the same way (the Fig. 2 shape), on each of five samples of the
    corpus.

    Measured with :data:`FIG2_VERIFIER` (one thread; a Xeon's native AMX/AVX512 kernels and the same
    with AVX2-only kernels gave the same to ~0.02): streak-distillation's expected accepted mass past
    the first position was 1.06-1.56x AR-distillation's per sample, 1.23x pooled. With the more
    peaked :data:`VERIFIER` it had been 0.96-1.11x per sample and 1.02-1.03x pooled, so a 3% margin
    passed or failed with the CPU's kernels (it failed with AVX2 kernels: 1.022x)."""
    runs = [
        _fig2_run(_sample_corpus(tmp_path / f"corpus{seed}", seed, FIG2_VERIFIER), tmp_path)
        for seed in range(5)
    ]
    later, ar_later, gamma2, ar_gamma2 = [], [], [], []
    for base_streak, (streak, curve), (ar_streak, ar_curve) in runs:
        print(
            f"base {base_streak:.3f}; streak {streak:.3f} {curve}; AR-distillation {ar_streak:.3f} {ar_curve}"
        )
        assert streak > 1.3 * base_streak  # measured: 0.56-0.66 -> 1.05-1.33
        # Expected accepted mass past the first position (P_j, j >= 2)
        later.append(streak - curve[0])
        ar_later.append(ar_streak - ar_curve[0])
        assert later[-1] > ar_later[-1]  # measured: 1.06-1.56x
        gamma2.append(curve[1])
        ar_gamma2.append(ar_curve[1])
    assert sum(later) > 1.1 * sum(ar_later)  # measured: 1.23x
    assert sum(gamma2) > sum(ar_gamma2)  # gamma_2, where AR-distillation has no direct signal


def test_checkpoint_holds_the_drafter_only_resumes_and_exports(corpus, tmp_path):
    model = _module(loss="streak", lr=1e-3)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=3)
    L.Trainer(max_steps=3, callbacks=[ckpt], default_root_dir=tmp_path, **QUIET).fit(model, _data(corpus))
    state = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
    keys = state["state_dict"].keys()
    assert keys and all(k.startswith("drafter_model.") for k in keys)  # no verifier weights
    assert state["DistillationDataModule"] == {"epoch": 0, "consumed": 3 * 32}  # trained on, not prefetched

    resumed = _module(loss="streak", lr=1e-3)
    trainer = L.Trainer(max_steps=6, default_root_dir=tmp_path, **QUIET)
    trainer.fit(resumed, _data(corpus), ckpt_path=tmp_path / "ckpt" / "last.ckpt")
    assert trainer.global_step == 6

    resumed.export(tmp_path / "exported")
    drafter = DiffusionDrafter.from_pretrained(tmp_path / "exported")
    prefix = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(drafter.draft_logits(prefix, 8), resumed.drafter.draft_logits(prefix, 8))
    verifier = resumed.verifier
    ref = verifier.generate(
        prefix, attention_mask=torch.ones_like(prefix), do_sample=False, max_new_tokens=12, pad_token_id=0
    )
    out = speculative_generate(
        verifier, drafter, prefix, max_new_tokens=12, gamma=8, num_drafts=4, temperature=0
    )
    assert torch.equal(out.sequences, ref)


def test_lora_online_teacher_and_exact_variant(corpus, tmp_path):
    lora = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    model = _module(loss="expected_streak", teacher="online", lora=lora, lr=1e-3)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    L.Trainer(max_steps=2, limit_val_batches=1, callbacks=[ckpt], default_root_dir=tmp_path, **QUIET).fit(
        model, _data(corpus)
    )
    keys = torch.load(tmp_path / "last.ckpt", weights_only=False)["state_dict"].keys()
    assert keys and all("lora_" in k for k in keys)  # only the adapter is checkpointed
    model.export(tmp_path / "merged")
    merged = DiffusionDrafter.from_pretrained(tmp_path / "merged")
    assert type(merged.model).__name__ == "LlamaForCausalLM"  # a plain HF model, adapters merged
    prefix = torch.tensor([[5, 6, 7]])
    torch.testing.assert_close(
        merged.draft_logits(prefix, 8), model.drafter.draft_logits(prefix, 8), atol=1e-5, rtol=1e-5
    )


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="unknown loss"):
        _module(loss="kl")
    with pytest.raises(ValueError, match="unknown teacher"):
        _module(teacher="cache")
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        _module(drafter_kwargs={"tiny": dict(DRAFTER, vocab_size=V + 1)})


class _RecordWindows(Callback):
    """Logs "step window_id" per rank; optionally dies at a given step (a simulated kill)."""

    def __init__(self, out, die_at_step=None):
        self.out, self.die_at_step = out, die_at_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.die_at_step:
            raise RuntimeError("simulated kill")
        with open(os.path.join(self.out, f"rank{trainer.global_rank}.txt"), "a") as f:
            f.writelines(f"{trainer.global_step} {w}\n" for w in batch["window_ids"])


def _ddp_fit(corpus, out, die_at_step=None, ckpt_dir=None, ckpt_path=None):
    os.makedirs(out, exist_ok=True)
    callbacks = [_RecordWindows(str(out), die_at_step)]
    if ckpt_dir is not None:
        callbacks.append(ModelCheckpoint(dirpath=ckpt_dir, save_last=True, every_n_train_steps=2))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_epochs=1,
        limit_val_batches=0,
        callbacks=callbacks,
        default_root_dir=out,
        **QUIET,
    )
    trainer.fit(_module(loss="streak", lr=1e-3), _data(corpus, batch_size=64), ckpt_path=ckpt_path)


def _read(out, rank):
    return [line.split() for line in Path(out, f"rank{rank}.txt").read_text().splitlines()]


@pytest.mark.slow
def test_ddp_spawn_disjoint_ranks_and_kill_resume(corpus, tmp_path):
    """2 CPU processes (gloo): ranks read disjoint, equal parts; a run killed mid-epoch and resumed
    from its checkpoint trains on exactly the windows of an uninterrupted run."""
    _ddp_fit(corpus, tmp_path / "full")
    full = [[w for _, w in _read(tmp_path / "full", r)] for r in range(2)]
    assert len(full[0]) == len(full[1]) > 0
    assert not set(full[0]) & set(full[1])  # no window seen twice in the epoch
    assert all(len(set(ws)) == len(ws) for ws in full)

    with pytest.raises(Exception, match="simulated kill"):
        _ddp_fit(corpus, tmp_path / "killed", die_at_step=3, ckpt_dir=tmp_path / "ckpt")
    _ddp_fit(corpus, tmp_path / "resumed", ckpt_path=tmp_path / "ckpt" / "last.ckpt")
    for r in range(2):
        before = [w for step, w in _read(tmp_path / "killed", r) if int(step) < 2]  # up to the checkpoint
        after = [w for _, w in _read(tmp_path / "resumed", r)]
        assert before + after == full[r]
