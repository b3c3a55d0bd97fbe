"""Decoding settings as one YAML-friendly object (LightningCLI ``model.decoding``)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

__all__ = ["DecodingConfig"]


@dataclass
class DecodingConfig:
    """Arguments of :func:`~specdiff_lightning.speculative_generate` for predict and bench.

    ``temperature=0`` is greedy decoding; ``acceptance`` is ``greedy`` (self-selection, any K),
    ``standard`` (K = 1) or ``recursive``.
    """

    max_new_tokens: int = 128
    gamma: int = 8
    num_drafts: int = 1
    draft_temperature: float = 1.0
    acceptance: str = "greedy"
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0

    def generate_kwargs(self) -> dict:
        kwargs = asdict(self)
        kwargs.pop("seed")
        return kwargs

    def sampling_kwargs(self) -> dict:
        """The verifier-side arguments (shared with the verifier-only baseline)."""
        return {k: getattr(self, k) for k in ("max_new_tokens", "temperature", "top_k", "top_p")}

    def config_hash(self) -> str:
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]
