"""Kernel choices measured on the machine: faster products for the few-token forwards of a tree.

A draft tree's forward multiplies a handful of rows by every weight matrix, and which kernel does that
fastest depends on the machine, the dtype and the number of rows. Three formulations compute the same
products (only the summation order inside them may differ, so logits agree to float rounding, as any
two kernels do):

- ``"linear"``: stock ``F.linear`` (``x @ W^T``).
- ``"transposed"``: ``W @ x^T``. On the x86 CPUs measured here float32 ``F.linear`` with 2-4 rows takes
  MKL's small-M GEMM path, which costs about one matrix-vector product per row (SmolLM2's 576 x 1,536
  MLP weight on a Zen 5: 47 us at 1 row, 90 at 2, 146 at 4), while ``W @ x^T`` costs 60 and 78 us.
- ``"packed"``: oneDNN's inner product on a weight reordered once into its blocked layout
  (``torch.ops.mkldnn._reorder_linear_weight``, what inductor's CPU freezing does). Stock bfloat16
  ``F.linear`` reorders the weight on every call; on a 2-core Intel Xeon with AMX (model 207) that
  doubled the cost of a one-row product (the MLP weight: 68 us stock, 34 packed; the 49,152-row head
  2.0 ms against 1.1) and made a bf16 one-token step of SmolLM2 33 ms against 27 packed.

:func:`choose_linear_kernels` times each on the model's own largest weight for every row count of
:data:`ROWS`, and :func:`use_linear_kernels` makes the model's ``nn.Linear`` layers dispatch on the
row count (counts between the measured ones take the next measured count's choice). A packed weight is
a copy in oneDNN's layout, made at first use, kept beside the module (never in its state dict or a
deep copy) and remade when the weight changes; a call that builds a graph (training through a frozen
verifier's head) takes ``F.linear``, which has a backward.

A compiled forward (``decoding/compiled.py``) cannot dispatch on a symbolic row count; its plan
(:func:`choose_compiled_kernels`) says how its products are computed. On a CPU where inductor's C++
GEMM template runs (AVX2 or better), ``gemm: "autotune"``: the verifier's weights are frozen into the
graph (inductor's ``freezing``) and every product is a GEMM that inductor *measures* at compile time
against ATen's (``max_autotune``, backends ``CPP,ATEN``), generated for the weight's shape and packed
once. On the 2-core Xeon with AVX2 kernels in float32, SmolLM2's tree forward over 2/4/8/16 nodes
went from 54/56/61/76 ms to 35/40/46/60 (a one-node step 33 either way): MKL's small-M GEMM costs a
matrix-vector product per row, the template streams the weight once. Elsewhere (an accelerator, a
CPU without the template), ``gemm: "stock"`` and one of :data:`COMPILED_KERNELS` measured here.
"""

from __future__ import annotations

import bisect
import statistics
import time
import weakref
from collections.abc import Collection, Mapping
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "COMPILED_GEMMS",
    "COMPILED_KERNELS",
    "cpp_gemm_available",
    "choose_compiled_kernels",
    "compiled_kernels",
    "KERNELS",
    "ROWS",
    "KERNEL_MARGIN",
    "choose_linear_kernels",
    "linear_kernel_choice",
    "packing_available",
    "use_linear_kernels",
]

#: the formulations a linear layer may dispatch to
KERNELS = ("linear", "transposed", "packed")
#: the row counts the choice is measured at: every count a draft tree usually has, then buckets
ROWS = (*range(1, 17), 24, 32, 64)
#: another kernel must be this much faster (median) than stock ``F.linear`` to be chosen: a choice
#: within noise would only add a dispatch
KERNEL_MARGIN = 0.9

#: the formulations a compiled forward may use: one for every row count (see the module docstring)
COMPILED_KERNELS = ("linear", "transposed")
#: how a compiled forward's GEMMs are made: ATen's kernels (``"stock"``), or inductor's C++ template
#: measured against them at compile time with the weights frozen in (``"autotune"``, CPUs)
COMPILED_GEMMS = ("stock", "autotune")
#: a model's compiled formulation where none was measured: stock, one graph (one-node trees padded)
_DEFAULT_COMPILED = {"kernel": "linear", "one_node": False, "gemm": "stock"}

#: module -> (packed weight, (dtype, data pointer, version) of the weight it was packed from)
_PACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PACKING: dict[torch.dtype, bool] = {}


def _packed_product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W^T (+ bias)`` through oneDNN, ``packed`` being ``W`` reordered by
    ``torch.ops.mkldnn._reorder_linear_weight``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def packing_available(dtype: torch.dtype) -> bool:
    """Whether this torch build runs oneDNN's packed inner product on CPU tensors of ``dtype``."""
    if dtype not in _PACKING:
        try:
            w = torch.ones(4, 8, dtype=dtype)
            packed = torch.ops.mkldnn._reorder_linear_weight(w)
            out = _packed_product(torch.ones(2, 8, dtype=dtype), packed)
            _PACKING[dtype] = bool(torch.allclose(out.float(), torch.full((2, 4), 8.0)))
        except (RuntimeError, AttributeError, NotImplementedError):
            _PACKING[dtype] = False
    return _PACKING[dtype]


def _packed_weight(module: nn.Linear) -> torch.Tensor:
    weight = module.weight
    stamp = (weight.dtype, weight.data_ptr(), weight._version)
    entry = _PACKED.get(module)
    if entry is None or entry[1] != stamp:
        with torch.inference_mode(False):  # kept across calls, whichever mode made it (decoding_mode)
            entry = (torch.ops.mkldnn._reorder_linear_weight(weight.detach()), stamp)
        _PACKED[module] = entry
    return entry[0]


def _grid_row(m: int) -> int:
    """The measured row count whose choice ``m`` rows take: ``m`` itself, the next one up, or the last."""
    i = bisect.bisect_left(ROWS, m)
    return ROWS[min(i, len(ROWS) - 1)]


def _transposed(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    out = (module.weight @ flat.T).T  # [m, out]: W @ x^T
    if module.bias is not None:
        out = out + module.bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _dispatch_linear(
    module: nn.Linear, table: Mapping[int, str], compiled: str, x: torch.Tensor
) -> torch.Tensor:
    if torch.compiler.is_compiling():
        # one formulation for every size (traced once: the row count is symbolic in the graph)
        return _transposed(module, x) if compiled == "transposed" else F.linear(x, module.weight, module.bias)
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    kernel = table.get(m if m in table else _grid_row(m), "linear")
    weight = module.weight
    if (
        kernel == "linear"
        or x.dtype != weight.dtype
        or x.device.type != "cpu"
        or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    ):
        return F.linear(x, weight, module.bias)
    if kernel == "packed":
        x = x if x.is_contiguous() else x.contiguous()
        return _packed_product(x, _packed_weight(module), module.bias)
    return _transposed(module, x)  # the faster kernel for these m rows


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
    model: nn.Module, rows: tuple[int, ...] = ROWS, repeats: int = 30
) -> dict[int, str]:
    """``{rows: kernel}`` for the row counts at which a kernel of :data:`KERNELS` beats stock
    ``F.linear`` by :data:`KERNEL_MARGIN` on this machine for ``model``'s largest linear layer
    below the head (its weight shape and dtype; the MLP projections dominate a decoder layer's time).
    Counts where ``F.linear`` is best are left out. CPU models only (an accelerator's GEMM has no
    such small-M gap): empty elsewhere."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears or linears[0].weight.device.type != "cpu":
        return {}
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    body = [m for m in linears if m is not head] or linears
    weight = max(body, key=lambda m: m.weight.numel()).weight.detach()
    packed = torch.ops.mkldnn._reorder_linear_weight(weight) if packing_available(weight.dtype) else None
    chosen = {}
    for m in rows:
        x = torch.randn(m, weight.shape[1], dtype=weight.dtype)
        times = {
            "linear": _time(lambda x=x: F.linear(x, weight), repeats),
            "transposed": _time(lambda x=x: (weight @ x.T).T, repeats),
        }
        if packed is not None:
            times["packed"] = _time(lambda x=x: _packed_product(x, packed), repeats)
        best = min(times, key=times.get)
        if best != "linear" and times[best] < KERNEL_MARGIN * times["linear"]:
            chosen[int(m)] = best
    return chosen


def use_linear_kernels(
    model: nn.Module, choice: Mapping[int, str] | Collection[int], compiled: Mapping | None = None
) -> nn.Module:
    """Make every ``nn.Linear`` of ``model`` dispatch on its input's row count: ``choice`` maps row
    counts to a kernel of :data:`KERNELS` (a plain collection of counts means ``"transposed"``);
    other counts take ``F.linear``; empty restores plain ``F.linear``. ``compiled``: the formulation
    a compiled forward takes (:func:`choose_compiled_kernels`; None: stock, one graph). Returns
    ``model``."""
    table = dict(choice) if isinstance(choice, Mapping) else dict.fromkeys(choice, "transposed")
    table = {int(m): str(k) for m, k in table.items() if k != "linear"}
    unknown = sorted(set(table.values()) - set(KERNELS))
    if unknown:
        raise ValueError(f"unknown linear kernel(s) {unknown}; the kernels are {list(KERNELS)}")
    plan = {**_DEFAULT_COMPILED, **(compiled or {})}
    if plan["kernel"] not in COMPILED_KERNELS:
        raise ValueError(
            f"unknown compiled linear kernel {plan['kernel']!r}; a compiled forward takes {list(COMPILED_KERNELS)}"
        )
    if plan["gemm"] not in COMPILED_GEMMS:
        raise ValueError(f"unknown compiled GEMM {plan['gemm']!r}; the choices are {list(COMPILED_GEMMS)}")
    plan = {"kernel": str(plan["kernel"]), "one_node": bool(plan["one_node"]), "gemm": str(plan["gemm"])}
    first = next(model.parameters(), None)
    if "packed" in table.values() and first is not None and not packing_available(first.dtype):
        table = {m: k for m, k in table.items() if k != "packed"}
    for module in model.modules():
        if isinstance(module, nn.Linear):
            _PACKED.pop(module, None)
            if table or plan["kernel"] != "linear":
                module.forward = partial(_dispatch_linear, module, table, plan["kernel"])
            else:
                module.__dict__.pop("forward", None)
    model.linear_kernels = {
        k: sorted(m for m, v in table.items() if v == k) for k in KERNELS[1:] if k in table.values()
    }
    model.compiled_kernels = plan
    return model


def compiled_kernels(model: nn.Module) -> dict:
    """``{"kernel", "one_node", "gemm"}``: the formulation ``model``'s compiled forward takes, whether
    a one-node tree gets a graph of its own and how its GEMMs are made (:func:`choose_compiled_kernels`;
    stock and padded where none was chosen)."""
    return {**_DEFAULT_COMPILED, **getattr(model, "compiled_kernels", {})}


def cpp_gemm_available(device: torch.device | str = "cpu") -> bool:
    """Whether inductor's C++ GEMM template can serve a compiled forward on ``device``: a CPU with a
    vector ISA inductor generates code for (AVX2, AVX512, ...; ``ATEN_CPU_CAPABILITY`` is honoured)."""
    if torch.device(device).type != "cpu":
        return False
    try:
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        return bool(pick_vec_isa())
    except (ImportError, RuntimeError, OSError):
        return False


def _sweep(weights: list[torch.Tensor], rows: int, kernel: str) -> float:
    """Seconds of one pass of ``rows`` rows through every weight in turn, as a forward reads them."""
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=w.dtype) for w in weights}
    start = time.perf_counter()
    for w in weights:
        x = inputs[w.shape[1]]
        if kernel == "transposed":
            w @ x.T  # the product; its transpose is a view
        else:
            F.linear(x, w)
    return time.perf_counter() - start


@torch.no_grad()
def choose_compiled_kernels(model: nn.Module, rows: tuple[int, ...] = (2, 8, 16), repeats: int = 5) -> dict:
    """The compiled forward's plan: where inductor's C++ GEMM template runs (:func:`cpp_gemm_available`),
    ``gemm: "autotune"`` (inductor measures each GEMM when it compiles). Otherwise the formulation of
    :data:`COMPILED_KERNELS` with which passes over all of ``model``'s weights
    (every ``nn.Linear``, head included) at ``rows`` rows take least time summed (another than
    ``"linear"`` only when :data:`KERNEL_MARGIN` faster), and ``one_node``: whether a one-row pass
    costs less than 0.9 of a two-row one in it (then a one-node tree gets a graph of its own rather
    than a dummy second node). Interleaved, medians; a few seconds. CPU models only (stock, padded,
    elsewhere)."""
    weights = [m.weight.detach() for m in model.modules() if isinstance(m, nn.Linear)]
    if not weights or weights[0].device.type != "cpu":
        return dict(_DEFAULT_COMPILED)
    if cpp_gemm_available(weights[0].device):
        # inductor measures every GEMM itself at compile time (module docstring); F.linear is the
        # pattern its template takes, and two rows cost about one there, so one-node trees are padded
        return {"kernel": "linear", "one_node": False, "gemm": "autotune"}
    times: dict[tuple[str, int], list[float]] = {}
    sizes = tuple(sorted({1, 2, *rows}))
    for r in range(repeats + 1):
        for kernel in COMPILED_KERNELS:
            for m in sizes:
                elapsed = _sweep(weights, m, kernel)
                if r:  # the first pass warms
                    times.setdefault((kernel, m), []).append(elapsed)
    med = {k: statistics.median(v) for k, v in times.items()}
    total = {k: sum(med[(k, m)] for m in rows) for k in COMPILED_KERNELS}
    kernel = "transposed" if total["transposed"] < KERNEL_MARGIN * total["linear"] else "linear"
    return {"kernel": kernel, "one_node": med[(kernel, 1)] < 0.9 * med[(kernel, 2)], "gemm": "stock"}


def linear_kernel_choice(model: nn.Module) -> dict[str, list[int]]:
    """``{kernel: row counts}`` that ``model``'s linear layers compute with a kernel other than
    ``F.linear`` ({}: none)."""
    return {k: list(v) for k, v in getattr(model, "linear_kernels", {}).items()}
