"""Shared test helpers: tiny model pairs, HF reference decoding, a noisy-oracle drafter."""

import torch

from specdiff_lightning import DiffusionDrafter
from specdiff_lightning.decoding import Drafter, Proposal
from specdiff_lightning.models import tiny_model

VOCAB = 48
MASK_ID = VOCAB - 1


def make_pair(verifier_arch: str, drafter_arch: str, seed: int, vocab: int = VOCAB, **kw):
    """A float64 verifier and diffusion drafter of real HF classes (float64: no argmax near-ties)."""
    verifier = tiny_model(verifier_arch, vocab_size=vocab, seed=seed, dtype=torch.float64, **kw)
    drafter_model = tiny_model(drafter_arch, vocab_size=vocab, seed=seed + 1000, dtype=torch.float64, **kw)
    return verifier, DiffusionDrafter(drafter_model, mask_token_id=vocab - 1, shift_logits=True)


def reference_greedy(verifier, input_ids, max_new_tokens, eos_token_id=None):
    # An explicit all-ones mask: generate() would otherwise infer one from pad_token_id.
    return verifier.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id if eos_token_id is not None else 0,
    )


class NoisyOracleDrafter(Drafter):
    """A drafter that proposes the verifier's greedy continuation with random corruptions.

    Real random tiny drafters rarely agree with the verifier, so long accepted paths, bonus tokens
    and branching trees whose chosen draft is not the first would go untested without it.
    """

    def __init__(self, verifier, noise: float = 0.25, seed: int = 0):
        self.verifier = verifier
        self.vocab_size = int(verifier.config.vocab_size)
        self.noise = noise
        self.rng = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def propose(self, input_ids, gamma, num_drafts=1, temperature=1.0, generator=None):
        ref = reference_greedy(self.verifier, input_ids, gamma)[:, input_ids.shape[1] :]
        ref = torch.nn.functional.pad(ref, (0, gamma - ref.shape[1]))
        drafts = ref.repeat(num_drafts, 1)
        flip = torch.rand(drafts.shape, generator=self.rng) < self.noise
        drafts = torch.where(
            flip, torch.randint(0, self.vocab_size, drafts.shape, generator=self.rng), drafts
        )
        probs = torch.full(
            (1, num_drafts, gamma, self.vocab_size), 1.0 / self.vocab_size, dtype=torch.float64
        )
        return Proposal(drafts[None], probs, exact_q=False)
