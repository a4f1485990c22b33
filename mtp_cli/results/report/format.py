"""How the report writes a number, an interval, a per-seed list and a Δ, the same in every table.

- A value over 2-3 seeds is its mean with each seed's value beside it, `5.189 (5.350, 5.028)`; a
  t-interval over so few seeds is too wide to read. From 4 seeds it is `mean [lo, hi]`.
- A Δ between two sides whose every value is 0 is "no signal (all 0)", never "+0.0% [0.0%, 0.0%]".
- A speed-up is `x×`, its interval drawn on the log scale where it pools seeds (never below 0).
"""

from __future__ import annotations

import math

from mtp_cli.base.result_docs import ci_key
from mtp_cli.base.stats import Estimate
from mtp_cli.results.resultset import Metric

NOT_MEASURED = "not measured"
NO_SIGNAL = "no signal (all 0)"
SHOW_SEEDS = 3  # up to this many seeds, a value over seeds is shown with each seed's value


def fmt(m: Metric, value: float | None, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    text = f"{100 * value:.1f}%" if m.pct else f"{value:.{m.digits}f}"
    return "+" + text if signed and not text.startswith("-") else text


def interval(m: Metric, lo: float | None, hi: float | None) -> str:
    if lo is None or hi is None or any(isinstance(v, float) and math.isnan(v) for v in (lo, hi)):
        return ""
    return f"[{fmt(m, lo)}, {fmt(m, hi)}]"


def seed_values(m: Metric, e: Estimate, signed: bool = False) -> str:
    """`(a, b)`: each seed's value, when there are 2-3 of them; "" otherwise."""
    if not 2 <= len(e.per_seed) <= SHOW_SEEDS:
        return ""
    return "(" + ", ".join(fmt(m, x, signed) for x in e.per_seed) + ")"


def fmt_estimate(m: Metric, e: Estimate | str | None, signed: bool = False) -> str:
    """`value [lo, hi]`, or with 2-3 seeds `mean (seed values)`; a reason string as is; "not measured"."""
    if isinstance(e, str):
        return e
    if e is None:
        return NOT_MEASURED
    if signed and e.all_zero:
        return NO_SIGNAL
    text = fmt(m, e.value, signed)
    seeds = seed_values(m, e, signed)
    if seeds:
        return f"{text} {seeds}"
    ci = interval(m, e.lo, e.hi)
    return f"{text} {ci}" if ci else text


def fmt_delta(m: Metric, e: Estimate | str | None) -> str:
    """One cell for a Δ (the claims table): `Δ [95% over seeds], detectable d`, or with no interval over
    seeds the evaluation-set interval, said so; "no signal (all 0)" when every value is 0."""
    if isinstance(e, str) or e is None:
        return fmt_estimate(m, e)
    if e.all_zero:
        return NO_SIGNAL
    text = fmt(m, e.value, signed=True)
    over_seeds = interval(m, e.lo, e.hi)
    if over_seeds:
        detectable = f", detectable {fmt(m, e.detectable)}" if e.detectable is not None else ""
        return f"{text} {over_seeds} over seeds{detectable}"
    items = interval(m, e.items_lo, e.items_hi)
    return f"{text} (no interval over seeds; evaluation-set noise only {items})" if items else text


def speed(m: dict, key: str) -> str:
    """A speed-up with its interval and, with 2-3 seeds, each seed's value. The interval: a t over seeds
    on the log scale; for one run, its own over prompts (`<key>_prompts_ci95`) where stored, else over its
    timed repeats."""
    value = m.get(key)
    if value is None:
        return "–"
    text = f"{value:.2f}×"
    seeds = m.get(f"{key}_seeds")
    ci = m.get(ci_key(key)) if seeds else m.get(f"{key}_prompts_ci95") or m.get(ci_key(key))
    one_repeat = not seeds and isinstance(ci, (list, tuple)) and len(ci) == 2 and ci[0] == ci[1]  # no width: says nothing
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and None not in ci and not one_repeat:
        text += f" [{ci[0]:.2f}, {ci[1]:.2f}]"
    if isinstance(seeds, list) and 2 <= len(seeds) <= SHOW_SEEDS:
        text += " (" + ", ".join(f"{x:.2f}" for x in seeds) + ")"
    return text
