"""Replay SmolLM2's HumanEval answers offline to choose a draft-tree shape before timing it.

How the demo's conditioned draft tree (``SmolPreset.tree`` / ``.lookups``) was chosen. Step 1 decodes
``--problems`` HumanEval problems greedily with the verifier (bf16), reads its hidden states over each
answer once and drafts, with the shipped conditioned drafter, the window after every answer prefix
(the training forward, ``blocks_logits``: what a decoding round drafts there). Step 2 replays decoding
for each tree shape: per round the drafts are built from that data, the accepted length is the
longest draft prefix agreeing with the verifier's answer, and the round costs, by a model measured
on this 2-core CPU (bf16, ~300-token context), ``verify_ms + node_ms * tree nodes + draft_ms +
other_ms``. Printed: tokens per round, nodes per round and the modelled speed-up over HF generate
(``hf_ms`` per token, the same prefill for both). Shapes that look best are then timed for real
(``make demo``); the model tracked the real runs within ~5%.

    python scripts/smollm2_tree_replay.py --problems 20
"""

from __future__ import annotations

import argparse
import pickle
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Shape:
    min_confidence: float = 0.0
    siblings: tuple[int, ...] = ()
    num_lookups: int = 1
    ngram_lengths: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Costs:
    verify_ms: float = 25.4
    node_ms: float = 0.55
    draft_ms: float = 6.3
    other_ms: float = 1.7
    hf_ms: float = 27.8
    prefill_ms_per_token: float = 0.8


def collect(problems: int, gamma: int, max_new_tokens: int) -> list[dict]:
    from transformers import AutoTokenizer

    from specdiff_lightning.bench.runners import hf_generate
    from specdiff_lightning.decoding.config import DecodingConfig
    from specdiff_lightning.demo.smollm2 import _prompts, load_smollm2_pair
    from specdiff_lightning.models.smollm2 import smollm2_dir

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir())
    verifier, drafters = load_smollm2_pair("bfloat16")
    drafter = drafters["conditioned"]
    cfg = DecodingConfig(max_new_tokens=max_new_tokens, temperature=0.0)
    data = []
    with torch.no_grad():
        for i, row in enumerate(_prompts(tokenizer, problems)):
            prompt = row["prompt_ids"]
            answer = hf_generate(verifier, torch.tensor([prompt]), cfg)
            seq = torch.tensor([prompt + answer])
            states = verifier(input_ids=seq, output_hidden_states=True).hidden_states
            features = torch.cat([states[j] for j in drafter.feature_layers], dim=-1)
            starts = torch.arange(len(prompt), seq.shape[1])[None]
            logits = drafter.blocks_logits(features, seq, starts, gamma)[0].float()  # [answer, gamma, V]
            top = logits.topk(2, dim=-1)
            data.append(
                {
                    "prompt": prompt,
                    "answer": answer,
                    "top": top.indices,  # [answer, gamma, 2]
                    "top_probs": torch.softmax(logits, -1).gather(-1, top.indices),
                }
            )
            print(
                f"problem {i + 1}/{problems}: {len(prompt)} prompt tokens, {len(answer)} answer tokens",
                flush=True,
            )
    return data


def round_drafts(record: dict, t: int, shape: Shape, gamma: int) -> list[list[int]]:
    """The drafts a round with ``t`` committed tokens would verify under ``shape``."""
    from specdiff_lightning.decoding.adaptive import confident_lengths
    from specdiff_lightning.decoding.lookup import lookup_continuations

    i = t - len(record["prompt"])
    draft = record["top"][i, :gamma, 0].tolist()
    size = int(confident_lengths(record["top_probs"][i, :gamma, 0], shape.min_confidence))
    drafts = [draft[:size]]
    for j in shape.siblings:
        if j < size:
            drafts.append(draft[:j] + [int(record["top"][i, j, 1])])
    context = (record["prompt"] + record["answer"])[:t]
    drafts += lookup_continuations(
        context, gamma, limit=shape.num_lookups, ngram_lengths=dict(shape.ngram_lengths)
    )
    return drafts


def replay(data: list[dict], shape: Shape, gamma: int, costs: Costs) -> tuple[float, float, float]:
    """(tokens per round, tree nodes per round, modelled speed-up over HF generate)."""
    tokens = rounds = nodes = 0
    ours_ms = hf_ms = 0.0
    for record in data:
        seq = record["prompt"] + record["answer"]
        t, end = len(record["prompt"]), len(seq)
        prefill = costs.prefill_ms_per_token * t
        ours_ms += prefill
        hf_ms += prefill + costs.hf_ms * (len(record["answer"]) - 1)
        while t < end:
            window = min(gamma, end - t - 1)
            drafts = [d[:window] for d in round_drafts(record, t, shape, gamma)] if window else []
            trie = {tuple(d[: j + 1]) for d in drafts for j in range(len(d))}
            accepted = 0
            for d in drafts:
                k = 0
                while k < len(d) and d[k] == seq[t + k]:
                    k += 1
                accepted = max(accepted, k)
            emitted = min(accepted + 1, end - t)
            t += emitted
            tokens += emitted
            rounds += 1
            nodes += 1 + len(trie)
            ours_ms += costs.verify_ms + costs.node_ms * (1 + len(trie)) + costs.other_ms
            ours_ms += costs.draft_ms if window else 0.0
    # the first token of each answer comes with the prefill (the bench's throughput convention)
    ours_rate = (tokens - len(data)) / ours_ms
    hf_rate = sum(len(r["answer"]) - 1 for r in data) / hf_ms
    return tokens / rounds, nodes / rounds, ours_rate / hf_rate


SHAPES = {
    "no cut, one copy (full window)": Shape(num_lookups=1),
    "cut 0.1": Shape(min_confidence=0.1, num_lookups=1),
    "cut 0.1 + runner-up": Shape(min_confidence=0.1, siblings=(0,), num_lookups=1),
    "cut 0.1 + runner-up + 2 copies": Shape(min_confidence=0.1, siblings=(0,), num_lookups=2),
    "shipped: + copies cut 2/5 by match length": Shape(0.1, (0,), 2, ((1, 2), (2, 5))),
    "cut 0.05 + runner-up, copies 2/5": Shape(0.05, (0,), 2, ((1, 2), (2, 5))),
    "cut 0.2 + runner-up, copies 2/5": Shape(0.2, (0,), 2, ((1, 2), (2, 5))),
    "cut 0.1 + runner-up at 0 and 1, copies 2/5": Shape(0.1, (0, 1), 2, ((1, 2), (2, 5))),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--problems", type=int, default=20)
    parser.add_argument("--gamma", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--cache", default="runs/smollm2/tree_replay.pkl", help="replay data, reused when present"
    )
    args = parser.parse_args()
    cache = Path(args.cache)
    if cache.exists():
        data = pickle.loads(cache.read_bytes())
    else:
        data = collect(args.problems, args.gamma, args.max_new_tokens)
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps(data))
        tmp.replace(cache)
    costs = Costs()
    print("| shape | tokens/round | nodes/round | modelled speed-up |\n|---|---:|---:|---:|")
    for name, shape in SHAPES.items():
        per_round, nodes, speedup = replay(data, shape, args.gamma, costs)
        print(f"| {name} | {per_round:.2f} | {nodes:.1f} | {speedup:.2f}x |")


if __name__ == "__main__":
    main()
