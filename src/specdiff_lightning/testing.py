"""Helpers that prove a decoding mode lossless: exact sequence probabilities and a chi-square test.

Used by the test suite and the notebooks (extend the engine, then check the extension here).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
from scipy import stats as scipy_stats
from torch import nn

from .decoding.sampling import logits_to_probs

__all__ = [
    "exact_sequence_probs",
    "sample_counts",
    "chi_square_test",
    "ChiSquareResult",
    "perturb",
    "detection_power",
    "samples_to_detect",
]


@torch.no_grad()
def exact_sequence_probs(
    verifier: nn.Module,
    input_ids: torch.Tensor,
    length: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> dict[tuple[int, ...], float]:
    """Enumerate ``P(x_1..x_length | prompt)`` under the verifier's warped distribution.

    Only for tiny vocabularies (``V ** length`` sequences). Returns a dict over token tuples.
    """
    vocab = int(verifier.config.vocab_size)
    prefixes: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(length):
        keys = list(prefixes)
        batch = torch.cat(
            [input_ids.repeat(len(keys), 1), torch.tensor(keys, dtype=torch.long).reshape(len(keys), -1)],
            dim=1,
        )
        logits = verifier(input_ids=batch, attention_mask=torch.ones_like(batch)).logits[:, -1]
        probs = logits_to_probs(logits, temperature, top_k, top_p).double().cpu()
        prefixes = {
            key + (tok,): prefixes[key] * float(probs[i, tok])
            for i, key in enumerate(keys)
            for tok in range(vocab)
            if probs[i, tok] > 0
        }
    return prefixes


def sample_counts(draw: Callable[[], tuple[int, ...]], num_samples: int) -> Counter:
    """Call ``draw`` ``num_samples`` times and count the outcomes."""
    return Counter(draw() for _ in range(num_samples))


@dataclass(frozen=True)
class ChiSquareResult:
    statistic: float
    dof: int
    pvalue: float
    num_bins: int


def chi_square_test(counts: Counter, probs: dict, min_expected: float = 5.0) -> ChiSquareResult:
    """Pearson goodness-of-fit of sampled ``counts`` against exact ``probs``.

    Outcomes whose expected count is below ``min_expected`` are pooled into one bin; an observed
    outcome with zero probability fails the test outright (p-value 0).
    """
    total = sum(counts.values())
    if any(outcome not in probs for outcome in counts):
        return ChiSquareResult(float("inf"), 0, 0.0, 0)
    observed, expected = [], []
    pooled_obs, pooled_exp = 0.0, 0.0
    for outcome, prob in probs.items():
        e = prob * total
        if e < min_expected:
            pooled_obs += counts.get(outcome, 0)
            pooled_exp += e
        else:
            observed.append(counts.get(outcome, 0))
            expected.append(e)
    if pooled_exp > 0:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    obs = torch.tensor(observed, dtype=torch.float64)
    exp = torch.tensor(expected, dtype=torch.float64)
    statistic = float(((obs - exp) ** 2 / exp).sum())
    dof = len(observed) - 1
    return ChiSquareResult(statistic, dof, float(scipy_stats.chi2.sf(statistic, dof)), len(observed))


def perturb(probs: dict, bias: float = 0.02) -> dict:
    """Move ``bias`` probability mass from the most to the second most likely outcome (a total
    variation shift of ``bias``): the alternative a sampling test must be able to reject."""
    ranked = sorted(probs, key=probs.get, reverse=True)
    top, second = ranked[0], ranked[1]
    moved = min(bias, probs[top])
    out = dict(probs)
    out[top] -= moved
    out[second] += moved
    return out


def detection_power(
    probs: dict, num_samples: int, bias: float = 0.02, alpha: float = 1e-3, min_expected: float = 5.0
) -> float:
    """The chance that :func:`chi_square_test` of ``num_samples`` draws from ``probs`` against
    ``perturb(probs, bias)`` rejects at level ``alpha``: the noncentral chi-square's tail, over the
    bins the test itself forms (outcomes expected fewer than ``min_expected`` times pooled)."""
    reference = perturb(probs, bias)
    kept = [k for k in reference if reference[k] * num_samples >= min_expected]
    pooled = [k for k in reference if reference[k] * num_samples < min_expected]
    bins = [([k], reference[k]) for k in kept]
    if pooled:
        bins.append((pooled, sum(reference[k] for k in pooled)))
    noncentrality = num_samples * sum((sum(probs[k] for k in keys) - q) ** 2 / q for keys, q in bins if q > 0)
    dof = len(bins) - 1
    return float(scipy_stats.ncx2.sf(scipy_stats.chi2.isf(alpha, dof), dof, noncentrality))


def samples_to_detect(
    probs: dict, bias: float = 0.02, alpha: float = 1e-3, power: float = 0.9999, at_least: int = 1000
) -> int:
    """The fewest draws (a multiple of 500, at least ``at_least``) with which a sampling test of
    ``probs`` rejects a ``bias`` shift (:func:`perturb`) with probability ``power``. Size a test's
    sample with it, so that its check "these counts reject a biased reference" holds on any run,
    not by the luck of one seed: at 6,000 draws a flatter distribution is caught only ~99% of
    the time."""
    n = max(500, -(-at_least // 500) * 500)  # at_least rounded up to a multiple of 500
    while detection_power(probs, n, bias, alpha) < power:
        n += 500
    return n
