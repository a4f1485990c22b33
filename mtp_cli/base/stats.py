"""Uncertainty for every number we report, computed one way everywhere (evals, tables and plots).

- Means of per-item 0/1 outcomes (greedy pass@1, GSM8K exact match): the Wilson score interval,
  which stays inside [0, 1] and is sensible at 0 or n successes (the usual case at laptop scale).
- Means of per-item real values (pass@k from n samples, per-window losses, per-problem bits/byte):
  a percentile bootstrap over items.
- A difference between two models scored on the same items: a *paired* bootstrap (items resampled
  once for both), which removes the item-to-item spread that dominates unpaired intervals.
- A difference between two variants trained with several seeds: see `seed_stats` (a Student t over
  the per-seed paired differences). The *hierarchical* percentile bootstrap here, which resamples
  seeds and then items, is kept only as the control of its coverage test: with 2-5 seeds it can draw
  only a few seed combinations, so its "95%" interval covers far less than 95% (tests/test_stats.py).
  With its seeds held fixed (`resample_seeds=False`) it is the within-seed interval over items:
  evaluation-set noise only.
- A value over seeds without per-item data: the Student-t interval of the seed values.
- Specbench's timings over repeats: a percentile bootstrap of the median; its acceptance rate over
  prompts: a percentile bootstrap of the ratio of sums (accepted / drafted).

Every bootstrap draws from a fixed seed: the same inputs give the same interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

Z95 = 1.959963984540054
BOOTSTRAP_ITERS = 2000
SEED = 0


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


def bootstrap_mean(values: Sequence[float], iters: int = BOOTSTRAP_ITERS, seed: int = SEED) -> tuple[float, float]:
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


def t_interval(values: Sequence[float]) -> tuple[float, float | None, float | None]:
    """Mean and its 95% Student-t interval (no interval from one value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None, None
    from scipy.stats import t  # scipy: a second of start-up, for intervals only

    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


# ---- timings and acceptance (specbench) ----------------------------------------------------------------
def median_ci(values: Sequence[float], seed: int = 0, n_boot: int = 2000) -> tuple[float, list[float]]:
    """Median and its 95% percentile-bootstrap interval."""
    v = np.asarray([x for x in values if x == x], dtype=float)  # NaN-free
    if len(v) == 0:
        return float("nan"), [float("nan"), float("nan")]
    med = float(np.median(v))
    if len(v) == 1:
        return med, [med, med]
    boots = np.median(np.random.default_rng(seed).choice(v, size=(n_boot, len(v))), axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return med, [float(lo), float(hi)]


def ratio_ci(numerators: Sequence[float], denominators: Sequence[float], seed: int = 0,
             n_boot: int = 2000) -> list[float | None]:
    """95% percentile-bootstrap interval of sum(numerators) / sum(denominators), units resampled with
    replacement ([None, None] when nothing was drafted)."""
    num, den = np.asarray(numerators, dtype=float), np.asarray(denominators, dtype=float)
    if not len(den) or den.sum() == 0:
        return [None, None]
    pick = np.random.default_rng(seed).integers(0, len(den), size=(n_boot, len(den)))
    d = den[pick].sum(1)
    ratios = num[pick].sum(1)[d > 0] / d[d > 0]
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return [float(lo), float(hi)]



def rate_ratio_ci(tokens_a: Sequence[float], seconds_a: Sequence[float], tokens_b: Sequence[float],
                  seconds_b: Sequence[float], seed: int = 0, n_boot: int = 2000) -> list[float | None]:
    """95% paired percentile-bootstrap interval of (Σ tokens_a / Σ seconds_a) / (Σ tokens_b / Σ seconds_b),
    units (prompts) resampled with replacement, the same draw for both sides."""
    ta, sa, tb, sb = (np.asarray(x, dtype=float) for x in (tokens_a, seconds_a, tokens_b, seconds_b))
    if not len(sa) or not (len(sa) == len(ta) == len(tb) == len(sb)):
        return [None, None]
    pick = np.random.default_rng(seed).integers(0, len(sa), size=(n_boot, len(sa)))
    ratios = (ta[pick].sum(1) / sa[pick].sum(1)) / (tb[pick].sum(1) / sb[pick].sum(1))
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return [float(lo), float(hi)]

# ---- per-item bootstraps ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Estimate:
    """A point estimate with its 95% interval and what the interval covers."""

    value: float
    lo: float | None
    hi: float | None
    method: str
    n_items: int = 0
    n_seeds: tuple[int, ...] = ()  # seeds per side (one entry for a mean, two for a difference)
    per_seed: tuple[float, ...] = ()  # the value per seed (per paired seed for a difference), in seed order
    items_lo: float | None = None  # the within-seed interval over items: evaluation-set noise only
    items_hi: float | None = None
    detectable: float | None = None  # minimal detectable |difference|, 95% confidence and 80% power
    all_zero: bool = False  # every value on both sides is 0: nothing was measured that could differ


def _item_matrix(runs: Mapping[int, pd.Series], items: pd.Index) -> np.ndarray:
    """(seeds × items) values, rows in seed order, columns in `items` order."""
    return np.stack([runs[s].reindex(items).to_numpy(dtype=np.float64) for s in sorted(runs)])


def common_items(*sides: Mapping[int, pd.Series]) -> pd.Index:
    """Item ids present (and not NaN) in every run of every side, sorted so the result is reproducible."""
    sets = [set(series.dropna().index) for side in sides for series in side.values()]
    return pd.Index(sorted(set.intersection(*sets))) if sets else pd.Index([])


CHUNK_CELLS = 2_000_000  # resampling weights held at once (iterations × items), to bound memory


def _resampled_sums(rng: np.random.Generator, iters: int, *matrices: np.ndarray) -> list[np.ndarray]:
    """For each (seeds × items) matrix, the (iters × seeds) means over items resampled with replacement;
    one item draw per iteration, shared by every matrix and every seed (that keeps the pairing)."""
    n_items = matrices[0].shape[1]
    chunk = max(1, CHUNK_CELLS // n_items)
    out: list[list[np.ndarray]] = [[] for _ in matrices]
    for start in range(0, iters, chunk):
        weights = rng.multinomial(n_items, np.full(n_items, 1.0 / n_items), size=min(chunk, iters - start)) / n_items
        for acc, m in zip(out, matrices):
            acc.append(weights @ m.T)
    return [np.concatenate(acc) for acc in out]


def _seed_draws(rng: np.random.Generator, iters: int, n_seeds: int, resample: bool) -> np.ndarray:
    if not resample or n_seeds == 1:
        return np.tile(np.arange(n_seeds), (iters, 1))
    return rng.integers(0, n_seeds, size=(iters, n_seeds))


def _percentiles(samples: np.ndarray) -> tuple[float, float]:
    lo, hi = np.percentile(samples, [2.5, 97.5])
    return float(lo), float(hi)


def hierarchical_difference(variant: Mapping[int, pd.Series], base: Mapping[int, pd.Series],
                            iters: int = BOOTSTRAP_ITERS, seed: int = SEED,
                            resample_seeds: bool = True) -> Estimate | None:
    """mean(variant) − mean(base) over the items every run scored, with a 95% interval from a
    bootstrap that resamples seeds on each side (unless `resample_seeds` is False), then items (one
    item draw shared by all runs).

    `variant`/`base`: {training seed: per-item values indexed by item id}. When both sides ran the
    same seeds, seed s of one side is drawn together with seed s of the other (they share data order
    and initialisation); otherwise each side's seeds are drawn independently. With one seed per side,
    or the seeds held fixed, this is the paired bootstrap over items. None when no item is common to
    every run. Resampling seeds, it is the control that fails the coverage test (module docstring)."""
    items = common_items(variant, base)
    if not variant or not base or len(items) == 0:
        return None
    v, b = _item_matrix(variant, items), _item_matrix(base, items)
    value = float(v.mean() - b.mean())
    paired_seeds = sorted(variant) == sorted(base)
    rng = np.random.default_rng(seed)
    per_seed_v, per_seed_b = _resampled_sums(rng, iters, v, b)  # (iters × seeds): each run's resampled mean
    sv = _seed_draws(rng, iters, len(v), resample=resample_seeds)
    sb = sv if paired_seeds else _seed_draws(rng, iters, len(b), resample=resample_seeds)
    diffs = np.take_along_axis(per_seed_v, sv, 1).mean(1) - np.take_along_axis(per_seed_b, sb, 1).mean(1)
    lo, hi = _percentiles(diffs)
    seeds = (len(variant), len(base))
    if max(seeds) == 1:
        method = "paired bootstrap over items (one seed per side)"
    elif not resample_seeds:
        method = "paired bootstrap over items, seeds held fixed"
    else:
        method = f"hierarchical bootstrap: seeds{' (paired)' if paired_seeds else ''}, then items (paired)"
    return Estimate(value, lo, hi, method, len(items), seeds)


def hierarchical_ratio(numerators: Mapping[int, pd.Series], denominators: Mapping[int, pd.Series],
                       resample_seeds: bool = True, iters: int = BOOTSTRAP_ITERS,
                       seed: int = SEED) -> Estimate | None:
    """Mean over seeds of Σ numerator / Σ denominator over items (e.g. accepted / drafted over prompts),
    with a 95% interval from resampling items (shared across seeds) and, if `resample_seeds`, seeds."""
    items = common_items(numerators, denominators)
    if not numerators or len(items) == 0:
        return None
    num, den = _item_matrix(numerators, items), _item_matrix(denominators, items)
    totals = den.sum(1)
    if np.any(totals <= 0):
        return None
    per_seed = num.sum(1) / totals
    rng = np.random.default_rng(seed)
    num_means, den_means = _resampled_sums(rng, iters, num, den)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratios = num_means / den_means
    draws = _seed_draws(rng, iters, len(num), resample=resample_seeds)
    samples = np.take_along_axis(ratios, draws, 1).mean(1)
    samples = samples[np.isfinite(samples)]
    lo, hi = _percentiles(samples) if samples.size else (None, None)
    over = "seeds, then items" if resample_seeds and len(num) > 1 else "items"
    return Estimate(float(per_seed.mean()), lo, hi, f"bootstrap over {over}", len(items), (len(num),),
                    per_seed=tuple(float(x) for x in per_seed))


# ---- paired speed-ups over prompts and repeats (specbench) ---------------------------------------------
CROSSED_INTERVAL = ("geometric mean over prompts (batches above batch size 1) and repeats of the paired per-prompt "
                    "ratio; 95% t interval of the mean log ratio under crossed random effects of prompt and repeat "
                    "(two-way ANOVA: Var = (MS_prompt + MS_repeat - MS_residual) / (n R), Satterthwaite degrees of "
                    "freedom, or the df of a term holding a fifth of the variance where fewer), so that it covers the "
                    "machine's repeat-to-repeat drift as well as which prompts were drawn")


MATERIAL_SHARE = 0.2


def crossed_log_mean_ci(log_ratios) -> tuple[float, list[float | None]]:
    """exp of the mean of an n × R matrix of log ratios (units × repeats) and its 95% interval (CROSSED_INTERVAL).

    A repeat's machine state (a slow spell, another process) moves every unit of that repeat alike, so the
    repeats are one random effect, the units another, crossed: ignoring either (a bootstrap over prompts of
    their medians, or a t over repeats alone) gives an interval narrower than the run-to-run spread. The
    variance estimate is floored at the larger of the two one-way terms, so that it is never below either
    (the ANOVA combination can fall below them by chance)."""
    y = np.asarray(log_ratios, dtype=float)
    if y.ndim != 2 or not y.size or not np.isfinite(y).all():
        return float("nan"), [None, None]
    n, reps = y.shape
    grand = float(y.mean())
    if n * reps == 1:
        return math.exp(grand), [None, None]
    rows, cols = y.mean(1), y.mean(0)
    ms_unit = reps * float(((rows - grand) ** 2).sum()) / (n - 1) if n > 1 else 0.0
    ms_rep = n * float(((cols - grand) ** 2).sum()) / (reps - 1) if reps > 1 else 0.0
    if n > 1 and reps > 1:
        resid = y - rows[:, None] - cols[None, :] + grand
        ms_err = float((resid ** 2).sum()) / ((n - 1) * (reps - 1))
        terms = [(ms_unit, n - 1), (ms_rep, reps - 1), (-ms_err, (n - 1) * (reps - 1))]
    else:  # one unit or one repeat: only the other effect can be seen
        terms = [(ms_unit, n - 1)] if n > 1 else [(ms_rep, reps - 1)]
    combo = sum(m for m, _ in terms)
    floor = max(ms_unit, ms_rep)
    if max(combo, floor) <= 0:  # every cell alike: nothing varied
        return math.exp(grand), [math.exp(grand), math.exp(grand)]
    if combo < floor:
        df = (n - 1) if ms_unit >= ms_rep else (reps - 1)
        combo = floor
    else:
        # Satterthwaite's df is liberal when a term with few degrees of freedom carries much of the variance
        # (two repeats' worth of drift): then that term's own df, which the simulation test holds to >= 93%
        df = min([combo ** 2 / sum(m ** 2 / d for m, d in terms)]
                 + [d for m, d in terms if m >= MATERIAL_SHARE * combo])
    from scipy.stats import t  # scipy: a second of start-up, for intervals only

    half = float(t.ppf(0.975, df)) * math.sqrt(combo / (n * reps))
    return math.exp(grand), [math.exp(grand - half), math.exp(grand + half)]
