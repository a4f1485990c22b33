"""Submit what the grid still lacks as Slurm jobs (submitit), record their ids, and optionally follow them.

Per run, three kinds of job (`jobs.GROUPS`): the training, then export+eval and specbench, each after the
training (`afterok`; a job whose dependency failed is cancelled, not left pending). Trainings that need
no job before them go out together as one job array. Every job's id is written to `<run>/jobs.json`
before anything else happens, so a second `mtp ablate` submits only what is neither done nor queued
nor running: a job that failed, timed out or vanished is submitted again, and a training resumes from
its checkpoint. Submitit's local executor (cluster="local", for tests) has no dependencies: there the
dependent jobs are submitted once their training has finished, which means waiting.
"""

from __future__ import annotations

import contextlib
import io
import time
from dataclasses import dataclass, field
from pathlib import Path

from mtp_cli.base import ui
from mtp_cli.base.errors import UserError
from mtp_cli.base.files import write_json
from mtp_cli.config.recipe import LauncherConfig, time_minutes
from mtp_cli.launch.records import ACTIVE, GROUPS, job_state, read_jobs, record_job, refresh_states, require_submitit
from mtp_cli.launch.status import grid_status
from mtp_cli.results import folder as results


@dataclass
class Submission:
    """What one `mtp ablate --launcher slurm` did: job ids per run and group, and what it left alone."""

    submitted: dict[str, dict[str, str]] = field(default_factory=dict)  # run -> group -> job id
    kept: dict[str, dict[str, str]] = field(default_factory=dict)  # already queued/running, not resubmitted
    deferred: list[tuple] = field(default_factory=list)  # (cell, group, upstream job) waiting: local executor


# ---- job records ----------------------------------------------------------------------------------
# ---- the executors ---------------------------------------------------------------------------------
def job_folder(ab, launcher: LauncherConfig) -> Path:
    return Path(launcher.folder).expanduser() if launcher.folder else ab.results_dir / "slurm"


def make_executor(ab, launcher: LauncherConfig, cluster: str, group: str, dependency: str | None = None):
    """A submitit executor for one kind of job: the training over `nodes` × `gpus_per_node`, the others
    on one GPU of one node; Slurm settings from the [launcher] recipe section and its flags."""
    import submitit  # optional dependency (.[slurm])

    executor = submitit.AutoExecutor(folder=job_folder(ab, launcher) / "%j", cluster=cluster)
    train = group == "train"
    extra = dict(launcher.sbatch)
    if dependency:
        extra.update({"dependency": f"afterok:{dependency}", "kill-on-invalid-dep": "yes"})
    params = dict(name=f"mtp-{ab.recipe.name}-{group}", timeout_min=time_minutes(launcher.time),
                  nodes=launcher.nodes if train else 1, tasks_per_node=1, cpus_per_task=launcher.cpus_per_task,
                  gpus_per_node=launcher.gpus_per_node if train else min(launcher.gpus_per_node, 1))
    if cluster == "slurm":
        params.update(slurm_partition=launcher.partition or None, slurm_account=launcher.account or None,
                      slurm_qos=launcher.qos or None, slurm_mem=launcher.mem or None,
                      slurm_additional_parameters=extra or None, slurm_setup=list(launcher.setup) or None,
                      slurm_time=launcher.time)
    else:
        params.update(local_setup=list(launcher.setup) or None)
    params = {k: v for k, v in params.items() if v is not None}
    try:
        executor.update_parameters(**params)
    except (ValueError, NameError) as exc:
        raise UserError(f"launcher settings rejected by submitit: {str(exc).splitlines()[0]}") from None
    return executor


def _submit(executor, calls: list, what: str) -> list:
    """Submit callables (several: one job array); sbatch's refusal is one line with its own message."""
    import submitit  # optional dependency (.[slurm])

    caught = io.StringIO()
    try:  # clean_env: submitted from inside a Slurm job, the new jobs must not inherit its SLURM_* settings
        with contextlib.redirect_stderr(caught), contextlib.redirect_stdout(caught), submitit.helpers.clean_env():
            if len(calls) == 1:
                return [executor.submit(calls[0])]
            with executor.batch():
                jobs = [executor.submit(call) for call in calls]
            return jobs
    except submitit.core.utils.FailedJobError as exc:
        message = " ".join(str(exc).split()) or caught.getvalue().strip().splitlines()[-1]
        raise UserError(f"sbatch rejected the {what}: {message}") from None
    except FileNotFoundError as exc:
        raise UserError(f"cannot submit the {what}: {exc.filename} not found (is this a Slurm login node?)") from None


# ---- what to submit --------------------------------------------------------------------------------
def submit_ablation(ab, launcher: LauncherConfig, wait: bool = False, show_progress: bool = True,
                    cluster: str = "slurm", poll_s: float | None = None):
    """Submit the grid's missing stages (nothing twice); with `wait`, follow them until they finish."""
    require_submitit()
    if cluster == "slurm":
        import submitit  # optional dependency (.[slurm])

        if submitit.SlurmExecutor.affinity() < 0:
            raise UserError("--launcher slurm: srun not found; run `mtp ablate` on a Slurm login node "
                            "(or drop --launcher slurm to run here)")
    sub = Submission()
    submit_round(ab, launcher, cluster, sub, set())
    jobs_line = ", ".join(f"{run}: " + " ".join(f"{g} {j}" for g, j in groups.items())
                          for run, groups in sub.submitted.items())
    if sub.submitted:
        ui.out.print(f"submitted {sum(map(len, sub.submitted.values()))} jobs to {job_folder(ab, launcher)}: {jobs_line}",
                     highlight=False, soft_wrap=True)
    if sub.kept:
        ui.console.print("already queued or running, not submitted again: "
                         + ", ".join(f"{run} {' '.join(f'{g} {j}' for g, j in gs.items())}" for run, gs in sub.kept.items()),
                         highlight=False, soft_wrap=True)
    if not sub.submitted and not sub.kept:
        ui.console.print(f"nothing to do: every stage of the {len(ab.cells)} runs in {ab.results_dir} is done")
    if wait or sub.deferred:
        follow(ab, launcher, cluster, sub, show_progress, poll_s or (30.0 if cluster == "slurm" else 1.0))
        ab.summary = results.write_summary(ab.results_dir)
        ab.failures += [f"{r.run}: {r.stage} failed" + (f" (job {r.job_id})" if r.job_id else "") + f": {r.detail}"
                        for r in grid_status(ab) if r.state == "failed"]
    for cell in ab.cells:
        cell.pending = results.pending_stages(results.RunFolder(cell.run_dir), cell.recipe)
    return ab


def submit_round(ab, launcher: LauncherConfig, cluster: str, sub: Submission, done_groups: set) -> None:
    """Submit every group of every cell that is missing and not queued or running; `done_groups`
    (cell, group) already submitted by this invocation are never submitted again by it."""
    from mtp_cli.launch.jobs import StageJob, TrainJob, cell_spec  # jobs imports submitit (optional: the slurm extra)

    sub.deferred = []
    trains, after, upstream = [], [], {}  # upstream: run -> the training job its later stages wait for
    all_records = {cell.name: read_jobs(cell.run_dir) for cell in ab.cells}
    refresh_states([r for records in all_records.values() for r in records.values()])
    for cell in ab.cells:
        pending = results.pending_stages(results.RunFolder(cell.run_dir), cell.recipe)
        records = all_records[cell.name]
        if "train" in pending and "train" in records:
            upstream[cell.name] = records["train"]["job_id"]
        for group, stages in GROUPS.items():
            if not set(stages) & set(pending) or (cell.name, group) in done_groups:
                continue
            if job_state(records.get(group), cached=True) in ACTIVE:
                sub.kept.setdefault(cell.name, {})[group] = records[group]["job_id"]
                continue
            if group == "train":
                trains.append(cell)
                upstream.pop(cell.name, None)
            else:
                after.append((cell, group))
    if trains:
        folder = job_folder(ab, launcher)
        (folder / "cells").mkdir(parents=True, exist_ok=True)
        calls = []
        for cell in trains:
            spec_path = folder / "cells" / f"{cell.name}.json"
            write_json(spec_path, cell_spec(ab, cell))
            calls.append(TrainJob(str(spec_path.resolve()), launcher.nodes, launcher.gpus_per_node))
        executor = make_executor(ab, launcher, cluster, "train")
        jobs = _submit(executor, calls, f"training job{'s' if len(calls) > 1 else ''} of "
                       f"{', '.join(c.name for c in trains)}")
        for cell, job in zip(trains, jobs):
            record_job(cell.run_dir, "train", job, cluster)
            sub.submitted.setdefault(cell.name, {})["train"] = str(job.job_id)
            done_groups.add((cell.name, "train"))
            upstream[cell.name] = str(job.job_id)
    for cell, group in after:
        waits_for = upstream.get(cell.name)
        if waits_for and cluster != "slurm":  # no dependencies outside Slurm: submit once the training is over
            if job_state(read_jobs(cell.run_dir).get("train")) in ACTIVE:
                sub.deferred.append((cell, group, waits_for))
            continue  # (a training that failed: its later stages are not submitted, as afterok would not run them)
        executor = make_executor(ab, launcher, cluster, group, dependency=waits_for)
        (job,) = _submit(executor, [StageJob(cell_spec(ab, cell), group)], f"{group} job of {cell.name}")
        record_job(cell.run_dir, group, job, cluster)
        sub.submitted.setdefault(cell.name, {})[group] = str(job.job_id)
        done_groups.add((cell.name, group))


# ---- following the jobs (--wait) ---------------------------------------------------------------------
def follow(ab, launcher: LauncherConfig, cluster: str, sub: Submission, show_progress: bool, poll_s: float) -> None:
    """A progress view of the grid until no job of it is queued or running (and, on the local executor,
    the deferred jobs have been submitted after their trainings)."""
    done_groups = {(run, g) for run, gs in sub.submitted.items() for g in gs}
    n = len(results.STAGES)
    progress = ui.progress(disable=not show_progress)
    with progress:
        rows = {cell.name: progress.add_task(f"  {cell.name}", total=n, completed=0, info="") for cell in ab.cells}
        while True:
            active = False
            all_records = {cell.name: read_jobs(cell.run_dir) for cell in ab.cells}
            refresh_states([r for records in all_records.values() for r in records.values()])
            for cell in ab.cells:
                pending = results.pending_stages(results.RunFolder(cell.run_dir), cell.recipe)
                records = all_records[cell.name]
                states = {g: job_state(records.get(g), cached=True) for g in records}
                active |= any(s in ACTIVE for s in states.values())
                info = " ".join(f"{g} {s}" for g, s in states.items() if any(st in pending for st in GROUPS[g]))
                progress.update(rows[cell.name], completed=n - len(pending), info=info if pending else "done")
            if sub.deferred and not active:
                submit_round(ab, launcher, cluster, sub, done_groups)
                continue
            if sub.deferred:
                ready = [d for d in sub.deferred if job_state(read_jobs(d[0].run_dir).get("train")) not in ACTIVE]
                if ready:
                    submit_round(ab, launcher, cluster, sub, done_groups)
                    continue
            if not active:
                break
            time.sleep(poll_s)
