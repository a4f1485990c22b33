"""The comparisons the report and the plots draw: a variant's value, its difference to NTP, the noise
floors, and speculative acceptance, each with the interval that fits the data stored:

- per-item metrics (held-out windows, HumanEval / GSM8K gold bits/byte) when every run stored its
  items: `seed_stats.seed_difference`, a t over the per-seed paired Δs with the item variance that the
  seeds share added; beside it the within-seed interval over items (evaluation-set noise only);
- otherwise (pass rates, older results): a paired t over the per-seed Δs of the runs' aggregates, or
  Welch's t when no seed is common; with one seed no interval over seeds, and the two runs' own
  intervals combined, √(h₁² + h₂²), as the evaluation-set interval.

Which runs each Δ-table row compares, and what it varies, is `delta_rows`.
"""

from __future__ import annotations

import math

import pandas as pd

from mtp_cli.base import stats
from mtp_cli.base.result_docs import ci_key
from mtp_cli.base.stats import Estimate
from mtp_cli.results import folder as results
from mtp_cli.results import seed_stats
from mtp_cli.results.resultset import Metric, ResultSet, values

NEEDS_TWO_NTP_SEEDS = "needs ≥ 2 NTP seeds"


def summarize(rows: pd.DataFrame, m: Metric) -> Estimate | None:
    """A variant's value: the mean over seeds with a t-interval and each seed's value, or the single
    run's own interval."""
    by_seed = _by_seed(rows, m.col)
    vals = [by_seed[s] for s in sorted(by_seed)] if by_seed else values(rows, m.col)
    if not vals:
        return None
    zero = all(v == 0 for v in vals)
    if len(vals) >= 2:
        mean, lo, hi = stats.t_interval(vals)
        if m.pct:  # a rate's interval stays within [0, 1]
            lo, hi = max(lo, 0.0), min(hi, 1.0)
        return Estimate(mean, lo, hi, "t over seeds", n_seeds=(len(vals),), per_seed=tuple(vals), all_zero=zero)
    lo, hi = (values(rows, f"{m.col}_lo"), values(rows, f"{m.col}_hi")) if m.ci else ([], [])
    return Estimate(vals[0], lo[0] if lo else None, hi[0] if hi else None, "the run's own interval", n_seeds=(1,),
                    per_seed=(vals[0],), all_zero=zero)


def seed_difference(rows: pd.DataFrame, base: pd.DataFrame, m: Metric) -> Estimate | None:
    """variant − baseline from per-run values only (no items): a paired t over the common seeds'
    Δs, else Welch's t; the evaluation-set interval from the runs' own intervals where they are stored."""
    v, b = _by_seed(rows, m.col), _by_seed(base, m.col)
    if not v or not b:
        return None
    seeds = (len(v), len(b))
    common = sorted(set(v) & set(b))
    zero = all(x == 0 for x in [*v.values(), *b.values()])
    if common:
        per_seed = tuple(v[s] - b[s] for s in common)
        mean = sum(per_seed) / len(per_seed)
        items = _combined_run_intervals(rows, base, m, common, common)
        # the item term: the runs' own intervals taken as independent (an upper bound of the shared part)
        item_var = ((items[1] - items[0]) / 2 / stats.Z95) ** 2 if items[0] is not None else 0.0
        lo, hi, mdd = seed_stats.t_over_seeds(per_seed, item_var)
        method = (f"paired t over {len(common)} seeds, the runs' own intervals as the item variance" if len(common) > 1
                  else "one seed: no interval over seeds")
        return Estimate(mean, lo, hi, method, n_seeds=seeds, per_seed=per_seed, items_lo=items[0], items_hi=items[1],
                        detectable=mdd, all_zero=zero)
    va, vb = list(v.values()), list(b.values())
    mean = sum(va) / len(va) - sum(vb) / len(vb)
    items = _combined_run_intervals(rows, base, m, sorted(v), sorted(b))
    if len(va) < 2 or len(vb) < 2:
        return Estimate(mean, None, None, "unpaired seeds, fewer than 2 a side: no interval over seeds", n_seeds=seeds,
                        items_lo=items[0], items_hi=items[1], all_zero=zero)
    from scipy.stats import t  # scipy: a second of start-up, for intervals only

    sa = sum((x - sum(va) / len(va)) ** 2 for x in va) / (len(va) - 1) / len(va)
    sb = sum((x - sum(vb) / len(vb)) ** 2 for x in vb) / (len(vb) - 1) / len(vb)
    se = math.sqrt(sa + sb)
    df = (sa + sb) ** 2 / ((sa**2 / (len(va) - 1) + sb**2 / (len(vb) - 1)) or 1e-300)
    q = float(t.ppf(0.975, df))
    return Estimate(mean, mean - q * se, mean + q * se, "Welch t over seeds", n_seeds=seeds,
                    items_lo=items[0], items_hi=items[1], detectable=(q + float(t.ppf(0.8, df))) * se, all_zero=zero)


def _combined_run_intervals(rows: pd.DataFrame, base: pd.DataFrame, m: Metric, v_seeds: list[int],
                            b_seeds: list[int]) -> tuple[float | None, float | None]:
    """The evaluation-set interval of mean(variant) − mean(base) from the runs' own intervals, taken as
    independent (their items are not paired here): half = √(Σ h²_v / n_v² + Σ h²_b / n_b²)."""
    if not m.ci:
        return None, None
    halves = []
    for frame, seeds in ((rows, v_seeds), (base, b_seeds)):
        side = []
        for seed in seeds:
            row = frame[frame["seed"] == seed]
            lo, hi = values(row, f"{m.col}_lo"), values(row, f"{m.col}_hi")
            if not (lo and hi):
                return None, None
            side.append((hi[0] - lo[0]) / 2)
        halves.append(sum(h * h for h in side) / len(side) ** 2)
    v = _by_seed(rows, m.col)
    bv = _by_seed(base, m.col)
    delta = sum(v[s] for s in v_seeds) / len(v_seeds) - sum(bv[s] for s in b_seeds) / len(b_seeds)
    half = math.sqrt(sum(halves))
    return delta - half, delta + half


def _by_seed(rows: pd.DataFrame, col: str) -> dict[int, float]:
    if col not in rows:
        return {}
    return {int(s): float(x) for s, x in zip(rows["seed"], pd.to_numeric(rows[col], errors="coerce")) if pd.notna(x)}


def difference(r: ResultSet, variant: str, m: Metric, base: str | None = None) -> Estimate | None:
    """variant − NTP (or `base`) for one metric: per item and over seeds where the items are stored."""
    base = base or r.baseline
    if base is None:
        return None
    v_items, b_items = r.item_runs(variant, m), r.item_runs(base, m)
    if v_items and b_items:
        estimate = seed_stats.seed_difference(v_items, b_items)
        if estimate is not None:
            return estimate
    return seed_difference(r.rows(variant), r.rows(base), m)


def noise_floor(r: ResultSet, m: Metric) -> Estimate | str | None:
    """The same Δ between NTP's first two seeds (seed b − seed a), which differ in initialisation and
    data order: one pair, so no interval over seeds, and the evaluation-set interval beside it. A reason
    string when there are fewer than two NTP seeds; None when the metric is absent."""
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
            estimate = seed_stats.seed_difference({0: b}, {0: a})
            if estimate is not None:
                return _one_pair(estimate)
    rows = r.rows(base)
    estimate = seed_difference(rows[rows["seed"] == seed_b], rows[rows["seed"] == seed_a].assign(seed=seed_b), m)
    return _one_pair(estimate) if estimate is not None else None


def _one_pair(e: Estimate) -> Estimate:
    return Estimate(e.value, None, None, "one pair of seeds: no interval over seeds", e.n_items, e.n_seeds,
                    items_lo=e.items_lo, items_hi=e.items_hi, all_zero=e.all_zero)


def noise_floor_seeds(r: ResultSet) -> tuple[int, int] | None:
    seeds = sorted(r.seeds(r.baseline)) if r.baseline else []
    return (seeds[0], seeds[1]) if len(seeds) >= 2 else None


def acceptance(r: ResultSet, variant: str, condition: str | None, batch_size: int) -> tuple[Estimate | None, Estimate | None]:
    """(within seeds: over prompts only, over seeds) for MTP acceptance = accepted / drafted: per-prompt
    counts resampled with the seeds held fixed (evaluation-set noise only), and the t over the seeds'
    rates with their shared prompt variance added; with one seed and no per-prompt counts, the stored
    per-prompt interval. The second is None with fewer than two seeds."""
    accepted, drafted = {}, {}
    runs = r.seeds(variant)
    for seed, run in runs.items():
        mtp = ((r.condition(run, condition).get("results") or {}).get(str(batch_size)) or {}).get(results.MTP_METHOD)
        ci = (mtp or {}).get(ci_key("acceptance_rate"))
        if len(runs) == 1 and isinstance(ci, (list, tuple)) and len(ci) == 2:  # specbench's own, as in summary.csv
            return Estimate(mtp["acceptance_rate"], ci[0], ci[1], "bootstrap over prompts", n_seeds=(1,)), None
        per_prompt = (mtp or {}).get("per_prompt")
        if per_prompt:
            accepted[seed] = pd.Series([float(p.get("accepted", 0)) for p in per_prompt])
            drafted[seed] = pd.Series([float(p.get("drafted", 0)) for p in per_prompt])
    if not accepted or len(accepted) != len(runs):
        return None, None
    over_prompts = stats.hierarchical_ratio(accepted, drafted, resample_seeds=False)
    over_seeds = seed_stats.seed_ratio(accepted, drafted) if len(accepted) >= 2 else None
    return over_prompts, over_seeds
