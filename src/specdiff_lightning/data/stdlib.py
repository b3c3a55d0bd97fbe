"""The built-in corpus: the CPython standard library that ships with the interpreter.

Code, like the paper's HumanEval setting, and present on every machine. Modules are split by
top-level name into train and held-out (about 10%); held-out prompts are function headers plus
docstrings from held-out modules.
"""

from __future__ import annotations

import ast
import json
import sysconfig
import zlib
from pathlib import Path

__all__ = ["stdlib_files", "is_heldout", "build_stdlib_corpus", "train_tokenizer", "SPECIAL_TOKENS"]

SPECIAL_TOKENS = {"eos_token": "<|endoftext|>", "pad_token": "<|pad|>", "mask_token": "<|mask|>"}
_SKIP = {"test", "tests", "idlelib", "site-packages", "lib2to3", "__pycache__", "turtledemo"}


def stdlib_files() -> list[tuple[str, Path]]:
    """``(module path, file)`` for the interpreter's pure-Python standard library, sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [f for f in root.rglob("*.py") if not (_SKIP & set(f.relative_to(root).parts))]
    return sorted((str(f.relative_to(root)), f) for f in files)


def is_heldout(module: str, percent: int = 10) -> bool:
    """Held out by top-level package, so related files never straddle the split."""
    top = module.split("/")[0].removesuffix(".py")
    return zlib.crc32(top.encode()) % 100 < percent


def _function_prompts(module: str, source: str) -> list[dict]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lines = source.splitlines(keepends=True)
    prompts = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not ast.get_docstring(node):
            continue
        doc = node.body[0]
        start = node.lineno - 1 if not node.decorator_list else node.decorator_list[0].lineno - 1
        header = "".join(lines[start : doc.end_lineno])
        body_lines = lines[doc.end_lineno : node.end_lineno]
        if len(body_lines) < 3 or len(header) > 1200:
            continue
        prompts.append(
            {"id": f"{module}:{node.name}:{node.lineno}", "prompt": header, "answer": "".join(body_lines)}
        )
    return prompts


def build_stdlib_corpus(
    out_dir: str | Path, heldout_percent: int = 10, max_prompts: int | None = None
) -> dict:
    """Write ``train.jsonl`` and ``heldout.jsonl`` (one record per module: empty prompt, source as
    continuation) and ``prompts.jsonl`` (held-out function headers + docstrings, with bodies as
    answers). Returns counts."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    counts = {"train": 0, "heldout": 0, "prompts": 0}
    prompts = []
    with open(out / "train.jsonl.tmp", "w") as train, open(out / "heldout.jsonl.tmp", "w") as held:
        for module, path in stdlib_files():
            try:
                source = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if not source.strip():
                continue
            record = json.dumps({"id": module, "prompt": "", "continuation": source})
            if is_heldout(module, heldout_percent):
                held.write(record + "\n")
                counts["heldout"] += 1
                prompts += _function_prompts(module, source)
            else:
                train.write(record + "\n")
                counts["train"] += 1
    with open(out / "prompts.jsonl.tmp", "w") as f:
        for p in prompts[:max_prompts]:
            f.write(json.dumps(p) + "\n")
            counts["prompts"] += 1
    for name in ("train", "heldout", "prompts"):
        (out / f"{name}.jsonl.tmp").replace(out / f"{name}.jsonl")
    return counts


def train_tokenizer(train_jsonl: str | Path, out_dir: str | Path, vocab_size: int = 4096):
    """A byte-level BPE trained with ``tokenizers`` on the train split, saved as a Hugging Face
    tokenizer directory with ``<|endoftext|>`` (EOS), ``<|pad|>`` and ``<|mask|>`` (the drafter's
    [MASK]) as special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    def texts():
        with open(train_jsonl) as f:
            for line in f:
                yield json.loads(line)["continuation"]

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts(), trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL_TOKENS)
    hf.save_pretrained(out_dir)
    return hf
