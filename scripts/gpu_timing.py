"""Timing at real shapes with random weights: what a speculative round costs, and what it can buy.

Reports, for a verifier/drafter pair built from configs of the real shapes (random weights, no
download):
- verifier cost of one forward scoring 1 … 512 tokens after a cached context (tree-mask path);
- drafter cost of one window against the context length, uncached (the full bidirectional pass)
  and, when the drafter supports ``prefix_cache``, cached (only the new tokens plus the mask block);
- the per-round loop overhead (a profiled ``speculative_generate`` run: round time outside the two
  model calls);
- the projected speed-up as a function of tokens emitted per verifier call:
  ``speedup(tau) = tau * t_verify(1) / (t_draft + t_verify(tree) + overhead)``.

    python scripts/gpu_timing.py --preset qwen32b-diffucoder7b --device cuda --json runs/gpu_timing.json
    python scripts/gpu_timing.py --preset qwen7b-0.5b --device cuda
    python scripts/gpu_timing.py --preset tiny --device cpu          # seconds, what the test runs

Presets ``qwen32b-diffucoder7b`` (Qwen2.5-32B-shaped verifier, DiffuCoder-7B-shaped drafter) and
``qwen7b-0.5b`` (Qwen2.5-7B verifier, Qwen2.5-0.5B-shaped diffusion drafter) fit one H200 in bf16.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

# Qwen2.5 shapes (config.json values): hidden, intermediate, layers, heads, kv heads, vocab.
SHAPES = {
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2, 151936),
    "qwen2.5-7b": (3584, 18944, 28, 28, 4, 152064),  # also DiffuCoder-7B / Dream-7B
    "qwen2.5-32b": (5120, 27648, 64, 40, 8, 152064),
    "tiny": (64, 128, 2, 4, 2, 512),
}
PRESETS = {
    "qwen32b-diffucoder7b": ("qwen2.5-32b", "qwen2.5-7b"),
    "qwen7b-0.5b": ("qwen2.5-7b", "qwen2.5-0.5b"),
    "tiny": ("tiny", "tiny"),
}


def build(shape: str, device: str, dtype: torch.dtype, vocab: int | None = None, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, inter, layers, heads, kv, v = SHAPES[shape]
    config = Qwen2Config(
        vocab_size=vocab or v,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=32768,
        use_sliding_window=False,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    model.eval().requires_grad_(False)
    return model


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats: int, warmup: int = 1) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs (device-synchronised)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.no_grad()
def verifier_costs(verifier, context: int, scored: list[int], device, repeats) -> dict[int, float]:
    from transformers import DynamicCache

    from specdiff_lightning.decoding.attention import to_model_mask

    vocab = verifier.config.vocab_size
    ids = torch.randint(0, vocab, (1, context), device=device)
    cache = DynamicCache()
    verifier(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
    dtype = next(verifier.parameters()).dtype
    out = {}
    for n in scored:
        tokens = torch.randint(0, vocab, (1, n), device=device)
        allowed = torch.ones(1, n, context + n, dtype=torch.bool, device=device)
        allowed[0, :, context:] = torch.ones(n, n, dtype=torch.bool, device=device).tril()  # a chain "tree"
        mask = to_model_mask(allowed, verifier, dtype)
        positions = torch.arange(context, context + n, device=device)[None]

        def run(tokens=tokens, mask=mask, positions=positions, n=n):
            verifier(
                input_ids=tokens, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True
            )
            cache.crop(-n)

        out[n] = timed(run, device, repeats)
    return out


@torch.no_grad()
def drafter_costs(
    drafter_model, contexts: list[int], gamma: int, device, repeats
) -> dict[str, dict[int, float]]:
    import inspect

    from specdiff_lightning.models.diffusion import DiffusionDrafter

    vocab = drafter_model.config.vocab_size
    out: dict[str, dict[int, float]] = {"uncached": {}}
    uncached = DiffusionDrafter(drafter_model, vocab - 1, True)
    can_cache = "prefix_cache" in inspect.signature(DiffusionDrafter.__init__).parameters
    cached = DiffusionDrafter(drafter_model, vocab - 1, True, prefix_cache=True) if can_cache else None
    if cached is not None:
        out["cached"] = {}
    for c in contexts:
        ids = torch.randint(0, vocab - 1, (1, c + gamma), device=device)
        out["uncached"][c] = timed(
            lambda ids=ids, c=c: uncached.draft_logits(ids[:, :c], gamma), device, repeats
        )
        if cached is not None:

            def step(ids=ids, c=c):
                # A round after the previous one committed `gamma` tokens: only those run again.
                cached.reset()
                cached.draft_logits(ids[:, :c], gamma)
                _sync(device)
                start = time.perf_counter()
                cached.draft_logits(ids[:, : c + gamma], gamma)
                _sync(device)
                return time.perf_counter() - start

            step()
            out["cached"][c] = statistics.median(step() for _ in range(repeats))
    return out


@torch.no_grad()
def loop_overhead(verifier, drafter_model, gamma, num_drafts, context, new_tokens, device) -> dict:
    from specdiff_lightning.decoding import speculative_generate
    from specdiff_lightning.decoding.timing import RoundProfiler
    from specdiff_lightning.models.diffusion import DiffusionDrafter

    vocab = verifier.config.vocab_size
    drafter = DiffusionDrafter(drafter_model, vocab - 1, True)
    ids = torch.randint(0, vocab - 1, (1, context), device=device)
    profiler = RoundProfiler(device)
    gen = torch.Generator(device=device).manual_seed(0)
    speculative_generate(
        verifier, drafter, ids, max_new_tokens=new_tokens, gamma=gamma, num_drafts=num_drafts,
        draft_temperature=1.5, temperature=0, generator=gen, profiler=profiler,
    )  # fmt: skip
    summary = profiler.summary()
    rounds = max(1, summary["rounds"])
    per_round = summary["round_s"] / rounds
    model_calls = (summary["draft_s"] + summary["verify_s"]) / rounds
    return {**summary, "rounds": rounds, "per_round_s": per_round, "overhead_s": per_round - model_calls}


def project(verify: dict[int, float], draft_s: float, overhead_s: float, tree_nodes: int, gamma: int) -> dict:
    """Speed-up over plain decoding (one verifier call per token) when each round emits ``tau`` tokens."""
    sizes = sorted(verify)
    tree = min((n for n in sizes if n >= tree_nodes), default=sizes[-1])
    round_s = draft_s + verify[tree] + overhead_s
    return {
        "tree_nodes": tree,
        "round_s": round_s,
        "speedup_by_tokens_per_call": {tau: tau * verify[sizes[0]] / round_s for tau in range(1, gamma + 2)},
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--context", type=int, default=1024, help="cached context for the verifier timings")
    parser.add_argument("--scored", default="1,2,4,8,16,32,64,128,256,512")
    parser.add_argument("--draft-contexts", default="128,512,1024,2048,4096")
    parser.add_argument("--gamma", type=int, default=32)
    parser.add_argument("--num-drafts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens of the profiled loop run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    device = args.device
    if device == "cpu":
        torch.set_num_threads(1)  # tiny shapes are dominated by per-op overhead
    dtype = (
        getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if "cuda" in device else torch.float32)
    )
    verifier_shape, drafter_shape = PRESETS[args.preset]
    verifier = build(verifier_shape, device, dtype, seed=0)
    # the pair shares the verifier's vocabulary size (padding rows aside, as with the real checkpoints)
    drafter = build(drafter_shape, device, dtype, vocab=verifier.config.vocab_size, seed=1)
    scored = [int(x) for x in args.scored.split(",")]
    contexts = [int(x) for x in args.draft_contexts.split(",")]

    report: dict = {"preset": args.preset, "device": str(device), "dtype": str(dtype), "gamma": args.gamma}
    if "cuda" in device:
        report["gpu"] = torch.cuda.get_device_name(device)
    report["verifier_s_by_scored_tokens"] = verifier_costs(
        verifier, args.context, scored, device, args.repeats
    )
    report["drafter_s_by_context"] = drafter_costs(drafter, contexts, args.gamma, device, args.repeats)
    report["loop"] = loop_overhead(
        verifier, drafter, args.gamma, args.num_drafts, args.context, args.new_tokens, device
    )
    draft_at_context = min(contexts, key=lambda c: abs(c - args.context))
    report["projection"] = project(
        report["verifier_s_by_scored_tokens"],
        report["drafter_s_by_context"]["uncached"][draft_at_context],
        max(0.0, report["loop"]["overhead_s"]),
        args.num_drafts * args.gamma + 1,
        args.gamma,
    )
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
