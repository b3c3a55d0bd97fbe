"""Time ``load_pair``'s defaults with two datastores side by side on HumanEval problems (stop 46).

Arms: the shipped pair's datastore (its corpora, ``SHIPPED_PAIRS``) against another set of corpus
files (``--other``, default the 1M corpus alone). One process, the pair's defaults (compiled where
``torch.compile`` works, ``dtype: auto``), 128 new tokens, the bench's framing of each problem, the
two arms alternating per prompt and per pass (each arm keeps its own gate and acceptance table).
Printed per pass and arm: tok/s, tokens, verifier rounds, tokens a round; the last line is JSON.

HumanEval 0-19 are the declared dev split (docs/results.md); decide on them, report 20-29 apart:

    python scripts/datastore_ab.py --offset 0 --problems 20 --passes 3
    python scripts/datastore_ab.py --offset 20 --problems 10 --passes 3
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from specdiff_lightning import load_pair
from specdiff_lightning.data.benchmarks import load_benchmark
from specdiff_lightning.data.tokenization import encode_prompt
from specdiff_lightning.decoding.datastore import load_datastore
from specdiff_lightning.pairs import assets_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--offset", type=int, default=0, help="first HumanEval problem (0-19: the dev split)")
    ap.add_argument("--problems", type=int, default=20)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument(
        "--other",
        nargs="+",
        default=["smollm2/corpus_dflash_1m.parquet"],
        help="the other arm's corpus files, under assets/ (default: the 1M corpus alone)",
    )
    args = ap.parse_args()

    pair = load_pair("smollm2-135m-instruct")
    if pair.compile:
        pair.warm()
    arms = {
        "shipped": load_datastore(pair.decoding["datastore"]),
        "other": load_datastore([assets_dir() / f for f in args.other]),
    }
    for name, store in arms.items():
        print(f"{name}: {store.source} ({len(store):,} tokens)", flush=True)
    rows = load_benchmark("humaneval", limit=args.offset + args.problems)[args.offset :]
    prompts = [torch.tensor([encode_prompt(pair.tokenizer, r["prompt"])]) for r in rows]
    for store in arms.values():  # each arm's first decode outside the timing
        pair.generate(prompts[0], max_new_tokens=32, datastore=store)
    results = {name: [] for name in arms}
    for p in range(args.passes):
        totals = {name: [0.0, 0, 0] for name in arms}
        for i, ids in enumerate(prompts):
            for name in list(arms) if (i + p) % 2 == 0 else list(arms)[::-1]:
                start = time.perf_counter()
                out = pair.generate(ids, max_new_tokens=args.max_new_tokens, datastore=arms[name])
                totals[name][0] += time.perf_counter() - start
                totals[name][1] += out.stats.new_tokens - 1  # as the bench counts
                totals[name][2] += out.stats.verifier_calls
        for name, (seconds, tokens, rounds) in totals.items():
            results[name].append({"tok_s": tokens / seconds, "tokens": tokens, "rounds": rounds})
            print(
                f"pass {p} {name}: {tokens / seconds:.1f} tok/s, {tokens} tokens, {rounds} rounds, "
                f"{tokens / max(rounds, 1):.2f} tokens a round",
                flush=True,
            )
    print(json.dumps({"offset": args.offset, "problems": args.problems, "arms": results}))


if __name__ == "__main__":
    main()
