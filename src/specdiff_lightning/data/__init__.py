"""Data: distillation corpora (records, windows, the streaming DataModule, corpus generation)."""

from .benchmarks import BENCHMARKS, load_benchmark
from .corpus import generate_corpus, load_prompts
from .datamodule import DistillationDataModule, tokenized_records
from .prompts import PromptDataModule
from .records import CorpusError, expand_files, iter_records
from .tokenization import encode_prompt, load_tokenizer
from .windows import collate_windows, cut_windows

__all__ = [
    "BENCHMARKS",
    "PromptDataModule",
    "load_benchmark",
    "CorpusError",
    "DistillationDataModule",
    "collate_windows",
    "cut_windows",
    "encode_prompt",
    "expand_files",
    "generate_corpus",
    "iter_records",
    "load_tokenizer",
    "load_prompts",
    "tokenized_records",
]
