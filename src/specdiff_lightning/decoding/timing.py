"""Wall-clock timing with device synchronisation, and a per-round profiler for the decode loop."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch

__all__ = ["synchronize", "now", "throughput", "timed", "RoundProfiler"]


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued kernels so a clock read measures finished work (no-op on CPU)."""
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize(device)
    elif device is not None and device.type == "mps" and torch.backends.mps.is_available():
        torch.mps.synchronize()


def throughput(new_tokens: int, seconds: float) -> float:
    """Tokens per second as the paper measures it (App. B.5): ``(new tokens - 1) / wall time``; the
    first token costs a prefill, not a decoding step."""
    return max(new_tokens - 1, 0) / seconds if seconds > 0 else float("nan")


def timed(fn, device: torch.device | str | None, seed: int | None = None):
    """``(fn(generator), seconds)``: ``fn`` run between two synchronised clock reads, given a fresh
    ``torch.Generator`` on ``device`` seeded with ``seed`` (None: no generator)."""
    generator = None if seed is None else torch.Generator(device=device).manual_seed(seed)
    start = now(device)
    result = fn(generator)
    return result, now(device) - start


def now(device: torch.device | str | None = None) -> float:
    """``time.perf_counter()`` after synchronising ``device``."""
    synchronize(device)
    return time.perf_counter()


class RoundProfiler:
    """Accumulates time per phase of a decoding round (``draft``, ``tree``, ``verify``, ``accept``,
    ``cache``) plus whole-round time. Pass as ``speculative_generate(..., profiler=...)``; each
    phase boundary synchronises the device, which itself costs a little on GPUs."""

    PHASES = ("draft", "tree", "verify", "accept", "cache")

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = device
        self.seconds: dict[str, float] = defaultdict(float)
        self.rounds = 0

    @contextmanager
    def phase(self, name: str):
        start = now(self.device)
        try:
            yield
        finally:
            self.seconds[name] += now(self.device) - start

    @contextmanager
    def round(self):
        start = now(self.device)
        try:
            yield
        finally:
            self.seconds["round"] += now(self.device) - start
            self.rounds += 1

    @property
    def overhead(self) -> float:
        """``1 - (draft + verify) / round``: the loop's share of round time outside the two model calls."""
        total = self.seconds.get("round", 0.0)
        if total == 0:
            return float("nan")
        return 1.0 - (self.seconds.get("draft", 0.0) + self.seconds.get("verify", 0.0)) / total

    def summary(self) -> dict[str, float]:
        out = {f"{k}_s": self.seconds.get(k, 0.0) for k in (*self.PHASES, "round")}
        out["rounds"] = self.rounds
        out["overhead"] = self.overhead
        return out
