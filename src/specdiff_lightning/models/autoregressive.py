"""An autoregressive drafter for the classic speculative-sampling (SpS) baseline."""

from __future__ import annotations

import os

import torch
from torch import nn
from transformers import DynamicCache

from ..decoding.drafting import Drafter, Proposal, derived_generator
from ..decoding.sampling import logits_to_probs, sample_tokens

__all__ = ["AutoregressiveDrafter"]


class AutoregressiveDrafter(Drafter):
    """Draft ``gamma`` tokens one by one with a causal LM and its own KV cache.

    The cache survives across rounds: on each call it is cropped to the longest common prefix of
    what it holds and the new context, so only the newly committed tokens are re-read.
    ``q_j`` is ``softmax(logits_j / T)`` conditioned on the earlier draft tokens (exact for ``standard``).

    The drafter may sit on another device than the verifier: the context crosses to the drafter's
    device once per round (as the token list it already is), the proposal comes back to the
    caller's device once, and sampling uses a generator on the drafter's device
    (:func:`~specdiff_lightning.decoding.drafting.derived_generator`).

    Its cache is a plain ``DynamicCache()`` (full-attention layers whatever the config says): the
    model still applies its own sliding-window mask, while the cache keeps every position so that
    cropping back to the accepted prefix always works (a sliding-window layer cannot be cropped
    once its window is full).

    Args:
        model: a HF causal LM sharing the verifier's tokenizer.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.vocab_size = int(model.config.vocab_size)
        self.reset()

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, *, verifier: nn.Module | None = None, **model_kwargs
    ) -> AutoregressiveDrafter:
        """A causal LM (directory, hub id or named verifier, see
        :func:`~specdiff_lightning.models.loading.load_verifier`), or a slice of ``verifier`` saved
        by this project (``slice.json`` kind ``autoregressive``; only ``dtype`` applies, the verifier's)."""
        from .slicing import is_slice

        if is_slice(path):
            from .kinds import load_slice_drafter

            dtype = model_kwargs.pop("dtype", None)
            return load_slice_drafter(path, verifier, "autoregressive", dtype, **model_kwargs)
        from .loading import load_verifier

        return cls(load_verifier(os.fspath(path), **model_kwargs))

    @classmethod
    def from_slice(cls, verifier: nn.Module, path: str | os.PathLike) -> AutoregressiveDrafter:
        """An AR slice saved by ``SliceDrafterTraining.export`` (objective ``ar``), rebuilt around
        ``verifier``'s embeddings in its dtype."""
        from .slicing import load_slice

        return cls(load_slice(verifier, path)[0])

    def reset(self) -> None:
        self._cache: DynamicCache | None = None
        self._cached: list[int] = []

    def _sync(self, context: list[int]) -> torch.Tensor:
        """Crop the cache to the common prefix with ``context``; return the tokens still to feed."""
        common = 0
        limit = min(len(self._cached), len(context) - 1)  # always re-feed >= 1 token to get logits
        while common < limit and self._cached[common] == context[common]:
            common += 1
        if self._cache is None:
            # Not DynamicCache(config=...): that builds sliding-window layers whose crop() raises.
            self._cache = DynamicCache()
        elif len(self._cached) > common:
            self._cache.crop(-(len(self._cached) - common))
        self._cached = context[:common]
        return torch.tensor([context[common:]], dtype=torch.long, device=self.device)

    def _step(self, tokens: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=tokens, cache=self._cache, use_cache=True, logits_to_keep=1)
        return self._restrict_logits(out.logits[:, -1])

    @torch.no_grad()
    def propose(
        self,
        input_ids: torch.Tensor,
        gamma: int,
        num_drafts: int = 1,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> Proposal:
        if input_ids.shape[0] != 1 or num_drafts != 1:
            raise NotImplementedError(
                "AutoregressiveDrafter drafts one sequence and one draft at a time (batch 1, num_drafts=1); "
                "use a DiffusionDrafter for multi-draft self-selection"
            )
        home = input_ids.device
        generator = derived_generator(generator, self.device)
        context = input_ids[0].tolist()
        logits = self._step(self._sync(context))
        tokens, probs = [], []
        for j in range(gamma):
            q = logits_to_probs(logits, temperature)  # [1, V]
            token = sample_tokens(q, generator)
            tokens.append(token)
            probs.append(q)
            if j + 1 < gamma:
                logits = self._step(token[:, None])
        tokens_t = torch.stack(tokens, dim=-1)[:, None]  # [1, 1, gamma]
        probs_t = torch.stack(probs, dim=1)[:, None]  # [1, 1, gamma, V]
        # The cache now holds the context and every draft token but the last: one host read per
        # round for this bookkeeping, not one per drafted token.
        self._cached = context + tokens_t[0, 0, : gamma - 1].tolist()
        return Proposal(tokens_t, probs_t).to(home)

    def __repr__(self) -> str:
        return f"AutoregressiveDrafter({type(self.model).__name__})"
