"""Probe (issue 17, not part of the package): what the verifier's compiled tree forward costs over n
nodes, under the loop's own plan or a variant, and with the first compiled call at a chosen size.

The loop compiles one shape-dynamic graph, and its first call is a one-node tree sent as two nodes
(``decoding/compiled.py``). Under the ``autotune`` plan inductor measures each GEMM's candidates, and
blocks its C++ template, for that first call's row count; the graph then serves every size. This
probe prints the medians (ms) of the forward over each n through the loop's ``StaticTreeVerifier``, after a
first call of ``--first`` nodes, under:

- ``autotune``: the loop's CPU plan (frozen weights, ``max_autotune``, backends ``CPP,ATEN``);
- ``freeze``: frozen weights only, so inductor's oneDNN pass packs every linear (no template).

Each plan compiles in its own process (run it once per plan; ``TORCHINDUCTOR_CACHE_DIR`` apart,
so no autotuning result is reused). docs/results.md, stop 48:

    TORCHINDUCTOR_CACHE_DIR=/tmp/ind_a python scripts/probe_compiled_plan.py --plan autotune --first 1
    TORCHINDUCTOR_CACHE_DIR=/tmp/ind_b python scripts/probe_compiled_plan.py --plan autotune --first 8
    TORCHINDUCTOR_CACHE_DIR=/tmp/ind_c python scripts/probe_compiled_plan.py --plan freeze --first 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdiff_lightning.decoding import compiled

# the calibration's own timing of one tree forward through the loop's verifier state (what the cost
# model tree: auto reads is measured this way); private helpers, used by this probe only
from specdiff_lightning.decoding.calibration import _forward, _state
from specdiff_lightning.decoding.verifier import decoding_mode
from specdiff_lightning.models.loading import load_verifier

#: inductor settings of each plan (``autotune`` is the loop's own)
PLANS = {"autotune": dict(compiled._AUTOTUNE), "freeze": {"freezing": True}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", choices=sorted(PLANS), default="autotune")
    ap.add_argument("--first", type=int, default=1, help="nodes of the first (compiling) call")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--context", type=int, default=256, help="cached tokens before each tree")
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 6, 8, 12, 16, 24, 32])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    # the plan's settings are what compiled_forward patches in around every call
    compiled._AUTOTUNE = PLANS[args.plan]
    model = load_verifier("smollm2-135m-instruct", dtype=args.dtype)
    gen = torch.Generator().manual_seed(0)
    with decoding_mode(True), torch.no_grad():
        state = _state(model, args.context, max(args.nodes), True, gen)  # a StaticTreeVerifier
        start = time.perf_counter()
        _forward(state, args.first, gen)
        print(
            f"plan {args.plan}: first call ({args.first} nodes) {time.perf_counter() - start:.0f} s",
            flush=True,
        )
        for n in args.nodes:  # any size the first graph does not serve compiles here, untimed
            _forward(state, n, gen)
        times = {n: [] for n in args.nodes}
        for _ in range(args.repeats):
            for n in args.nodes:
                times[n].append(_forward(state, n, gen) * 1e3)
    medians = "  ".join(f"{n}: {statistics.median(t):.1f}" for n, t in times.items())
    print(
        f"plan {args.plan}, first {args.first}, {args.dtype}, context {args.context}, ms by nodes: {medians}"
    )


if __name__ == "__main__":
    main()
