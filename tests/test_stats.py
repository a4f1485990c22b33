"""`mtp_cli.stats`: the paired and hierarchical bootstraps behave as statistics must — nothing from
identical models, a planted shift recovered, seed variation widening the interval — agree with the
textbook where there is one, and are deterministic; rates keep the Wilson interval."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from mtp_cli import stats


def _items(values, prefix="item") -> pd.Series:
    return pd.Series(np.asarray(values, dtype=float), index=[f"{prefix}/{i}" for i in range(len(values))])


def _width(e: stats.Estimate) -> float:
    return e.hi - e.lo


@pytest.fixture
def difficulty():
    """Per-item difficulty shared by every model: the spread that pairing removes."""
    return np.random.default_rng(1).gamma(2.0, 0.5, size=300)


def test_identical_models_give_zero_with_a_zero_width_interval(difficulty):
    a = _items(difficulty)
    e = stats.paired_bootstrap(a, a.copy())
    assert (e.value, e.lo, e.hi) == (0.0, 0.0, 0.0)
    seeds = {s: _items(difficulty + 0.1 * s) for s in range(3)}  # seed noise, but the same on both sides
    e = stats.hierarchical_difference(seeds, {s: v.copy() for s, v in seeds.items()})
    assert (e.value, e.lo, e.hi) == (0.0, 0.0, 0.0) and e.n_seeds == (3, 3)


def test_a_planted_shift_is_recovered(difficulty):
    rng = np.random.default_rng(2)
    base = _items(difficulty)
    variant = _items(difficulty - 0.05 + rng.normal(0, 0.03, difficulty.size))
    e = stats.paired_bootstrap(variant, base)
    assert e.value == pytest.approx(-0.05, abs=0.005)
    assert e.lo < -0.05 < e.hi and e.hi < 0
    # the textbook paired interval: mean ± 1.96 sd/√n of the per-item differences
    d = (variant - base).to_numpy()
    half = 1.96 * d.std(ddof=1) / math.sqrt(d.size)
    assert _width(e) == pytest.approx(2 * half, rel=0.15)
    # pairing is what makes it tight: the unpaired interval is an order of magnitude wider
    widths = [np.subtract(*stats.bootstrap_mean(x.to_numpy())[::-1]) for x in (variant, base)]
    assert _width(e) < 0.2 * math.hypot(*widths)


def test_items_pair_by_id_not_by_position(difficulty):
    base = _items(difficulty)
    shuffled = (base + 0.2).sample(frac=1.0, random_state=0)  # same items, another order, one extra item
    shuffled["extra/0"] = 100.0
    e = stats.paired_bootstrap(shuffled, base)
    assert e.n_items == 300
    assert e.value == pytest.approx(0.2) and _width(e) == pytest.approx(0.0, abs=1e-12)


def test_seed_variation_widens_the_interval(difficulty):
    rng = np.random.default_rng(3)
    seed_effect = {"ntp": [0.0, 0.06, -0.04], "mtp": [0.05, -0.03, 0.01]}  # per-seed offsets, as at quick scale

    def runs(name, shift):
        return {s: _items(difficulty + shift + off + rng.normal(0, 0.02, difficulty.size))
                for s, off in enumerate(seed_effect[name])}

    ntp, mtp = runs("ntp", 0.0), runs("mtp", -0.02)
    one_seed = stats.paired_bootstrap(mtp[0], ntp[0])
    hier = stats.hierarchical_difference(mtp, ntp)
    assert "hierarchical" in hier.method and "paired bootstrap" in one_seed.method
    assert _width(hier) > 3 * _width(one_seed)
    # the true difference of the objectives (−0.02 plus the mean seed offsets) is inside the wide interval
    truth = -0.02 + np.mean(seed_effect["mtp"]) - np.mean(seed_effect["ntp"])
    assert hier.lo < truth < hier.hi
    assert hier.value == pytest.approx(np.mean([mtp[s].mean() for s in mtp]) - np.mean([ntp[s].mean() for s in ntp]))


def test_without_seed_variation_hierarchical_is_as_tight_as_paired(difficulty):
    rng = np.random.default_rng(4)
    noise = rng.normal(0, 0.02, difficulty.size)
    ntp = {s: _items(difficulty) for s in range(3)}
    mtp = {s: _items(difficulty - 0.03 + noise) for s in range(3)}
    hier = stats.hierarchical_difference(mtp, ntp)
    one = stats.paired_bootstrap(mtp[0], ntp[0])
    assert hier.value == pytest.approx(one.value)
    assert _width(hier) == pytest.approx(_width(one), rel=0.1)


def test_unpaired_seed_sets_are_drawn_independently(difficulty):
    a = {0: _items(difficulty), 1: _items(difficulty + 0.1)}
    b = {2: _items(difficulty), 3: _items(difficulty + 0.1)}
    e = stats.hierarchical_difference(a, b)
    assert "(paired)" in e.method and "seeds (paired)" not in e.method
    assert e.value == pytest.approx(0.0) and e.lo < 0 < e.hi  # same distribution, but seeds not paired
    same = stats.hierarchical_difference(a, {0: a[0].copy(), 1: a[1].copy()})
    assert "seeds (paired)" in same.method and _width(same) == 0


def test_deterministic_and_empty(difficulty):
    a, b = _items(difficulty), _items(difficulty[::-1])
    assert stats.paired_bootstrap(a, b) == stats.paired_bootstrap(a, b)
    assert stats.paired_bootstrap(a, _items(difficulty, prefix="other")) is None  # no common item
    assert stats.hierarchical_difference({}, {0: a}) is None


def test_ratio_over_prompts_and_seeds():
    accepted = {0: pd.Series([1.0, 4.0, 0.0, 3.0]), 1: pd.Series([2.0, 3.0, 1.0, 3.0])}
    drafted = {0: pd.Series([4.0, 4.0, 4.0, 4.0]), 1: pd.Series([4.0, 4.0, 4.0, 4.0])}
    e = stats.hierarchical_ratio(accepted, drafted)
    assert e.value == pytest.approx((8 / 16 + 9 / 16) / 2) and e.lo < e.value < e.hi
    prompts_only = stats.hierarchical_ratio(accepted, drafted, resample_seeds=False)
    assert prompts_only.value == e.value and prompts_only.method == "bootstrap over items"
    flat = stats.hierarchical_ratio({0: pd.Series([2.0, 2.0])}, {0: pd.Series([4.0, 4.0])})
    assert (flat.value, flat.lo, flat.hi) == (0.5, 0.5, 0.5)
    assert stats.hierarchical_ratio({0: pd.Series([0.0])}, {0: pd.Series([0.0])}) is None


def test_binary_metrics_keep_wilson():
    (lo, hi), method = stats.binary_or_bootstrap([1, 0, 0, 1, 0, 0, 0, 0, 0, 0])
    assert method == "wilson" and (lo, hi) == stats.wilson(2, 10)
    # Wilson 2/10 from the closed form (Agresti & Coull 1998): 0.0567, 0.5098
    assert lo == pytest.approx(0.05668, abs=1e-4) and hi == pytest.approx(0.50984, abs=1e-4)
    _, method = stats.binary_or_bootstrap([0.5, 1.0])
    assert method == "bootstrap"


def test_t_interval_matches_the_textbook():
    mean, lo, hi = stats.t_interval([1.0, 2.0, 3.0])
    half = 4.302652729911275 * 1.0 / math.sqrt(3)  # t(0.975, 2) · sd / √n
    assert mean == 2.0 and math.isclose(lo, 2 - half) and math.isclose(hi, 2 + half)
    assert stats.t_interval([5.0]) == (5.0, None, None)
