"""Corpus copies (decoding/datastore.py): the suffix index against a brute-force count, the corpus
files it reads, its refusals, and exactness when its continuations join auto-sized trees."""

import json
import random

import pytest
import torch

from helpers import make_pair, reference_greedy
from specdiff_lightning import TokenDatastore, speculative_generate
from specdiff_lightning.decoding import AdaptiveDrafter
from specdiff_lightning.decoding.autotree import AutoTreeDrafter
from specdiff_lightning.decoding.costmodel import CostModel
from specdiff_lightning.decoding.datastore import load_datastore


def _cheap() -> CostModel:
    nodes = [1, 2, 4, 8, 16, 32, 64]
    row = [10.0 + 0.01 * (n - 1) for n in nodes]
    return CostModel(nodes, [16, 512], [row, row], {})


def _brute_force(sequences, context, depth, max_ngram):
    """The longest suffix of ``context`` occurring in ``sequences`` and every continuation's count."""
    for n in range(min(max_ngram, len(context)), 0, -1):
        tail = context[len(context) - n :]
        runs = [
            tuple(seq[i + n : i + n + depth])
            for seq in sequences
            for i in range(len(seq) - n + 1)
            if seq[i : i + n] == tail
        ]
        if runs:
            counts = {}
            for run in runs:
                for d in range(1, len(run) + 1):
                    counts[run[:d]] = counts.get(run[:d], 0) + 1
            return n, len(runs), counts
    return None


@pytest.mark.parametrize("seed,big,window", [(0, 49151, 8), (1, 49151, 5), (2, 151_935, 8), (3, 151_935, 7)])
def test_lookup_matches_a_brute_force_count(seed, big, window):
    """16-bit packing (SmolLM2's 49,152 ids) and 21-bit packing (Qwen's 151,936), whole keys or not."""
    rng = random.Random(seed)
    sequences = [[rng.randrange(6) for _ in range(rng.randrange(1, 40))] for _ in range(30)]
    sequences.append([40000, big, 3])  # ids above 2^15 (and 2^16) pack like any other
    store = TokenDatastore(sequences, window=window)
    assert len(store) == sum(map(len, sequences)) and store.vocab_limit == big + 1
    for _ in range(40):
        context = [rng.randrange(7) for _ in range(rng.randrange(1, 12))]
        want = _brute_force(sequences, context, depth=5, max_ngram=window)
        got = store.lookup(context, depth=5, sample=10_000)
        if want is None or not want[2]:
            assert got is None or not got.counts
            continue
        # a match at a sequence's very end has no continuation: the brute force counts it, the
        # store too (its total), but it adds no path
        assert (got.ngram, got.total, got.counts) == want
    got = store.lookup([40000, big], depth=3)
    assert got.ngram == 2 and got.counts == {(3,): 1}
    # an id the store cannot hold ends the suffixes that can match; the ids after it still do
    got = store.lookup([1, 2, 2**21 + 5, 40000, big], depth=3)
    assert got.ngram == 2 and got.counts == {(3,): 1}
    # continuations longer than the window stop at the last sequence's end, never past the array
    assert store.lookup([40000, big], depth=30).counts == {(3,): 1}


def test_lookup_samples_occurrences_evenly_and_never_crosses_sequences():
    sequences = [[1, 2, 3]] * 50 + [[1, 2, 4]] * 50
    store = TokenDatastore(sequences)
    match = store.lookup([9, 1, 2], depth=4, sample=10)
    assert match.ngram == 2 and match.total == 10
    assert match.counts == {(3,): 5, (4,): 5}  # spread over both halves, and stopped at each end
    assert match.parent_count((3,)) == 10
    assert store.lookup([7, 8], depth=2) is None


def test_corpus_files_and_their_errors(tmp_path):
    from datasets import Dataset

    records = [
        {"prompt_ids": [1], "continuation_ids": [5, 6, 7]},
        {"prompt_ids": [2], "continuation_ids": [5, 6, 8]},
    ]
    parquet = tmp_path / "c.parquet"
    Dataset.from_list(records).to_parquet(str(parquet))
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    for path in (parquet, jsonl):
        store = load_datastore(path)
        assert store.lookup([5, 6], depth=1).counts == {(7,): 1, (8,): 1}
    assert load_datastore(parquet) is load_datastore(str(parquet))  # built once per process
    with pytest.raises(FileNotFoundError, match="decoding.datastore"):
        load_datastore(tmp_path / "missing.parquet")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(records[0]) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl, line 2"):
        load_datastore(bad)
    with pytest.raises(ValueError, match="continuation_ids"):
        TokenDatastore.from_corpus(parquet, field="answers")
    with pytest.raises(ValueError, match="window must be >= 1"):
        TokenDatastore([[1]], window=0)
    with pytest.raises(ValueError, match=">= 0"):
        TokenDatastore([[1, -2]])
    with pytest.raises(ValueError, match="21-bit"):
        TokenDatastore([[2**21]])


def test_several_corpus_files_make_one_index(tmp_path):
    """A list of corpus files (the shipped pair's two corpora) is one store: lookups count the
    occurrences in every file, as a store of all their sequences would; a missing or malformed file
    is named; the store is built once per process for the same files."""
    from datasets import Dataset

    first = [{"continuation_ids": [5, 6, 7]}, {"continuation_ids": [9, 5, 6, 7]}]
    second = [{"continuation_ids": [5, 6, 8]}, {"continuation_ids": []}]
    a, b = tmp_path / "a.parquet", tmp_path / "b.jsonl"
    Dataset.from_list(first).to_parquet(str(a))
    b.write_text("".join(json.dumps(r) + "\n" for r in second))
    both = load_datastore([a, b])
    joined = TokenDatastore([r["continuation_ids"] for r in first + second])
    assert both.lookup([5, 6], depth=1).counts == joined.lookup([5, 6], depth=1).counts == {(7,): 2, (8,): 1}
    assert len(both) == len(joined) == 10 and str(a) in both.source and str(b) in both.source
    assert load_datastore([str(a), str(b)]) is both and load_datastore(a) is not both
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        load_datastore([a, tmp_path / "missing.parquet"])
    with pytest.raises(ValueError, match="no corpus file given"):
        TokenDatastore.from_corpus([])


def test_a_datastore_is_refused_where_it_cannot_join():
    verifier, drafter = make_pair("qwen2", "llama", seed=1)
    prompt = torch.tensor([[1, 2]])
    kwargs = dict(max_new_tokens=3, gamma=2, temperature=0)
    with pytest.raises(ValueError, match="tree='auto'"):
        speculative_generate(
            verifier, drafter, prompt, tree=None, datastore=TokenDatastore([[1, 2]]), **kwargs
        )
    with pytest.raises(ValueError, match="already shaped"):
        speculative_generate(
            verifier, AdaptiveDrafter(drafter), prompt, datastore=TokenDatastore([[1, 2]]), **kwargs
        )
    with pytest.raises(ValueError, match="another datastore"):
        speculative_generate(
            verifier, AutoTreeDrafter(drafter, _cheap()), prompt, datastore=TokenDatastore([[1, 2]]), **kwargs
        )
    vocab = verifier.config.vocab_size
    with pytest.raises(ValueError, match="another tokenizer"):
        speculative_generate(verifier, drafter, prompt, datastore=TokenDatastore([[vocab + 3]]), **kwargs)


def test_corpus_continuations_join_auto_trees_and_stay_greedy_exact():
    """The store holds the verifier's own greedy continuation, so its nodes are accepted; the
    output stays the verifier's, and the calibration learns the store's cells."""
    verifier, drafter = make_pair("qwen2", "llama", seed=2)
    prompt = torch.tensor([[4, 8, 15, 16, 23, 4, 8]])
    ref = reference_greedy(verifier, prompt, 40)
    answer = ref[0, prompt.shape[1] :].tolist()
    rng = random.Random(0)
    noise = [[rng.randrange(verifier.config.vocab_size) for _ in range(30)] for _ in range(20)]
    store = TokenDatastore([answer[:25], *noise])
    auto = AutoTreeDrafter(drafter, _cheap(), datastore=store, num_lookups=0)
    out = speculative_generate(
        verifier, auto, prompt, max_new_tokens=40, gamma=6, temperature=0, eos_token_id=[]
    )
    assert torch.equal(out.sequences, ref)
    store_cells = {cell: counts for cell, counts in auto.calibration.cells.items() if cell[0] == "store"}
    assert sum(accepted for accepted, _ in store_cells.values()) > 5
    # the same through speculative_generate's own argument (a plain drafter; a path would load too)
    again = speculative_generate(
        verifier, drafter, prompt, max_new_tokens=40, gamma=6, temperature=0, eos_token_id=[], datastore=store
    )
    assert torch.equal(again.sequences, ref)


def test_decoding_config_checks_its_datastore_at_config_time(tmp_path):
    from specdiff_lightning.decoding.config import DecodingConfig

    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"continuation_ids": [1, 2, 3]}) + "\n")
    assert DecodingConfig(gamma=4, datastore=str(corpus)).generate_kwargs()["datastore"] == str(corpus)
    with pytest.raises(ValueError, match="tree: auto"):
        DecodingConfig(gamma=4, tree=None, datastore=str(corpus))
    with pytest.raises(FileNotFoundError, match="decoding.datastore"):
        DecodingConfig(gamma=4, datastore=str(tmp_path / "missing.parquet"))
