"""Verifier continuations for training the SmolLM2 drafters (functions from the stdlib and installed
packages, checked disjoint from HumanEval: data/function_prompts.py).

Each record: the chat-formatted prompt ids (the same format as the HumanEval loader) and the
verifier's greedy continuation ids. Appends to a JSONL file, flushed per batch, resumable: records
whose id is already present are skipped, and a line cut by a kill is dropped and redone. Batches
are length-sorted within groups of 8 batches (less padding), B rows per forward.

    python scripts/smollm2_corpus.py --out runs/smollm2/corpus.jsonl --limit 1500 --max_new_tokens 192
    python scripts/smollm2_corpus.py --out runs/smollm2/corpus_1m.jsonl --pool packages --limit 9000 \
        --max_new_tokens 160 --batch_size 32
"""

from __future__ import annotations

import argparse
import json
import time
import zlib
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdiff_lightning.data.benchmarks import code_completion_prompt
from specdiff_lightning.data.function_prompts import function_prompts, humaneval_disjoint
from specdiff_lightning.data.stdlib import _function_prompts, is_heldout, stdlib_files
from specdiff_lightning.models.smollm2 import smollm2_dir


def prompts(limit: int, max_chars: int) -> list[dict]:
    out = []
    for module, path in stdlib_files():
        if is_heldout(module):
            continue
        try:
            source = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        out += [p for p in _function_prompts(module, source) if len(p["prompt"]) <= max_chars]
    # A deterministic spread over modules rather than the first modules alphabetically.
    out.sort(key=lambda p: zlib.crc32(p["id"].encode()))
    return out[:limit]


def _done_ids(out: Path) -> set[str]:
    """Ids already written; a last line cut by a kill is truncated away (it is regenerated)."""
    if not out.exists():
        return set()
    data = out.read_bytes()
    keep = data[: data.rfind(b"\n") + 1]
    if len(keep) != len(data):
        print(f"{out}: dropping a cut last line ({len(data) - len(keep)} bytes)", flush=True)
        out.write_bytes(keep)
    return {json.loads(line)["id"] for line in keep.decode().splitlines() if line.strip()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--limit", type=int, default=1500)
    ap.add_argument("--max_new_tokens", type=int, default=192)
    ap.add_argument("--batch_size", type=int, default=16)
    ap.add_argument("--max_chars", type=int, default=900)
    ap.add_argument(
        "--pool",
        choices=("stdlib", "packages"),
        default="stdlib",
        help="stdlib: the standard library's training modules (the first corpus); packages: those plus installed "
        "packages' functions, filtered against HumanEval",
    )
    args = ap.parse_args()
    torch.manual_seed(0)
    directory = smollm2_dir()
    tok = AutoTokenizer.from_pretrained(directory)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16).eval()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = _done_ids(out)
    if args.pool == "packages":
        pool, report = humaneval_disjoint(function_prompts(max_chars=args.max_chars))
        print(f"prompt pool: {report}", flush=True)
        pool = pool[: args.limit]
    else:
        pool = prompts(args.limit, args.max_chars)
    group = 8 * args.batch_size  # length-sorted within groups: less padding, order still spread over modules
    pool = [
        p
        for g in range(0, len(pool), group)
        for p in sorted(pool[g : g + group], key=lambda p: len(p["prompt"]))
    ]
    todo = [p for p in pool if p["id"] not in done]
    print(f"{len(done)} done, {len(todo)} to go", flush=True)
    start = time.time()
    with open(out, "a") as f:
        for i in range(0, len(todo), args.batch_size):
            batch = todo[i : i + args.batch_size]
            texts = [
                tok.apply_chat_template(
                    [{"role": "user", "content": code_completion_prompt(p["prompt"])}],
                    tokenize=False,
                    add_generation_prompt=True,
                )
                for p in batch
            ]
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.no_grad():
                gen = model.generate(**enc, max_new_tokens=args.max_new_tokens, do_sample=False)
            for j, p in enumerate(batch):
                prompt_ids = enc.input_ids[j][enc.attention_mask[j].bool()].tolist()
                cont = gen[j, enc.input_ids.shape[1] :].tolist()
                if tok.eos_token_id in cont:
                    cont = cont[: cont.index(tok.eos_token_id) + 1]
                f.write(
                    json.dumps({"id": p["id"], "prompt_ids": prompt_ids, "continuation_ids": cont}) + "\n"
                )
            f.flush()
            n = i + len(batch)
            print(f"{n}/{len(todo)} records, {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
