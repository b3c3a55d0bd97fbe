"""Decoding settings as one YAML-friendly object (LightningCLI ``model.decoding``)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace

__all__ = ["DecodingConfig"]


@dataclass
class DecodingConfig:
    """Arguments of :func:`~specdiff_lightning.speculative_generate` for predict and bench.

    ``temperature=0`` is greedy decoding; ``acceptance`` is ``greedy`` (self-selection, any K),
    ``standard`` (K = 1) or ``recursive``. ``gamma=None`` (the default in configs) means the
    drafter's trained window: :class:`~specdiff_lightning.training.DrafterDistillation` fills in
    its ``gamma``, so a config names the window once.
    """

    max_new_tokens: int = 128
    gamma: int | None = None
    num_drafts: int = 1
    draft_temperature: float = 1.0
    acceptance: str = "greedy"
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0

    def with_gamma(self, gamma: int) -> DecodingConfig:
        """This config, with ``gamma`` filled in where it was left unset."""
        return self if self.gamma is not None else replace(self, gamma=gamma)

    def generate_kwargs(self) -> dict:
        if self.gamma is None:
            raise ValueError("DecodingConfig.gamma is unset: give a draft window, or use with_gamma(...)")
        kwargs = asdict(self)
        kwargs.pop("seed")
        return kwargs

    def sampling_kwargs(self) -> dict:
        """The verifier-side arguments (shared with the verifier-only baseline)."""
        return {k: getattr(self, k) for k in ("max_new_tokens", "temperature", "top_k", "top_p")}

    def config_hash(self) -> str:
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]
