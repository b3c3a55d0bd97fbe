"""Tokenisation shared by the data modules, corpus generation and the prompt loaders."""

from __future__ import annotations

import functools

__all__ = ["load_tokenizer", "encode_prompt"]


@functools.lru_cache(maxsize=4)
def load_tokenizer(spec: str):
    """The tokenizer of a named verifier (``smollm2-135m-instruct``), directory or hub id
    (:func:`specdiff_lightning.models.loading.load_tokenizer`), cached (data modules call it per record)."""
    from ..models.loading import load_tokenizer as _load

    return _load(spec)


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """Token ids of a user prompt: through the chat template (with the generation prompt) when the
    tokenizer has one, else plain encoding with special tokens. ``[]`` for an empty prompt."""
    if not prompt:
        return []
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return tokenizer(prompt, add_special_tokens=True)["input_ids"]
