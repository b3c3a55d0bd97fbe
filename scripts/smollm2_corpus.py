"""Verifier continuations for training the SmolLM2 drafters (functions from the stdlib and installed
packages, checked disjoint from HumanEval: data/function_prompts.py).

Each record: the chat-formatted prompt ids (the same format as the HumanEval loader) and the
verifier's greedy continuation ids. Appends to a JSONL file, flushed per batch, resumable: records
whose id is already present are skipped, and a line cut by a kill is dropped and redone. Batches
are length-sorted within groups of 8 batches (less padding), B rows per forward.

    python scripts/smollm2_corpus.py --out runs/smollm2/corpus.jsonl --limit 1500 --max_new_tokens 192
    python scripts/smollm2_corpus.py --out runs/smollm2/corpus_1m.jsonl --pool packages --limit 9000 \
        --max_new_tokens 160 --batch_size 32

More prompts than one machine's packages hold, decoded where the verifier is fast (a GPU): write the
pool here (``--write_prompts``, with more ``--packages`` and without the prompts an existing corpus
already answered, ``--skip_corpus``), then decode it there (``--prompts``, ``--device cuda``), for at
most ``--max_seconds``:

    python scripts/smollm2_corpus.py --pool packages --packages torch,numpy,scipy \
        --skip_corpus assets/smollm2/corpus_dflash_1m.parquet --limit 100000 --write_prompts prompts.jsonl
    python scripts/smollm2_corpus.py --prompts prompts.jsonl --out corpus_gpu.jsonl --device cuda \
        --batch_size 384 --max_new_tokens 160 --max_seconds 150
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
from specdiff_lightning.data.function_prompts import PACKAGES, function_prompts, humaneval_disjoint
from specdiff_lightning.data.stdlib import _function_prompts, is_heldout, stdlib_files
from specdiff_lightning.data.tokenization import encode_prompt
from specdiff_lightning.decoding.calibration import native_bf16
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


def _chat_ids(tok, prompts: list[dict]) -> list[list[int]]:
    """The chat-formatted prompt ids the corpus records hold (the HumanEval loader's format)."""
    return [encode_prompt(tok, code_completion_prompt(p["prompt"])) for p in prompts]


def _answered(tok, pool: list[dict], corpus: str) -> list[dict]:
    """``pool`` less the prompts ``corpus`` already answered, compared by their prompt ids (record ids
    carry line numbers, which move between package versions)."""
    from specdiff_lightning.data.records import expand_files, iter_records

    seen = {tuple(r["prompt_ids"]) for r in iter_records(expand_files(corpus))}
    ids = _chat_ids(tok, pool)
    return [p for p, i in zip(pool, ids, strict=True) if tuple(i) not in seen]


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
    ap.add_argument("--out", help="the corpus JSONL to append to")
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
    ap.add_argument("--packages", help="comma-separated packages for --pool packages (default: PACKAGES)")
    ap.add_argument("--skip_corpus", help="drop the prompts this corpus (file or glob) already answered")
    ap.add_argument("--write_prompts", help="write the pool as JSONL {id, prompt} here and stop")
    ap.add_argument("--prompts", help="decode this JSONL {id, prompt} instead of building a pool")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--dtype",
        choices=("auto", "bfloat16", "float32"),
        default="auto",
        help="auto: bfloat16 on a GPU or a CPU that multiplies bf16 in hardware (AVX512-BF16/AMX), float32 "
        "elsewhere, where bf16 is emulated and batches of it run several times slower (docs/results.md)",
    )
    ap.add_argument("--max_seconds", type=float, help="stop after the batch that passes this many seconds")
    args = ap.parse_args()
    if not (args.out or args.write_prompts):
        ap.error("give --out (decode) or --write_prompts (only the pool)")
    torch.manual_seed(0)
    directory = smollm2_dir()
    tok = AutoTokenizer.from_pretrained(directory)
    tok.padding_side = "left"
    if args.prompts:
        pool = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
        pool = pool[: args.limit]
    elif args.pool == "packages":
        packages = tuple(args.packages.split(",")) if args.packages else PACKAGES
        pool, report = humaneval_disjoint(function_prompts(packages, max_chars=args.max_chars))
        print(f"prompt pool: {report}", flush=True)
        if args.skip_corpus:
            pool = _answered(tok, pool, args.skip_corpus)
            print(f"{len(pool)} prompts not in {args.skip_corpus}", flush=True)
        pool = pool[: args.limit]
    else:
        pool = prompts(args.limit, args.max_chars)
    if args.write_prompts:
        with open(args.write_prompts, "w") as f:
            f.writelines(json.dumps({"id": p["id"], "prompt": p["prompt"]}) + "\n" for p in pool)
        print(f"{len(pool)} prompts written to {args.write_prompts}")
        return
    dtype = args.dtype
    if dtype == "auto":
        dtype = "bfloat16" if torch.device(args.device).type != "cpu" or native_bf16() else "float32"
        print(f"dtype: {dtype}", flush=True)
    model = (
        AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, dtype)).to(args.device).eval()
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = _done_ids(out)
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
            enc = tok.pad({"input_ids": _chat_ids(tok, batch)}, return_tensors="pt")
            with torch.no_grad():
                gen = model.generate(
                    **enc.to(args.device), max_new_tokens=args.max_new_tokens, do_sample=False
                ).cpu()
            enc = enc.to("cpu")
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
            if args.max_seconds is not None and time.time() - start > args.max_seconds:
                print(
                    f"stopping after {time.time() - start:.0f} s (--max_seconds): rerun to go on", flush=True
                )
                break


if __name__ == "__main__":
    main()
