"""Corpus records, windows, the streaming DataModule (epochs, ranks, resume) and generate-corpus."""

import json
import logging
import random
from types import SimpleNamespace

import pytest

from specdiff_lightning.data import (
    CorpusError,
    DistillationDataModule,
    collate_windows,
    cut_windows,
    generate_corpus,
    iter_records,
    load_prompts,
)
from specdiff_lightning.models import tiny_model
from specdiff_lightning.training import IGNORE_INDEX


def _write_jsonl(path, records, extra_lines=()):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        for line in extra_lines:
            f.write(line + "\n")
    return path


def _records(n, seed=0):
    rng = random.Random(seed)
    return [
        {
            "id": f"r{i}",
            "prompt_ids": [1, 2, rng.randrange(3, 9)],
            "continuation_ids": [rng.randrange(3, 40) for _ in range(rng.randrange(4, 12))],
        }
        for i in range(n)
    ]


def test_bad_lines_are_reported_with_file_and_line(tmp_path, caplog):
    path = _write_jsonl(
        tmp_path / "c.jsonl",
        _records(2),
        [
            '{"prompt_ids": [1, 2], "continuation_ids": [',
            "",
            '{"prompt": "x"}',
            '{"continuation_ids": [1, -3]}',
            '{"continuation_ids": []}',
        ],
    )
    with caplog.at_level(logging.WARNING):
        assert len(list(iter_records([str(path)], "skip"))) == 2
    for lineno, what in [
        (3, "malformed JSON"),
        (4, "empty line"),
        (5, "a record needs 'continuation_ids'"),
        (6, "'prompt_ids' and 'continuation_ids' must be lists of non-negative ints"),
        (7, "empty continuation"),
    ]:
        assert f"c.jsonl:{lineno}: {what}" in caplog.text
    with pytest.raises(CorpusError, match=r"c.jsonl:3: malformed JSON"):
        list(iter_records([str(path)], "raise"))


def test_empty_or_missing_corpus_fails_before_training(tmp_path):
    empty = _write_jsonl(tmp_path / "empty.jsonl", [], ["", "{broken"])
    with pytest.raises(CorpusError, match="no usable records"):
        DistillationDataModule(str(empty)).setup("fit")
    with pytest.raises(CorpusError, match="does not exist"):
        DistillationDataModule(str(tmp_path / "nope.jsonl")).setup("fit")
    with pytest.raises(CorpusError, match="no corpus files match"):
        DistillationDataModule(str(tmp_path / "*.parquet")).setup("fit")
    with pytest.raises(CorpusError, match="no training corpus"):
        DistillationDataModule().setup("fit")


def test_text_records_need_a_tokenizer(tmp_path):
    path = _write_jsonl(tmp_path / "t.jsonl", [{"prompt": "hi", "continuation": "there"}])
    with pytest.raises(CorpusError, match="need a tokenizer"):
        DistillationDataModule(str(path)).setup("fit")


def test_cut_windows_pads_short_windows_and_caps_prefix():
    rng = random.Random(0)
    windows = cut_windows([1, 2, 3], [10, 11, 12], gamma=4, num_windows=5, rng=rng, max_prefix_tokens=4)
    assert len(windows) == 5  # more windows than offsets: drawn with replacement
    for w in windows:
        assert 1 <= len(w["prefix"]) <= 4 and len(w["targets"]) == 4
        o = len([t for t in w["prefix"] if t >= 10])
        assert w["targets"] == [10, 11, 12][o:] + [IGNORE_INDEX] * (4 - (3 - o))
    assert cut_windows([], [5], 4, 2, rng) == []  # no non-empty prefix possible
    batch = collate_windows(
        [{"prefix": [1, 2], "targets": [3]}, {"prefix": [4], "targets": [5]}], pad_token_id=0
    )
    assert batch["prefix"].tolist() == [[1, 2], [0, 4]] and batch["prefix_mask"].tolist() == [[1, 1], [0, 1]]


def _ids_of_epoch(loader, key="ids"):
    return [i for batch in loader for i in batch[key]]


def test_epochs_reshuffle_and_cover_every_record(tmp_path):
    _write_jsonl(tmp_path / "a.jsonl", _records(30))
    _write_jsonl(tmp_path / "b.jsonl", _records(10, seed=1)[:10])
    dm = DistillationDataModule(str(tmp_path), gamma=4, windows_per_record=2, batch_size=4, shuffle_buffer=16)
    dm.setup("fit")
    loader = dm.train_dataloader()
    first, second = _ids_of_epoch(loader), _ids_of_epoch(loader)
    assert len(first) == 2 * 40  # 40 records (ids repeat across the two files), 2 windows each
    assert sorted(first) == sorted(second)
    assert first != second  # set_epoch reshuffled


def test_ranks_read_disjoint_equal_parts(tmp_path):
    _write_jsonl(tmp_path / "a.jsonl", [dict(r, id=f"a{i}") for i, r in enumerate(_records(21))])
    seen = []
    for rank in range(2):
        dm = DistillationDataModule(
            str(tmp_path / "a.jsonl"), gamma=4, windows_per_record=3, batch_size=4, shuffle_buffer=8
        )
        dm.trainer = SimpleNamespace(global_rank=rank, world_size=2)
        dm.setup("fit")
        seen.append(_ids_of_epoch(dm.train_dataloader(), "window_ids"))
    assert len(seen[0]) == len(seen[1]) == 63 // 2  # 21 records x 3 windows: equal counts per rank
    assert not set(seen[0]) & set(seen[1])  # no window read by both ranks
    assert (
        len(set(seen[0]) | set(seen[1])) == 62
    )  # and only the one window that cannot be split evenly is left


def test_resume_mid_epoch_continues_the_stream_exactly(tmp_path):
    _write_jsonl(tmp_path / "a.jsonl", _records(40))
    kwargs = dict(gamma=4, windows_per_record=2, batch_size=4, shuffle_buffer=8)
    dm = DistillationDataModule(str(tmp_path / "a.jsonl"), **kwargs)
    dm.setup("fit")
    full = [b["window_ids"] for b in dm.train_dataloader()]
    dm = DistillationDataModule(str(tmp_path / "a.jsonl"), **kwargs)
    dm.setup("fit")
    iterator = iter(dm.train_dataloader())
    head = [next(iterator)["window_ids"] for _ in range(7)]
    state = dm.state_dict()
    resumed_dm = DistillationDataModule(str(tmp_path / "a.jsonl"), **kwargs)
    resumed_dm.load_state_dict(state)
    resumed_dm.setup("fit")
    tail = [b["window_ids"] for b in resumed_dm.train_dataloader()]
    assert head == full[:7]
    flat_full = [i for b in full for i in b]
    flat_resumed = [i for b in head + tail for i in b]
    assert flat_resumed == flat_full  # nothing repeated, nothing skipped


def test_generate_corpus_is_resumable_and_streams(tmp_path):
    verifier = tiny_model("qwen2", vocab_size=32, seed=0)
    prompts = [{"id": f"p{i}", "prompt_ids": [1 + i % 5, 2, 3]} for i in range(10)]
    kwargs = dict(
        num_continuations=2,
        max_new_tokens=6,
        batch_size=4,
        prompts_per_shard=4,
        val_fraction=0.3,
        progress=False,
    )
    generate_corpus(verifier, prompts[:6], tmp_path / "c", **kwargs)  # an "interrupted" run: 6 prompts
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert len(manifest["done"]) == 6
    generate_corpus(verifier, prompts, tmp_path / "c", **kwargs)  # resumes with the rest
    records = list(iter_records(sorted(str(p) for p in (tmp_path / "c").glob("*.jsonl"))))
    assert len(records) == 20 and len({r["id"] for r in records}) == 20
    assert all(len(r["continuation_ids"]) == 6 and r["prompt_ids"][1:] == [2, 3] for r in records)
    assert list((tmp_path / "c").glob("val-*")) and list((tmp_path / "c").glob("train-*"))
    with pytest.raises(CorpusError, match="other settings"):
        generate_corpus(verifier, prompts, tmp_path / "c", **dict(kwargs, num_continuations=3))
    dm = DistillationDataModule(str(tmp_path / "c" / "train-*.jsonl"), gamma=4, batch_size=4)
    dm.setup("fit")
    assert next(iter(dm.train_dataloader()))["targets"].shape == (4, 4)


def test_generate_corpus_parquet(tmp_path):
    verifier = tiny_model("llama", vocab_size=32, seed=0)
    generate_corpus(
        verifier,
        [{"id": "a", "prompt_ids": [1, 2]}],
        tmp_path,
        num_continuations=3,
        max_new_tokens=4,
        fmt="parquet",
        progress=False,
    )
    records = list(iter_records([str(tmp_path / "train-00000.parquet")]))
    assert len(records) == 3 and all(len(r["continuation_ids"]) == 4 for r in records)


def test_streamed_parquet_and_text_keep_row_and_line_numbers(tmp_path, caplog):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"prompt_ids": [1], "continuation_ids": [2, 3]},
        {"prompt_ids": [1], "continuation_ids": []},
        {"prompt_ids": [4], "continuation_ids": [5]},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet")
    with caplog.at_level(logging.WARNING):
        records = list(iter_records([str(tmp_path / "c.parquet")]))
    assert [r["id"] for r in records] == [f"{tmp_path / 'c.parquet'}:row {i}" for i in (1, 3)]
    assert "c.parquet:row 2: empty continuation" in caplog.text
    with pytest.raises(CorpusError, match="c.parquet:row 2: empty continuation"):
        list(iter_records([str(tmp_path / "c.parquet")], on_error="raise"))
    (tmp_path / "d.txt").write_text("first doc\n\n  \nfourth doc\n")
    records = list(iter_records([str(tmp_path / "d.txt")]))
    assert [(r["id"], r["continuation"]) for r in records] == [
        (f"{tmp_path / 'd.txt'}:1", "first doc"),
        (f"{tmp_path / 'd.txt'}:4", "fourth doc"),
    ]


def test_load_prompts_errors(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt_ids": [1, 2]}\n{"nope": 1}\n')
    with pytest.raises(CorpusError, match="p.jsonl:2: a prompt record needs"):
        load_prompts(tmp_path / "p.jsonl")
    (tmp_path / "t.txt").write_text("hello\n")
    with pytest.raises(CorpusError, match="need a tokenizer"):
        load_prompts(tmp_path / "t.txt")
    (tmp_path / "ok.jsonl").write_text('{"id": "x", "prompt_ids": [4, 5]}\n\n')
    assert load_prompts(tmp_path / "ok.jsonl") == [{"id": "x", "prompt_ids": [4, 5]}]


def test_batched_greedy_corpus_rows_equal_their_own_single_row_generate(tmp_path):
    """Issue 18: B left-padded prompts per forward; at temperature 0 in float32 each row's tokens are
    those of its own single-row generate()."""
    import torch

    verifier = tiny_model("llama", vocab_size=48, seed=0, dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    prompts = [
        {"id": f"p{i}", "prompt_ids": torch.randint(1, 47, (int(n),), generator=gen).tolist()}
        for i, n in enumerate([3, 9, 5, 12, 2, 7])
    ]
    out = generate_corpus(
        verifier,
        prompts,
        tmp_path / "c",
        num_continuations=1,
        max_new_tokens=10,
        batch_size=6,
        temperature=0.0,
        eos_token_id=47,
        progress=False,
    )
    records = {r["id"]: r for r in iter_records(sorted(str(p) for p in out.glob("*.jsonl")))}
    for p in prompts:
        ids = torch.tensor([p["prompt_ids"]])
        alone = verifier.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=10,
            eos_token_id=47,
            pad_token_id=47,
        )[0, ids.shape[1] :].tolist()
        if 47 in alone:
            alone = alone[: alone.index(47) + 1]
        assert records[f"{p['id']}#0"]["continuation_ids"] == alone, p["id"]
    with pytest.raises(ValueError, match="one greedy continuation per prompt"):
        generate_corpus(
            verifier, prompts, tmp_path / "d", num_continuations=2, temperature=0.0, progress=False
        )


def test_sampled_corpus_records_do_not_depend_on_the_batch_they_were_drawn_in(tmp_path):
    """Issue 18: each continuation samples from its own generator (seeded by the run's seed, its
    prompt's id and its index), so batch size, shard layout and ranks never change a record."""
    import torch

    verifier = tiny_model("llama", vocab_size=48, seed=0, dtype=torch.float32)
    gen = torch.Generator().manual_seed(2)
    prompts = [
        {"id": f"p{i}", "prompt_ids": torch.randint(1, 47, (int(n),), generator=gen).tolist()}
        for i, n in enumerate([3, 9, 5, 12, 2, 7])
    ]
    kwargs = dict(num_continuations=2, max_new_tokens=8, temperature=1.0, eos_token_id=47, progress=False)

    def records(name, **options):
        out = generate_corpus(verifier, prompts, tmp_path / name, **kwargs, **options)
        return {
            r["id"]: r["continuation_ids"] for r in iter_records(sorted(str(p) for p in out.glob("*.jsonl")))
        }

    alone = records("b1", batch_size=1)
    assert len(alone) == 12 and len({tuple(c) for c in alone.values()}) > 6  # sampled, not repeated
    assert records("b6", batch_size=6, prompts_per_shard=4) == alone
    assert (
        records("ranks0", batch_size=3, rank=0, world_size=2)
        | records("ranks1", batch_size=3, rank=1, world_size=2)
        == alone
    )
    assert records("seed1", batch_size=1, seed=1) != alone  # the seed still matters


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_damaged_shard_is_reported_and_regenerated_without_duplicates(tmp_path, fmt):
    """Issue 18: a truncated or corrupt shard is found on resume, named with its file and row, and
    its prompts are generated again; no row is written twice."""
    verifier = tiny_model("qwen2", vocab_size=32, seed=0)
    prompts = [{"id": f"p{i}", "prompt_ids": [1 + i % 5, 2, 3]} for i in range(8)]
    kwargs = dict(
        num_continuations=2, max_new_tokens=5, batch_size=4, prompts_per_shard=4, fmt=fmt, progress=False
    )
    out = tmp_path / "c"
    generate_corpus(verifier, prompts, out, **kwargs)
    shard = out / f"train-00000.{fmt}"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])  # cut mid-row: a kill while copying, a full disk
    with pytest.warns(UserWarning, match=rf"train-00000.{fmt}.*regenerating"):
        generate_corpus(verifier, prompts, out, **kwargs)
    records = list(iter_records(sorted(str(p) for p in out.glob(f"*.{fmt}")), on_error="raise"))
    ids = [r["id"] for r in records]
    assert len(ids) == 16 and len(set(ids)) == 16  # every prompt twice (two continuations), once each
    assert not shard.exists()  # the damaged shard went; its prompts live in a new one
    generate_corpus(verifier, prompts, out, **kwargs)  # a clean rerun changes nothing
    assert sorted(r["id"] for r in iter_records(sorted(str(p) for p in out.glob(f"*.{fmt}")))) == sorted(ids)


def test_ranks_write_disjoint_shares_of_the_prompts_each_resumable(tmp_path):
    verifier = tiny_model("qwen2", vocab_size=32, seed=0)
    prompts = [{"id": f"p{i}", "prompt_ids": [1 + i % 5, 2, 3]} for i in range(12)]
    kwargs = dict(num_continuations=1, max_new_tokens=4, batch_size=4, prompts_per_shard=3, progress=False)
    out = tmp_path / "c"
    for rank in (0, 1):
        generate_corpus(verifier, prompts, out, rank=rank, world_size=2, **kwargs)
    assert sorted(p.name for p in out.glob("manifest*")) == ["manifest-r0of2.json", "manifest-r1of2.json"]
    shares = [
        {r["id"] for r in iter_records(sorted(str(p) for p in out.glob(f"train-r{rank}of2-*.jsonl")))}
        for rank in (0, 1)
    ]
    assert shares[0] and shares[1] and not shares[0] & shares[1]
    assert shares[0] | shares[1] == {f"p{i}#0" for i in range(12)}
    before = sorted(p.name for p in out.iterdir())
    generate_corpus(verifier, prompts, out, rank=1, world_size=2, **kwargs)  # a finished rank: nothing to do
    assert sorted(p.name for p in out.iterdir()) == before
    with pytest.raises(ValueError, match="rank must be in"):
        generate_corpus(verifier, prompts, out, rank=2, world_size=2, **kwargs)


@pytest.mark.slow
def test_generate_corpus_under_ddp_writes_one_share_per_rank(tmp_path):
    """Two DDP processes (CPU, spawned by Lightning's strategy as fit would be) split the prompts."""
    import torch.multiprocessing

    # the tensors go to the ranks through files: this sandbox's /dev/shm cannot hold them
    previous = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")
    from specdiff_lightning.trainer import SpecDiffTrainer
    from specdiff_lightning.training.dflash import DFlashDrafterTraining

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": f"p{i}", "prompt_ids": [1 + i, 2, 3]}) + "\n" for i in range(8))
    )
    module = DFlashDrafterTraining(
        verifier="tiny-llama", num_layers=1, target_layer_ids=(0, 1), block_size=5, mask_token_id=63
    )
    trainer = SpecDiffTrainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        logger=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    try:
        trainer.generate_corpus(
            module, str(prompts), str(tmp_path / "c"), num_continuations=1, max_new_tokens=4
        )
    finally:
        torch.multiprocessing.set_sharing_strategy(previous)
    out = tmp_path / "c"
    assert sorted(p.name for p in out.glob("manifest*")) == ["manifest-r0of2.json", "manifest-r1of2.json"]
    ids = [r["id"] for r in iter_records(sorted(str(p) for p in out.glob("train-*.jsonl")))]
    assert sorted(ids) == sorted(f"p{i}#0" for i in range(8))
