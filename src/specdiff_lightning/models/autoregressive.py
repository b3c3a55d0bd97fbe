"""An autoregressive drafter for the classic speculative-sampling (SpS) baseline."""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache

from ..decoding.drafting import Drafter, Proposal
from ..decoding.sampling import logits_to_probs, sample_tokens

__all__ = ["AutoregressiveDrafter"]


class AutoregressiveDrafter(Drafter):
    """Draft ``gamma`` tokens one by one with a causal LM and its own KV cache.

    The cache survives across rounds: on each call it is cropped to the longest common prefix of
    what it holds and the new context, so only the newly committed tokens are re-read.
    ``q_j`` is ``softmax(logits_j / T)`` conditioned on the earlier draft tokens (exact for ``standard``).

    Args:
        model: a HF causal LM sharing the verifier's tokenizer.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.vocab_size = int(model.config.vocab_size)
        self.reset()

    @classmethod
    def from_pretrained(cls, path: str, **model_kwargs) -> AutoregressiveDrafter:
        from transformers import AutoModelForCausalLM

        return cls(AutoModelForCausalLM.from_pretrained(path, **model_kwargs).eval())

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
            self._cache = DynamicCache(config=self.model.config)
        elif len(self._cached) > common:
            self._cache.crop(-(len(self._cached) - common))
        self._cached = context[:common]
        return torch.tensor([context[common:]], dtype=torch.long, device=self.model.device)

    def _step(self, tokens: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=tokens, cache=self._cache, use_cache=True, logits_to_keep=1)
        self._cached += tokens[0].tolist()
        return out.logits[:, -1]

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
        logits = self._step(self._sync(input_ids[0].tolist()))
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
        return Proposal(tokens_t, probs_t)

    def __repr__(self) -> str:
        return f"AutoregressiveDrafter({type(self.model).__name__})"
