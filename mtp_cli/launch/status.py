"""`mtp ablate --status RECIPE`: every run and stage of the grid with its state, read from the results
folder and the recorded jobs (done, queued, running, failed with the tail of its log, or to do)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from mtp_cli.base import paths
from mtp_cli.grid.cells import Ablation
from mtp_cli.grid.plan import plan
from mtp_cli.launch.records import GROUP_OF, job_state, read_jobs, refresh_states
from mtp_cli.results import folder as results

LOG_TAIL_LINES = 3


@dataclass
class StageState:
    run: str
    stage: str
    state: str  # done | queued | running | failed | to do
    job_id: str = ""
    detail: str = ""  # the log tail of a failure, or training progress


def grid_status(ab: Ablation) -> list[StageState]:
    """The state of every stage of every cell of a planned ablation (`grid.plan.plan`)."""
    rows = []
    all_records = {cell.name: read_jobs(cell.run_dir) for cell in ab.cells}
    if any(all_records.values()):
        refresh_states([r for records in all_records.values() for r in records.values()])
    for cell in ab.cells:
        run = results.RunFolder(cell.run_dir)
        pending = results.pending_stages(run, cell.recipe)
        records = all_records[cell.name]
        states = {group: job_state(rec, cached=True) for group, rec in records.items()}
        for stage in results.enabled_stages(cell.recipe):
            if stage not in pending:
                rows.append(StageState(cell.name, stage, "done"))
                continue
            group = GROUP_OF[stage]
            record, state = records.get(group), states.get(group, "none")
            job_id = record["job_id"] if record else ""
            if state == "completed":  # the job ended well, yet the stage is missing: it did not finish it
                state = "failed"
            detail = ""
            if state == "failed":
                detail = _failure_tail(cell.run_dir, stage, record)
            elif stage == "train" and state == "running":
                step = run.run.get("step")
                detail = f"step {step}/{cell.recipe.train.steps}" if step is not None else ""
            elif state == "none":
                state = "failed" if _stage_failed_locally(cell.run_dir, stage) else "to do"
                detail = _failure_tail(cell.run_dir, stage, None) if state == "failed" else ""
            rows.append(StageState(cell.name, stage, state, job_id, detail))
    return rows


def status_table(ab, rows: list[StageState]):
    colors = {"done": "green", "queued": "cyan", "running": "yellow", "failed": "red", "to do": "white"}
    table = Table(title=f"mtp ablate {ab.recipe.name}: {ab.results_dir}", title_justify="left")
    for col in ("run", "stage", "state", "job", "detail"):
        table.add_column(col, overflow="fold")
    last = None
    for r in rows:
        table.add_row(r.run if r.run != last else "", r.stage, f"[{colors[r.state]}]{r.state}[/]", r.job_id,
                      escape(r.detail))
        last = r.run
    counts = {s: sum(r.state == s for r in rows) for s in colors}
    table.caption = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    return table


def _stage_failed_locally(run_dir: Path, stage: str) -> bool:
    log = Path(run_dir) / results.ABLATE_LOG
    return log.is_file() and f"--- {stage} failed at" in log.read_text(errors="replace")


def _failure_tail(run_dir: Path, stage: str, record: dict | None) -> str:
    """The last lines of the job's stderr, else of the run's ablate.log entry for the stage."""
    candidates = [Path(record["stderr"])] if record and record.get("stderr") else []
    candidates.append(Path(run_dir) / results.ABLATE_LOG)
    for path in candidates:
        try:
            lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            continue
        if lines:
            return " | ".join(line.strip() for line in lines[-LOG_TAIL_LINES:])
    return "no log"


def ablation_status(recipe_path, only=None, seeds=None, results_root=paths.RESULTS_ROOT):
    """(the planned ablation, the state of each of its stages) for `mtp ablate --status`."""
    ab = plan(recipe_path, only, seeds, results_root)
    return ab, grid_status(ab)
