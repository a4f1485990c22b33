"""Seed-level inference: the unit of replication is the training seed, not the item.

A variant's difference to NTP is measured per seed s on the items both runs scored: Δ_s, the paired
mean over items. Its 95% interval over seeds is

    mean(Δ_s) ± √( t²₀.₉₇₅,ₙ₋₁ · var_s(Δ_s)/n  +  z²₀.₉₇₅ · S/n_items )

The first term is the Student t over the n per-seed Δs. The second is the item-level variance the
seeds share. Every seed is scored on the same items, so an item that favours the variant does so in
every seed. That part of the evaluation set's noise does not show in the seeds' spread. S is the mean
covariance, over items, of two seeds' per-item Δs (an estimate of that shared per-item variance,
clipped at 0). The first term has n − 1 degrees of freedom and the second n_items − 1 (about normal),
so their half-widths add in quadrature. With one seed there is no interval over seeds (None: "n/a" in
the report). Separately, `Estimate.items_lo/hi` hold the within-seed interval over items (seeds held
fixed): evaluation-set noise only.

`Estimate.detectable` is the minimal detectable difference: the |Δ| that a two-sided test at 5% would
find with about 80% power, from the same two terms: √((t₀.₉₇₅ + t₀.₈₀)² · var_s/n + (z₀.₉₇₅ + z₀.₈₀)² · S/n_items).
That rule is the usual approximation: with 3 seeds (and no item term) an exact t-test has 77% power at that
|Δ| and reaches 80% at one about 5% larger (tests/test_stats.py simulates both).

Ratios (speed-ups) are averaged and given intervals on the log scale, so no interval goes below zero.

A simulation over 2, 3 and 5 seeds (tests/test_stats.py) checks that this interval covers 95%, while the
hierarchical percentile bootstrap the report used before (`stats.hierarchical_difference`, kept as
the control) does not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from mtp_cli.base import stats
from mtp_cli.base.stats import Estimate

CONFIDENCE = 0.95
POWER = 0.80


def _quantiles(df: float) -> tuple[float, float]:
    """(two-sided 95% quantile, 80% power quantile) of Student's t with `df` degrees of freedom."""
    from scipy.stats import t  # scipy: a second of start-up, for intervals only

    return float(t.ppf(1 - (1 - CONFIDENCE) / 2, df)), float(t.ppf(POWER, df))


def shared_item_variance(per_item: np.ndarray) -> float:
    """Of an (seeds × items) matrix of per-item contributions: the variance of their mean over items
    that every seed shares. That is the mean covariance, over items, between two different seeds' rows
    (never below 0), divided by the number of items. 0 with one seed or one item."""
    n, n_items = per_item.shape
    if n < 2 or n_items < 2:
        return 0.0
    cov = np.cov(per_item)
    shared = (cov.sum() - np.trace(cov)) / (n * (n - 1))
    return max(float(shared), 0.0) / n_items


def t_over_seeds(per_seed: Sequence[float], item_variance: float = 0.0) -> tuple[float | None, float | None, float | None]:
    """(lo, hi, minimal detectable difference) for the mean of `per_seed`: the t half-width over the
    seeds (n − 1 degrees of freedom) and the normal half-width of `item_variance`, in quadrature.
    Nones with fewer than two values."""
    x = np.asarray(per_seed, dtype=np.float64)
    if x.size < 2:
        return None, None, None
    seed_var, item_var = float(x.var(ddof=1)) / x.size, max(item_variance, 0.0)
    (t_conf, t_power), (z_conf, z_power) = _quantiles(x.size - 1), _quantiles(math.inf)
    half = math.sqrt(t_conf**2 * seed_var + z_conf**2 * item_var)
    mdd = math.sqrt((t_conf + t_power) ** 2 * seed_var + (z_conf + z_power) ** 2 * item_var)
    mean = float(x.mean())
    return mean - half, mean + half, mdd


def _all_zero(*matrices: np.ndarray) -> bool:
    return all(m.size and not np.any(m) for m in matrices)


def seed_difference(variant: Mapping[int, pd.Series], base: Mapping[int, pd.Series],
                    within: bool = True) -> Estimate | None:
    """mean(variant) − mean(base) over the items every run scored, with the interval over seeds above
    and, if `within`, the within-seed interval over items (a bootstrap; evaluation-set noise only).

    `variant`/`base`: {grid seed: per-item values indexed by item id}. Seeds that both sides ran are
    paired (Δ_s per seed) and the rest left out. Without a common seed the two sides' seed means are
    compared (Welch t, item term added). None when no item is common to every run."""
    items = stats.common_items(variant, base)
    if not variant or not base or len(items) == 0:
        return None
    common = sorted(set(variant) & set(base))
    if common:
        variant, base = {s: variant[s] for s in common}, {s: base[s] for s in common}
    v, b = stats._item_matrix(variant, items), stats._item_matrix(base, items)
    inside = stats.hierarchical_difference(variant, base, resample_seeds=False) if within else None
    value = float(v.mean() - b.mean())
    seeds = (len(variant), len(base))
    if common:
        per_seed = tuple(float(x) for x in v.mean(1) - b.mean(1))
        lo, hi, mdd = t_over_seeds(per_seed, shared_item_variance(v - b))
        method = (f"t over {len(per_seed)} paired seeds, shared item variance added" if len(per_seed) > 1
                  else "one seed: no interval over seeds")
    else:
        per_seed = ()
        lo, hi, mdd, method = _welch(v, b, value)
    return Estimate(value, lo, hi, method, len(items), seeds, per_seed=per_seed,
                    items_lo=inside.lo if inside else None, items_hi=inside.hi if inside else None,
                    detectable=mdd, all_zero=_all_zero(v, b))


def _welch(v: np.ndarray, b: np.ndarray, value: float):
    """Unpaired seeds: Welch's t on the two sides' per-seed means; each side's shared item variance added."""
    if len(v) < 2 or len(b) < 2:
        return None, None, None, "unpaired seeds, fewer than 2 a side: no interval over seeds"
    mv, mb = v.mean(1), b.mean(1)
    sa, sb = mv.var(ddof=1) / mv.size, mb.var(ddof=1) / mb.size
    df = (sa + sb) ** 2 / (sa**2 / (mv.size - 1) + sb**2 / (mb.size - 1)) if sa + sb > 0 else mv.size + mb.size - 2
    items = shared_item_variance(v) + shared_item_variance(b)
    (t_conf, t_power), (z_conf, z_power) = _quantiles(df), _quantiles(math.inf)
    half = math.sqrt(t_conf**2 * (sa + sb) + z_conf**2 * items)
    mdd = math.sqrt((t_conf + t_power) ** 2 * (sa + sb) + (z_conf + z_power) ** 2 * items)
    return value - half, value + half, mdd, "Welch t over unpaired seeds, shared item variance added"


def seed_ratio(numerators: Mapping[int, pd.Series], denominators: Mapping[int, pd.Series],
               bounds: tuple[float, float] | None = (0.0, 1.0)) -> Estimate | None:
    """Mean over seeds of Σ numerator / Σ denominator over items (acceptance = accepted / drafted over
    prompts): a t over the per-seed ratios, with the variance the seeds share through their common
    prompts added (each prompt's linearised contribution to its seed's ratio), kept within `bounds`;
    the within-seed interval is the bootstrap over prompts with the seeds held fixed."""
    inside = stats.hierarchical_ratio(numerators, denominators, resample_seeds=False)
    if inside is None:
        return None
    items = stats.common_items(numerators, denominators)
    num, den = stats._item_matrix(numerators, items), stats._item_matrix(denominators, items)
    ratio = num.sum(1) / den.sum(1)
    contribution = (num - ratio[:, None] * den) / den.mean(1, keepdims=True)  # mean over items = 0 per seed
    lo, hi, mdd = t_over_seeds(ratio, shared_item_variance(contribution))
    if lo is not None and bounds is not None:
        lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
    method = f"t over {len(ratio)} seeds, shared prompt variance added" if len(ratio) > 1 else "one seed"
    return Estimate(inside.value, lo, hi, method, inside.n_items, (len(ratio),), per_seed=inside.per_seed,
                    items_lo=inside.lo, items_hi=inside.hi, detectable=mdd, all_zero=_all_zero(num))


def log_t_interval(values: Sequence[float]) -> tuple[float, float | None, float | None]:
    """Geometric mean of positive ratios (speed-ups) and its 95% t-interval over seeds on the log scale:
    both ends stay above zero. No interval from one value; nan when a value is not a positive number."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0 or np.any(~np.isfinite(x)) or np.any(x <= 0):
        return float("nan"), None, None
    logs = np.log(x)
    centre = float(np.exp(logs.mean()))
    lo, hi, _ = t_over_seeds(logs)
    if lo is None:
        return centre, None, None
    return centre, float(np.exp(lo)), float(np.exp(hi))
