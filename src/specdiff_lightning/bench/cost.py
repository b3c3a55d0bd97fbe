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

from ..decoding.timing import now
from ..models.conditioned import ConditionedDrafter
from ..models.diffusion import DiffusionDrafter

__all__ = ["drafter_cost_curve", "plot_drafter_cost"]


@torch.no_grad()
def _verifier_step_ms(verifier, ids: torch.Tensor, repeats: int) -> float:
    from transformers import DynamicCache

    device = ids.device
    times = []
    for _ in range(repeats):
        cache = DynamicCache(config=verifier.config)
        verifier(input_ids=ids[:, :-1], cache=cache, use_cache=True, logits_to_keep=1)
        start = now(device)
        verifier(input_ids=ids[:, -1:], cache=cache, use_cache=True)
        times.append(now(device) - start)
    return 1000 * statistics.median(times)


@torch.no_grad()
def _drafter_round_ms(
    drafter: DiffusionDrafter, ids: torch.Tensor, gamma: int, new: int, repeats: int
) -> float:
    device = ids.device
    times = []
    for _ in range(repeats):
        drafter.reset()
        drafter.draft_logits(ids[:, :-new], gamma)  # the rounds before: the cache holds the prefix
        start = now(device)
        drafter.draft_logits(ids, gamma)
        times.append(now(device) - start)
    drafter.reset()
    return 1000 * statistics.median(times)


@torch.no_grad()
def _conditioned_round_ms(
    drafter: ConditionedDrafter, verifier, ids: torch.Tensor, gamma: int, new: int, repeats: int, cached: bool
) -> float:
    """A conditioned drafter's round: with its cache (the new tokens' features plus the block), or
    without (the training forward: every context feature plus the block, one window)."""
    device = ids.device
    width = len(drafter.feature_layers) * int(verifier.config.hidden_size)
    dtype = next(drafter.model.parameters()).dtype
    feats = torch.randn(ids.shape[1] - 1, width, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    times = []
    for _ in range(repeats):
        if cached:
            drafter.reset()
            drafter.observe(feats[: ids.shape[1] - new - 1])
            drafter.propose(ids[:, :-new], gamma, 1, 0.0)  # the rounds before: the cache holds the prefix
            drafter.observe(feats[ids.shape[1] - new - 1 :])
            start = now(device)
            drafter.propose(ids, gamma, 1, 0.0)
        else:
            start = now(device)
            last = torch.tensor([[ids.shape[1] - 1]], device=device)
            drafter.blocks_logits(feats[None], ids[:, :-1], last, gamma)
        times.append(now(device) - start)
    drafter.reset()
    return 1000 * statistics.median(times)


def _with_prefix_cache(drafter: DiffusionDrafter, on: bool) -> DiffusionDrafter:
    copied = copy.copy(drafter)
    copied.prefix_cache = on
    return copied


def drafter_cost_curve(
    verifier,
    drafter: DiffusionDrafter | ConditionedDrafter,
    contexts: list[int] = (200, 400, 600, 800, 1000),
    gamma: int = 8,
    new_tokens: int = 3,
    repeats: int = 5,
    seed: int = 0,
) -> list[dict]:
    """``[{context, verifier_step_ms, drafter_cached_ms, drafter_uncached_ms}]`` per context length.

    ``new_tokens``: tokens the cached drafter runs besides the mask block (a round's accepted tokens).
    Random token ids stand in for text: costs depend on lengths, not on which tokens.
    """
    if isinstance(drafter, ConditionedDrafter):
        timers = {
            f"drafter_{name}_ms": functools.partial(
                _conditioned_round_ms, drafter, verifier, cached=use_cache
            )
            for name, use_cache in (("cached", True), ("uncached", False))
        }
    else:
        timers = {
            f"drafter_{name}_ms": functools.partial(_drafter_round_ms, _with_prefix_cache(drafter, use_cache))
            for name, use_cache in (("cached", True), ("uncached", False))
        }
    gen = torch.Generator().manual_seed(seed)
    vocab = int(verifier.config.vocab_size)
    device = next(verifier.parameters()).device
    rows = []
    for context in contexts:
        ids = torch.randint(100, vocab - 100, (1, context), generator=gen).to(device)
        row = {"context": context, "verifier_step_ms": _verifier_step_ms(verifier, ids, repeats)}
        row.update({name: timer(ids, gamma, new_tokens, repeats) for name, timer in timers.items()})
        rows.append(row)
    return rows


def plot_drafter_cost(rows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["context"] for r in rows]
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.plot(x, [r["verifier_step_ms"] for r in rows], marker="o", label="verifier: one decoding step")
    ax.plot(x, [r["drafter_cached_ms"] for r in rows], marker="s", label="drafter round, prefix cache")
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
