"""The sampling tests' own statistics: the power of a chi-square test against a biased reference."""

from collections import Counter

import torch

from specdiff_lightning.testing import (
    chi_square_test,
    detection_power,
    perturb,
    samples_to_detect,
)

#: a flat-ish law over 40 outcomes, like a 3-token continuation of a tiny model
PROBS = dict(enumerate((torch.linspace(1.0, 2.0, 40) / torch.linspace(1.0, 2.0, 40).sum()).tolist()))


def test_the_predicted_power_is_the_rate_at_which_draws_reject_the_bias():
    """Simulated: 400 samples of n draws each; the share whose counts reject ``perturb(PROBS)`` at
    1e-3 is the predicted power, within Monte Carlo error."""
    n = 1000
    predicted = detection_power(PROBS, n, bias=0.02, alpha=1e-3)
    assert 0.2 < predicted < 0.8  # a size where the rate is informative
    generator = torch.Generator().manual_seed(0)
    weights = torch.tensor([PROBS[k] for k in range(40)], dtype=torch.float64)
    rejected = 0
    for _ in range(400):
        draws = torch.multinomial(weights, n, replacement=True, generator=generator)
        counts = Counter(draws.tolist())
        rejected += chi_square_test(counts, perturb(PROBS, 0.02)).pvalue < 1e-3
    assert abs(rejected / 400 - predicted) < 0.1, (rejected / 400, predicted)


def test_samples_to_detect_is_the_fewest_multiple_of_500_with_the_power():
    n = samples_to_detect(PROBS, bias=0.02, alpha=1e-3, power=0.999)
    assert n % 500 == 0
    assert detection_power(PROBS, n, 0.02, 1e-3) >= 0.999 > detection_power(PROBS, n - 500, 0.02, 1e-3)
    assert samples_to_detect(PROBS, power=0.999, at_least=10**6) == 10**6
    assert samples_to_detect({0: 0.5, 1: 0.5}, bias=0.2, at_least=1001) == 1500  # rounded up
