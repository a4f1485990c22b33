"""The report's difference-to-NTP tables: what each comparison varies, and per metric each Δ with its
per-seed values, its 95% interval over seeds, the evaluation-set interval apart from it, the smallest
difference the run could have detected, and a reading that says "better" or "worse" only where the
interval over seeds excludes 0.
"""

from __future__ import annotations

from mtp_cli.base.stats import Estimate
from mtp_cli.base.tables import Table
from mtp_cli.results import delta_rows
from mtp_cli.results.delta_rows import Comparison
from mtp_cli.results.report.format import NO_SIGNAL, fmt, interval, seed_values
from mtp_cli.results.resultset import Metric, ResultSet

NOT_RESOLVED = "not resolved"
DELTA_COLUMNS = ["metric", "comparison", "Δ (per seed)", "95% over seeds", "evaluation-set noise only",
                 "detectable (95%, ≈80% power)", "reading"]


def difference_tables(r: ResultSet, metrics: list[Metric]) -> list[Table]:
    base = r.baseline
    rows = delta_rows.comparisons(r)
    varies = Table("What each comparison varies", ["comparison", "varies", "shares", "paired"],
                   [[c.label, c.varies, c.shares, c.seeds] for c in rows],
                   [f"each comparison is one side minus {base}, run by run at the same grid seed (the seed that "
                    "names the run folder); settings and seeds are read from each run's run.json",
                    "init seed: train.seed (the initialisation); data order: train.data_seed (the batches), the "
                    "init seed where unset"])
    cells, methods = [], {}
    for m in metrics:
        first = True
        for c in rows:
            e = delta_rows.estimate(r, c, m)
            if e is None:
                continue
            cells.append([m.label if first else "", c.label, *delta_cells(m, e, c)])
            first = False
            if isinstance(e, Estimate) and not e.all_zero:
                methods.setdefault(e.method, [])
                if m.label not in methods[e.method]:
                    methods[e.method].append(m.label)
    notes = [f"Δ = one side minus {base} on the items both runs scored (paired per item), averaged over the paired "
             "seeds; with 2-3 seeds, each seed's Δ in brackets",
             "95% over seeds: a t over the per-seed Δs (n − 1 degrees of freedom) with the item variance the seeds "
             "share added (docs/evidence.md); n/a with one seed or one pair of seeds, where no interval over seeds exists",
             "evaluation-set noise only: the bootstrap over items with the seeds held fixed (without stored items, "
             "as for pass rates: the runs' own intervals combined) — what another draw of the evaluation items "
             "could change, not what another training seed could",
             "detectable: the smallest |Δ| these seeds and items would find at 95% confidence with about 80% power, "
             "from the observed per-seed spread (the (t₀.₉₇₅ + t₀.₈₀) rule: with 3 seeds an exact t-test has 77% "
             "power there, and 80% at a Δ about 5% larger)",
             "reading: better or worse only where the interval over seeds excludes 0; not resolved otherwise, which "
             "is no evidence of no difference",
             *[f"{how}: {', '.join(labels)}" for how, labels in methods.items()]]
    if any(c.kind != delta_rows.VARIANT for c in rows):
        notes.append("noise floors: objective-free differences (only seeds differ), measured like a variant; their "
                     "Δs show how large the seed noise is at that pairing")
    else:
        notes.append("no noise floor: it needs ≥ 2 NTP seeds, or a noise-floor variant (NTP with init_seed_offset "
                     "or data_seed_offset)")
    return [varies, Table(f"Difference to NTP ({base})", DELTA_COLUMNS, cells, notes)]


def delta_cells(m: Metric, e: Estimate | str, c: Comparison) -> list[str]:
    """The Δ table's cells after metric and comparison."""
    if isinstance(e, str):
        return [e, "–", "–", "–", "–"]
    if e.all_zero:
        return [NO_SIGNAL, "–", "–", "–", "nothing measured (every value 0)"]
    value = fmt(m, e.value, signed=True)
    seeds = seed_values(m, e, signed=True)
    over_seeds = interval(m, e.lo, e.hi) or _why_none(e, c)
    items = interval(m, e.items_lo, e.items_hi) or "–"
    mdd = fmt(m, e.detectable) if e.detectable is not None else "n/a"
    return [f"{value} {seeds}".strip(), over_seeds, items, mdd, reading(m, e, c)]


def _why_none(e: Estimate, c: Comparison) -> str:
    if c.kind == delta_rows.PAIR:
        return "n/a (one pair of seeds)"
    if "unpaired" in e.method:
        return "n/a (unpaired, < 2 seeds a side)"
    return "n/a (one seed)"


def reading(m: Metric, e: Estimate, c: Comparison) -> str:
    """better / worse where the interval over seeds excludes 0; otherwise not resolved, and why."""
    if c.kind != delta_rows.VARIANT:
        return "–"
    if e.lo is None or e.hi is None:
        return f"{NOT_RESOLVED}: no interval over seeds"
    if e.lo <= 0 <= e.hi:
        return f"{NOT_RESOLVED}: interval contains 0"
    higher = e.lo > 0
    return "better" if higher == m.higher_better else "worse"
