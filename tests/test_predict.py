"""predict through the Trainer: the JSONL writer and the metrics callback."""

import json
from pathlib import Path

import lightning as L
import pytest
import torch

from helpers import tiny_distillation, write_prompts
from specdiff_lightning.data import PromptDataModule
from specdiff_lightning.predict import DecodingMetrics, JsonlPredictionWriter


@pytest.mark.parametrize(
    "shape",
    [
        {},
        {"tree": {"min_confidence": 0.05, "siblings": [0], "branch_width": 2}, "lookup": {"num_lookups": 2}},
        {"tree": "auto", "compile": True},  # decoding.compile: the compiled verifier (baseline too)
    ],
    ids=["plain", "tree+lookup", "auto+compiled"],
)
def test_predict_writes_jsonl_and_summary(tmp_path, capsys, shape):
    model = tiny_distillation(**shape)
    metrics = DecodingMetrics()
    trainer = L.Trainer(
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[JsonlPredictionWriter(str(tmp_path / "out")), metrics],
    )
    data = PromptDataModule(benchmark="prompts", path=str(write_prompts(tmp_path)), batch_size=2)
    trainer.predict(model, data, return_predictions=False)
    rows = [
        json.loads(line) for line in (tmp_path / "out" / "predictions-rank0.jsonl").read_text().splitlines()
    ]
    assert [r["id"] for r in rows] == ["q0", "q1", "q2", "q3"]
    for r in rows:
        assert set(r) == set(JsonlPredictionWriter.FIELDS)
        assert r["new_tokens"] == len(r["completion"]) == 16 and r["verifier_calls"] >= 16 / 5
        assert r["baseline_wall_time"] > 0 and r["speedup"] > 0
    # temperature 0: the completions are the verifier's greedy decoding
    verifier = model.verifier
    for r, line in zip(rows, (tmp_path / "prompts.jsonl").read_text().splitlines(), strict=True):
        ids = torch.tensor([json.loads(line)["prompt_ids"]])
        ref = verifier.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16, pad_token_id=0
        )
        assert r["completion"] == ref[0, 5:].tolist()
    assert {"predict/mean_accepted", "predict/speedup", "predict/gamma_1"} <= set(metrics.results)
    assert "Decoding summary" in capsys.readouterr().out
    if shape.get("compile"):
        # compiled before the first prompt, untimed (on_predict_start): only a warm-up records this,
        # the decodes themselves never do, so no row's wall_time or speed-up holds the compile
        from specdiff_lightning.decoding.compiled import _WARMED

        assert model.verifier in _WARMED and model.drafter in _WARMED


def test_prediction_writer_replaces_an_earlier_run(tmp_path):
    from types import SimpleNamespace

    writer = JsonlPredictionWriter(str(tmp_path / "out"))
    trainer = SimpleNamespace(global_rank=0)
    for run in range(2):
        writer.on_predict_start(trainer, None)
        for batch in range(2):
            rows = [{"id": f"r{run}b{batch}i{i}"} for i in range(3)]
            writer.write_on_batch_end(trainer, None, rows, None, None, batch, 0)
    lines = (tmp_path / "out" / "predictions-rank0.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == [f"r1b{b}i{i}" for b in range(2) for i in range(3)]


def test_predictions_carry_text_when_the_data_module_has_a_tokenizer(tmp_path):
    """Issue 19: with a tokenizer configured on the data module only, completions were token ids
    and nothing else; `text` is their decoding."""
    from specdiff_lightning.data.tokenization import load_tokenizer

    tokenizer = str(Path(__file__).parents[1] / "assets" / "demo" / "tokenizer")
    trainer = L.Trainer(
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[JsonlPredictionWriter(str(tmp_path / "out"))],
    )
    data = PromptDataModule(benchmark="prompts", path=str(write_prompts(tmp_path, n=2)), tokenizer=tokenizer)
    trainer.predict(tiny_distillation(), data, return_predictions=False)
    rows = [
        json.loads(line) for line in (tmp_path / "out" / "predictions-rank0.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 2
    for r in rows:
        assert isinstance(r["completion"], list) and r["text"] == load_tokenizer(tokenizer).decode(
            r["completion"]
        )
