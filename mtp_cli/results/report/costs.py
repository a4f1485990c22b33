"""REPORT.md's cost section: parameters, FLOPs, step time, MFU, memory and wall time per variant against NTP."""

from __future__ import annotations

from mtp_cli.base.tables import Table
from mtp_cli.results.report.helpers import duration, mean_of, num, pct, signed_whole, times_base, whole
from mtp_cli.results.report.section import Section
from mtp_cli.results.resultset import ResultSet, values

TABLE_STAGES = ("train", "eval", "specbench")  # the wall-time column's stages (export, seconds, only in the total)


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
        fpt = mean_of(run.run.get("flops_per_token") for run in r.runs if run.variant == v)
        stage_times = {s: mean_of(run.log.get("stages", {}).get(s, {}).get("seconds") for run in r.runs if run.variant == v)
                       for s in TABLE_STAGES}
        rows.append([v, whole(mean(v, "params_trunk")), whole(mean(v, "params_mtp")),
                     signed_whole(total - b_total) if total is not None and b_total is not None else "–",
                     num(fpt / 1e6 if fpt else None, 1), num(step, 3) + times_base(step, b_step),
                     num(mean(v, "tokens_per_s"), 0), pct(mean(v, "mfu")),
                     num(mem, 0) + times_base(mem, b_mem),
                     " / ".join(duration(stage_times[s]) for s in TABLE_STAGES)])
    kinds = {run.run.get("throughput", {}).get("peak_memory_kind") for run in r.runs} - {None}
    notes = [f"× = ratio to {base}" if base else "no NTP variant to compare against",
             "step time and tokens/s are medians over training steps; FLOPs/token counts training (3× forward; "
             "a frozen trunk, which runs under no-grad, its forward only)",
             *_flops_recount_notes(r), *_resumed_notes(r), *_total_time_note(r),
             f"peak memory: {', '.join(sorted(kinds)) or 'as recorded'}; each run trains in its own process",
             "compute-matched parallel heads move n−1 layers from the trunk into the heads: same total parameters"]
    table = Table("Training cost against NTP", ["variant", "trunk params", "MTP params", "added vs NTP", "MFLOP/token",
                                                 "step time s", "tokens/s", "MFU", "peak memory MB",
                                                 "wall time train / eval / specbench"], rows, notes)
    return Section("Cost", "", [table])



def _total_time_note(r: ResultSet) -> list[str]:
    """Every run's recorded stages (export included) and the baseline's evaluation added up: about what
    running the grid again takes on the same machine (a [source] stage's own training is not counted)."""
    spent = [s for run in r.runs for stage in run.log.get("stages", {}).values()
             if isinstance(s := stage.get("seconds"), (int, float))]
    if not spent:
        return []
    before = r.before_seconds
    parts = "every stage of every run" + (f", and the baseline's evaluation ({duration(before)})" if before else "")
    return [f"wall time of all stages added up: {duration(sum(spent) + (before or 0))} ({parts})"]


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
    """Frozen-trunk runs whose stored FLOPs/token (and so MFU) predate the current count: the frozen trunk's
    backward counted, or a distilled module's teacher logits not."""
    notes = []
    for run in r.runs:
        now = r.frozen_flops_recount(run)
        if now is None:
            continue
        stored, mfu = run.run["flops_per_token"], (run.run.get("throughput") or {}).get("mfu_median")
        why = "counted the frozen trunk's backward" if stored > now else "left out the teacher's logits"
        notes.append(f"{run.path.name}: its stored {stored / 1e6:.1f} MFLOP/token {why}; "
                     f"counted as it trained, {now / 1e6:.1f} MFLOP/token"
                     + (f", MFU {pct(mfu * now / stored)}" if isinstance(mfu, (int, float)) else ""))
    return notes
