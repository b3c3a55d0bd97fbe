"""Drafter cost against context length, next to the verifier's one-token step at the same context.

A drafter pays off only if a round's drafting is cheap next to a verifier step and stays so as the
context grows. This measures, per context length, the median time of: one verifier decoding step
(KV cache of the context, one new token), one drafting round with the prefix cache (a few newly
accepted tokens plus the mask block) and without it (the whole prefix every round).
"""

from __future__ import annotations

import copy
import functools
import statistics

import torch

from ..decoding.drafting import Drafter
from ..decoding.timing import now
from ..models.diffusion import DiffusionDrafter

__all__ = ["drafter_cost_curve", "plot_drafter_cost"]


class _Context:
    """One context length's inputs, prepared once: token ids, the verifier's KV cache of all but
    the last token, and stand-in verifier features for a drafter that reads them (DFlash)."""

    def __init__(self, verifier, ids: torch.Tensor, feature_width: int | None, dtype) -> None:
        from transformers import DynamicCache

        self.ids = ids
        self.cache = DynamicCache(config=verifier.config)
        verifier(input_ids=ids[:, :-1], cache=self.cache, use_cache=True, logits_to_keep=1)
        self.feats = None
        if feature_width is not None:
            gen = torch.Generator().manual_seed(1)
            self.feats = torch.randn(ids.shape[1] - 1, feature_width, generator=gen).to(ids.device, dtype)


def _verifier_step(verifier, ctx: _Context, gamma: int, new: int) -> float:
    """Seconds of one decoding step (one token after the context's cache)."""
    start = now(ctx.ids.device)
    verifier(input_ids=ctx.ids[:, -1:], cache=ctx.cache, use_cache=True)
    elapsed = now(ctx.ids.device) - start
    ctx.cache.crop(-1)  # back to the context alone: every repeat times the same step
    return elapsed


def _drafter_round(drafter: DiffusionDrafter, ctx: _Context, gamma: int, new: int) -> float:
    """Seconds of a diffusion drafter's round after rounds that cached all but ``new`` tokens."""
    drafter.reset()
    # the rounds before (the prefill, then one round, as in decoding): the cache holds the prefix
    drafter.draft_logits(ctx.ids[:, : -2 * new], gamma)
    drafter.draft_logits(ctx.ids[:, :-new], gamma)
    start = now(ctx.ids.device)
    drafter.draft_logits(ctx.ids, gamma)
    elapsed = now(ctx.ids.device) - start
    drafter.reset()
    return elapsed


def _feature_round(drafter: Drafter, ctx: _Context, gamma: int, new: int, cached: bool) -> float:
    """Seconds of a feature-reading drafter's round (DFlash): with its cache (the new tokens'
    features plus the block), or without (the training forward: every context feature plus the
    block, one window)."""
    ids, feats, device = ctx.ids, ctx.feats, ctx.ids.device
    if cached:
        drafter.reset()
        # the rounds before (the prefill, then one round, as in decoding): the cache holds the prefix
        length = ids.shape[1]
        drafter.observe(feats[: length - 2 * new - 1])
        drafter.propose(ids[:, : -2 * new], gamma, 1, 0.0)
        drafter.observe(feats[length - 2 * new - 1 : length - new - 1])
        drafter.propose(ids[:, :-new], gamma, 1, 0.0)
        drafter.observe(feats[length - new - 1 :])
        start = now(device)
        drafter.propose(ids, gamma, 1, 0.0)
    else:
        start = now(device)
        last = torch.tensor([[ids.shape[1] - 1]], device=device)
        drafter.blocks_logits(feats[None], ids[:, :-1], last, gamma)
    elapsed = now(device) - start
    drafter.reset()
    return elapsed


def _with_prefix_cache(drafter: DiffusionDrafter, on: bool) -> DiffusionDrafter:
    copied = copy.copy(drafter)
    copied.prefix_cache = on
    return copied


@torch.inference_mode()  # as the eager loop's rounds run (decoding.verifier.decoding_mode)
def drafter_cost_curve(
    verifier,
    drafter: Drafter,
    contexts: list[int] = (200, 400, 600, 800, 1000),
    gamma: int = 8,
    new_tokens: int = 3,
    repeats: int = 15,
    seed: int = 0,
) -> list[dict]:
    """``[{context, verifier_step_ms, drafter_cached_ms, drafter_uncached_ms}]`` per context length,
    for a :class:`DiffusionDrafter` (its prefix cache on and off) or a drafter that reads the
    verifier's features (:class:`~specdiff_lightning.DFlashDrafter`: its context cache, or the
    training forward over the whole context).

    ``new_tokens``: tokens the cached drafter runs besides the mask block (a round's accepted tokens).
    Random token ids stand in for text: costs depend on lengths, not on which tokens. Each repeat
    times every context in turn (interleaved), so a machine that speeds up or slows down during the
    measurement shifts every context alike rather than bending the curve; medians over the repeats.
    """
    timers = {"verifier_step_ms": functools.partial(_verifier_step, verifier)}
    reads_features = drafter.feature_layers is not None
    for name, use_cache in (("cached", True), ("uncached", False)):
        timers[f"drafter_{name}_ms"] = (
            functools.partial(_feature_round, drafter, cached=use_cache)
            if reads_features
            else functools.partial(_drafter_round, _with_prefix_cache(drafter, use_cache))
        )
    width = len(drafter.feature_layers) * int(verifier.config.hidden_size) if reads_features else None
    dtype = next(drafter.model.parameters()).dtype
    gen = torch.Generator().manual_seed(seed)
    vocab = int(verifier.config.vocab_size)
    device = next(verifier.parameters()).device
    prepared = []
    for context in contexts:
        ids = torch.randint(100, vocab - 100, (1, context), generator=gen).to(device)
        prepared.append(_Context(verifier, ids, width, dtype))
    samples = [{name: [] for name in timers} for _ in contexts]
    for _ in range(repeats):
        for ctx, times in zip(prepared, samples, strict=True):
            for name, timer in timers.items():
                times[name].append(timer(ctx, gamma, new_tokens))
    return [
        {"context": c, **{name: 1000 * statistics.median(t) for name, t in times.items()}}
        for c, times in zip(contexts, samples, strict=True)
    ]


def plot_drafter_cost(rows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["context"] for r in rows]
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.plot(x, [r["verifier_step_ms"] for r in rows], marker="o", label="verifier: one decoding step")
    ax.plot(x, [r["drafter_cached_ms"] for r in rows], marker="s", label="drafter round, with its cache")
    ax.plot(x, [r["drafter_uncached_ms"] for r in rows], marker="^", label="drafter round, no cache")
    ax.set_xlabel("context tokens")
    ax.set_ylabel("ms (median)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("Drafter cost vs context")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
