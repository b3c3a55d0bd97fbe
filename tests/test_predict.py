"""predict through the Trainer (writer + metrics callback), benchmark loaders, and bench."""

import json

import lightning as L
import pytest
import torch

from specdiff_lightning.bench import default_methods, run_bench, sweep_methods, write_report
from specdiff_lightning.data import CorpusError, PromptDataModule, load_benchmark
from specdiff_lightning.decoding.config import DecodingConfig
from specdiff_lightning.models import AutoregressiveDrafter, tiny_model
from specdiff_lightning.predict import DecodingMetrics, JsonlPredictionWriter
from specdiff_lightning.training import DrafterDistillation

V = 48
TINY_V = {
    "vocab_size": V,
    "hidden_size": 32,
    "num_layers": 2,
    "seed": 0,
    "initializer_range": 0.1,
    "dtype": "float64",
}
TINY_D = {"vocab_size": V, "hidden_size": 32, "num_layers": 1, "seed": 1, "dtype": "float64"}


def _prompts_file(tmp_path, n=4):
    path = tmp_path / "prompts.jsonl"
    gen = torch.Generator().manual_seed(0)
    with open(path, "w") as f:
        for i in range(n):
            f.write(
                json.dumps(
                    {"id": f"q{i}", "prompt_ids": torch.randint(0, V - 1, (5,), generator=gen).tolist()}
                )
                + "\n"
            )
    return path


def _module(**decoding):
    cfg = DecodingConfig(max_new_tokens=16, gamma=4, num_drafts=4, draft_temperature=1.5, **decoding)
    tiny_v = {k: v for k, v in TINY_V.items() if k != "dtype"}
    tiny_d = {k: v for k, v in TINY_D.items() if k != "dtype"}
    return DrafterDistillation(
        verifier_kwargs={"tiny": tiny_v, "dtype": "float64"},
        drafter_kwargs={"tiny": tiny_d, "dtype": "float64"},
        gamma=4,
        decoding=cfg,
    )


def test_predict_writes_jsonl_and_summary(tmp_path, capsys):
    model = _module()
    metrics = DecodingMetrics()
    trainer = L.Trainer(
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[JsonlPredictionWriter(str(tmp_path / "out")), metrics],
    )
    data = PromptDataModule(benchmark="prompts", path=str(_prompts_file(tmp_path)), batch_size=2)
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


def test_benchmark_loaders_read_local_files(tmp_path):
    files = {
        "math500": {"problem": "1+1?", "answer": "2", "unique_id": "m/1"},
        "humaneval": {"task_id": "HumanEval/0", "prompt": "def f():\n"},
        "gpqa": {
            "Question": "Q?",
            "Correct Answer": "yes",
            "Incorrect Answer 1": "a",
            "Incorrect Answer 2": "b",
            "Incorrect Answer 3": "c",
        },
        "mt_bench": {"question_id": 81, "prompt": ["Write a poem.", "Shorter."]},
    }
    for name, row in files.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text(json.dumps(row) + "\n")
        (rec,) = load_benchmark(name, str(path))
        assert rec["id"] and rec["prompt"]
    assert "\\boxed{}" in load_benchmark("math500", str(tmp_path / "math500.jsonl"))[0]["prompt"]
    gpqa = load_benchmark("gpqa", str(tmp_path / "gpqa.jsonl"))[0]
    assert f"({gpqa['answer']}) yes" in gpqa["prompt"]
    assert load_benchmark("mt_bench", str(tmp_path / "mt_bench.jsonl"))[0]["prompt"] == "Write a poem."
    with pytest.raises(CorpusError, match="missing field"):
        load_benchmark("math500", str(tmp_path / "humaneval.jsonl"))
    with pytest.raises(CorpusError, match="does not exist"):
        load_benchmark("gpqa", str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match="unknown benchmark"):
        load_benchmark("mmlu")


@pytest.mark.slow
def test_bench_runs_every_method_and_writes_reports(tmp_path):
    model = _module()
    data = PromptDataModule(benchmark="prompts", path=str(_prompts_file(tmp_path, n=3)))
    data.setup("predict")
    ar = AutoregressiveDrafter(
        tiny_model("qwen2", vocab_size=V, hidden_size=16, num_layers=1, seed=3, dtype=torch.float64)
    )
    cfg = model.decoding
    methods = default_methods(cfg, with_ar=True) + sweep_methods(cfg, [1, 2], [1.0], [2, 4], [1, 2])
    report = run_bench(
        model.verifier, model.drafter, data.rows, cfg, methods, ar_drafter=ar, profile=True, progress=False
    )
    kinds = {r["kind"] for r in report["rows"]}
    assert kinds == {"verifier", "hf", "hf_prompt_lookup", "hf_assisted", "sps", "diffusion"}
    assert all(r["identical_to_verifier"] for r in report["rows"])  # temperature 0: all lossless
    assert all(0 <= r["profile"]["overhead"] < 1 for r in report["rows"] if "profile" in r)
    out = write_report(report, tmp_path / "bench")
    for name in (
        "bench.json",
        "bench.md",
        "positional_acceptance.png",
        "speedup_vs_k.png",
        "speedup_vs_gamma.png",
    ):
        assert (out / name).stat().st_size > 0
    assert "| SpecDiff-2 (K=4, greedy) |" in (out / "bench.md").read_text()


def test_answer_extraction_and_scoring():
    from specdiff_lightning.budget import extract_answer, is_correct

    assert extract_answer("so \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert extract_answer("x = 3, then 41.5") == "41.5"
    assert extract_answer("no answer") is None
    assert (
        is_correct("\\dfrac{1}{2}", "\\frac{1}{2}") and not is_correct("3", "4") and not is_correct(None, "1")
    )


def test_eval_budget_mechanics(tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    from specdiff_lightning.budget import run_budget_eval, write_budget_report

    words = [
        "<unk>",
        "time",
        "is",
        "up",
        ",",
        "summarise",
        "your",
        "answer",
        ".",
        "final",
        ":",
        "1",
        "2",
        "+",
        "?",
    ]
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok)
    model = _module()
    rows = [{"id": "a", "prompt_ids": [11, 13, 11, 14], "answer": "2"}]
    report = run_budget_eval(
        model.verifier,
        model.drafter,
        tokenizer,
        rows,
        [0.01, 0.05],
        model.decoding,
        answer_tokens=4,
        progress=False,
    )
    assert [(r["budget_s"], r["method"]) for r in report["rows"]] == [
        (0.01, "verifier"),
        (0.01, "specdiff2"),
        (0.05, "verifier"),
        (0.05, "specdiff2"),
    ]
    assert all(r["mean_thinking_tokens"] >= 1 for r in report["rows"])
    out = write_budget_report(report, tmp_path)
    assert (out / "accuracy_vs_budget.png").stat().st_size > 0 and (out / "eval_budget.md").exists()


@pytest.mark.slow
def test_cli_predict_and_bench(tmp_path, monkeypatch):
    from pathlib import Path

    from specdiff_lightning.cli import main

    configs = Path(__file__).parents[1] / "configs"
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
    assert not Path("lightning_logs").exists()


@pytest.mark.slow
def test_cli_predict_decodes_with_the_configs_settings_not_the_checkpoints(tmp_path, monkeypatch):
    """A fit checkpoint stores its own decoding settings (here K=3, 20 tokens); predict with that
    checkpoint decodes with the predict config's and the command line's (K=4 from
    tiny_predict.yaml, 12 tokens from the command line), and re-running replaces the JSONL."""
    from pathlib import Path

    from specdiff_lightning.cli import main

    configs = Path(__file__).parents[1] / "configs"
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
    ckpt = Path("runs/tiny/checkpoints/last.ckpt")
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
        max_new_tokens=12, gamma=8, num_drafts=4, draft_temperature=1.5, acceptance="greedy", temperature=0.0
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
