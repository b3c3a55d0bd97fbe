"""Tokens per second of the verifier's batched greedy generation against the batch size (issue 18):
SmolLM2-135M-Instruct, left-padded code prompts, bf16 and float32, one timed run per setting after
a short warm-up. Prints one line per (dtype, batch).

    python scripts/corpus_batch_throughput.py --batches 1 8 32 64 --new_tokens 48
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdiff_lightning.models.smollm2 import smollm2_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--new_tokens", type=int, default=48)
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    args = ap.parse_args()
    directory = smollm2_dir()
    tok = AutoTokenizer.from_pretrained(directory)
    tok.padding_side = "left"
    for dtype in args.dtypes:
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, dtype)).eval()
        for batch in args.batches:
            texts = [
                f'def function_{i}(x):\n    """Return the {i}-th power of x plus a long docstring about numbers."""\n'
                * 6
                for i in range(batch)
            ]
            enc = tok(texts, return_tensors="pt", padding=True)
            n = args.new_tokens
            with torch.no_grad():
                model.generate(**enc, max_new_tokens=4, do_sample=False)
                start = time.perf_counter()
                model.generate(**enc, max_new_tokens=n, min_new_tokens=n, do_sample=False)
                seconds = time.perf_counter() - start
            print(
                f"{dtype} batch {batch}: {batch * n / seconds:.1f} tok/s, {seconds / n * 1000:.0f} ms/step "
                f"(prompt {enc.input_ids.shape[1]} tokens)",
                flush=True,
            )


if __name__ == "__main__":
    main()
