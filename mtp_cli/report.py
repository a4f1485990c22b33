"""`mtp report`: REPORT.md, PNG plots and the same tables in the terminal, from an ablation's stored
results only (run folders, eval.json, specbench.json, recipe.lock.json); nothing is trained or run.

Training evidence (the trunk with the MTP modules discarded) and inference evidence (the modules kept
as drafters) are separate sections and separate tables. The numbers come from the results model
(`resultset`) and their intervals from `compare`/`stats`, which the plots read too.

REPORT.md holds no render time: re-rendering unchanged results with unchanged code gives the same bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from mtp_cli import claims, compare, plots, results
from mtp_cli.files import atomic_write_text, write_json
from mtp_cli.report_deltas import difference_tables
from mtp_cli.report_format import NOT_MEASURED, fmt, fmt_delta, fmt_estimate, interval, seed_values, speed
from mtp_cli.resultset import BEFORE, Metric, ResultSet, code_commit, load, values
from mtp_cli.tables import Table

CLAIMS_DOC = "docs/CLAIMS.md"
DEGENERATE_THRESHOLD = 0.5  # above this share of degenerate outputs, acceptance measures repetition


@dataclass
class Section:
    title: str
    intro: str = ""
    tables: list[Table] = field(default_factory=list)
    images: list[tuple[str, str]] = field(default_factory=list)  # (caption, path relative to the report)


# ---- training evidence -----------------------------------------------------------------------------------
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


_TRAINING_INTRO = ("Quality of the trunk alone: each run's trunk is exported as a Hugging Face checkpoint with its "
                   "MTP modules discarded and evaluated like any causal LM. Gold bits/byte scores the reference "
                   "solution (HumanEval canonical solution, GSM8K answer) given its prompt, per item.")


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


# ---- inference evidence ---------------------------------------------------------------------------------
PEERS = {"hf_generate": "HF generate", "hf_prompt_lookup": "HF prompt lookup", "hf_assisted": "HF assisted"}
PCT = Metric("", "", pct=True)


def inference_section(r: ResultSet) -> Section:
    conditions = r.condition_names
    primary = conditions[0] if conditions else None
    mtp_rows, speed_rows, notes = [], [], set()
    for v in r.variants:
        for name in conditions:
            for bs, methods, n in r.spec_by_batch(v, name):
                mtp = methods.get(results.MTP_METHOD)
                if not mtp:
                    notes.add(f"{v}: {_no_mtp_reason(r, v)}")
                    continue
                over_prompts, over_seeds = compare.acceptance(r, v, name, bs)
                mtp_rows.append([
                    v, _condition_label(r, v, name, primary), str(bs), str(n), _yesno(mtp.get("lossless")),
                    _with_interval(over_prompts) if over_prompts else _pct(mtp.get("acceptance_rate")),
                    _with_interval(over_seeds, seeds=True) if over_seeds else ("n/a (one seed)" if n < 2 else "–"),
                    _num(mtp.get("mean_acceptance_length"), 2),
                    " / ".join(_pct(x) for x in mtp.get("per_position_acceptance") or []) or "–",
                    _share(r.text_share(v, name, "degenerate_share")), _share(r.text_share(v, name, "whitespace_share")),
                    speed(mtp, "speedup"), speed(mtp, "ideal_speedup")])
        for bs, methods, _n in r.spec_by_batch(v, primary):
            mtp, greedy = methods.get(results.MTP_METHOD), methods.get(results.GREEDY_METHOD) or {}
            if not mtp:
                notes.add(f"{v}: {_no_mtp_reason(r, v)}")
            peers = [methods.get(name) or {} for name in PEERS]
            best_peer = max((p.get("tokens_per_s") or 0 for p in peers), default=0)
            speed_rows.append([v, str(bs), _num(greedy.get("tokens_per_s"), 0),
                               _num((mtp or {}).get("tokens_per_s"), 0),
                               *[_num(p.get("tokens_per_s"), 0) for p in peers],
                               _ratio(greedy.get("tokens_per_s"), (methods.get("hf_generate") or {}).get("tokens_per_s")),
                               _ratio((mtp or {}).get("tokens_per_s"), best_peer)])
    seeds_note = ("seeds = runs measured; with several, acceptance and MAL are means over seeds, speed-ups geometric "
                  "means with a 95% t-interval over seeds on the log scale (so never below 0) and, with 2-3 seeds, "
                  "each seed's value in brackets" if any(len(r.rows(v)) > 1 for v in r.variants) else
                  "one seed: the speed intervals are 95% bootstrap intervals of the median over timed repeats")
    mtp_notes = ["acceptance = accepted / drafted tokens. Evaluation-set noise only: 95% bootstrap over prompts with "
                 "the seeds held fixed. 95% over seeds: a t over the seeds' rates (n − 1 degrees of freedom) with the "
                 "prompt variance the seeds share added (the same prompts for every seed); with 2-3 seeds, each "
                 "seed's rate in brackets",
                 "degenerate: share of our plain decoder's generated tokens inside a repetition loop (an n-gram, "
                 "n ≤ 16, repeated at least 3 times in a row); whitespace: share of its outputs that are whitespace "
                 "only — high acceptance on such text says little about real text",
                 "speedup = MTP speculative tokens/s ÷ our plain greedy tokens/s on the same prompts, end to end; "
                 "ideal = MAL · T_step / (T_verify + T_draft) from measured parts: the gap is our overhead",
                 "lossless: the speculative output equals plain greedy on every prompt",
                 "acceptance per draft position i counts i only when every earlier position was accepted (vLLM)",
                 seeds_note, *sorted(notes)]
    speed_notes = [f"condition {primary}; all on the exported trunk's weights and the same prompts; peers: Hugging "
                   "Face transformers (prompt lookup and assisted decoding run at batch size 1 only)",
                   "MTP ÷ best peer: MTP speculative tokens/s over the fastest Hugging Face method at that batch size"]
    tables = [
        Table("Self-speculative decoding with the run's own MTP modules",
              ["variant", "prompts × temperature", "batch", "seeds", "lossless", "acceptance, evaluation-set noise only",
               "acceptance, 95% over seeds", "MAL", "per position", "degenerate", "whitespace",
               "speedup vs our greedy", "ideal speedup"], mtp_rows, mtp_notes,
              empty="no specbench result with MTP drafting stored (stage disabled, not run yet, or NTP only)."),
        Table("Decoding speed against the peers (tokens/s, median of repeats)",
              ["variant", "batch", "ours greedy", "ours MTP", *PEERS.values(), "ours greedy ÷ HF generate",
               "MTP ÷ best peer"], speed_rows, speed_notes, empty="no specbench results stored."),
    ]
    parts = _parts_table(r, primary)
    if parts:
        tables.append(parts)
    proxy_rows, source = [], set()
    for v in r.variants:
        for k in range(1, int(r.first(v, "n_extra") or 0) + 1):
            prefix = "heldout" if values(r.rows(v), f"heldout_agree_{k}") else "val"
            source.add(prefix)
            cells = [fmt_estimate(m, compare.summarize(r.rows(v), m))
                     for m in (Metric("", f"{prefix}_{what}_{k}", pct=True, ci=False) for what in ("top1", "agree"))]
            proxy_rows.append([v, str(k), *cells])
    if proxy_rows:
        where = {"heldout": "the whole validation split (eval)", "val": "the end-of-training validation batches"}
        tables.append(Table("Acceptance proxy on validation text (teacher-forced, modules kept)",
                            ["variant", "extra prediction k", "top-1 vs the true token", "agrees with trunk's greedy"],
                            proxy_rows, [f"on {' and '.join(where[s] for s in sorted(source))}; a proxy only — the "
                                         "tables above are the measured acceptance and speed"]))
    intro = ("What keeping the MTP modules buys as drafters for the trunk's own greedy decoding (lossless: the output "
             "must equal plain greedy). Only measured speeds appear here.")
    warning = _degenerate_warning(r, primary)
    return Section("Inference evidence", f"{intro}\n\n{warning}" if warning else intro, tables)


def _with_interval(e, seeds: bool = False) -> str:
    """A rate with its interval and, when asked and there are 2-3 seeds, each seed's rate."""
    text = " ".join(x for x in (fmt(PCT, e.value), interval(PCT, e.lo, e.hi)) if x)
    return f"{text} {seed_values(PCT, e)}".strip() if seeds else text


def _condition_label(r: ResultSet, variant: str, name: str, primary: str | None) -> str:
    run = next(iter(r.seeds(variant).values()))
    cond = r.condition(run, name)
    source = (cond.get("prompts") or {}).get("source")
    temp = cond.get("temperature")
    label = f"{source} × T={temp:g}" if source and isinstance(temp, (int, float)) else str(name)
    return label + (" (primary)" if name == primary and len(r.condition_names) > 1 else "")


def _parts_table(r: ResultSet, primary: str | None) -> Table | None:
    """Where the time of one speculative step goes (primary condition, smallest batch): the parts
    relative to a plain step, and the break-even MAL at which drafting starts to pay."""
    rows, vocab_notes = [], set()
    for v in r.variants:
        by_batch = r.spec_by_batch(v, primary)
        mtp = by_batch[0][1].get(results.MTP_METHOD) if by_batch else None
        if not mtp:
            continue
        k = int(r.first(v, "n_extra") or 1)
        step, draft = mtp.get("t_forward_step_s"), mtp.get("t_draft_s")
        verify = (mtp.get("t_verify_by_k_s") or {}).get(str(k))
        ok = all(isinstance(x, (int, float)) and x > 0 for x in (step, draft, verify))
        rows.append([v, str(by_batch[0][0]), _num(step * 1e3 if ok else None, 2),
                     _num(verify / step if ok else None, 2), _num(draft / step if ok else None, 2),
                     _num((verify + draft) / step if ok else None, 2), _num(mtp.get("mean_acceptance_length"), 2)])
        for run in r.seeds(v).values():
            dv = run.spec.get("draft_vocab") or {}
            if dv.get("size") and dv.get("vocab_size") and dv["size"] < dv["vocab_size"]:
                vocab_notes.add(f"the modules draft from the {dv['size']} most frequent training tokens of "
                                f"{dv['vocab_size']} (the trunk verifies over all of them, so output is unchanged)")
    if not rows:
        return None
    notes = ["per step: T_step is one plain decoding step (the trunk's forward and unembedding), T_verify(k) the "
             "same over the pending token and k drafts, T_draft the modules' drafting; break-even MAL = "
             "(T_verify + T_draft) / T_step: drafting pays only above it", *sorted(vocab_notes)]
    return Table("Where a speculative step's time goes (primary condition, medians)",
                 ["variant", "batch", "T_step ms", "T_verify ÷ T_step", "T_draft ÷ T_step", "break-even MAL",
                  "measured MAL"], rows, notes)


def _degenerate_warning(r: ResultSet, primary: str | None) -> str:
    """One sentence, with the figures, when the primary condition's decoded text is degenerate."""
    shares = {v: r.text_share(v, primary, "degenerate_share") for v in r.variants} if primary else {}
    bad = {v: s for v, s in shares.items() if s is not None and s > DEGENERATE_THRESHOLD}
    if not bad:
        return ""
    figures = ", ".join(f"{_pct(s)} ({v})" for v, s in bad.items())
    return (f"**The trunks' decoded text is degenerate in the primary condition ({primary}): degenerate share "
            f"{figures}, so acceptance there measures agreement on degenerate text, not the drafting of real text.**")


def _no_mtp_reason(r: ResultSet, variant: str) -> str:
    obj = r.first(variant, "objective")
    if obj == "ntp":
        return "NTP has no MTP modules, so no speculative row (its greedy and peer speeds are the baseline)"
    return "no specbench result stored for this run"


def cost_section(r: ResultSet) -> Section:
    base = r.baseline
    rows = []

    def mean(v, col):
        vals = values(r.rows(v), col)
        return sum(vals) / len(vals) if vals else None

    for v in r.variants:
        step, mem, total = mean(v, "step_time_s"), mean(v, "peak_memory_mb"), mean(v, "params_total")
        b_step = mean(base, "step_time_s") if base else None
        b_mem = mean(base, "peak_memory_mb") if base else None
        b_total = mean(base, "params_total") if base else None
        fpt = _mean(run.run.get("flops_per_token") for run in r.runs if run.variant == v)
        stage_times = {s: _mean(run.log.get("stages", {}).get(s, {}).get("seconds") for run in r.runs if run.variant == v)
                       for s in ("train", "eval", "specbench")}
        rows.append([v, _int(mean(v, "params_trunk")), _int(mean(v, "params_mtp")),
                     _signed_int(total - b_total) if total is not None and b_total is not None else "–",
                     _num(fpt / 1e6 if fpt else None, 1), _num(step, 3) + _times(step, b_step),
                     _num(mean(v, "tokens_per_s"), 0), _pct(mean(v, "mfu")),
                     _num(mem, 0) + _times(mem, b_mem),
                     " / ".join(_duration(stage_times[s]) for s in ("train", "eval", "specbench"))])
    kinds = {run.run.get("throughput", {}).get("peak_memory_kind") for run in r.runs} - {None}
    notes = [f"× = ratio to {base}" if base else "no NTP variant to compare against",
             "step time and tokens/s are medians over training steps; FLOPs/token counts training (3× forward; "
             "a frozen trunk, which runs under no-grad, its forward only)",
             *_flops_recount_notes(r), *_resumed_notes(r),
             f"peak memory: {', '.join(sorted(kinds)) or 'as recorded'}; each run trains in its own process",
             "compute-matched parallel heads move n−1 layers from the trunk into the heads: same total parameters"]
    table = Table("Training cost against NTP", ["variant", "trunk params", "MTP params", "added vs NTP", "MFLOP/token",
                                                 "step time s", "tokens/s", "MFU", "peak memory MB",
                                                 "wall time train / eval / specbench"], rows, notes)
    return Section("Cost", "", [table])




def _resumed_notes(r: ResultSet) -> list[str]:
    """Runs trained in more than one process (interrupted, then resumed): their cost sums the segments."""
    notes = []
    for run in r.runs:
        segments = max(len(run.run.get("segments") or []), int(run.log.get("stages", {}).get("train", {}).get("segments", 1)))
        if segments > 1:
            notes.append(f"{run.path.name}: trained in {segments} segments (interrupted and resumed); its wall time "
                         "and step-time median cover all of them")
    invalid = [run.path.name for run in r.runs
               if isinstance(m := (run.run.get("throughput") or {}).get("mfu_median"), (int, float)) and m > 1]
    if invalid:
        notes.append(f"MFU left out for {', '.join(invalid)}: the matmul peak they divided by was measured below "
                     "the FLOP/s their training reached")
    return notes


def _flops_recount_notes(r: ResultSet) -> list[str]:
    """Frozen-trunk runs whose stored FLOPs/token (and so MFU) counted the trunk's backward too."""
    notes = []
    for run in r.runs:
        now = r.frozen_flops_recount(run)
        if now is None:
            continue
        stored, mfu = run.run["flops_per_token"], (run.run.get("throughput") or {}).get("mfu_median")
        notes.append(f"{run.path.name}: its stored {stored / 1e6:.1f} MFLOP/token counted the frozen trunk's backward; "
                     f"counted as it trained, {now / 1e6:.1f} MFLOP/token"
                     + (f", MFU {_pct(mfu * now / stored)}" if isinstance(mfu, (int, float)) else ""))
    return notes


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
                    ours.append(f"{v} bs={bs}: {_pct(mtp['per_position_acceptance'][0])}")
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
    return (f"trunks of {_range(params, _short)} params, {_range(tokens, _short)} training tokens, "
            f"batch size {_range(bs, str) if bs else '–'} at decoding, {hw}")




RENDERED_BY = "REPORT.rendered.json"  # the report code's commit (not committed with the results: see .gitignore)


def provenance(r: ResultSet) -> str:
    """Which code produced the results. The code that rendered them goes to the sidecar (`RENDERED_BY`), so a
    code change that does not change what the report says changes no byte of REPORT.md."""
    produced = r.results_commits
    return (f"Results produced at commit {', '.join(f'`{c[:12]}`' for c in produced)}." if produced
            else "The commit that produced these results was not recorded.")


def environment_section(r: ResultSet) -> Section:
    envs = [run.run.get("env") or {} for run in r.runs]
    env = envs[0] if envs else {}
    started = sorted(run.run.get("started") for run in r.runs if run.run.get("started"))
    finished = sorted(run.run.get("finished") for run in r.runs if run.run.get("finished"))
    rows = [
        ["CPU", str(env.get("cpu", "?"))],
        ["cores / torch threads", f"{env.get('cpu_count', '?')} / {env.get('torch_threads', '?')}"],
        ["GPU", str(env.get("gpu", "none"))],
        ["torch / python", f"{env.get('torch', '?')} / {env.get('python', '?')}"],
        ["platform", str(env.get("platform", "?"))],
        ["device", ", ".join(sorted({str(run.run.get('device', '?')) for run in r.runs}))],
        ["git commit (results)", ", ".join(c[:12] for c in r.results_commits) or "unknown"],
        ["runs", f"{len(r.runs)} ({', '.join(r.variants)}), started {started[0] if started else '?'}, "
                 f"finished {finished[-1] if finished else '?'}"],
        ["recipe", f"{r.lock.get('recipe_name', r.dir.name)} ({r.lock.get('source', '?')}, "
                   f"fingerprint {r.lock.get('fingerprint', '?')})"],
    ]
    if len({(e.get("cpu"), e.get("gpu"), e.get("torch")) for e in envs}) > 1:
        rows.append(["warning", "runs come from different machines or torch versions"])
    return Section("Environment", "", [Table("Where these numbers come from", ["", ""], rows)])


def settings_table(r: ResultSet) -> Table:
    recipe = r.lock.get("recipe") or {}
    model, train, ev, sb = (recipe.get(k) or {} for k in ("model", "train", "eval", "specbench"))
    rows = [
        ["model", _trained_models(r, model)],
        ["data", f"{(recipe.get('data') or {}).get('source')}"],
        ["training", f"{train.get('steps')} steps × {train.get('batch_size')} sequences, peak lr {train.get('lr')}, "
                     f"{train.get('schedule', 'cosine')} schedule, {_seeds_text(recipe)}"],
        ["eval", _eval_text(r, ev) if ev.get("enabled", True) else "disabled"],
        ["specbench", _specbench_text(sb) if sb.get("enabled", True) else "disabled"],
    ]
    variants = recipe.get("variants") or []
    for v in variants:
        overrides = "; ".join(f"{sec}: " + ", ".join(f"{k}={_plain(val)}" for k, val in v[sec].items())
                              for sec in ("model", "mtp", "data", "train") if v.get(sec))
        offsets = ", ".join(f"{k} {v[k]}" for k in ("init_seed_offset", "data_seed_offset") if v.get(k))
        what = v.get("description") or overrides or "the recipe as is"
        ran = "" if v["name"] in r.variants else " — no runs yet"
        rows.append([f"variant {v['name']}", what + (f" ({offsets})" if offsets else "") + ran])
    return Table("Settings", ["", ""], rows)


def _plain(value) -> str:
    """A recipe value as a reader writes it: lists joined by commas, no quotes or brackets."""
    if isinstance(value, (list, tuple)):
        return ", ".join(_plain(x) for x in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _seeds_text(recipe: dict) -> str:
    seeds = recipe.get("seeds") or []
    data_seed = (recipe.get("train") or {}).get("data_seed")
    text = f"seed{'s' if len(seeds) != 1 else ''} {_plain(seeds)}" if seeds else "seeds ?"
    return text + (f" (initialisation; data order fixed at data seed {data_seed})" if data_seed is not None else "")


def _eval_text(r: ResultSet, ev: dict) -> str:
    limits = ev.get("limits") or {}
    shots = sorted({int(v) for v in values(r.frame, "gsm8k_fewshot")}) if "gsm8k_fewshot" in r.frame else []
    parts = []
    for task in ev.get("tasks", []):
        what = [f"first {limits[task]}" if limits.get(task) else "all"]
        if task == "gsm8k":
            what.append(f"{'/'.join(map(str, shots))}-shot" if shots else f"{ev.get('gsm8k_fewshot', 5)}-shot (recipe)")
        parts.append(f"{task} ({', '.join(what)})")
    return ", ".join(parts)


def _specbench_text(sb: dict) -> str:
    temps = sb.get("temperatures")
    return (f"{sb.get('limit')} prompts each from {_plain(sb.get('prompts'))}"
            + (f" at temperature {_plain(temps)}" if temps else "")
            + f", {sb.get('max_new_tokens')} new tokens, batch size{'s' if len(sb.get('batch_sizes') or []) != 1 else ''} "
            f"{_plain(sb.get('batch_sizes'))}, {sb.get('repeats')} timed repeat{'s' if sb.get('repeats') != 1 else ''}")


def _describe_model(model: dict) -> str:
    return (f"{model.get('n_layers')} layers, d={model.get('d_model')}, {model.get('n_heads')} heads, "
            f"SwiGLU {model.get('ffn_hidden')}, context {model.get('context')}, vocab {model.get('vocab_size')}")


def _trained_models(r: ResultSet, recipe_model: dict) -> str:
    """The model the runs trained (their run.json, after init_from resolved it), not the recipe's [model];
    when runs differ, each description with its runs. The recipe's only when no run stored one."""
    by_text: dict[str, list[str]] = {}
    for run, model in r.run_models().items():
        by_text.setdefault(_describe_model(model), []).append(run)
    if not by_text:
        return f"{_describe_model(recipe_model)} (the recipe's; no run stored its own)"
    if len(by_text) == 1:
        return next(iter(by_text))
    return "runs differ: " + "; ".join(f"{text} ({', '.join(runs)})" for text, runs in by_text.items())


# ---- render ---------------------------------------------------------------------------------------------
def incomplete_note(results_dir: Path) -> str:
    """One sentence naming the runs of the recipe's grid that lack a stage ("" when none do)."""
    missing = results.missing_runs(results_dir)
    if not missing:
        return ""
    runs = "; ".join(f"{name} ({', '.join(stages)})" for name, stages in missing)
    return f"Incomplete: {len(missing)} run(s) of the grid lack stages, so the tables show only what is stored: {runs}."


def render_report(results_dir: str | Path, console: Console | None = None) -> Path:
    """Write REPORT.md and plots/*.png into `results_dir` from its stored results; print the tables."""
    r = load(results_dir)
    description = (r.lock.get("recipe") or {}).get("description", "")
    plot_dir = r.dir / results.PLOTS
    images = plots.render_all(r, plot_dir)
    sections = [training_section(r), inference_section(r), cost_section(r), claims_section(r),
                Section("Plots", "", [], [(caption, f"{results.PLOTS}/{path.name}") for caption, path in images]),
                environment_section(r)]
    head = [f"# MTP ablation: {r.lock.get('recipe_name', r.dir.name)}", ""]
    if description:
        head += [description, ""]
    head += [f"Rendered by `mtp report {_shown_path(r.dir)}` from stored results (`summary.csv` has one row per run). "
             "Training evidence and inference evidence answer different questions and are never mixed. "
             f"{provenance(r)}", ""]
    missing = incomplete_note(r.dir)
    if missing:
        head += [f"**{missing}**", ""]
    head += [settings_table(r).markdown()]
    body = []
    for s in sections:
        body += [f"## {s.title}", ""]
        if s.intro:
            body += [s.intro, ""]
        body += [t.markdown() for t in s.tables]
        body += [f"![{caption}]({path})\n\n*{caption}*\n" for caption, path in s.images]
        if s.title == "Plots" and not s.images:
            body.append("No plots: no stored metrics to draw.\n")
    path = r.dir / results.REPORT
    atomic_write_text(path, "\n".join(head + body).rstrip() + "\n")
    write_json(r.dir / RENDERED_BY, {"report_code_commit": code_commit(), "results_commits": r.results_commits})
    if console is not None:
        if missing:
            console.print(missing, style="bold yellow", markup=False)
        console.print(settings_table(r).rich())
        for s in sections:
            if s.tables:
                console.rule(s.title)
                if s.intro and "**" in s.intro:  # the degenerate-text warning
                    console.print(s.intro.split("\n\n")[-1].replace("**", ""), style="bold yellow")
                for t in s.tables:
                    console.print(t.rich())
        console.print(f"plots: {', '.join(str(p) for _, p in images) or 'none'}")
    return path


def _shown_path(folder: Path) -> str:
    """The results folder as a user would type it: relative to the working directory when inside it."""
    resolved, cwd = folder.resolve(), Path.cwd().resolve()
    return resolved.relative_to(cwd).as_posix() if resolved.is_relative_to(cwd) else str(folder)


# ---- formatting helpers ----------------------------------------------------------------------------------
def _mean(values) -> float | None:
    nums = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    return sum(nums) / len(nums) if nums else None


def _num(value, digits: int = 3, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.{digits}f}{suffix}"


def _pct(value) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.1f}%"


def _int(value) -> str:
    return "–" if value is None else f"{int(round(value)):,}"


def _signed_int(value) -> str:
    return f"{int(round(value)):+,}"


def _times(value, base) -> str:
    return f" ({value / base:.2f}×)" if value and base else ""


def _ratio(a, b) -> str:
    return f"{a / b:.2f}×" if a and b else "–"


def _yesno(value) -> str:
    return "–" if value is None else ("yes" if value else "**NO**")


def _duration(seconds) -> str:
    if seconds is None:
        return "–"
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def _short(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def _range(values: list, fmt) -> str:
    if not values:
        return "?"
    return fmt(values[0]) if len(values) == 1 else f"{fmt(values[0])}–{fmt(values[-1])}"


def _share(value) -> str:
    return NOT_MEASURED if value is None else _pct(value)
