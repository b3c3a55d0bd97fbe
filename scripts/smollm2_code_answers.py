"""Real code answers in the verifier's chat format, for training the DFlash drafter with the
verifier's teacher-forced targets (``DFlashDrafterTraining(targets="verifier")``).

Each record: the same chat-formatted prompt as ``smollm2_corpus.py`` (a CPython-stdlib function's
signature and docstring, never HumanEval) and, as the continuation, the function's real source in a
```python block (the shape of SmolLM2's answers), then EOS. No decoding: only tokenization, so a
thousand records take seconds; the verifier reads them once during training.

    python scripts/smollm2_code_answers.py --out runs/smollm2/code_answers.jsonl --limit 500
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from smollm2_corpus import prompts
from transformers import AutoTokenizer

from specdiff_lightning.data.benchmarks import code_completion_prompt
from specdiff_lightning.models.smollm2 import smollm2_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--limit", type=int, default=500)
    ap.add_argument("--skip", type=int, default=0, help="skip the first N prompts (e.g. those of the corpus)")
    ap.add_argument("--max_chars", type=int, default=900)
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = prompts(args.skip + args.limit, args.max_chars)[args.skip :]
    with open(out, "w") as f:
        for p in rows:
            text = tok.apply_chat_template(
                [{"role": "user", "content": code_completion_prompt(p["prompt"])}],
                tokenize=False,
                add_generation_prompt=True,
            )
            prompt_ids = tok(text, add_special_tokens=False).input_ids
            answer = "```python\n" + p["prompt"] + p["answer"].rstrip("\n") + "\n```"
            cont = tok(answer, add_special_tokens=False).input_ids + [tok.eos_token_id]
            f.write(json.dumps({"id": p["id"], "prompt_ids": prompt_ids, "continuation_ids": cont}) + "\n")
    print(f"{len(rows)} records written to {out}")


if __name__ == "__main__":
    main()
