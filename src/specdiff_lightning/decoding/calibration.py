"""Measuring the machine: the verifier's forward cost over n new tokens, cached per machine.

:func:`measure_cost_model` times forwards over ``n`` new tokens through a tree mask after a KV cache
of a few context lengths, repeated and interleaved (every size in turn within a repeat, so a machine
that speeds up or slows down shifts all sizes alike), medians made non-decreasing in n. It takes
seconds. :func:`cost_model_for` memoises it in the process and caches it on disk per (machine, model,
dtype, device), written atomically; a file that is corrupt, of another version, or measured for
another key is rebuilt, and so is one the machine now beats (:func:`stale_step`): a calibration
measured while another process shared the cores, or on a slower host of the same CPU model, would
otherwise choose the dtype and the trees of every later process. :func:`machine_info` says what the
machine is (the CPU's model and the flags that decide its kernels).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import statistics
import time
import warnings
from pathlib import Path

import torch
from torch import nn

from ..paths import atomic_write, cache_root
from .costmodel import COST_MODEL_VERSION, CostModel, isotonic
from .kernels import (
    choose_compiled_kernels,
    choose_linear_kernels,
    compiled_kernels,
    linear_kernel_choice,
    use_linear_kernels,
)
from .timing import now

__all__ = [
    "machine_info",
    "native_bf16",
    "calibration_key",
    "calibration_dir",
    "measure_cost_model",
    "cost_model_for",
    "load_cost_model",
    "save_cost_model",
    "fastest_dtype",
    "in_fastest_dtype",
    "dtype_request_cost",
    "compiled_candidates",
    "COMPILED_DTYPE_MARGIN",
    "prepare_kernels",
    "slower_than_plain",
    "slowdown_text",
    "warn_if_slower_than_plain",
    "SlowerThanPlainWarning",
    "check_dtype_runs",
    "stale_step",
    "DEFAULT_NODES",
    "STALE_FACTOR",
    "RECHECK_FACTOR",
    "DEFAULT_CONTEXTS",
    "COMPILED_CONTEXTS",
    "DTYPE_TREE_NODES",
    "COMPILED_DTYPE_TREE_NODES",
    "DTYPE_NEW_TOKENS",
    "DTYPE_TOKENS_PER_ROUND",
]

DEFAULT_NODES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
DEFAULT_CONTEXTS = (64, 512)
#: a compiled forward's contexts (each in a static cache that holds it and the largest tree, as a
#: decode's does; the cache's length is a dynamic dimension of the graph, so none compiles another)
COMPILED_CONTEXTS = (64, 384)
#: CPU flags that decide which kernels torch runs (bf16 matrix units or emulation)
_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_vnni", "avx_vnni")
#: environment variables that change the kernels torch picks (the AVX2 emulation sets them)
_KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
#: a cached cost model whose one-token step is this many times what the machine takes now is
#: rebuilt (:func:`stale_step`). Timing noise only ever adds, so the machine's fastest step now
#: bounds its true cost from above: a cached figure far over it was measured slower than the machine
#: is (measured: a bf16 step cached at 112 ms, taken while another process ran, against 29 ms
#: unloaded, made ``dtype="auto"`` pick float32, whose compiled step is 1.4x bf16's there)
STALE_FACTOR = 1.3
#: a measurement just taken is measured again where the machine's step now beats its own by this
#: factor (more than :data:`STALE_FACTOR`: a measurement's median against the fastest of a few steps
#: taken at once read 1.3x for a tiny model on a quiet machine; the slowed one that made this check
#: read 2.7x)
RECHECK_FACTOR = 2.0
#: one-token forwards :func:`stale_step` times (after one that warms)
STALE_REPEATS = 3
#: the format of a cached kernel choice (4: the compiled plan says how its GEMMs are made; 3: with
#: the compiled forward's formulation; 2: ``{rows: kernel}`` with packed weights; 1 held the rows of
#: ``W @ x^T`` only; older ones are measured again)
KERNEL_CHOICE_VERSION = 4

_MEMO: dict[str, CostModel] = {}


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset[str]]:
    """The CPU's model name (with its x86 family and model numbers: a VM may name a Zen 1 and a
    Zen 4 both "AMD EPYC") and flags (read once: every cost-model look-up keys on them)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model, frozenset(flags)
    numbers: dict[str, str] = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name == "model name" and value.strip():
            model = value.strip()
        elif name in ("cpu family", "model") and value.strip():
            numbers.setdefault(name, value.strip())
        elif name in ("flags", "Features") and not flags:
            flags = set(value.split())
    if len(numbers) == 2:
        model = f"{model} (family {numbers['cpu family']} model {numbers['model']})"
    return model, frozenset(flags)


def machine_info(device: torch.device | str = "cpu") -> dict:
    """What decides the speed here: the CPU model and its kernel-relevant flags, torch's CPU kernel
    level, threads, kernel-selecting environment variables and, on a GPU, its name."""
    model, flags = _cpuinfo()
    info = {
        "cpu": model,
        "cpu_flags": [f for f in _FLAGS if f in flags],
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__.split("+")[0],
        "env": {k: os.environ[k] for k in _KERNEL_ENV if k in os.environ},
    }
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def native_bf16(machine: dict | None = None) -> bool:
    """Whether a CPU's torch kernels multiply bf16 in hardware (AVX512-BF16 or AMX, and torch's
    kernel level not capped below AVX512, as the AVX2 emulation caps it); elsewhere bf16 products
    are emulated, and slower than float32 ones as soon as a forward has more than a few rows (a
    Zen 3, batched greedy generation of SmolLM2: float32 wrote 3.1x bf16's tokens a second at
    batch 8, 4.9x at 32). ``machine``: a :func:`machine_info` record (a report's; one without the
    kernel level is judged by its flags); None: this machine's."""
    machine = machine_info() if machine is None else machine
    flags = set(machine.get("cpu_flags", ()))
    level = str(machine.get("cpu_capability", "AVX512"))
    return bool(flags & {"avx512_bf16", "amx_bf16"}) and level.startswith("AVX512")


def _model_id(model: nn.Module) -> dict:
    config = model.config
    return {
        "name": str(getattr(config, "_name_or_path", "") or type(model).__name__),
        "class": type(model).__name__,
        "layers": int(getattr(config, "num_hidden_layers", 0)),
        "hidden": int(getattr(config, "hidden_size", 0)),
        "heads": int(getattr(config, "num_attention_heads", 0)),
        "kv_heads": int(getattr(config, "num_key_value_heads", 0) or 0),
        "vocab": int(getattr(config, "vocab_size", 0)),
        "attention": str(getattr(config, "_attn_implementation", "")),
        "linear_kernels": linear_kernel_choice(model),
        "compiled_kernels": compiled_kernels(model),
    }


def calibration_key(model: nn.Module, dtype: torch.dtype | None = None, compiled: bool = False) -> dict:
    """What a cost model is valid for: this machine, this model's shape, its dtype (or ``dtype``:
    the key the model would have in it), device and forward (eager, or ``compiled`` over a static
    cache: :mod:`.compiled`)."""
    param = next(model.parameters())
    return {
        "machine": machine_info(param.device),
        "model": _model_id(model),
        "dtype": str(dtype or param.dtype).removeprefix("torch."),
        "device": param.device.type,
        "forward": "compiled" if compiled else "eager",
        "version": COST_MODEL_VERSION,
    }


def _key_hash(key: dict) -> str:
    return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def calibration_dir() -> Path:
    """``$SPECDIFF_CALIBRATION_DIR`` or ``<cache root>/calibration``."""
    return Path(os.environ.get("SPECDIFF_CALIBRATION_DIR", cache_root() / "calibration"))


def _path(key: dict, directory: Path | None) -> Path:
    compiled = "-compiled" if key.get("forward") == "compiled" else ""
    return (directory or calibration_dir()) / f"{key['dtype']}{compiled}-{_key_hash(key)}.json"


def _write_json(path: Path, data: dict) -> Path:
    """Write ``data`` as JSON atomically (:func:`~specdiff_lightning.paths.atomic_write`)."""
    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(data, indent=1)))
    return path


def save_cost_model(model: CostModel, path: str | os.PathLike) -> Path:
    """Write ``model`` as JSON atomically (a temporary file renamed into place)."""
    return _write_json(Path(path), model.to_dict())


def load_cost_model(path: str | os.PathLike, key: dict | None = None) -> CostModel | None:
    """The cost model in ``path``, or None when it is missing, corrupt, of another version or (with
    ``key``) measured for another machine, model, dtype or device."""
    try:
        model = CostModel.from_dict(json.loads(Path(path).read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        warnings.warn(f"calibration file {path} is unreadable ({err}); measuring again", stacklevel=2)
        return None
    if key is not None and model.key != key:
        return None
    return model


def _forward(state, n: int, gen: torch.Generator) -> float:
    """Seconds of one forward over ``n`` new tokens (a chain: a tree mask of the same size costs the
    same) through the verifier ``state`` the loop would use; the tree is dropped again."""
    from .tree import build_tree

    device = next(state.model.parameters()).device
    drafts = torch.randint(0, int(state.model.config.vocab_size), (1, n - 1), generator=gen).to(device)
    tree = build_tree(state.pending, drafts)
    start = now(device)
    state.score(tree)
    elapsed = now(device) - start
    state.discard(tree)
    return elapsed


def measure_cost_model(
    model: nn.Module,
    nodes: tuple[int, ...] = DEFAULT_NODES,
    contexts: tuple[int, ...] | None = None,
    repeats: int = 3,
    seed: int = 0,
    compiled: bool = False,
) -> CostModel:
    """Time ``model``'s forward over each of ``nodes`` new tokens after each of ``contexts`` cached
    ones (``repeats`` interleaved passes after one warm-up pass; medians, made non-decreasing in n),
    through the verifier state the decoding loop uses: eager, or ``compiled`` (the warm-up pass
    then compiles its graphs). ``contexts`` None: :data:`DEFAULT_CONTEXTS`, or for a compiled
    forward :data:`COMPILED_CONTEXTS` (within the static cache the decodes use).

    Random token ids stand in for text: the cost depends on shapes, not on which tokens."""
    from .verifier import decoding_mode

    with decoding_mode(compiled):  # the mode the loop's forwards run in
        return _measure_cost_model(model, nodes, contexts, repeats, seed, compiled)


def _state(model: nn.Module, context: int, largest: int, compiled: bool, gen: torch.Generator):
    """The verifier state a decode would score trees through, after ``context`` cached random
    tokens (random ids stand in for text: the cost depends on shapes), with room for ``largest``
    new ones."""
    from .compiled import StaticTreeVerifier
    from .verifier import TreeVerifier

    device = next(model.parameters()).device
    # context + 1 prompt tokens: the cache holds context, the last is the pending root
    ids = torch.randint(0, int(model.config.vocab_size), (1, context + 1), generator=gen).to(device)
    if compiled:
        return StaticTreeVerifier(model, ids, capacity=context + 1 + largest)
    return TreeVerifier(model, ids)


def _measure_cost_model(model, nodes, contexts, repeats, seed, compiled) -> CostModel:
    start = time.perf_counter()
    if contexts is None:
        contexts = COMPILED_CONTEXTS if compiled else DEFAULT_CONTEXTS
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None:
        contexts = tuple(c for c in contexts if c + max(nodes) <= limit) or (max(1, limit - max(nodes)),)
    gen = torch.Generator().manual_seed(seed)
    states = {context: _state(model, context, max(nodes), compiled, gen) for context in contexts}
    times = {(c, n): [] for c in contexts for n in nodes}
    for r in range(repeats + 1):
        for c in contexts:
            for n in nodes:
                elapsed = _forward(states[c], n, gen)
                if r:  # the first pass warms kernels and allocator (and compiles)
                    times[(c, n)].append(elapsed)
    table = [isotonic([statistics.median(times[(c, n)]) * 1e3 for n in nodes]) for c in contexts]
    return CostModel(
        list(nodes),
        list(contexts),
        table,
        calibration_key(model, compiled=compiled),
        seconds=time.perf_counter() - start,
    )


def cost_model_for(
    model: nn.Module,
    *,
    directory: str | os.PathLike | None = None,
    refresh: bool = False,
    compiled: bool = False,
    check_stale: bool = True,
    **measure,
) -> CostModel:
    """The cost model of ``model`` on this machine: from this process's memo, else the disk cache,
    else measured now (seconds; a ``compiled`` forward's first measurement compiles it, minutes on a
    cold inductor cache) and cached. ``refresh``: measure again whatever is cached.
    ``check_stale=False`` reads a cached file without timing ``model`` against it
    (:func:`stale_step`), which for a ``compiled`` forward would compile it: for comparing the
    dtypes a model is not going to decode in. Such a read is not memoised, so the model that does
    decode is checked when it asks."""
    key = calibration_key(model, compiled=compiled)
    path = _path(key, Path(directory) if directory is not None else None)
    # memoised by the file (its name holds the key's hash), not the key alone: the directory
    # ($SPECDIFF_CALIBRATION_DIR) may change within a process
    memo = str(path)
    if not refresh and memo in _MEMO:
        return _MEMO[memo]
    cost = None if refresh else load_cost_model(path, key)
    if cost is not None and not check_stale:
        return cost
    if cost is not None:
        stale = stale_step(cost, model, compiled=compiled)
        if stale is not None:
            warnings.warn(f"calibration file {path}: {stale}; measuring again", stacklevel=2)
            cost = None
    if cost is None:
        cost = _measured(model, compiled, measure)
        try:
            save_cost_model(cost, path)
        except OSError as err:  # a read-only home: measuring each process is slower, not wrong
            warnings.warn(f"could not cache the calibration in {path} ({err})", stacklevel=2)
    _MEMO[memo] = cost
    return cost


def _measured(model: nn.Module, compiled: bool, measure: dict) -> CostModel:
    """A new measurement of ``model``'s cost model, checked at once against the machine
    (:func:`stale_step`): one whose step the machine now beats by :data:`RECHECK_FACTOR` was slowed
    while it ran, and is measured once more. Caching it would set every later process's dtype and
    trees until a reader found it stale (measured: an emulated demo's first compiled float32
    measurement gave a 112 ms step where the machine took 42, and its dtype choice was made on it)."""
    cost = measure_cost_model(model, compiled=compiled, **measure)
    slowed = stale_step(cost, model, compiled=compiled, factor=RECHECK_FACTOR)
    if slowed is not None:
        warnings.warn(f"the calibration just measured: {slowed}; measuring again", stacklevel=3)
        cost = measure_cost_model(model, compiled=compiled, **measure)  # kept: a second try at most
    return cost


@torch.no_grad()
def stale_step(
    cost: CostModel, model: nn.Module, compiled: bool = False, factor: float = STALE_FACTOR
) -> str | None:
    """Why ``cost`` (read from the disk cache, or just measured: :func:`_measured`) does not
    describe this machine, or None when it does: the fastest of :data:`STALE_REPEATS` one-token forwards of ``model`` now, at the cost
    model's shortest context, through the same verifier state (eager or ``compiled``), is
    ``factor`` (:data:`STALE_FACTOR`) times faster than the cached step. Milliseconds of model time (a
    compiled forward must have compiled; it would on first use anyway).

    Only a cache slower than the machine is stale. One faster than the machine is now may be right
    with the machine busy at this moment, and measuring it again then would record the load."""
    from .verifier import decoding_mode

    context = min(cost.contexts)
    gen = torch.Generator().manual_seed(0)
    with decoding_mode(compiled):
        state = _state(model, context, max(cost.nodes), compiled, gen)  # the measured cache length
        _forward(state, 1, gen)  # warms, as the measurement's first pass does
        now_ms = min(_forward(state, 1, gen) for _ in range(STALE_REPEATS)) * 1e3
    cached = cost.step_cost(context)
    if cached <= factor * now_ms:
        return None
    return (
        f"its one-token step ({cached:.1f} ms at {context} tokens) is {cached / now_ms:.1f}x what this machine "
        f"takes now ({now_ms:.1f} ms): it was measured while the machine was busy, or on a slower host"
    )


#: the tree size of an eager round in the request :func:`dtype_request_cost` prices (a one-token
#: step alone would mislead where bf16 is emulated: its step is faster, its multi-token forwards far
#: slower)
DTYPE_TREE_NODES = 8
#: the same for a compiled round, which verifies smaller trees: its one-token step is about half
#: the eager one, so each node costs twice as many steps and tree: auto stops sooner; without AMX,
#: inductor's bf16 GEMMs turn compute-bound beyond 4 rows (a 5-node tree cost 1.75x a 4-node one
#: on Zen 4, docs/results.md stop 39), so compiled rounds there verify 4 nodes or fewer
COMPILED_DTYPE_TREE_NODES = 4
#: the context length at which dtypes are compared, and the prompt of the priced request
DTYPE_CONTEXT = 256
#: the priced request's new tokens and the tokens a round adds (the shipped drafter's rounds
#: add 2.1-3.6, docs/results.md; plain decoding's 1)
DTYPE_NEW_TOKENS = 128
DTYPE_TOKENS_PER_ROUND = 2.0


def dtype_request_cost(eager: CostModel, compiled: CostModel | None = None) -> float:
    """What decides the fastest dtype: milliseconds of a typical request in the dtype of ``eager``
    (its eager forward's cost model): the prefill of a :data:`DTYPE_CONTEXT`-token prompt, which
    runs eagerly in both forwards (a compiled prefill would compile once per prompt length), then
    :data:`DTYPE_NEW_TOKENS` new tokens in rounds of :data:`DTYPE_TOKENS_PER_ROUND`, each a tree's
    forward (:data:`DTYPE_TREE_NODES` nodes) or, given the ``compiled`` forward's cost model, a
    compiled one's (:data:`COMPILED_DTYPE_TREE_NODES`).

    The prefill matters where bf16 is emulated (AVX2-only CPUs): there the compiled bf16 forward
    verifies a round faster than float32's while its eager prefill, compute-bound, costs several
    times float32's, and a request of a 256-token prompt and 128 new tokens is slower in bf16
    (docs/results.md stop 40)."""
    prefill = eager.verifier_cost(DTYPE_CONTEXT, min(eager.contexts))
    forward, nodes = (compiled, COMPILED_DTYPE_TREE_NODES) if compiled else (eager, DTYPE_TREE_NODES)
    rounds = DTYPE_NEW_TOKENS / DTYPE_TOKENS_PER_ROUND
    return prefill + rounds * forward.verifier_cost(nodes, DTYPE_CONTEXT)


#: a dtype whose eager request (:func:`dtype_request_cost`) prices at least this many times the
#: cheapest dtype's is not compiled to be compared: compiling a verifier costs minutes on 2 cores, and
#: compiling has never moved the ratio of two dtypes' prices that far. bf16's price over float32's,
#: eager -> compiled, in every demo run that measured both (docs/results.md stops 40-44): Zen 4
#: 0.74 -> 0.69, emulated 1.76 -> 1.83; AMX Xeon (model 207) 0.83 -> 0.60, emulated 2.12 -> 2.36,
#: 1.74 -> 1.78, 2.08 -> 2.26; AMX Xeon (model 167) emulated 1.39 -> 1.74 (stop 44, measured again in
#: a second process: the demo's own measurement ran slow, a 112 ms float32 step against 42). The
#: largest move, 1.38x (in bf16's favour), is under this margin. Most emulated bf16 prices are over
#: it; model 167's emulated 1.39 is not, and both dtypes are compiled there
COMPILED_DTYPE_MARGIN = 1.6


def compiled_candidates(eager_prices: dict) -> list:
    """The keys of ``eager_prices`` (dtype -> a request's eager price, :func:`dtype_request_cost`)
    worth compiling to compare their compiled forwards: those priced under
    :data:`COMPILED_DTYPE_MARGIN` times the cheapest, the cheapest always among them, in order."""
    cheapest = min(eager_prices.values())
    return [
        d
        for d, price in eager_prices.items()
        if price == cheapest or price < COMPILED_DTYPE_MARGIN * cheapest
    ]


def check_dtype_runs(dtype: torch.dtype, device: torch.device | str) -> None:
    """Raise a clear ``ValueError`` when ``device`` cannot run matrix products in ``dtype``."""
    device = torch.device(device)
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ValueError(
            f"this GPU ({torch.cuda.get_device_name(device)}) cannot run bfloat16; use dtype='float16', "
            f"'float32' or 'auto'"
        )
    try:
        a = torch.ones(2, 2, dtype=dtype, device=device)
        (a @ a).sum().item()
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"{device.type} cannot run {str(dtype).removeprefix('torch.')} here ({err}); use 'float32' or 'auto'"
        ) from None


def fastest_dtype(
    model: nn.Module, candidates: tuple[torch.dtype, ...] | None = None, compiled: bool = False
) -> torch.dtype:
    """The dtype in which ``model`` decodes a typical request fastest on this machine:
    :func:`in_fastest_dtype`'s choice, without keeping the cast copy."""
    return next(in_fastest_dtype(model, candidates, compiled).parameters()).dtype


def in_fastest_dtype(
    model: nn.Module, candidates: tuple[torch.dtype, ...] | None = None, compiled: bool = False
) -> nn.Module:
    """``model`` in the dtype that decodes a typical request fastest on this machine: ``model``
    itself, or the cast copy (linear kernels prepared, :func:`prepare_kernels`) that was measured
    to choose it.

    On a CPU: float32 or bfloat16, compared by the time of a typical request their cost models
    predict (:func:`dtype_request_cost`: an eager prefill, then rounds of small trees), cached;
    the first call measures each dtype on a cast copy. ``compiled``: the rounds are priced by the
    compiled forward's cost models, the forward a compiled decode runs, which can differ from the
    eager one's in which dtype is faster. Measuring a compiled forward compiles it (minutes, once per
    machine and dtype), so only the dtypes :func:`compiled_candidates` leaves are compared (one left
    is returned unmeasured); later processes read the cached cost models without compiling the dtype
    they do not decode in. On a GPU: bfloat16 where supported, else float16, unmeasured (float32
    decodes slower on every GPU this project targets)."""
    device = next(model.parameters()).device
    if device.type == "cuda":
        # cast in place, not copied as in_dtype does: a GPU's verifier may not fit twice
        chosen = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return model if chosen == next(model.parameters()).dtype else prepare_kernels(model.to(chosen))
    candidates = candidates or (torch.float32, torch.bfloat16)
    copies = {dtype: in_dtype(model, dtype) for dtype in candidates}
    eager = {dtype: cost_model_for(copy) for dtype, copy in copies.items()}
    costs = {dtype: dtype_request_cost(cost) for dtype, cost in eager.items()}
    if not compiled:
        return copies[min(costs, key=costs.get)]
    # only the dtypes the eager prices leave in the running are compiled to be compared; one left
    # is chosen unmeasured (its decode compiles and measures it, with no other dtype's graphs around)
    costs = {dtype: costs[dtype] for dtype in compiled_candidates(costs)}
    if len(costs) == 1:
        return copies[next(iter(costs))]
    compiled_here = False
    for dtype in costs:
        candidate = copies[dtype]
        # a compiled forward's cached file is read unchecked: checking times the forward, which
        # would compile a dtype this process may not decode in (the chosen one is checked when
        # its decode asks for the cost model)
        compiled_here |= load_cost_model(_path(calibration_key(candidate, compiled=True), None)) is None
        fast = cost_model_for(candidate, compiled=True, check_stale=False)
        costs[dtype] = dtype_request_cost(eager[dtype], fast)
    if compiled_here:
        # Measured here, the graphs of every dtype stay in dynamo's cache of the forward they share
        # (their module guards are skipped: compiled.compiled_forward). A process that went on to
        # decode with them ran 71-77 tok/s where a fresh one ran 121 (stop 40): start clean, and
        # let the chosen model compile again for its decode (once per machine, at first use).
        # Keeping the chosen dtype's measured graphs instead (reset before the other dtype's
        # compile only) was worse on the AMX Xeon (stop 42): its first call still compiled, 503 s
        # against 263, and it then decoded 78-83 tok/s against 100-103
        torch._dynamo.reset()
    return copies[min(costs, key=costs.get)]


def in_dtype(model: nn.Module, dtype: torch.dtype, prepare: bool = True) -> nn.Module:
    """``model`` itself where its parameters are in ``dtype``; else a cast copy, its linear kernels
    chosen for that dtype (:func:`prepare_kernels`) unless ``prepare`` is false. The copy is what a
    cost model in ``dtype`` measures and what decodes in it, so the two agree on kernels."""
    import copy

    if next(model.parameters()).dtype == dtype:
        return model
    cast = copy.deepcopy(model).to(dtype)
    return prepare_kernels(cast) if prepare else cast


def prepare_kernels(model: nn.Module) -> nn.Module:
    """``model`` with the linear kernels measured fastest here for its dtype
    (:func:`~.kernels.choose_linear_kernels`) and the formulation its compiled forward takes
    (:func:`~.kernels.choose_compiled_kernels`), the choice cached on disk beside the cost models so
    every process makes the same one (and so reads the same cost model). Returns ``model``."""
    use_linear_kernels(model, set())
    key = calibration_key(model)
    path = (calibration_dir()) / f"kernels-{key['dtype']}-{_key_hash(key)}.json"
    choice = compiled = None
    try:
        data = json.loads(path.read_text())
        if data.get("key") == key and data.get("version") == KERNEL_CHOICE_VERSION:
            choice = {int(m): str(k) for m, k in data["kernels"].items()}
            compiled = {
                "kernel": str(data["compiled"]["kernel"]),
                "one_node": bool(data["compiled"]["one_node"]),
                "gemm": str(data["compiled"]["gemm"]),
            }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        choice = None  # missing, corrupt, another model's or an older format's: measure again
    if choice is None or compiled is None:
        choice, compiled = choose_linear_kernels(model), choose_compiled_kernels(model)
        try:
            data = {"key": key, "version": KERNEL_CHOICE_VERSION, "kernels": choice, "compiled": compiled}
            _write_json(path, data)
        except OSError as err:
            warnings.warn(f"could not cache the kernel choice in {path} ({err})", stacklevel=2)
    return use_linear_kernels(model, choice, compiled)


class SlowerThanPlainWarning(UserWarning):
    """Speculative decoding ran slower than plain decoding of the same verifier on this machine."""


def slowdown_text(factor: float) -> str:
    """``"1.32x slower"`` for a decode ``factor`` times slower than another; under 1.005 the percentage
    (``"0.3% slower"``), which two decimals of the ratio would print as a self-contradictory "1.00x"."""
    if factor < 1.005:
        return f"{(factor - 1) * 100:.1f}% slower"
    return f"{factor:.2f}x slower"


def slower_than_plain(
    tokens_per_s: float,
    verifier: nn.Module,
    context: int,
    mean_accepted: float | None = None,
    *,
    plain_tokens_per_s: float | None = None,
    tree_auto: bool = False,
) -> str | None:
    """A sentence saying by how much a decode at ``tokens_per_s`` (around ``context`` tokens) was
    slower than plain decoding here, and the likely cause; None when it was not.

    Plain decoding's speed is ``plain_tokens_per_s`` where the run measured it on the same prompt
    (a busy machine slows both alike), else the calibrated one: one token per measured one-token
    step (the cost model is measured on first use, :func:`cost_model_for`). ``tree_auto``: the
    decode already sized its rounds for this machine, so the advice is not to turn that on."""
    if not tokens_per_s or tokens_per_s != tokens_per_s:  # 0 or NaN: nothing measured
        return None
    cost = cost_model_for(verifier)
    measured = bool(plain_tokens_per_s) and plain_tokens_per_s == plain_tokens_per_s
    plain = plain_tokens_per_s if measured else 1e3 / cost.step_cost(context)
    if tokens_per_s >= plain:
        return None
    rel = cost.relative(context)
    tree = rel.get(8) or cost.verifier_cost(8, context) / cost.step_cost(context)
    if mean_accepted is not None and mean_accepted < 0.5:
        cause = (
            f"the drafts are rarely accepted ({mean_accepted:.2f} draft tokens per verifier call), while a "
            f"tree of 8 nodes costs {tree:.2f} one-token steps here"
        )
    else:
        cause = f"multi-token forwards are costly here (8 tokens: {tree:.2f} steps; {cost.key.get('dtype')})"
    against = "plain decoding of the same prompt" if measured else "plain decoding's calibrated"
    advice = (
        "tree='auto' already falls back to plain decoding where nothing pays: a better-trained drafter, "
        "or decoding without one, is what helps"
        if tree_auto
        else "use tree='auto' (the default) and dtype='auto', or decode without a drafter"
    )
    return (
        f"speculative decoding ran at {tokens_per_s:.1f} tok/s, {slowdown_text(plain / tokens_per_s)} than "
        f"{against} {plain:.1f} tok/s on this machine; likely cause: {cause}; {advice}"
    )


def warn_if_slower_than_plain(
    tokens_per_s: float,
    verifier: nn.Module,
    context: int,
    mean_accepted: float | None = None,
    **options,
) -> bool:
    """:func:`slower_than_plain` (``options``: its keywords) as a :class:`SlowerThanPlainWarning`;
    whether it warned (a caller warns once per run)."""
    message = slower_than_plain(tokens_per_s, verifier, context, mean_accepted, **options)
    if message is not None:
        warnings.warn(message, SlowerThanPlainWarning, stacklevel=2)  # at the decoding call
    return message is not None
