"""Kernel choices measured on the machine: a faster product for the few-token forwards of a tree.

A draft tree's forward multiplies a handful of rows by every weight matrix. On the x86 CPUs measured
here, float32 ``F.linear`` (``x @ W^T``) with 2-4 rows takes MKL's small-M GEMM path, which costs about
one matrix-vector product per row (SmolLM2's 576 x 1,536 MLP weight: 47 us at 1 row, 90 at 2, 146 at
4), while the same product written ``W @ x^T`` costs 60 and 78 us; at 8 rows ``F.linear`` wins again,
and in bfloat16 on a CPU with bf16 instructions it wins at every size. Which is faster depends on the
machine, the dtype and the number of rows, so :func:`choose_linear_kernels` times both on the model's
own weight shapes for each row count, and :func:`use_linear_kernels` makes the model's ``nn.Linear``
layers dispatch on the row count. Both formulations compute the same products; only the summation
order inside them may differ (so logits agree to float rounding, as any two kernels do).
"""

from __future__ import annotations

import statistics
import time
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["choose_linear_kernels", "use_linear_kernels", "linear_kernel_rows", "TRANSPOSED_MARGIN"]

#: the transposed product must be this much faster (median) to be chosen: a choice within noise
#: would only add a dispatch
TRANSPOSED_MARGIN = 0.9


def _transposed_linear(module: nn.Linear, rows: frozenset, x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    if flat.shape[0] not in rows:
        return F.linear(x, module.weight, module.bias)
    out = (module.weight @ flat.T).T  # [m, out]: W @ x^T, the faster kernel for these m rows
    if module.bias is not None:
        out = out + module.bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _time(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.no_grad()
def choose_linear_kernels(
    model: nn.Module, rows: tuple[int, ...] = tuple(range(2, 17)), repeats: int = 30
) -> set[int]:
    """The row counts at which ``W @ x^T`` beats ``F.linear`` on this machine for ``model``'s largest
    linear layer (its weight shape and dtype), by :data:`TRANSPOSED_MARGIN`. CPU models only (an
    accelerator's GEMM has no such small-M gap): empty elsewhere."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears or linears[0].weight.device.type != "cpu":
        return set()
    # the largest layer below the LM head: the MLP projections dominate a decoder layer's time
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    body = [m for m in linears if m is not head] or linears
    weight = max(body, key=lambda m: m.weight.numel()).weight
    chosen = set()
    for m in rows:
        x = torch.randn(m, weight.shape[1], dtype=weight.dtype)
        plain = _time(lambda x=x: F.linear(x, weight), repeats)
        transposed = _time(lambda x=x: (weight @ x.T).T, repeats)
        if transposed < TRANSPOSED_MARGIN * plain:
            chosen.add(m)
    return chosen


def use_linear_kernels(model: nn.Module, rows: set[int]) -> nn.Module:
    """Make every ``nn.Linear`` of ``model`` compute ``W @ x^T`` for inputs of ``rows`` rows (other
    sizes: ``F.linear``); ``rows`` empty restores plain ``F.linear``. Returns ``model``."""
    frozen = frozenset(int(r) for r in rows)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            if frozen:
                module.forward = partial(_transposed_linear, module, frozen)
            else:
                module.__dict__.pop("forward", None)
    model.linear_kernel_rows = sorted(frozen)
    return model


def linear_kernel_rows(model: nn.Module) -> list[int]:
    """The row counts at which ``model``'s linear layers use ``W @ x^T`` ([]: none)."""
    return list(getattr(model, "linear_kernel_rows", []))
