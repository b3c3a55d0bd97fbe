"""A DFlash drafter's static context cache (models/compiled_prefix.py): round by round the same
logits as its ``DFlashCache``, through single commits, catch-up rounds and the cache's growth;
compiled, the same logits to rounding from one graph, and decoding through it stays greedy-identical
to the verifier."""

import torch

from helpers import reference_greedy
from specdiff_lightning import DFlashDrafter, speculative_generate
from specdiff_lightning.models import tiny_model
from specdiff_lightning.models.compiled_prefix import _SLACK, MAX_ROWS, StaticContextCache

VOCAB = 48
#: tokens committed before each round: single tokens, accepted runs, and catch-ups longer than one
#: compiled call (the rounds a drafter sits out); ~700 positions, past the 512-slot cache
COMMITS = [1, 3, 9, MAX_ROWS + 7, 2, 1, 5, 2 * MAX_ROWS + 3, 4] * 3 + [1] * 40
#: the context the walk commits (the first round's 5 rows and every commit but the last)
WALKED = 5 + sum(COMMITS[:-1])


def _walk(drafter, width: int, draft, seed: int, commits) -> list[torch.Tensor]:
    """``draft(ids)`` after each of ``commits`` (random features ``width`` wide and random tokens:
    the cache reads the rows it is given, whoever computed them)."""
    gen = torch.Generator().manual_seed(seed)
    dtype = next(drafter.model.parameters()).dtype
    ids = torch.randint(0, VOCAB - 1, (1, 6), generator=gen)
    drafter.observe(torch.randn(5, width, generator=gen).to(dtype))
    out = []
    with torch.no_grad():
        for n in commits:
            out.append(draft(ids)[0])
            ids = torch.cat([ids, torch.randint(0, VOCAB - 1, (1, n), generator=gen)], dim=1)
            drafter.observe(torch.randn(n, width, generator=gen).to(dtype))
    return out


def _dflash(dtype):
    verifier = tiny_model("llama", vocab_size=VOCAB, num_layers=3, seed=0, dtype=dtype, max_positions=2048)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        drafter = DFlashDrafter.build(verifier, 2, (0, 2), VOCAB - 1, block_size=5)
    with torch.no_grad():  # weights with some structure (the stock init is near the identity)
        for p in drafter.model.parameters():
            if p.dim() == 2:
                p.mul_(10)
    return verifier, drafter


def _dflash_rounds(drafter, static: StaticContextCache | None, seed=0, commits=COMMITS):
    """The DFlash drafter's block logits over :data:`COMMITS`; ``static``: through that static
    context cache."""
    drafter.reset()
    drafter.compiled = static is not None
    drafter._static = static
    width = len(drafter.target_layer_ids) * drafter.model.config.hidden_size
    return _walk(drafter, width, drafter.block_logits, seed, commits)


def test_dflash_static_rounds_equal_its_dynamic_cache():
    """float64, eager: a DFlash drafter's block logits through the static context cache equal its
    DFlashCache's, round for round (single commits re-send earlier rows, catch-ups split, the cache
    grows, several times)."""
    _, drafter = _dflash(torch.float64)
    dynamic = _dflash_rounds(drafter, None)
    static = StaticContextCache(drafter.model, compile=False)
    for expected, got in zip(dynamic, _dflash_rounds(drafter, static), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)
    assert static.past == WALKED and WALKED < static.capacity <= WALKED + _SLACK + 2 * MAX_ROWS


def test_dflash_compiled_rounds_equal_the_eager_ones_and_decode_greedy_identically():
    """float32: compiled, the DFlash drafter's block logits equal the eager ones to rounding, one
    graph serves every round after the first few, the cache's growth included (its length is a
    dynamic dimension: a longer prompt or decode never stalls on a compile), and
    ``speculative_generate(compile=True)`` is token for token the verifier's greedy decoding."""
    from torch._dynamo.utils import counters

    verifier, drafter = _dflash(torch.float32)
    commits = COMMITS  # ~700 positions: the cache grows several times
    eager = _dflash_rounds(drafter, None, commits=commits)
    _dflash_rounds(drafter, StaticContextCache(drafter.model), commits=[1, 2, 5])  # compiles
    frames = dict(counters["frames"])
    static = StaticContextCache(drafter.model)
    for expected, got in zip(eager, _dflash_rounds(drafter, static, commits=commits), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert dict(counters["frames"]) == frames, "a round after the first few compiled a graph"
    assert static.past == WALKED and WALKED < static.capacity <= WALKED + _SLACK + 2 * MAX_ROWS
    prompt = torch.randint(0, VOCAB - 1, (1, 12), generator=torch.Generator().manual_seed(3))
    for tree in (None, "auto"):
        out = speculative_generate(
            verifier, drafter, prompt, max_new_tokens=40, gamma=4, temperature=0, tree=tree, compile=True
        )
        assert drafter.compiled and isinstance(drafter._static, StaticContextCache)
        assert torch.equal(out.sequences, reference_greedy(verifier, prompt, 40))
