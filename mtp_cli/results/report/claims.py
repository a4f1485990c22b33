"""REPORT.md's claims section: the published numbers (docs/CLAIMS.md) beside ours, each with its conditions."""

from __future__ import annotations

from mtp_cli.base import claims
from mtp_cli.base.tables import Table
from mtp_cli.results import compare
from mtp_cli.results import folder as results
from mtp_cli.results.report.format import fmt_delta, speed
from mtp_cli.results.report.helpers import pct, short_count, value_range
from mtp_cli.results.report.section import Section
from mtp_cli.results.resultset import ResultSet, values

CLAIMS_DOC = "docs/CLAIMS.md"



def claims_section(r: ResultSet) -> Section:
    ours_cond = _our_conditions(r)
    families = {fam: [v for v in r.variants if r.first(v, "objective") == fam] for fam in ("sequential", "parallel")}
    base = r.baseline
    by_col = {m.col: m for m in r.quality_metrics}
    metric_for = {"HumanEval": by_col["humaneval_pass1"], "GSM8K": by_col["gsm8k_strict"], "BPB": by_col["heldout_bpb"],
                  "MBPP": by_col["humaneval_pass1"]}
    train_rows = []
    for c in claims.TRAINING:
        key = next((k for k in metric_for if k in c.metric), None)
        ours = []
        if key and base:
            m = metric_for[key]
            for v in families[c.family]:
                e = compare.difference(r, v, m)
                if e is not None:
                    delta = fmt_delta(m, e)
                    ours.append(f"{v}: {delta if e.all_zero else 'Δ ' + delta}"
                                + (" (HumanEval; no MBPP here)" if key == "MBPP" else ""))
        train_rows.append([c.source, c.metric, c.value, c.conditions, "; ".join(ours) or "–"])
    inf_rows = []
    for c in claims.INFERENCE:
        ours = []
        for v in families[c.family]:
            for bs, methods, _ in r.spec_by_batch(v):
                mtp = methods.get(results.MTP_METHOD) or {}
                if "acceptance" in c.metric and mtp.get("per_position_acceptance"):
                    ours.append(f"{v} bs={bs}: {pct(mtp['per_position_acceptance'][0])}")
                elif "speedup" in c.metric and mtp.get("speedup") is not None:
                    ours.append(f"{v} bs={bs}: {speed(mtp, 'speedup')}")
        inf_rows.append([c.source, c.metric, c.value, c.conditions, "; ".join(ours) or "–"])
    notes = [f"ours: {ours_cond}", "published numbers are at 10⁹–10¹¹ parameters and 10¹¹–10¹² tokens; "
             "ours are orders of magnitude smaller — compare directions and conditions, not values",
             f"{claims.TUTORIAL_LABEL}: {claims.TUTORIAL} — no paper supports these; not a reference"]
    return Section("Claims vs measured", f"Published numbers ({CLAIMS_DOC}) beside ours, each with its conditions.", [
        Table("Training evidence: published vs ours (modules discarded)",
              ["source", "metric", "published", "conditions", "ours (vs NTP)"], train_rows, notes[:2]),
        Table("Inference evidence: published vs ours (modules kept as drafters)",
              ["source", "metric", "published", "conditions", "ours"], inf_rows, notes[:1] + notes[2:]),
    ])



def _our_conditions(r: ResultSet) -> str:
    params = sorted({int(p) for p in values(r.frame, "params_trunk")})
    tokens = sorted({int(t) for t in values(r.frame, "train_tokens_seen")})
    env = next((run.run.get("env") for run in r.runs if run.run.get("env")), {}) or {}
    hw = env.get("gpu") or f"{env.get('cpu', 'CPU')}, {env.get('cpu_count', '?')} cores"
    bs = sorted({bs for v in r.variants for bs, _, _ in r.spec_by_batch(v)})
    return (f"trunks of {value_range(params, short_count)} params, {value_range(tokens, short_count)} training tokens, "
            f"batch size {value_range(bs, str) if bs else '–'} at decoding, {hw}")
