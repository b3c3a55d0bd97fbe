"""The advertised commands end to end, in a temporary working directory: generate-corpus, fit,
export, predict (the config's decoding settings, not the checkpoint's) and bench."""

import json
from pathlib import Path

import pytest
import torch

from specdiff_lightning import DiffusionDrafter
from specdiff_lightning.cli import main
from specdiff_lightning.decoding.config import DecodingConfig

ROOT = Path(__file__).parents[2]
V = 64  # the tiny configs' vocabulary


@pytest.mark.slow
def test_cli_generate_corpus_fit_and_export(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = ROOT / "configs" / "tiny_fit.yaml"
    prompts = ROOT / "configs" / "tiny_prompts.jsonl"
    main(
        [
            "generate-corpus",
            "--config",
            str(config),
            "--prompts",
            str(prompts),
            "--output_dir",
            "runs/tiny/corpus",
            "--val_fraction",
            "0.15",
            "--max_new_tokens",
            "16",
            "--trainer.enable_progress_bar",
            "false",
        ]
    )
    assert json.loads(Path("runs/tiny/corpus/manifest.json").read_text())["done"]
    assert not Path("runs/tiny/lightning_logs").exists()  # generate-corpus logs nothing
    main(
        [
            "fit",
            "--config",
            str(config),
            "--trainer.max_epochs",
            "1",
            "--trainer.enable_progress_bar",
            "false",
        ]
    )
    # under default_root_dir, where tiny_predict.yaml's comment points
    ckpt = Path("runs/tiny/lightning_logs/version_0/checkpoints/last.ckpt")
    assert ckpt.is_file() and sorted(p.name for p in Path("runs/tiny/lightning_logs").iterdir()) == [
        "version_0"
    ]
    main(["export", "--config", str(config), "--ckpt_path", str(ckpt), "--output_dir", "exported"])
    assert DiffusionDrafter.from_pretrained("exported").mask_token_id == V - 1


@pytest.mark.slow
def test_cli_predict_and_bench(tmp_path, monkeypatch):
    configs = ROOT / "configs"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(configs)
    common = [
        "--config",
        "configs/tiny_predict.yaml",
        "--data.init_args.limit",
        "2",
        "--model.init_args.decoding.max_new_tokens",
        "12",
    ]
    main(["predict", *common, "--trainer.enable_progress_bar", "false"])
    rows = Path("runs/tiny/predict/predictions-rank0.jsonl").read_text().splitlines()
    assert len(rows) == 2
    main(
        [
            "bench",
            *common,
            "--config",
            "configs/tiny_bench.yaml",
            "--sweep_num_drafts",
            "[1, 2]",
            "--sweep_gamma",
            "[2]",
            "--sweep_draft_temperature",
            "[]",
            "--sweep_steps",
            "[]",
            "--trainer.enable_progress_bar",
            "false",
        ]
    )
    report = json.loads(Path("runs/tiny/bench/bench.json").read_text())
    assert all(r["identical_to_verifier"] for r in report["rows"])
    assert any(r["kind"] == "hf_assisted" for r in report["rows"])
    assert any(r["tree"] and r["lookup"] for r in report["rows"])  # tiny_bench.yaml's shaped row
    assert not Path("lightning_logs").exists()


@pytest.mark.slow
def test_cli_predict_decodes_with_the_configs_settings_not_the_checkpoints(tmp_path, monkeypatch):
    """A fit checkpoint stores its own decoding settings (here K=3, 20 tokens); predict with that
    checkpoint decodes with the predict config's and the command line's (K=4 from
    tiny_predict.yaml, 12 tokens from the command line), and re-running replaces the JSONL."""
    configs = ROOT / "configs"
    monkeypatch.chdir(tmp_path)
    gen = torch.Generator().manual_seed(0)
    with open("corpus.jsonl", "w") as f:
        for i in range(16):
            ids = torch.randint(0, 63, (20,), generator=gen).tolist()
            f.write(json.dumps({"id": f"r{i}", "prompt_ids": ids[:4], "continuation_ids": ids[4:]}) + "\n")
    main(
        [
            "fit",
            "--config",
            str(configs / "tiny_fit.yaml"),
            "--data.init_args.train_files",
            "corpus.jsonl",
            "--data.init_args.val_files",
            "null",
            "--data.init_args.batch_size",
            "8",
            "--model.init_args.decoding",
            '{"max_new_tokens": 20, "num_drafts": 3}',
            "--model.init_args.baseline",
            "false",
            "--trainer.max_steps",
            "1",
            "--trainer.enable_progress_bar",
            "false",
        ]
    )
    ckpt = Path("runs/tiny/lightning_logs/version_0/checkpoints/last.ckpt")
    assert torch.load(ckpt, weights_only=True)["hyper_parameters"]["decoding"]["num_drafts"] == 3
    assert not Path("lightning_logs").exists()
    predict = [
        "predict",
        "--config",
        str(configs / "tiny_predict.yaml"),
        "--ckpt_path",
        str(ckpt),
        "--data.init_args.path",
        str(configs / "tiny_prompts.jsonl"),
        "--data.init_args.limit",
        "2",
        "--model.init_args.decoding.max_new_tokens",
        "12",
        "--trainer.enable_progress_bar",
        "false",
    ]
    expected = DecodingConfig(
        max_new_tokens=12,
        gamma=8,
        num_drafts=4,
        draft_temperature=1.5,
        acceptance="greedy",
        temperature=0.0,
        tree={"min_confidence": 0.05, "siblings": [0]},
        lookup={"num_lookups": 2},
    )
    for _ in range(2):
        main(predict)
        rows = [
            json.loads(line)
            for line in Path("runs/tiny/predict/predictions-rank0.jsonl").read_text().splitlines()
        ]
        assert len(rows) == 2  # replaced, not appended
        assert all(r["new_tokens"] == 12 for r in rows)
        assert all(r["config_hash"] == expected.config_hash() for r in rows)
        assert all(r["baseline_wall_time"] is not None for r in rows)  # the config's baseline: true
