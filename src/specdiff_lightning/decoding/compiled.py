"""The verifier's tree forward compiled (``torch.compile``) over a static KV cache.

Eager, every round's forward pays the framework around its matrix products: on SmolLM2-135M about
1,500 small aten ops (RMSNorm's casts, rotary halves, adds, copies) and the Python of transformers'
modules, per forward. Plain decoding's strongest peer, ``generate()`` with a static cache and a
compiled forward, does not; where that overhead weighs most (a CPU running AVX2 kernels, an
accelerator at batch 1) the peer's lead over an eager loop is that overhead. This module runs the
loop's forwards the same way: :class:`StaticTreeVerifier` keeps :class:`~.verifier.TreeVerifier`'s
state in transformers' ``StaticCache`` and scores each draft tree through the model's compiled
``forward`` (:func:`compiled_forward`).

What the static cache changes (transformers 5.24): a ``StaticLayer`` writes each forward's keys at
its own running ``cumulative_length``, ignoring ``cache_position``; so before every tree that length
is set back to the committed length, and a commit gathers the accepted nodes to the front and sets
the length, as the dynamic cache's slicing does. Keys past the committed length are stale, never
read: the tree mask spans the whole static length and allows only the committed prefix and the
node's ancestors.

Graphs: one per model, dtype and device, shape-dynamic over 2-64 nodes (the node dimension is
marked dynamic on the first tree, so dynamo does not compile a static graph first). A one-node tree
(plain decoding) is sent as two nodes, the root and a dummy child whose logits are dropped, where
two rows cost no more than one (a graph of its own would cost ~40 s more to compile): always on a
CPU's autotuned plan; on the stock plan, where two rows cost double (float32, ATen's GEMMs, AVX2
kernels) it gets its own graph (:func:`~.kernels.compiled_kernels`). Grouped SDPA
serves every size inside the graph (:data:`~.attention.MAX_GROUPED_QUERIES_COMPILED`); a larger
fixed tree compiles another graph on first use. :func:`warm_compiled` compiles before a timed run
(SmolLM2 on a 2-core Xeon: 54 s with an empty inductor cache; three graphs took 135 s). The prefill
runs eagerly (its length varies per prompt). Compiled kernels are cached on disk by inductor (per
machine: :func:`use_machine_inductor_cache`), so a later process compiles in seconds under the
stock plan; under the autotuned plan (frozen weights) a later process took ~1.5-2 minutes again on
the 2-core Xeon (stop 27, cache warm).

On a CPU the GEMMs are inductor's own (:func:`inductor_options`, plan ``gemm: "autotune"`` of
:func:`~.kernels.choose_compiled_kernels`): the weights are frozen into the graph and each product is
a C++ template generated for its shape, measured against ATen's when the graph compiles. It roughly
halves what a tree of 2-8 nodes costs over one node with AVX2 kernels (float32); compiling takes
longer (SmolLM2 on 2 cores: ~2 minutes cold against ~1 with stock GEMMs; inductor's disk cache
keeps it). Frozen weights are a snapshot: a verifier whose weights change after its forward
compiled is refused (reload it). The template is measured and blocked for the row count of the
graph's first call (a one-node tree as two rows), and larger trees stream the weights once per block
of rows: on a Zen 4 (AVX512-BF16, no AMX) in bf16 an 8-node tree costs 3.3x a step, against 1.16x
eagerly and ~1.2x with frozen weights alone (the cliff fell at 4 nodes in another compile: inductor
times its candidates on the machine), while the smallest trees cost least this way; on AMX the graph
is flat to 16 nodes. ``tree: auto`` reads whichever curve the machine has. A second graph for larger
trees was measured and not adopted: it decoded no faster with the shipped drafter and compiles for
minutes more (docs/results.md, stops 35 and 48; ``scripts/probe_compiled_plan.py``).

Lossless as before: greedy acceptance is exact for any logits the verifier gives, and the compiled
forward *is* the verifier here; in float32 its logits match the eager forward's to rounding (tests
prove greedy identity with the verifier's own ``generate()``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import types
import weakref
from collections.abc import Callable
from contextlib import contextmanager, nullcontext

import torch
from torch import nn

from .attention import to_model_mask
from .kernels import compiled_kernels
from .tree import DraftTree, build_tree
from .verifier import TreeVerifier

__all__ = [
    "StaticTreeVerifier",
    "compile_unavailable",
    "compiled_forward",
    "copy_positions",
    "mark_dynamic",
    "static_addresses_off",
    "warm_compiled",
    "warm_decoding",
    "warm_drafter",
    "use_machine_inductor_cache",
    "cache_capacity",
    "mark_capacity_dynamic",
    "inductor_options",
    "inductor_config",
    "CAPACITY_STEP",
    "WARM_NODES",
]

#: static caches are allocated in whole multiples of this many positions. Every compiled graph takes
#: the cache's length as a dynamic dimension (:func:`mark_capacity_dynamic`), so a length costs no
#: compile; the attention spans the whole cache, so slack costs time (SmolLM2 bf16, one Xeon thread,
#: context 300, one node: 27.9 ms over 384 slots, 28.4 over 512, 30.4 over 1024)
CAPACITY_STEP = 64
#: tree sizes :func:`warm_compiled` runs: the first compiles the one graph, the others check that it
#: serves them (one node, a tree, the largest tree ``tree: auto`` measures)
WARM_NODES = (1, 2, 17, 64)
#: compiled graphs dynamo may keep per function: every compiled model shares transformers' forward
#: wrapper, and each model, dtype and branch is a graph (torch's default, 8, would send the ninth to
#: eager without an error)
RECOMPILE_LIMIT = 64

#: model -> its compiled forward (a weak key: it goes with the model)
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: model or drafter -> seconds :func:`warm_compiled` / :func:`warm_drafter` took for it the first time
_WARMED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compile_unavailable(device: torch.device | str) -> str | None:
    """None where ``torch.compile`` can build kernels for ``device`` here; otherwise why not, with
    the fix. Inductor writes C++ for a CPU (it needs the C++ compiler it searches for, e.g. g++)
    and Triton for a CUDA GPU; a machine without them fails at the first compiled call, deep inside
    inductor, so callers that compile by default (:func:`~specdiff_lightning.load_pair`) ask first."""
    device = torch.device(device)
    if device.type == "cpu":
        from torch._inductor.cpp_builder import get_cpp_compiler

        try:
            get_cpp_compiler()
        except Exception as err:  # inductor's InvalidCxxCompiler, or a broken toolchain probe
            return (
                f"torch.compile needs a C++ compiler for CPU kernels and found none ({type(err).__name__}); "
                f"install one (e.g. `apt install g++`) or set CXX"
            )
        return None
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        return None if has_triton() else "torch.compile needs Triton for CUDA kernels; `pip install triton`"
    return f"compiled decoding runs on CPUs and CUDA GPUs; this verifier is on {device.type}"


def use_machine_inductor_cache() -> None:
    """Keep inductor's compiled kernels apart per machine and kernel level (unless the user chose a
    directory with ``TORCHINDUCTOR_CACHE_DIR``): a kernel compiled for AVX512 crashes (segfault) when
    torch runs AVX2 kernels, as after a change of CPU on a kept machine or under
    ``ATEN_CPU_CAPABILITY=avx2``; measured here.

    inductor writes its default directory into ``TORCHINDUCTOR_CACHE_DIR`` the first time it looks
    it up (importing lightning or peft does), so that value is taken for "not chosen" too."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from ..paths import cache_root
    from .calibration import machine_info

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen is not None and os.path.abspath(chosen) != os.path.abspath(default_cache_dir()):
        return
    info = machine_info()
    tag = hashlib.sha1(json.dumps(info, sort_keys=True).encode()).hexdigest()[:12]
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_root() / "inductor" / f"{info['cpu_capability']}-{tag}")


#: inductor's settings for a plan whose GEMMs inductor makes itself (kernels.COMPILED_GEMMS)
_AUTOTUNE = {
    "freezing": True,
    "max_autotune": True,
    "max_autotune_gemm_backends": "CPP,ATEN",
    # inductor prints every GEMM's candidates, timings and stats to stderr (hundreds of lines); not
    # ours to show
    "autotune_num_choices_displayed": 0,
    "max_autotune_report_choices_stats": False,
}


def inductor_options(model: nn.Module) -> dict:
    """The inductor settings ``model``'s compiled forward compiles under: on a plan with ``gemm:
    "autotune"`` (:func:`~.kernels.compiled_kernels`) the weights are frozen into the graph and every
    GEMM is inductor's C++ template or ATen's, whichever it measures faster; otherwise none."""
    return dict(_AUTOTUNE) if compiled_kernels(model)["gemm"] == "autotune" else {}


@contextmanager
def static_addresses_off(active: bool = True):
    """transformers marks a static cache's tensors as static addresses (for CUDA graphs); inductor's
    freezing takes such inputs for parameters and bakes the first cache's tensors into the graph, so a
    later decode with a new cache would read the old one (measured: logits off by 0.9, no recompile).
    Here (when ``active``: the weights are frozen) they stay plain inputs."""
    if not active:
        yield
        return
    mark = torch._dynamo.mark_static_address
    torch._dynamo.mark_static_address = lambda t, guard=False: None
    try:
        yield
    finally:
        torch._dynamo.mark_static_address = mark


@contextmanager
def inductor_config(model: nn.Module):
    """A context in which inductor compiles ``model``'s forward as :func:`inductor_options` says
    (every call of a compiled forward runs in it: a recompile later must see the same settings),
    and, where weights are frozen, no static cache is marked a static address
    (:func:`static_addresses_off`). The compiled HF peer's ``generate`` runs in it too, so plain
    decoding's denominator gets the same GEMMs."""
    options = inductor_options(model)
    if not options:
        yield
        return
    with torch._inductor.config.patch(options), static_addresses_off():
        yield


def _weights_stamp(model: nn.Module) -> tuple:
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


def _own_forward(model: nn.Module) -> Callable | None:
    """``model.forward`` as a method whose function has a code object of its own, or None where the
    forward is not a plain bound method (a hook library replaced it, say).

    dynamo keeps its compiled graphs on the code object of the frame it compiles, and every model of a
    class shares its ``forward``'s code: graphs of one model are told from another's only by guards
    on the module tree (~9,000 checks for SmolLM2's, 1.6-1.9 ms of a ~20 ms tree forward on a 2-core
    Xeon, measured). With a code object per model, that model's graphs are the only ones dynamo
    looks at for this frame, so the module guards can go (:func:`compiled_forward`)."""
    bound = model.forward
    if not isinstance(bound, types.MethodType) or bound.__self__ is not model:
        return None
    fn = bound.__func__
    own = types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    own.__kwdefaults__ = fn.__kwdefaults__
    own.__dict__.update(fn.__dict__)
    return types.MethodType(own, model)


def compiled_forward(model: nn.Module) -> Callable:
    """``model.forward`` through ``torch.compile`` (memoised per model), shape-dynamic where shapes
    change, compiled under :func:`inductor_config`. Call it under ``torch.no_grad()``, as the
    decoding loops do. Where the plan freezes the weights into the graph, a model whose weights
    changed since is an error (the graph would compute with the old ones).

    The graph is a snapshot of the module tree: its modules, their attributes and hooks are not
    guarded (:func:`_own_forward`: dynamo's guards on them cost about a tenth of a SmolLM2 tree
    forward), so a module changed after compiling (a hook added, a layer swapped) is not seen;
    reload the model, or decode with ``compile=False``, to change one. Its inputs stay guarded:
    a new shape, dtype or device compiles again."""
    entry = _COMPILED.get(model)
    if entry is None:
        use_machine_inductor_cache()
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        own = _own_forward(model)
        if own is None:
            compiled = torch.compile(model.forward, dynamic=None, fullgraph=False)
        else:
            guards = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
            compiled = torch.compile(own, dynamic=None, fullgraph=False, options=guards)
        options = inductor_options(model)

        def forward(*args, **kwargs):
            with torch._inductor.config.patch(options) if options else nullcontext():
                return compiled(*args, **kwargs)

        entry = (forward, _weights_stamp(model) if options.get("freezing") else None)
        _COMPILED[model] = entry
    forward, stamp = entry
    if stamp is not None and _weights_stamp(model) != stamp:
        raise RuntimeError(
            f"{type(model).__name__}: the weights changed after its forward was compiled with them "
            f"frozen in (compile=True on a CPU freezes them, decoding/compiled.py): reload the verifier "
            f"(or the drafter, whichever changed), or decode with compile=False"
        )
    return forward


def cache_capacity(positions: int) -> int:
    """The static cache length that holds ``positions``: the next multiple of :data:`CAPACITY_STEP`."""
    return CAPACITY_STEP * max(1, math.ceil(positions / CAPACITY_STEP))


def copy_positions(layers, cache, start: int, stop: int, frozen: bool) -> None:
    """Copy positions ``[start, stop)`` of ``layers`` (a cache's layers, static or dynamic) into
    slots ``[0, stop - start)`` of the static ``cache``, whose layers are allocated here shaped like
    them (as plain inputs where the compiled graph freezes weights: :func:`static_addresses_off`).
    Layers never written (a prompt of one token) are left unallocated."""
    for src, dst in zip(layers, cache.layers, strict=True):
        if getattr(src, "is_initialized", True):
            with static_addresses_off(frozen):
                dst.lazy_initialization(src.keys, src.values)
            dst.keys[..., : stop - start, :] = src.keys[..., start:stop, :]
            dst.values[..., : stop - start, :] = src.values[..., start:stop, :]


class StaticTreeVerifier(TreeVerifier):
    """:class:`~.verifier.TreeVerifier`'s state in a static KV cache, scored by a compiled forward.

    Args:
        model, input_ids, feature_layers: as :class:`~.verifier.TreeVerifier`.
        capacity: positions the cache should hold: the prompt, the new tokens and the largest tree
            (it grows, recompiling once, if a tree would not fit).
        compile: score through :func:`compiled_forward`; False runs the same static-cache forwards
            eagerly (for tests and debugging: no compile time).
    """

    def __init__(
        self,
        model: nn.Module,
        input_ids: torch.Tensor,
        feature_layers: tuple[int, ...] | None = None,
        capacity: int = CAPACITY_STEP,
        compile: bool = True,
    ) -> None:
        self._capacity = cache_capacity(max(int(capacity), int(input_ids.shape[1])))
        self._length = 0
        self.compile = bool(compile)
        self._one_node = compiled_kernels(model)["one_node"]
        self._frozen = self.compile and bool(inductor_options(model).get("freezing"))
        # looked up once a decode (it checks frozen weights): every round's tree goes through it
        self._forward = compiled_forward(model) if self.compile else model
        super().__init__(model, input_ids, feature_layers)

    def _new_cache(self, prompt_length: int):
        from transformers import StaticCache
        from transformers.cache_utils import StaticLayer

        cache = StaticCache(config=self.model.config, max_cache_len=self._capacity)
        for layer in cache.layers:
            if type(layer) is not StaticLayer:  # as TreeVerifier: compaction is proven for plain layers
                raise ValueError(
                    f"the verifier's static cache uses {type(layer).__name__} layers; compiled tree "
                    f"verification compacts plain full-attention StaticLayer caches only (disable "
                    f"sliding-window attention, or decode with compile=False)"
                )
        return cache

    def _prefill(self, ids: torch.Tensor):
        # eager: the prompt's length varies, and a compiled prefill would compile once per length;
        # the cache's tensors are allocated here (lazily), as plain inputs where weights are frozen
        with static_addresses_off(self._frozen):
            return self._prefill_eager(ids)

    def _prefill_eager(self, ids: torch.Tensor):
        out = self.model(
            input_ids=ids,
            cache=self.cache,
            use_cache=True,
            cache_position=torch.arange(ids.shape[1], device=ids.device),
            logits_to_keep=1,
            **self._feature_kwargs(),
        )
        self._length = int(ids.shape[1])
        return out

    def _feature_kwargs(self) -> dict:
        if self.compile:
            # every hidden state, whoever reads which (or none): one set of graphs serves every
            # drafter and plain decoding; the states are computed anyway, returning them is free
            return {"output_hidden_states": True}
        return super()._feature_kwargs()

    @property
    def past_length(self) -> int:
        return self._length

    def _grow(self, needed: int) -> None:
        """Move the committed keys/values into a cache that holds ``needed`` positions."""
        old = self.cache
        self._capacity = cache_capacity(needed)
        self.cache = self._new_cache(0)
        copy_positions(old.layers, self.cache, 0, self._length, self._frozen)

    def score(self, tree: DraftTree) -> torch.Tensor:
        past, n = self._length, tree.size
        # a one-node tree (plain decoding) goes through the same graph as every other tree, with a
        # dummy child of the root: its logits are dropped, its keys land after the root's, past the
        # committed length, so nothing ever reads them. Dynamo would compile a graph of its own for
        # one node (~40 s on 2 cores), which pays only where a row costs much less than two
        # (compiled_kernels: the plan for this machine, model and dtype)
        width = 2 if self.compile and n == 1 and not self._one_node else n
        if past + width > self._capacity:
            self._grow(past + width)
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(past)  # StaticLayer writes there (module docstring)
        device = tree.tokens.device
        tokens, depth = tree.tokens, tree.depth
        allowed = torch.zeros(1, width, self._capacity, dtype=torch.bool, device=device)
        allowed[0, :, :past] = True
        allowed[0, :n, past : past + n] = tree.ancestors
        if width > n:
            tokens, depth = tokens.repeat(2), torch.tensor([0, 1], device=device)
            allowed[0, 1, past : past + 2] = True
        inputs = dict(
            input_ids=tokens[None],
            attention_mask=to_model_mask(allowed, self.model, self.dtype),
            position_ids=(past + depth)[None],
            cache_position=torch.arange(past, past + width, device=device),
        )
        if self.compile:
            mark_dynamic(inputs, _NODE_DIMS)
            mark_capacity_dynamic(inputs["attention_mask"], self.cache)
        out = self._forward(**inputs, cache=self.cache, use_cache=True, **self._feature_kwargs())
        self._length = past + n
        if width > n:
            out.logits = out.logits[:, :n]
            if out.hidden_states is not None:
                out.hidden_states = tuple(h[:, :n] for h in out.hidden_states)
        return self._scored(out, tree)

    def commit(self, tree: DraftTree, kept_nodes: torch.Tensor, next_token: int) -> None:
        start = self._length - tree.size
        kept = kept_nodes.shape[0]
        if int(kept_nodes[-1]) != kept - 1:
            for layer in self.cache.layers:
                # gather the accepted path right after the prefix (the RHS is a copy); in place, as
                # the compiled graphs hold these tensors' addresses
                index = (start + kept_nodes).to(layer.keys.device)
                layer.keys[..., start : start + kept, :] = layer.keys[..., index, :]
                layer.values[..., start : start + kept, :] = layer.values[..., index, :]
        self._length = start + kept
        self._committed(tree, kept_nodes, next_token)

    def discard(self, tree: DraftTree) -> None:
        self._length -= tree.size
        self._tree_features = None


#: the node counts one compiled graph serves (a one-node tree is sent as two nodes; larger trees than
#: this compile another graph when they first come)
_NODES = (2, 64)


def mark_dynamic(inputs: dict, dims: dict[str, int], span: tuple[int, int] = _NODES) -> None:
    """Tell dynamo that dimension ``dims[name]`` of each ``inputs[name]`` varies (together: they are
    one size), so the first call compiles the shape-dynamic graph every later size reuses (left to
    itself, it compiles a static graph first, then a dynamic one). Sizes outside ``span`` are left
    alone (they compile a graph of their own when they come).

    A hint, not a constraint (``maybe_mark_dynamic``): a compiled artifact reused from inductor's
    disk cache brings the shape guards it was compiled under (an older graph's ``n <= 16``, say);
    with a hard range that is an error, with a hint a size outside them compiles once more."""
    name = next(iter(dims))
    if not span[0] <= inputs[name].shape[dims[name]] <= span[1]:
        return
    for name, dim in dims.items():
        torch._dynamo.maybe_mark_dynamic(inputs[name], dim)


def mark_capacity_dynamic(mask: torch.Tensor, cache) -> None:
    """Tell dynamo that the static cache's length varies (the mask's last dimension, the cached
    keys' and values' sequence dimension), so the first graph serves every capacity."""
    torch._dynamo.maybe_mark_dynamic(mask, mask.dim() - 1)
    for layer in cache.layers:
        if getattr(layer, "is_initialized", True):
            torch._dynamo.maybe_mark_dynamic(layer.keys, 2)
            torch._dynamo.maybe_mark_dynamic(layer.values, 2)


#: the node dimension of a tree forward's inputs
_NODE_DIMS = {"input_ids": 1, "attention_mask": 2, "position_ids": 1, "cache_position": 0}


@torch.no_grad()
def warm_compiled(model: nn.Module, prompt_length: int = 64, drafter=None) -> float:
    """Compile ``model``'s tree-forward graphs now (:data:`WARM_NODES`: every graph the loop will
    run), and with a ``drafter`` its compiled drafting graphs too (:func:`warm_drafter`), so that no
    timed decode compiles. Returns the seconds that took: a few where inductor's disk cache has the
    kernels, minutes on a cold one; what was warmed before is not warmed again, and its first
    warm-up's seconds are counted."""
    seconds = _warm_verifier(model, prompt_length)
    if drafter is not None:
        seconds += warm_drafter(model, drafter, prompt_length)
    return seconds


def warm_decoding(model: nn.Module, drafter=None, tree_auto: bool = False) -> float:
    """What a compiled decode's first call would otherwise do inside its own timing: compile the
    graphs (:func:`warm_compiled`, with the ``drafter``'s) and, for ``tree="auto"``, read or measure
    the compiled forward's cost model (~10 s once per machine, then the disk cache). Seconds."""
    from .calibration import cost_model_for  # calibration builds these states: imported late

    start = time.perf_counter()
    warm_compiled(model, drafter=drafter)
    if tree_auto:
        cost_model_for(model, compiled=True)
    return time.perf_counter() - start


def _warm_verifier(model: nn.Module, prompt_length: int) -> float:
    if model in _WARMED:
        return _WARMED[model]
    start = time.perf_counter()
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)
    ids = torch.randint(0, vocab, (1, prompt_length), generator=gen).to(device)
    # feature layers given, so the graphs return the hidden states, as they do for every drafter
    # (StaticTreeVerifier asks for all of them when compiled); plain decoding shares these graphs
    state = StaticTreeVerifier(model, ids, (0,), capacity=prompt_length + max(WARM_NODES))
    for n in WARM_NODES:
        drafts = torch.randint(0, vocab, (1, n - 1), generator=gen).to(device)
        tree = build_tree(state.pending, drafts)
        state.score(tree)
        state.discard(tree)
    _WARMED[model] = time.perf_counter() - start
    return _WARMED[model]


@torch.no_grad()
def warm_drafter(model: nn.Module, drafter, prompt_length: int = 64) -> float:
    """Compile ``drafter``'s drafting graphs (a drafter with a compiled path:
    :class:`~specdiff_lightning.DFlashDrafter`) by decoding a random prompt with it through ``model``, the verifier it drafts for: every round
    drafts, so its first rounds compile the one shape-dynamic graph. Seconds it took (the first time; a drafter is warmed once)."""
    from .generate import speculative_generate  # the loop imports this module

    key = getattr(drafter, "base", drafter)
    if key in _WARMED:
        return _WARMED[key]
    _warm_verifier(model, prompt_length)
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, int(model.config.vocab_size), (1, prompt_length), generator=gen)
    gamma = 8
    speculative_generate(
        model,
        drafter,
        ids.to(next(model.parameters()).device),
        max_new_tokens=3 * gamma,
        gamma=gamma,
        temperature=0,
        eos_token_id=[],
        tree=None,
        compile=True,
    )
    _WARMED[key] = time.perf_counter() - start
    return _WARMED[key]
