"""Draft trees shaped by the drafter's own confidence.

A tree node costs the verifier a little (on a 2-core CPU about 0.55 ms of a ~25 ms forward for
SmolLM2-135M), so a node worth scoring is one likely to be accepted. A diffusion drafter's marginals
say how likely: a draft is cut where the drafter's probability of its prefix falls below a threshold,
and at chosen positions the runner-up token joins as a one-token branch (when the first choice is
rejected there, the second is often right). The drafts are then chosen knowing the drafter's
marginals, so only q-free (``greedy``) acceptance may verify them; it stays lossless.
"""

from __future__ import annotations

import torch

from .drafting import DrafterWrapper, Proposal

__all__ = ["confident_lengths", "AdaptiveDrafter"]


def confident_lengths(token_probs: torch.Tensor, min_confidence: float) -> torch.Tensor:
    """``LongTensor[..., ]``: how many leading tokens of each draft keep the drafter's prefix
    probability ``prod_{i<=j} q_i(x_i)`` at or above ``min_confidence`` (at least one).

    Args:
        token_probs: ``FloatTensor[..., g]``, the drafter's marginal probability of each draft token.
    """
    prefix = torch.cumprod(token_probs, dim=-1)
    return (prefix >= min_confidence).sum(-1).clamp(min=1)


class AdaptiveDrafter(DrafterWrapper):
    """``base``'s drafts cut where it is unsure, plus its runner-up tokens as one-token branches.

    Needs a drafter whose proposals carry their marginal logits (diffusion drafters do).

    Args:
        base: a diffusion drafter (:class:`~specdiff_lightning.DiffusionDrafter`, :class:`~specdiff_lightning.DFlashDrafter`).
        min_confidence: cut each draft after the last token where the drafter's probability of the
            prefix (the product of its marginals along the draft) is still at least this; 0: no cut.
        siblings: draft positions (0: the first token) where the marginal's best tokens other than the
            first draft's join as branches after the first draft's prefix, when the (cut) draft
            reaches that position.
        branch_width: how many such runner-up tokens join at each sibling position (one node each).
        mode_first: the first of K sampled drafts becomes the marginals' mode (each position's most
            likely token); the other K-1 stay samples. At temperature 0 self-selection then picks
            among the mode and K-1 alternatives, so K drafts never accept fewer tokens than the one
            mode draft of K=1 (i.i.d. samples at a draft temperature > 0 can all miss it).
    """

    def __init__(
        self,
        base,
        min_confidence: float = 0.0,
        siblings: tuple[int, ...] = (),
        branch_width: int = 1,
        mode_first: bool = False,
    ) -> None:
        super().__init__(base)
        if not 0.0 <= min_confidence <= 1.0:
            raise ValueError(f"min_confidence must lie in [0, 1], got {min_confidence}")
        if any(int(j) < 0 for j in siblings):
            raise ValueError(f"sibling positions must be >= 0 (0 is the first draft token), got {siblings}")
        if branch_width < 1:
            raise ValueError(
                f"branch_width must be >= 1 (runner-up tokens per sibling position), got {branch_width}"
            )
        self.min_confidence = float(min_confidence)
        self.siblings = tuple(sorted({int(j) for j in siblings}))
        self.branch_width = int(branch_width)
        self.mode_first = bool(mode_first)

    def propose(self, input_ids, gamma, num_drafts=1, temperature=1.0, generator=None) -> Proposal:
        proposal = self.base.propose(input_ids, gamma, num_drafts, temperature, generator)
        if self.min_confidence == 0 and not self.siblings and not self.mode_first:
            return proposal
        if proposal.logits is None:
            raise ValueError(
                f"AdaptiveDrafter shapes drafts by the drafter's marginals, but {type(self.base).__name__} "
                f"proposals carry none (use a diffusion drafter, or min_confidence=0, no siblings and "
                f"mode_first=False)"
            )
        tokens = proposal.tokens  # [B, K, g]
        logits = torch.log_softmax(proposal.full_logits().float(), dim=-1)  # [B, g, V]: log q_j
        batch, k, g = tokens.shape
        if self.mode_first:
            # (padding past a capped window has zero logits: its argmax is the padding token 0)
            tokens = torch.cat([logits.argmax(-1)[:, None], tokens[:, 1:]], dim=1)
        token_probs = logits[:, None].expand(batch, k, g, -1).gather(-1, tokens[..., None])[..., 0].exp()
        lengths = torch.minimum(confident_lengths(token_probs, self.min_confidence), proposal.draft_lengths())
        branches = [j for j in self.siblings if j < g]
        if branches:
            w = self.branch_width
            # the w best tokens at each branch position other than the first draft's own
            top = logits[:, branches].topk(w + 1, dim=-1).indices  # [B, S, w + 1]
            own = tokens[:, 0, branches, None]
            # drop the draft's own token (or, when it is not among them, the last)
            drop = torch.where((top == own).any(-1, keepdim=True), top == own, _last(top))
            runner_ups = top[~drop].view(batch, len(branches), w)
            positions = torch.tensor(branches, device=tokens.device).repeat_interleave(w)
            extra = tokens[:, :1].expand(batch, len(positions), g).clone()
            extra[:, torch.arange(len(positions)), positions] = runner_ups.flatten(1)
            extra_lengths = (positions + 1).expand(batch, -1)
            # a branch only where the first draft (after its cut) reaches that position
            keep = (positions < lengths[:, :1]).all(0)
            tokens = torch.cat([tokens, extra[:, keep]], dim=1)
            lengths = torch.cat([lengths, extra_lengths[:, keep]], dim=1)
        return proposal.reshaped(tokens, lengths)


def _last(top: torch.Tensor) -> torch.Tensor:
    """``BoolTensor`` like ``top``: True at the last entry of the final dimension."""
    mask = torch.zeros_like(top, dtype=torch.bool)
    mask[..., -1] = True
    return mask
