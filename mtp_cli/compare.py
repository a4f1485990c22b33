"""The comparisons the report and the plots draw: a variant's value, its difference to NTP and the
noise floor (the same difference between two NTP seeds), and speculative acceptance, each with the
interval that fits the data stored (see `stats`):

- per-item metrics (held-out windows, HumanEval / GSM8K gold bits/byte) when every run stored its
  items: a hierarchical bootstrap over seeds, then items (paired per item, and per seed when both
  variants ran the same seeds);
- otherwise (pass rates, older results): over seeds, a paired t over common seeds or Welch t; with
  one seed, the per-run intervals combined as √(h₁² + h₂²) (Wilson for pass rates), and said so.
"""

from __future__ import annotations

import math

import pandas as pd

from mtp_cli import results, stats
from mtp_cli.resultset import Metric, ResultSet, values
from mtp_cli.stats import Estimate

NEEDS_TWO_NTP_SEEDS = "needs ≥ 2 NTP seeds"


def summarize(rows: pd.DataFrame, m: Metric) -> Estimate | None:
    """A variant's value: the mean over seeds with a t-interval, or the single run's own interval."""
    vals = values(rows, m.col)
    if not vals:
        return None
    if len(vals) >= 2:
        mean, lo, hi = stats.t_interval(vals)
        if m.pct:  # a rate's interval stays within [0, 1]
            lo, hi = max(lo, 0.0), min(hi, 1.0)
        return Estimate(mean, lo, hi, "t over seeds", n_seeds=(len(vals),))
    lo, hi = (values(rows, f"{m.col}_lo"), values(rows, f"{m.col}_hi")) if m.ci else ([], [])
    return Estimate(vals[0], lo[0] if lo else None, hi[0] if hi else None, "the run's own interval", n_seeds=(1,))


def seed_difference(rows: pd.DataFrame, base: pd.DataFrame, m: Metric) -> Estimate | None:
    """variant − baseline from per-run values only (no items): paired t over common seeds, Welch t,
    or with one seed the two runs' own intervals combined."""
    v, b = _by_seed(rows, m.col), _by_seed(base, m.col)
    if not v or not b:
        return None
    seeds = (len(v), len(b))
    common = sorted(set(v) & set(b))
    if len(common) >= 2:
        mean, lo, hi = stats.t_interval([v[s] - b[s] for s in common])
        return Estimate(mean, lo, hi, f"paired t over {len(common)} seeds", n_seeds=seeds)
    if len(v) >= 2 and len(b) >= 2:
        from scipy.stats import t

        va, vb = list(v.values()), list(b.values())
        ma, mb = sum(va) / len(va), sum(vb) / len(vb)
        sa = sum((x - ma) ** 2 for x in va) / (len(va) - 1) / len(va)
        sb = sum((x - mb) ** 2 for x in vb) / (len(vb) - 1) / len(vb)
        se = math.sqrt(sa + sb)
        df = (sa + sb) ** 2 / ((sa**2 / (len(va) - 1) + sb**2 / (len(vb) - 1)) or 1e-300)
        half = float(t.ppf(0.975, df)) * se
        return Estimate(ma - mb, ma - mb - half, ma - mb + half, "Welch t over seeds", n_seeds=seeds)
    sv = common[0] if common else next(iter(v))
    sb_ = common[0] if common else next(iter(b))
    delta = v[sv] - b[sb_]
    halves = []
    for frame, seed in ((rows, sv), (base, sb_)):
        row = frame[frame["seed"] == seed]
        lo, hi = values(row, f"{m.col}_lo"), values(row, f"{m.col}_hi")
        if not (m.ci and lo and hi):
            return Estimate(delta, None, None, "one seed, no per-run interval", n_seeds=seeds)
        halves.append((hi[0] - lo[0]) / 2)
    half = math.sqrt(sum(h * h for h in halves))
    return Estimate(delta, delta - half, delta + half, "one seed: per-run intervals combined", n_seeds=seeds)


def _by_seed(rows: pd.DataFrame, col: str) -> dict[int, float]:
    if col not in rows:
        return {}
    return {int(s): float(x) for s, x in zip(rows["seed"], pd.to_numeric(rows[col], errors="coerce")) if pd.notna(x)}


def difference(r: ResultSet, variant: str, m: Metric, base: str | None = None) -> Estimate | None:
    """variant − NTP (or `base`) for one metric, per item and over seeds where the items are stored."""
    base = base or r.baseline
    if base is None:
        return None
    v_items, b_items = r.item_runs(variant, m), r.item_runs(base, m)
    if v_items and b_items:
        estimate = stats.hierarchical_difference(v_items, b_items)
        if estimate is not None:
            return estimate
    return seed_difference(r.rows(variant), r.rows(base), m)


def noise_floor(r: ResultSet, m: Metric) -> Estimate | str | None:
    """The same Δ between NTP's first two seeds (seed b − seed a): what a difference of nothing looks
    like. A reason string when there are fewer than two NTP seeds; None when the metric is absent."""
    base = r.baseline
    if base is None:
        return None
    runs = r.seeds(base)
    if len(runs) < 2:
        return NEEDS_TWO_NTP_SEEDS if values(r.rows(base), m.col) or r.item_runs(base, m) else None
    seed_a, seed_b = sorted(runs)[:2]
    if m.items is not None:
        a, b = r.items(runs[seed_a], *m.items), r.items(runs[seed_b], *m.items)
        if a is not None and b is not None:
            estimate = stats.paired_bootstrap(b, a)
            if estimate is not None:
                return estimate
    rows = r.rows(base)
    return seed_difference(rows[rows["seed"] == seed_b], rows[rows["seed"] == seed_a].assign(seed=seed_b), m)


def noise_floor_seeds(r: ResultSet) -> tuple[int, int] | None:
    seeds = sorted(r.seeds(r.baseline)) if r.baseline else []
    return (seeds[0], seeds[1]) if len(seeds) >= 2 else None


def acceptance(r: ResultSet, variant: str, condition: str | None, batch_size: int) -> tuple[Estimate | None, Estimate | None]:
    """(over prompts, over seeds and prompts) for MTP acceptance = accepted / drafted: per-prompt counts
    resampled (shared prompts across seeds); with one seed, the stored per-prompt interval if there are
    no per-prompt counts. The second is None with fewer than two seeds."""
    accepted, drafted = {}, {}
    runs = r.seeds(variant)
    for seed, run in runs.items():
        mtp = ((r.condition(run, condition).get("results") or {}).get(str(batch_size)) or {}).get(results.MTP_METHOD)
        ci = (mtp or {}).get("acceptance_rate_ci")
        if len(runs) == 1 and isinstance(ci, (list, tuple)) and len(ci) == 2:  # specbench's own, as in summary.csv
            return Estimate(mtp["acceptance_rate"], ci[0], ci[1], "bootstrap over prompts", n_seeds=(1,)), None
        per_prompt = (mtp or {}).get("per_prompt")
        if per_prompt:
            accepted[seed] = pd.Series([float(p.get("accepted", 0)) for p in per_prompt])
            drafted[seed] = pd.Series([float(p.get("drafted", 0)) for p in per_prompt])
    if not accepted or len(accepted) != len(runs):
        return None, None
    over_prompts = stats.hierarchical_ratio(accepted, drafted, resample_seeds=False)
    over_seeds = stats.hierarchical_ratio(accepted, drafted) if len(accepted) >= 2 else None
    return over_prompts, over_seeds
