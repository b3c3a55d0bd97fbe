"""Decode HumanEval problems with several feature-reading drafters, side by side (issue 18 item 3).

Each drafter decodes the same problems, interleaved problem by problem, greedily (lossless: every
output equals the verifier's own greedy decoding, which is checked), in three modes:

- ``chain``: one draft of the drafter's own window, verified as a chain (no tree, no copies): the
  drafter alone, what issue 18's chain target reads;
- ``chain8``: the same with an 8-token window, the same verifier cost for every drafter;
- ``auto_store``: the demo's recipe (``tree: auto`` + the corpus's continuations), eager.

Printed per drafter and mode: accepted draft tokens per verifier call, tokens per round, tok/s
(eager, bf16 on a CPU with fast bf16; the demo times the compiled rows). HumanEval 0-19 are the
declared dev split (docs/results.md); choose with them, report the held-out 20-29 separately.

The decision rule, fixed before the runs: for the first two drafters named, the paired bootstrap over problems
(2,000 resamples) of the difference in accepted draft tokens per call, per mode; the old family is
kept only if it wins with the 95% interval above 0 in ``chain8`` (equal verifier cost) and in
``auto_store`` (the recipe the demo ships).

    python scripts/family_ab.py --drafter conditioned=runs/ab/conditioned \
        --drafter dflash=runs/ab/dflash --offset 0 --problems 20

Stop 30 ran it at commit 03113b2, the last with the conditioned family (a worktree of it, with
``PYTHONPATH`` at its ``src``); the figures are in docs/results.md ("Stop 30") and
docs/figures/family_ab_stop30*.json. Any drafter ``load_drafter`` reads still runs through it.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

MODES = {
    "chain": {"tree": None},
    "chain8": {"tree": None, "gamma": 8},
    "auto_store": {"tree": "auto", "datastore": "assets/smollm2/corpus_dflash_1m.parquet"},
}


def main() -> None:
    from specdiff_lightning.data.benchmarks import load_benchmark
    from specdiff_lightning.data.tokenization import encode_prompt
    from specdiff_lightning.decoding.generate import speculative_generate
    from specdiff_lightning.models.loading import load_drafter, load_tokenizer, load_verifier

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", action="append", required=True, help="name=path (repeatable)")
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--problems", type=int, default=20)
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default=None, help="write the per-problem figures here (JSON)")
    args = ap.parse_args()

    verifier = load_verifier("smollm2-135m-instruct", dtype=getattr(torch, args.dtype))
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    drafters = {}
    for spec in args.drafter:
        name, path = spec.split("=", 1)
        drafters[name] = load_drafter(path, verifier=verifier, head_vocab=8192)
    rows = load_benchmark("humaneval", limit=args.offset + args.problems)[args.offset :]
    modes = args.modes.split(",")
    results: dict = {f"{n}/{m}": [] for n in drafters for m in modes}
    with torch.no_grad():
        for i, row in enumerate(rows):
            ids = torch.tensor([encode_prompt(tokenizer, row["prompt"])])
            reference = verifier.generate(
                ids, max_new_tokens=args.max_new_tokens, do_sample=False, attention_mask=torch.ones_like(ids)
            )[0, ids.shape[1] :].tolist()
            for mode in modes:
                for name, drafter in drafters.items():
                    opts = dict(MODES[mode])
                    # the drafter's own window: the conditioned drafter's trained block, DFlash's block - 1
                    own = getattr(drafter, "block", None) or drafter.block_size - 1
                    gamma = opts.pop("gamma", None) or own
                    start = time.perf_counter()
                    out = speculative_generate(
                        verifier,
                        drafter,
                        ids,
                        max_new_tokens=args.max_new_tokens,
                        gamma=gamma,
                        draft_temperature=0.0,
                        temperature=0.0,
                        **opts,
                    )
                    seconds = time.perf_counter() - start
                    new = out.sequences[0, ids.shape[1] :].tolist()
                    s = out.stats
                    results[f"{name}/{mode}"].append(
                        {
                            "problem": args.offset + i,
                            "tokens": len(new),
                            "seconds": seconds,
                            "calls": s.verifier_calls,
                            "accepted": sum(r.accepted for r in s.emitted_rounds),
                            "identical": new == reference[: len(new)] and len(new) == len(reference),
                        }
                    )
            print(f"problem {args.offset + i} done", flush=True)
    print(f"\nHumanEval {args.offset}-{args.offset + args.problems - 1}, {args.dtype}, eager")
    print(f"{'drafter/mode':28} {'acc/call':>8} {'tok/round':>9} {'tok/s':>7} identical")
    for key, per in results.items():
        calls = sum(p["calls"] for p in per)
        tokens = sum(p["tokens"] for p in per)
        print(
            f"{key:28} {sum(p['accepted'] for p in per) / calls:8.3f} {tokens / calls:9.3f} "
            f"{tokens / sum(p['seconds'] for p in per):7.1f} {sum(p['identical'] for p in per)}/{len(per)}"
        )
    names = list(drafters)
    if len(names) >= 2:  # the first two named: the compared pair (any others are references)
        a, b = names[:2]
        print(f"\npaired bootstrap over problems, accepted per call, {a} - {b} (95% interval)")
        gen = torch.Generator().manual_seed(0)
        for mode in modes:
            pa, pb = results[f"{a}/{mode}"], results[f"{b}/{mode}"]
            n = len(pa)
            stats = torch.tensor([[p["accepted"], p["calls"]] for p in pa + pb], dtype=torch.float64)
            idx = torch.randint(0, n, (2000, n), generator=gen)
            diff = stats[idx, 0].sum(1) / stats[idx, 1].sum(1) - stats[idx + n, 0].sum(1) / stats[
                idx + n, 1
            ].sum(1)
            lo, hi = diff.quantile(torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
            point = stats[:n, 0].sum() / stats[:n, 1].sum() - stats[n:, 0].sum() / stats[n:, 1].sum()
            print(f"  {mode:12} {point.item():+.3f}  [{lo:+.3f}, {hi:+.3f}]")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
