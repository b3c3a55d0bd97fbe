"""Streak and acceptance metrics (METHOD.md §6), as DDP-reducible torchmetrics.

The same classes serve validation (expected values under the drafter, from the streak terms) and
prediction (counts from decoding statistics), so a training curve and a benchmark read alike.
"""

from __future__ import annotations

import torch
from torchmetrics import Metric

__all__ = ["StreakLength", "PositionalAcceptance", "Throughput", "Speedup"]


class StreakLength(Metric):
    """Mean accepted draft tokens per verifier call.

    ``compute()`` returns accepted draft tokens per call, **excluding** the token every round emits
    itself (correction or bonus); :meth:`compute_with_bonus` includes it (tokens per verifier call).
    """

    full_state_update = False
    higher_is_better = True

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("accepted", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("emitted", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("calls", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(
        self,
        accepted: torch.Tensor | float,
        calls: torch.Tensor | float,
        emitted: torch.Tensor | float | None = None,
    ) -> None:
        """Args: summed accepted draft tokens (float for expectations), verifier calls, and emitted
        tokens (defaults to accepted + calls: one extra token per call)."""
        accepted = torch.as_tensor(accepted, dtype=torch.float64, device=self.accepted.device).sum()
        calls = torch.as_tensor(calls, dtype=torch.float64, device=self.calls.device).sum()
        emitted = accepted + calls if emitted is None else torch.as_tensor(emitted, dtype=torch.float64).sum()
        # Out-of-place: states reset under inference mode (trainer.validate) must stay updatable in fit.
        self.accepted = self.accepted + accepted
        self.calls = self.calls + calls
        self.emitted = self.emitted + emitted.to(self.emitted.device)

    def compute(self) -> torch.Tensor:
        return self.accepted / self.calls.clamp_min(1)

    def compute_with_bonus(self) -> torch.Tensor:
        return self.emitted / self.calls.clamp_min(1)


class PositionalAcceptance(Metric):
    """``gamma_j = P(draft token j accepted | tokens 1..j-1 accepted)``, j = 1..gamma (Fig. 2).

    ``update(accepted, reached)`` takes per-position sums: how often (or with what probability)
    position j was accepted, and how often it was reached (1..j-1 accepted and j drafted).
    """

    full_state_update = False
    higher_is_better = True

    def __init__(self, gamma: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.gamma = gamma
        self.add_state("accepted", default=torch.zeros(gamma, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("reached", default=torch.zeros(gamma, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, accepted: torch.Tensor, reached: torch.Tensor) -> None:
        """Args: ``[..., g]`` tensors with ``g <= gamma`` (summed over leading dims)."""
        accepted = accepted.reshape(-1, accepted.shape[-1]).sum(0).double()
        reached = reached.reshape(-1, reached.shape[-1]).sum(0).double()
        pad = self.gamma - accepted.shape[0]
        self.accepted = self.accepted + torch.nn.functional.pad(accepted, (0, pad)).to(self.accepted.device)
        self.reached = self.reached + torch.nn.functional.pad(reached, (0, pad)).to(self.reached.device)

    def update_from_streak_terms(self, terms: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        """Expected counts from ``P_j = prod_{k<=j} q_k(x_k)`` (``[B, g]``): accepted_j = P_j,
        reached_j = P_{j-1} with P_0 = 1, and 0 where ``valid`` is False (past a window's end)."""
        reached = torch.cat([torch.ones_like(terms[..., :1]), terms[..., :-1]], dim=-1)
        if valid is not None:
            reached = reached * valid
        self.update(terms.detach(), reached.detach())

    def compute(self) -> torch.Tensor:
        return self.accepted / self.reached.where(self.reached > 0, torch.nan)

    def plot(self, val=None, ax=None):
        """Positional acceptance curve; returns ``(fig, ax)`` like every torchmetrics ``plot``."""
        import matplotlib.pyplot as plt

        curve = self.compute() if val is None else val
        if ax is None:
            fig, ax = plt.subplots(figsize=(5, 3.2))
        else:
            fig = ax.figure
        positions = torch.arange(1, curve.shape[-1] + 1)
        ax.plot(positions, curve.cpu(), marker="o")
        ax.set_xlabel("draft position j")
        ax.set_ylabel(r"$\gamma_j$ = P(accept j | accepted < j)")
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
        return fig, ax


class _PerSampleMean(Metric):
    """Mean of a per-sample quantity, summed across processes."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def _add(self, values: torch.Tensor) -> None:
        self.total = self.total + values.sum().to(self.total.device)
        self.count = self.count + torch.as_tensor(
            values.numel(), dtype=torch.float64, device=self.count.device
        )

    def compute(self) -> torch.Tensor:
        return self.total / self.count.clamp_min(1)


def _rate(new_tokens, seconds) -> torch.Tensor:
    # The first token is excluded: every method pays the prompt prefill for it (App. B.5).
    n = torch.as_tensor(new_tokens, dtype=torch.float64)
    return (n - 1).clamp_min(0) / torch.as_tensor(seconds, dtype=torch.float64)


class Throughput(_PerSampleMean):
    """Mean per-sample throughput ``(new_tokens - 1) / seconds``. Read clocks with
    :func:`~specdiff_lightning.decoding.timing.now` so device work is finished."""

    def update(self, new_tokens: torch.Tensor | float, seconds: torch.Tensor | float) -> None:
        self._add(_rate(new_tokens, seconds))


class Speedup(_PerSampleMean):
    """Mean per-sample speed-up: throughput of the method over verifier-only decoding of the same
    prompt with the same settings, measured side by side."""

    def update(self, new_tokens, seconds, baseline_new_tokens, baseline_seconds) -> None:
        self._add(_rate(new_tokens, seconds) / _rate(baseline_new_tokens, baseline_seconds))
