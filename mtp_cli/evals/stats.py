"""Uncertainty for every score we report: which interval, computed one way everywhere.

- Means of per-item 0/1 outcomes (greedy pass@1, GSM8K exact match): the Wilson score interval,
  which stays inside [0, 1] and is sensible at 0 or n successes (the usual case at laptop scale).
- Means of per-item real values (pass@k from n samples per problem, per-window losses): a
  percentile bootstrap over items with a fixed seed, so the same inputs give the same interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Z95 = 1.959963984540054
BOOTSTRAP_ITERS = 2000


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """95% Wilson score interval for a binomial proportion."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if successes <= 0 else max(0.0, centre - half)  # exact at the ends, not 1e-17 off
    hi = 1.0 if successes >= n else min(1.0, centre + half)
    return (lo, hi)


def bootstrap_mean(values: Sequence[float], iters: int = BOOTSTRAP_ITERS, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the mean of `values` (items resampled with replacement)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return (float("nan"), float("nan"))
    if x.size == 1 or np.all(x == x[0]):
        return (float(x[0]), float(x[0]))
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(iters, x.size))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return (float(lo), float(hi))


def binary_or_bootstrap(values: Sequence[float]) -> tuple[tuple[float, float], str]:
    """The interval for a mean of per-item scores and the name of the method used."""
    x = np.asarray(values, dtype=np.float64)
    if np.all((x == 0) | (x == 1)):
        return wilson(float(x.sum()), int(x.size)), "wilson"
    return bootstrap_mean(x), "bootstrap"
