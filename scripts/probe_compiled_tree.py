"""Probe (issue 17, not part of the package): the verifier's tree forward compiled over a static cache,
against the loop's eager forward over a dynamic cache. SmolLM2-135M-Instruct, a random prompt, trees
as causal chains of n nodes; prints the compile time, the logits' agreement, then medians in ms of
both forwards for each n, interleaved, a few repeats (docs/results.md, stop 24).

    python scripts/probe_compiled_tree.py --dtype bfloat16 --prompt 300 --repeats 3

transformers 5.24's ``StaticLayer.update`` ignores ``cache_position`` and writes at its own running
``cumulative_length``; a tree forward over a static cache must set that back to the committed length
first, or each tree lands after the last one's keys (and finally past the end of the cache).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from transformers import DynamicCache, StaticCache

from specdiff_lightning.decoding.kernels import use_linear_kernels
from specdiff_lightning.decoding.tree import build_tree, tree_attention_allowed
from specdiff_lightning.models.loading import load_verifier


def _chain(ids: torch.Tensor, past: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(allowed[1, 1, n, past + n], position_ids[1, n])`` for ``ids[1, n]`` as the loop sends a
    chain: the pending token and n - 1 drafts, masked by :func:`tree_attention_allowed`."""
    tree = build_tree(ids[0, 0], ids[:, 1:])
    return tree_attention_allowed(tree, past)[:, None], (past + tree.depth)[None]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompt", type=int, default=300, help="cached tokens before the tree")
    ap.add_argument("--max_cache", type=int, default=1024)
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 4, 8, 16, 24])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    eager = load_verifier("smollm2-135m-instruct", dtype=args.dtype).eval()
    stock = use_linear_kernels(copy.deepcopy(eager), {})  # inductor would break its graph on the dispatch
    vocab, past = eager.config.vocab_size, args.prompt
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, past), generator=gen)
    dynamic = DynamicCache(config=eager.config)
    static = StaticCache(config=stock.config, max_cache_len=args.max_cache)
    compiled = torch.compile(stock.forward, dynamic=None)

    def eager_tree(ids: torch.Tensor) -> torch.Tensor:
        allowed, positions = _chain(ids, past)
        out = eager(
            input_ids=ids,
            attention_mask=allowed,
            position_ids=positions,
            cache=dynamic,
            use_cache=True,
        )
        for layer in dynamic.layers:  # drop the tree again
            layer.keys, layer.values = layer.keys[..., :past, :], layer.values[..., :past, :]
        return out.logits

    def compiled_tree(ids: torch.Tensor) -> torch.Tensor:
        n = ids.shape[1]
        for layer in static.layers:
            layer.cumulative_length.fill_(past)  # see the module docstring
        allowed, positions = _chain(ids, past)
        # the static cache's keys span max_cache positions: those past the tree are masked out
        allowed = torch.nn.functional.pad(allowed, (0, args.max_cache - past - n), value=False)
        out = compiled(
            input_ids=ids,
            attention_mask=allowed,
            position_ids=positions,
            cache_position=torch.arange(past, past + n),
            cache=static,
            use_cache=True,
        )
        return out.logits

    with torch.no_grad():
        eager(input_ids=prompt, cache=dynamic, use_cache=True, logits_to_keep=1)
        stock(
            input_ids=prompt,
            cache=static,
            use_cache=True,
            cache_position=torch.arange(past),
            logits_to_keep=1,
        )
        start = time.perf_counter()
        for n in args.nodes:
            compiled_tree(torch.randint(0, vocab, (1, n), generator=gen))
        print(f"compile (first call of each size): {time.perf_counter() - start:.1f} s", flush=True)
        ids = torch.randint(0, vocab, (1, 8), generator=gen)
        a, b = eager_tree(ids).float(), compiled_tree(ids).float()
        agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
        print(
            f"8 nodes: max |logit difference| {(a - b).abs().max().item():.3g}, argmax agreement {agree:.2f}"
        )
        for repeat in range(args.repeats):
            for name, forward in (
                ("eager, dynamic cache", eager_tree),
                ("compiled, static cache", compiled_tree),
            ):
                medians = {}
                for n in args.nodes:
                    times = []
                    for _ in range(10):
                        ids = torch.randint(0, vocab, (1, n), generator=gen)
                        t = time.perf_counter()
                        forward(ids)
                        times.append(time.perf_counter() - t)
                    medians[n] = round(statistics.median(times) * 1e3, 1)
                print(repeat, name, medians, flush=True)


if __name__ == "__main__":
    main()
