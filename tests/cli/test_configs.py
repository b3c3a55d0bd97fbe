"""Every shipped config parses and instantiates (model, data module, trainer) through LightningCLI,
with tiny models of the same classes swapped in for checkpoints that need downloads or GPUs."""

import copy
import importlib
import inspect
from pathlib import Path

import pytest
import yaml

from helpers import config_base
from specdiff_lightning.cli.lightning_cli import SpecDiffCLI
from specdiff_lightning.models import DRAFTER_FAMILIES
from specdiff_lightning.trainer import SpecDiffTrainer

ROOT = Path(__file__).parents[2]
CONFIGS = sorted(p for p in (ROOT / "configs").rglob("*.yaml"))
MODEL_CONFIGS = [p for p in CONFIGS if "model" in (yaml.safe_load(p.read_text()) or {})]
BENCH_LAYERS = [p for p in CONFIGS if p not in MODEL_CONFIGS]
TOKENIZER = str(ROOT / "assets" / "demo" / "tokenizer")


def _arch(spec: str) -> str:
    return "llama" if "llama" in spec.lower() else "qwen2"


def _tiny_kwargs(kwargs: dict | None, vocab: int) -> dict:
    kwargs = dict(kwargs or {})
    # checkpoint-only options, and a DFlash drafter's (the tiny stand-in is a diffusion drafter)
    for key in ("device_map", "dtype", "attn_implementation", "family", "head_vocab"):
        kwargs.pop(key, None)
    kwargs["tiny"] = {"vocab_size": vocab, "hidden_size": 32, "num_layers": 1}
    return kwargs


def _shrink(config: dict) -> dict:
    """Swap checkpoints for tiny same-class models and GPU settings for CPU ones."""
    config = copy.deepcopy(config)
    init = config["model"].setdefault("init_args", {})
    cls = config["model"]["class_path"]
    if cls.endswith("DrafterDistillation"):
        family = (init.get("drafter_kwargs") or {}).get("family")
        if family is not None:
            assert family in DRAFTER_FAMILIES
        init["verifier_kwargs"] = _tiny_kwargs(init.get("verifier_kwargs"), 64)
        init["drafter_kwargs"] = _tiny_kwargs(init.get("drafter_kwargs"), 64)
        init["verifier"] = f"tiny-{_arch(init.get('verifier', 'tiny-qwen2'))}"
        init["drafter"] = f"tiny-{_arch(init.get('drafter', 'tiny-qwen2') + init.get('verifier', ''))}"
        init["tokenizer"] = init["drafter_tokenizer"] = None
    elif cls.endswith(("SliceDrafterTraining", "DFlashDrafterTraining")):
        init["verifier"] = "tiny-llama"  # cut from (or reading) a tiny verifier
        for key in ("init_from", "init_layers_from", "export_dir"):
            init.pop(key, None)
        if "target_layer_ids" in init:  # the tiny verifier's depth
            init.update(target_layer_ids=[0, 1], num_layers=1)
    else:  # pretraining modules: the shipped tokenizer, a new small model
        init["tokenizer"] = TOKENIZER
        init.pop("init_from", None)
        init["model"] = {"hidden_size": 32, "num_layers": 1, "num_heads": 2}
    data = config.get("data", {}).get("init_args", {})
    if "tokenizer" in data:
        data["tokenizer"] = None
    trainer = config.setdefault("trainer", {})
    strategy = trainer.get("strategy")
    if isinstance(strategy, dict):  # the strategy class and its wrap policies must exist
        module, _, name = strategy["class_path"].rpartition(".")
        assert hasattr(importlib.import_module(module), name)
        for layer in strategy.get("init_args", {}).get("auto_wrap_policy", []):
            module, _, name = layer.rpartition(".")
            assert hasattr(importlib.import_module(module), name), layer
    trainer.update(accelerator="cpu", devices=1, strategy="auto", precision="32-true", logger=False)
    trainer.pop("default_root_dir", None)
    return config


def _merged(base: dict, layer: dict) -> dict:
    """``layer`` over ``base`` as ``--config base --config layer`` merges them: mappings key by key,
    anything else (lists too) replaced."""
    out = copy.deepcopy(base)
    for key, value in layer.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merged(out[key], value) if both else copy.deepcopy(value)
    return out


def _load(path) -> dict:
    """A config, or a layer (``drafter_dflash_gpu.yaml``) merged over the recipe it extends."""
    config = yaml.safe_load(path.read_text())
    base = config_base(path)
    return config if base is None else _merged(_load(base), config)


@pytest.mark.parametrize("path", MODEL_CONFIGS, ids=lambda p: str(p.relative_to(ROOT / "configs")))
def test_config_instantiates_with_tiny_models(path):
    config = _shrink(_load(path))
    config.pop("seed_everything", None)
    bench_params = inspect.signature(SpecDiffTrainer.bench).parameters
    for key in [k for k in config if k not in ("model", "data", "trainer")]:
        assert key in bench_params, f"{path.name}: unknown top-level key {key!r}"
        config.pop(key)  # subcommand arguments (here: bench's), checked above
    cli = SpecDiffCLI(args=config, run=False, save_config_callback=None)
    assert cli.model is not None and cli.trainer is not None
    if "data" in config:
        assert cli.datamodule is not None
    gamma = config["model"]["init_args"].get("gamma")
    decoding = getattr(cli.model, "decoding", None)
    if decoding is not None:  # one gamma: the decoding window follows the model's unless set
        assert decoding.gamma == (config["model"]["init_args"].get("decoding") or {}).get("gamma", gamma)
    if gamma is not None and "gamma" in getattr(cli.datamodule, "hparams", {}):
        assert cli.datamodule.hparams.gamma == gamma  # linked: data.gamma follows model.gamma


@pytest.mark.parametrize("path", BENCH_LAYERS, ids=lambda p: str(p.relative_to(ROOT / "configs")))
def test_bench_layers_match_the_bench_signature(path):
    args = yaml.safe_load(path.read_text())
    params = inspect.signature(SpecDiffTrainer.bench).parameters
    unknown = set(args) - set(params)
    assert not unknown, f"{path.name}: {unknown} are not bench arguments"


def test_every_config_is_covered():
    assert len(MODEL_CONFIGS) >= 12 and BENCH_LAYERS


DRAFTER_CONFIGS = [
    p
    for p in MODEL_CONFIGS
    if ((yaml.safe_load(p.read_text())["model"].get("init_args") or {}).get("drafter_kwargs") or {}).get(
        "family"
    )
]


@pytest.mark.parametrize("path", DRAFTER_CONFIGS, ids=lambda p: str(p.relative_to(ROOT / "configs")))
def test_paper_drafters_load_through_the_stock_route(path, tmp_path):
    """The config's drafter family, from a tiny checkpoint laid out like the published one (its own
    config.json, model_type, auto_map, tensor names; its remote-code files raise on import), loads
    with the config's drafter_kwargs into a stock transformers class; so does the `export` of it
    that the predict configs point at."""
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    from hub_layout import HUB_WRITERS
    from specdiff_lightning.models.loading import load_drafter

    kwargs = dict(yaml.safe_load(path.read_text())["model"]["init_args"]["drafter_kwargs"])
    family = kwargs["family"]
    assert "trust_remote_code" not in kwargs
    kwargs.pop("device_map", None)
    checkpoint = HUB_WRITERS[family](tmp_path / "hub")
    drafter = load_drafter(str(checkpoint), **kwargs)
    stock = {"qwen2": Qwen2ForCausalLM, "llama": LlamaForCausalLM}[DRAFTER_FAMILIES[family].stock_class]
    assert type(drafter.model) is stock and drafter._stock
    assert drafter.shift_logits is DRAFTER_FAMILIES[family].shift_logits
    drafter.save_pretrained(tmp_path / "export")
    again = load_drafter(str(tmp_path / "export"), **kwargs)
    assert type(again.model) is stock and again.mask_token_id == drafter.mask_token_id
