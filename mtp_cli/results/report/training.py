"""REPORT.md's training evidence: the trunk's quality with the MTP modules discarded, per variant and as differences to NTP."""

from __future__ import annotations

from mtp_cli.base.tables import Table
from mtp_cli.results import compare
from mtp_cli.results.report.deltas import difference_tables
from mtp_cli.results.report.format import NOT_MEASURED, fmt_estimate
from mtp_cli.results.report.section import Section
from mtp_cli.results.resultset import BEFORE, ResultSet, values

_TRAINING_INTRO = ("Quality of the trunk alone: each run's trunk is exported as a Hugging Face checkpoint with its "
                   "MTP modules discarded and evaluated like any causal LM. Gold bits/byte scores the reference "
                   "solution (HumanEval canonical solution, GSM8K answer) given its prompt, per item.")



def training_section(r: ResultSet) -> Section:
    metrics = r.quality_metrics
    seeds = {v: _evaluated_seeds(r.rows(v), metrics) for v in r.variants}
    trained = {v: len(r.rows(v)) for v in r.variants}
    rows = [[r.variant_label(v), str(seeds[v]) if seeds[v] == trained[v] else f"{seeds[v]} of {trained[v]}",
             *[fmt_estimate(m, compare.summarize(r.rows(v), m)) for m in metrics]] for v in r.variants]
    notes = [_n_note(r), _context_cut_note(r), _interval_note(seeds)]
    if r.before is not None:
        rows.insert(0, [BEFORE, "–", *[fmt_estimate(m, compare.summarize(r.before, m)) for m in metrics]])
        notes += _before_notes(r)
    tables = [Table("Trunk quality per variant (MTP modules discarded)", ["variant", "seeds", *[m.label for m in metrics]],
                    rows, [n for n in notes if n])]
    if r.baseline is None:
        notes = ["no NTP variant in this ablation, so no differences to NTP"]
        return Section("Training evidence", _TRAINING_INTRO, tables + [Table("Difference to NTP", ["variant"], [], notes)])
    return Section("Training evidence", _TRAINING_INTRO, tables + difference_tables(r, metrics))



def _before_notes(r: ResultSet) -> list[str]:
    """What the "before" row is and, when every run froze its trunk, whether their trunk scores equal it."""
    notes = [f"{BEFORE}: the checkpoint the runs start from ({r.before_source}), evaluated as it is with the "
             "runs' eval settings (`mtp eval --hf`, baseline/eval.json)"]
    if r.frozen_trunk:
        differ = {v: labels for v, labels in r.trunk_differences().items() if labels}
        verdict = "yes" if not differ else "**NO** — " + "; ".join(f"{v}: {', '.join(labels)}" for v, labels in differ.items())
        notes.append(f"frozen trunk (train.freeze_trunk): trunk scores equal the source's: {verdict}")
    return notes



def _n_note(r: ResultSet) -> str:
    parts = []
    for col, name in (("heldout_n", "held-out tokens"), ("humaneval_n", "HumanEval problems"),
                      ("gsm8k_n", "GSM8K questions")):
        vals = sorted({int(v) for v in values(r.frame, col)})
        if vals:
            parts.append(f"{name}: {'/'.join(map(str, vals))}")
    shots = sorted({int(v) for v in values(r.frame, "gsm8k_fewshot")}) if "gsm8k_fewshot" in r.frame else []
    if shots:
        parts.append(f"GSM8K {'/'.join(map(str, shots))}-shot")
    return "n per run — " + "; ".join(parts) if parts else ""



def _context_cut_note(r: ResultSet) -> str:
    """How many prompts were left-cut to fit the context, beside the scores they affect."""
    parts = []
    for task, name in (("humaneval", "HumanEval"), ("gsm8k", "GSM8K")):
        for cut in r.context_cuts(task):
            if cut.get("prompts_cut") is None:
                parts.append(f"{name}: {NOT_MEASURED}")
                continue
            text = f"{name}: {cut['prompts_cut']}/{cut.get('n', '?')}"
            if cut["prompts_cut"] and cut.get("prompt_cut_tokens_max") is not None:
                text += f", ≤ {cut['prompt_cut_tokens_max']} tokens"
                if cut.get("prompt_cut_tokens_mean") is not None:
                    text += f" (mean {cut['prompt_cut_tokens_mean']:.1f})"
            parts.append(text + (f", context {cut['context']}" if cut.get("context") else ""))
    return "prompts cut (left) to fit the context — " + "; ".join(dict.fromkeys(parts)) if parts else ""



def _evaluated_seeds(rows, metrics) -> int:
    """Seeds of a variant with at least one quality figure (a partial report has runs not yet evaluated)."""
    cols = [m.col for m in metrics if m.col in rows]
    return int(rows[cols].notna().any(axis=1).sum()) if cols else 0



def _interval_note(seeds: dict[str, int]) -> str:
    if all(n == 1 for n in seeds.values()):
        return (
            "one seed per variant: [lo, hi] is each run's own 95% interval over its items (Wilson for pass rates), not over seeds"
        )
    return ("with 2-3 seeds: the mean over seeds and, in brackets, each seed's value (a t-interval over so few seeds "
            "is too wide to read); with 4 or more, the mean [95% t-interval over seeds]; with one seed, the run's "
            "own interval over its items")
