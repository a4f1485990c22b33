"""`mtp report`: REPORT.md, PNG plots and the same tables in the terminal, from an ablation's stored
results only (run folders, eval.json, specbench.json, recipe.lock.json); nothing is trained or run.

Training evidence (the trunk with the MTP modules discarded) and inference evidence (the modules kept
as drafters) are separate sections and separate tables. Intervals are 95%: over seeds (Student t,
paired by seed against NTP) when a variant has two or more seeds; with one seed, the per-run interval
each eval stores (Wilson for pass rates), combined for a difference as √(h₁² + h₂²), and said so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
from rich.console import Console

from mtp_cli import claims, plots, results
from mtp_cli.errors import UserError
from mtp_cli.tables import Table


@dataclass
class Section:
    title: str
    intro: str = ""
    tables: list[Table] = field(default_factory=list)
    images: list[tuple[str, str]] = field(default_factory=list)  # (caption, path relative to the report)


# ---- numbers and their intervals --------------------------------------------------------------------
@dataclass(frozen=True)
class Metric:
    label: str
    col: str
    pct: bool = False  # a rate shown in percent
    digits: int = 3
    ci: bool = True  # the summary has <col>_lo / <col>_hi per run

    def fmt(self, value: float | None) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "–"
        return f"{100 * value:.1f}%" if self.pct else f"{value:.{self.digits}f}"

    def fmt_ci(self, value, lo, hi, signed: bool = False) -> str:
        text = self.fmt(value)
        if signed and text != "–" and not text.startswith("-"):
            text = "+" + text
        if lo is None or hi is None or any(isinstance(v, float) and math.isnan(v) for v in (lo, hi)):
            return text
        return f"{text} [{self.fmt(lo)}, {self.fmt(hi)}]"


def _vals(rows: pd.DataFrame, col: str) -> list[float]:
    if col not in rows:
        return []
    return [float(v) for v in pd.to_numeric(rows[col], errors="coerce").dropna()]


def t_interval(values: list[float]) -> tuple[float, float | None, float | None]:
    """Mean and its 95% Student-t interval (no interval from one value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None, None
    from scipy.stats import t

    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def summarize(rows: pd.DataFrame, m: Metric) -> tuple[float | None, float | None, float | None, int]:
    """(value, lo, hi, n seeds) of one variant: t over seeds, or the single run's own interval."""
    values = _vals(rows, m.col)
    if not values:
        return None, None, None, 0
    if len(values) >= 2:
        mean, lo, hi = t_interval(values)
        if m.pct:  # a rate's interval stays within [0, 1]
            lo, hi = max(lo, 0.0), min(hi, 1.0)
        return mean, lo, hi, len(values)
    lo, hi = (_vals(rows, f"{m.col}_lo"), _vals(rows, f"{m.col}_hi")) if m.ci else ([], [])
    return values[0], (lo[0] if lo else None), (hi[0] if hi else None), 1


def difference(rows: pd.DataFrame, base: pd.DataFrame, m: Metric) -> tuple[float | None, float | None, float | None, str]:
    """variant − baseline with a 95% interval, and how the interval was made."""
    v = {int(s): x for s, x in zip(rows["seed"], pd.to_numeric(rows.get(m.col), errors="coerce")) if pd.notna(x)} \
        if m.col in rows else {}
    b = {int(s): x for s, x in zip(base["seed"], pd.to_numeric(base.get(m.col), errors="coerce")) if pd.notna(x)} \
        if m.col in base else {}
    if not v or not b:
        return None, None, None, ""
    common = sorted(set(v) & set(b))
    if len(common) >= 2:
        mean, lo, hi = t_interval([v[s] - b[s] for s in common])
        return mean, lo, hi, f"paired t over {len(common)} seeds"
    if len(v) >= 2 and len(b) >= 2:
        from scipy.stats import t

        va, vb = list(v.values()), list(b.values())
        ma, mb = sum(va) / len(va), sum(vb) / len(vb)
        sa = sum((x - ma) ** 2 for x in va) / (len(va) - 1) / len(va)
        sb = sum((x - mb) ** 2 for x in vb) / (len(vb) - 1) / len(vb)
        se = math.sqrt(sa + sb)
        df = (sa + sb) ** 2 / ((sa**2 / (len(va) - 1) + sb**2 / (len(vb) - 1)) or 1e-300)
        half = float(t.ppf(0.975, df)) * se
        return ma - mb, ma - mb - half, ma - mb + half, "Welch t over seeds"
    sv, sb_ = common[0] if common else next(iter(v)), common[0] if common else next(iter(b))
    delta = v[sv] - b[sb_]
    halves = []
    for frame, seed in ((rows, sv), (base, sb_)):
        row = frame[frame["seed"] == seed]
        lo, hi = _vals(row, f"{m.col}_lo"), _vals(row, f"{m.col}_hi")
        if not (m.ci and lo and hi):
            return delta, None, None, "one seed, no per-run interval"
        halves.append((hi[0] - lo[0]) / 2)
    half = math.sqrt(sum(h * h for h in halves))
    return delta, delta - half, delta + half, "one seed: per-run intervals combined"


# ---- the report's content -----------------------------------------------------------------------------
QUALITY = [
    Metric("held-out loss ↓ (nats/token)", "heldout_loss"),
    Metric("bits/byte ↓", "heldout_bpb"),
    Metric("HumanEval pass@1", "humaneval_pass1", pct=True),
    Metric("GSM8K strict", "gsm8k_strict", pct=True),
    Metric("GSM8K flexible", "gsm8k_flexible", pct=True),
]
VAL_LOSS = Metric("val loss ↓ (training-time)", "val_loss", ci=False)


@dataclass
class Results:
    """Everything the report reads, loaded once."""

    dir: Path
    frame: pd.DataFrame
    runs: list[results.RunFolder]
    lock: dict

    @property
    def variants(self) -> list[str]:
        return list(dict.fromkeys(self.frame["variant"]))

    def rows(self, variant: str) -> pd.DataFrame:
        return self.frame[self.frame["variant"] == variant]

    @property
    def baseline(self) -> str | None:
        ntp = self.frame[self.frame["objective"] == "ntp"]
        return str(ntp["variant"].iloc[0]) if len(ntp) else None

    def first(self, variant: str, col: str):
        values = self.rows(variant)[col].dropna() if col in self.frame else []
        return values.iloc[0] if len(values) else None

    @property
    def quality_metrics(self) -> list[Metric]:
        have = [m for m in QUALITY if _vals(self.frame, m.col)]
        if not _vals(self.frame, "heldout_loss"):
            have.insert(0, VAL_LOSS)
        return have

    def variant_label(self, variant: str) -> str:
        what = self.describe(variant)
        return variant if what == variant else f"{variant} ({what})"

    def describe(self, variant: str) -> str:
        obj = self.first(variant, "objective")
        if obj == "sequential":
            return f"sequential D={self.first(variant, 'n_extra')} λ={self.first(variant, 'lambda'):g} " \
                   f"{self.first(variant, 'mtp_input')}"
        if obj == "parallel":
            return f"parallel n={int(self.first(variant, 'n_extra')) + 1} λ={self.first(variant, 'lambda'):g}, " \
                   f"{self.first(variant, 'trunk_layers')}-layer trunk"
        return str(obj)


def load(results_dir: str | Path) -> Results:
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise UserError(f"results folder not found: {results_dir}")
    runs = results.run_folders(results_dir)
    if not runs:
        raise UserError(f"no runs in {results_dir / results.RUNS}; run `mtp ablate --recipe RECIPE` first")
    results.write_summary(results_dir)
    return Results(results_dir, results.summary_frame(results_dir), runs, results.read_lock(results_dir))


def training_section(r: Results) -> Section:
    metrics = r.quality_metrics
    seeds = {v: len(r.rows(v)) for v in r.variants}
    rows = []
    for v in r.variants:
        cells = []
        for m in metrics:
            value, lo, hi, _ = summarize(r.rows(v), m)
            cells.append(m.fmt_ci(value, lo, hi))
        rows.append([r.variant_label(v), str(seeds[v]), *cells])
    notes = [_n_note(r), _interval_note(seeds)]
    tables = [Table("Trunk quality per variant (MTP modules discarded)", ["variant", "seeds", *[m.label for m in metrics]],
                    rows, [n for n in notes if n])]
    base = r.baseline
    if base is None:
        notes = ["no NTP variant in this ablation, so no differences to NTP"]
        return Section("Training evidence", _TRAINING_INTRO, tables + [Table("Difference to NTP", ["variant"], [], notes)])
    diff_rows, methods = [], set()
    for v in r.variants:
        if v == base:
            continue
        cells = []
        for m in metrics:
            delta, lo, hi, how = difference(r.rows(v), r.rows(base), m)
            cells.append(m.fmt_ci(delta, lo, hi, signed=True))
            methods.add(how) if how else None
        diff_rows.append([v, *cells])
    notes = [f"variant − {base}; 95% interval: {', '.join(sorted(methods)) or 'n/a'}",
             "an interval that contains 0 is no evidence of a difference"]
    if any(s == 1 for s in seeds.values()):
        notes.append("one seed per variant: the interval covers evaluation noise only, not seed-to-seed variation")
    tables.append(Table(f"Difference to NTP ({base})", ["variant", *[f"Δ {m.label}" for m in metrics]], diff_rows, notes))
    return Section("Training evidence", _TRAINING_INTRO, tables)


_TRAINING_INTRO = ("Quality of the trunk alone: each run's trunk is exported as a Hugging Face checkpoint with its "
                   "MTP modules discarded and evaluated like any causal LM.")


def _n_note(r: Results) -> str:
    parts = []
    for col, name in (("heldout_n", "held-out tokens"), ("humaneval_n", "HumanEval problems"),
                      ("gsm8k_n", "GSM8K questions")):
        values = sorted({int(v) for v in _vals(r.frame, col)})
        if values:
            parts.append(f"{name}: {'/'.join(map(str, values))}")
    return "n per run — " + "; ".join(parts) if parts else ""


def _interval_note(seeds: dict[str, int]) -> str:
    if all(n >= 2 for n in seeds.values()):
        return "[lo, hi] = 95% t-interval over seeds"
    if all(n == 1 for n in seeds.values()):
        return "one seed per variant: [lo, hi] is each run's own 95% interval (Wilson for pass rates), not over seeds"
    return "[lo, hi]: 95% t-interval over seeds where a variant has ≥2 seeds, else the run's own interval"


PEERS = {"hf_generate": "HF generate", "hf_prompt_lookup": "HF prompt lookup", "hf_assisted": "HF assisted"}


def inference_section(r: Results) -> Section:
    mtp_rows, speed_rows, notes = [], [], set()
    for v in r.variants:
        for bs, methods, n in _spec_by_batch(r, v):
            mtp, greedy = methods.get(results.MTP_METHOD), methods.get(results.GREEDY_METHOD) or {}
            if mtp:
                mtp_rows.append([v, str(bs), str(n), _yesno(mtp.get("lossless")), _pct(mtp.get("acceptance_rate")),
                                 _num(mtp.get("mean_acceptance_length"), 2),
                                 " / ".join(_pct(x) for x in mtp.get("per_position_acceptance") or []) or "–",
                                 _speed(mtp, "speedup"), _speed(mtp, "ideal_speedup")])
            else:
                notes.add(f"{v}: {_no_mtp_reason(r, v)}")
            peers = [methods.get(name) or {} for name in PEERS]
            best_peer = max((p.get("tokens_per_s") or 0 for p in peers), default=0)
            speed_rows.append([v, str(bs), _num(greedy.get("tokens_per_s"), 0),
                               _num((mtp or {}).get("tokens_per_s"), 0),
                               *[_num(p.get("tokens_per_s"), 0) for p in peers],
                               _ratio(greedy.get("tokens_per_s"), (methods.get("hf_generate") or {}).get("tokens_per_s")),
                               _ratio((mtp or {}).get("tokens_per_s"), best_peer)])
    seeds_note = ("runs = seeds measured; with several, numbers are means over seeds and [lo, hi] a t-interval over "
                  "seeds" if any(len(r.rows(v)) > 1 for v in r.variants) else
                  "one seed: [lo, hi] is the 95% bootstrap interval of the median over timed repeats")
    mtp_notes = ["speedup = MTP speculative tokens/s ÷ our plain greedy tokens/s on the same prompts, end to end; "
                 "ideal = MAL · T_step / (T_verify + T_draft) from measured parts: the gap is our overhead",
                 "lossless: the speculative output equals plain greedy on every prompt",
                 "acceptance per draft position i counts i only when every earlier position was accepted (vLLM)",
                 seeds_note, *sorted(notes)]
    speed_notes = ["all on the exported trunk's weights and the same prompts; peers: Hugging Face transformers "
                   "(prompt lookup and assisted decoding run at batch size 1 only)",
                   "MTP ÷ best peer: MTP speculative tokens/s over the fastest Hugging Face method at that batch size"]
    tables = [
        Table("Self-speculative decoding with the run's own MTP modules",
              ["variant", "batch", "runs", "lossless", "acceptance", "MAL", "per position", "speedup vs our greedy",
               "ideal speedup"], mtp_rows, mtp_notes,
              empty="no specbench result with MTP drafting stored (stage disabled, not run yet, or NTP only)."),
        Table("Decoding speed against the peers (tokens/s, median of repeats)",
              ["variant", "batch", "ours greedy", "ours MTP", *PEERS.values(), "ours greedy ÷ HF generate",
               "MTP ÷ best peer"], speed_rows, speed_notes, empty="no specbench results stored."),
    ]
    proxy_rows, source = [], set()
    for v in r.variants:
        for k in range(1, int(r.first(v, "n_extra") or 0) + 1):
            prefix = "heldout" if _vals(r.rows(v), f"heldout_agree_{k}") else "val"
            source.add(prefix)
            cells = []
            for what in ("top1", "agree"):
                m = Metric("", f"{prefix}_{what}_{k}", pct=True, ci=False)
                value, lo, hi, _ = summarize(r.rows(v), m)
                cells.append(m.fmt_ci(value, lo, hi))
            proxy_rows.append([v, str(k), *cells])
    if proxy_rows:
        where = {"heldout": "the whole validation split (eval)", "val": "the end-of-training validation batches"}
        tables.append(Table("Acceptance proxy on validation text (teacher-forced, modules kept)",
                            ["variant", "extra prediction k", "top-1 vs the true token", "agrees with trunk's greedy"],
                            proxy_rows, [f"on {' and '.join(where[s] for s in sorted(source))}; a proxy only — the "
                                         "tables above are the measured acceptance and speed"]))
    return Section("Inference evidence", "What keeping the MTP modules buys as drafters for the trunk's own greedy "
                   "decoding (lossless: the output must equal plain greedy). Only measured speeds appear here.",
                   tables)


def _spec_by_batch(r: Results, variant: str):
    """[(batch size, {method: metrics}, runs)]: one run's numbers, or their means over seeds, where every
    stored interval (`<key>_ci`) becomes a t-interval over the seeds."""
    per_bs: dict[int, list[dict]] = {}
    for run in r.runs:
        if run.variant == variant:
            for bs, methods in results.spec_batches(run.spec).items():
                per_bs.setdefault(bs, []).append(methods)
    out = []
    for bs, all_methods in sorted(per_bs.items()):
        if len(all_methods) == 1:
            out.append((bs, all_methods[0], 1))
            continue
        merged = {}
        for name in all_methods[0]:
            ms = [m.get(name) or {} for m in all_methods]
            merged[name] = {key: _seed_mean([m.get(key) for m in ms]) for key in ms[0]}
            for key in ms[0]:
                values = [m.get(key) for m in ms]
                if f"{key}_ci" in ms[0] and all(isinstance(x, (int, float)) for x in values):
                    _, lo, hi = t_interval([float(x) for x in values])
                    merged[name][f"{key}_ci"] = [lo, hi]
        out.append((bs, merged, len(all_methods)))
    return out


def _seed_mean(values: list):
    if values and all(isinstance(v, bool) for v in values):
        return all(values)
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if values and len(nums) == len(values):
        return sum(nums) / len(nums)
    if values and all(isinstance(v, list) for v in values):
        width = min(len(v) for v in values)
        return [_seed_mean([v[i] for v in values]) for i in range(width)]
    return values[0] if values else None


def _no_mtp_reason(r: Results, variant: str) -> str:
    obj = r.first(variant, "objective")
    if obj == "ntp":
        return "NTP has no MTP modules, so no speculative row (its greedy and peer speeds are the baseline)"
    return "no specbench result stored for this run"


def cost_section(r: Results) -> Section:
    base = r.baseline
    rows = []

    def mean(v, col):
        vals = _vals(r.rows(v), col)
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
             "step time and tokens/s are medians over training steps; FLOPs/token counts training (3× forward)",
             f"peak memory: {', '.join(sorted(kinds)) or 'as recorded'}; each run trains in its own process",
             "compute-matched parallel heads move n−1 layers from the trunk into the heads: same total parameters"]
    table = Table("Training cost against NTP", ["variant", "trunk params", "MTP params", "added vs NTP", "MFLOP/token",
                                                 "step time s", "tokens/s", "MFU", "peak memory MB",
                                                 "wall time train / eval / specbench"], rows, notes)
    return Section("Cost", "", [table])


def claims_section(r: Results) -> Section:
    ours_cond = _our_conditions(r)
    families = {fam: [v for v in r.variants if r.first(v, "objective") == fam] for fam in ("sequential", "parallel")}
    base = r.baseline
    metric_for = {"HumanEval": QUALITY[2], "GSM8K": QUALITY[3], "BPB": QUALITY[1], "MBPP": QUALITY[2]}
    train_rows = []
    for c in claims.TRAINING:
        key = next((k for k in metric_for if k in c.metric), None)
        ours = []
        if key and base:
            m = metric_for[key]
            for v in families[c.family]:
                delta, lo, hi, _ = difference(r.rows(v), r.rows(base), m)
                if delta is not None:
                    ours.append(f"{v}: Δ {m.fmt_ci(delta, lo, hi, signed=True)}" + (" (HumanEval; no MBPP here)" if key == "MBPP" else ""))
        train_rows.append([c.source, c.metric, c.value, c.conditions, "; ".join(ours) or "–"])
    inf_rows = []
    for c in claims.INFERENCE:
        ours = []
        for v in families[c.family]:
            for bs, methods, _ in _spec_by_batch(r, v):
                mtp = methods.get(results.MTP_METHOD) or {}
                if "acceptance" in c.metric and mtp.get("per_position_acceptance"):
                    ours.append(f"{v} bs={bs}: {_pct(mtp['per_position_acceptance'][0])}")
                elif "speedup" in c.metric and mtp.get("speedup") is not None:
                    ours.append(f"{v} bs={bs}: {_speed(mtp, 'speedup')}")
        inf_rows.append([c.source, c.metric, c.value, c.conditions, "; ".join(ours) or "–"])
    notes = [f"ours: {ours_cond}", "published numbers are at 10⁹–10¹¹ parameters and 10¹¹–10¹² tokens; "
             "ours are orders of magnitude smaller — compare directions and conditions, not values",
             f"{claims.TUTORIAL_LABEL}: {claims.TUTORIAL} — no paper supports these; not a reference"]
    return Section("Claims vs measured", "Published numbers (docs/CLAIMS.md) beside ours, each with its conditions.", [
        Table("Training evidence: published vs ours (modules discarded)",
              ["source", "metric", "published", "conditions", "ours (vs NTP)"], train_rows, notes[:2]),
        Table("Inference evidence: published vs ours (modules kept as drafters)",
              ["source", "metric", "published", "conditions", "ours"], inf_rows, notes[:1] + notes[2:]),
    ])


def _our_conditions(r: Results) -> str:
    params = sorted({int(p) for p in _vals(r.frame, "params_trunk")})
    tokens = sorted({int(t) for t in _vals(r.frame, "train_tokens_seen")})
    env = next((run.run.get("env") for run in r.runs if run.run.get("env")), {}) or {}
    hw = env.get("gpu") or f"{env.get('cpu', 'CPU')}, {env.get('cpu_count', '?')} cores"
    bs = sorted({bs for run in r.runs for bs in results.spec_batches(run.spec)})
    return (f"trunks of {_range(params, _short)} params, {_range(tokens, _short)} training tokens, "
            f"batch size {_range(bs, str) if bs else '–'} at decoding, {hw}")


def environment_section(r: Results) -> Section:
    envs = [run.run.get("env") or {} for run in r.runs]
    env = envs[0] if envs else {}
    commits = sorted({run.run.get("git_commit", "unknown") for run in r.runs})
    started = sorted(run.run.get("started") for run in r.runs if run.run.get("started"))
    finished = sorted(run.run.get("finished") for run in r.runs if run.run.get("finished"))
    rows = [
        ["CPU", str(env.get("cpu", "?"))],
        ["cores / torch threads", f"{env.get('cpu_count', '?')} / {env.get('torch_threads', '?')}"],
        ["GPU", str(env.get("gpu", "none"))],
        ["torch / python", f"{env.get('torch', '?')} / {env.get('python', '?')}"],
        ["platform", str(env.get("platform", "?"))],
        ["device", ", ".join(sorted({str(run.run.get('device', '?')) for run in r.runs}))],
        ["git commit", ", ".join(c[:12] for c in commits)],
        ["runs", f"{len(r.runs)} ({', '.join(r.variants)}), started {started[0] if started else '?'}, "
                 f"finished {finished[-1] if finished else '?'}"],
        ["recipe", f"{r.lock.get('recipe_name', r.dir.name)} ({r.lock.get('source', '?')}, "
                   f"fingerprint {r.lock.get('fingerprint', '?')})"],
        ["report rendered", datetime.now(timezone.utc).isoformat(timespec="seconds")],
    ]
    if len({(e.get("cpu"), e.get("gpu"), e.get("torch")) for e in envs}) > 1:
        rows.append(["warning", "runs come from different machines or torch versions"])
    return Section("Environment", "", [Table("Where these numbers come from", ["", ""], rows)])


def settings_table(r: Results) -> Table:
    recipe = r.lock.get("recipe") or {}
    model, train, ev, sb = (recipe.get(k) or {} for k in ("model", "train", "eval", "specbench"))
    limits = ev.get("limits") or {}
    rows = [
        ["model", f"{model.get('n_layers')} layers, d={model.get('d_model')}, {model.get('n_heads')} heads, "
                  f"SwiGLU {model.get('ffn_hidden')}, context {model.get('context')}, vocab {model.get('vocab_size')}"],
        ["data", f"{(recipe.get('data') or {}).get('source')}"],
        ["training", f"{train.get('steps')} steps × {train.get('batch_size')} sequences, peak lr {train.get('lr')}, "
                     f"{train.get('schedule')} schedule, seeds {recipe.get('seeds')}"],
        ["eval", (", ".join(f"{t} ({'first ' + str(limits[t]) if limits.get(t) else 'all'})" for t in ev.get("tasks", []))
                  if ev.get("enabled", True) else "disabled")],
        ["specbench", (f"{sb.get('limit')} {sb.get('prompts')} prompts, {sb.get('max_new_tokens')} new tokens, batch "
                       f"sizes {sb.get('batch_sizes')}, {sb.get('repeats')} repeats") if sb.get("enabled", True) else "disabled"],
    ]
    variants = recipe.get("variants") or []
    for v in variants:
        overrides = "; ".join(f"{sec}: " + ", ".join(f"{k}={val}" for k, val in v[sec].items())
                              for sec in ("model", "mtp", "data", "train") if v.get(sec))
        ran = "" if v["name"] in r.variants else " — no runs yet"
        rows.append([f"variant {v['name']}", (v.get("description") or overrides or "the recipe as is") + ran])
    return Table("Settings", ["", ""], rows)


# ---- render ---------------------------------------------------------------------------------------------
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
    head += [f"Rendered by `mtp report {r.dir}` from stored results (`summary.csv` has one row per run). "
             "Training evidence and inference evidence answer different questions and are never mixed.", "",
             settings_table(r).markdown()]
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
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(head + body).rstrip() + "\n")
    tmp.replace(path)
    if console is not None:
        console.print(settings_table(r).rich())
        for s in sections:
            if s.tables:
                console.rule(s.title)
                for t in s.tables:
                    console.print(t.rich())
        console.print(f"plots: {', '.join(str(p) for _, p in images) or 'none'}")
    return path


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


def _speed(m: dict, key: str) -> str:
    value = m.get(key)
    if value is None:
        return "–"
    ci = m.get(f"{key}_ci95") or m.get(f"{key}_ci")
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and None not in ci:
        return f"{value:.2f}× [{ci[0]:.2f}, {ci[1]:.2f}]"
    return f"{value:.2f}×"


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
