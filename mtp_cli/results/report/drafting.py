"""REPORT.md's drafter section: acceptance at each draft position with its interval over prompts, and the
data-scaling curve, acceptance against the distinct tokens a drafter was distilled on (results/acceptance.py)."""

from __future__ import annotations

from mtp_cli.base.tables import Table
from mtp_cli.results.acceptance import (
    curve_variants,
    distinct_tokens,
    mtp_entry,
    paired_difference,
    position_acceptance,
    run_recipe,
)
from mtp_cli.results.report.helpers import num, pct
from mtp_cli.results.report.section import Section
from mtp_cli.results.resultset import ResultSet


def _cell(units: list[dict], position: int) -> str:
    value, (lo, hi) = position_acceptance(units, position)
    if value is None:
        return "–"
    return pct(value) + (f" [{pct(lo)}, {pct(hi)}]" if lo is not None else "")


def drafting_section(r: ResultSet) -> Section:
    conditions = r.condition_names
    reference = next((v for v in r.variants if int(r.first(v, "n_extra") or 0)), None)
    rows = []
    for v in r.variants:
        for name in conditions:
            m = mtp_entry(r, v, name)
            units = m.get("per_prompt") or []
            if not units:
                continue
            k = int(m.get("draft_len") or 0)
            diff, (lo, hi) = paired_difference(units, mtp_entry(r, reference, name).get("per_prompt") or [])
            paired = "–" if v == reference or diff is None else f"{100 * diff:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
            rows.append([v, name, str(k), *(_cell(units, j) if j <= k else "" for j in (1, 2, 3)), paired,
                         num(m.get("mean_acceptance_length"), 2), str(len(units))])
    tables = []
    if rows:
        tables.append(Table("Acceptance at each draft position (batch size 1, first timed repeat)",
                            ["variant", "condition", "k", "draft 1", "draft 2 | 1 accepted", "draft 3 | 1-2 accepted",
                             f"draft 1 − {reference}'s (points)", "MAL", "prompts"], rows,
                            ["draft j's share accepted among the steps whose drafts before it were all accepted, "
                             "with its 95% bootstrap interval over prompts; positions beyond the chosen k are not "
                             "drafted (the draft-length table's candidates show them on the tuning prompts)",
                             f"the difference to {reference} is paired: the same prompts resampled for both (at T = 0 "
                             "each decodes the same greedy text, so only the drafter differs)"]))
    curve = curve_variants(r)
    if curve:
        recipes = {v: run_recipe(r, v) for v in curve}
        curve_rows = []
        for v in curve:
            t = recipes[v]["train"]
            passes = t["steps"] / t["distinct_batches"] if t.get("distinct_batches") else 1.0
            cells = []
            for name in conditions:
                m = mtp_entry(r, v, name)
                cells += [_cell(m.get("per_prompt") or [], 1), num(m.get("mean_acceptance_length"), 2)]
            curve_rows.append([v, f"{distinct_tokens(recipes[v]):,}", f"{passes:g}", *cells])
        headers = ["variant", "distinct tokens", "passes"]
        for name in conditions:
            headers += [f"{name} draft 1", f"{name} MAL"]
        tables.append(Table("Acceptance against the distinct tokens the drafter was trained on", headers, curve_rows,
                            ["the variants differ only in train.distinct_batches: the same steps, so the smaller "
                             "samples are seen more times (equal compute); MAL at each run's chosen k"]))
    return Section("Drafting", "", tables)
