"""The Slurm jobs a grid has out, as each run's jobs.json records them, and what state each is in
(sacct through submitit's watcher, or the local process for submitit's local executor). Read by the
submitter, which sends only what is neither done nor queued, and by `mtp ablate --status`."""

from __future__ import annotations

import json
import os
import pickle
import time
from datetime import UTC, datetime
from pathlib import Path

from mtp_cli.base.errors import UserError
from mtp_cli.base.files import write_json

# The job groups: which stages each kind of job runs.
GROUPS = {"train": ("train",), "eval": ("export", "eval"), "specbench": ("specbench",)}
GROUP_OF = {stage: group for group, stages in GROUPS.items() for stage in stages}
JOBS_JSON = "jobs.json"
ACTIVE = {"queued", "running"}
# Slurm states (sacct) in our words; anything else (FAILED, CANCELLED, TIMEOUT, NODE_FAIL, PREEMPTED,
# OUT_OF_MEMORY, BOOT_FAIL, DEADLINE) is "failed". REQUEUED: a pre-empted training waiting to resume.
SLURM_STATES = {"PENDING": "queued", "REQUEUED": "queued", "REQUEUE_HOLD": "queued", "REQUEUE_FED": "queued",
                "CONFIGURING": "queued", "RUNNING": "running", "COMPLETING": "running", "SUSPENDED": "running",
                "RESIZING": "running", "STAGE_OUT": "running", "SIGNALING": "running", "COMPLETED": "completed"}
UNKNOWN_GRACE_S = 300  # a job sacct does not know yet, this soon after its submission, counts as queued


def require_submitit() -> None:
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise UserError("--launcher slurm needs submitit: pip install submitit  (or: pip install 'mtp[slurm]')") from None


def read_jobs(run_dir: Path) -> dict:
    try:
        return json.loads((Path(run_dir) / JOBS_JSON).read_text())
    except (OSError, ValueError):
        return {}


def record_job(run_dir: Path, group: str, job, cluster: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    jobs = read_jobs(run_dir)
    jobs[group] = {"job_id": str(job.job_id), "cluster": cluster, "folder": str(Path(job.paths.folder).resolve()),
                   "stages": list(GROUPS[group]), "submitted": _now(), "stdout": str(job.paths.stdout),
                   "stderr": str(job.paths.stderr)}
    write_json(run_dir / JOBS_JSON, jobs)


def refresh_states(records: list[dict]) -> None:
    """Ask sacct once about all these recorded Slurm jobs (through submitit's watcher); `job_state(...,
    cached=True)` then reads the answers."""
    require_submitit()
    # submitit is an optional dependency (the slurm extra): imported only where a job is asked about
    import submitit

    ids = [r["job_id"] for r in records if r and r.get("cluster") == "slurm"]
    if ids:
        watcher = submitit.SlurmJob.watcher
        for job_id in ids:
            watcher.register_job(job_id)
        watcher.update()


def job_state(record: dict | None, cached: bool = False) -> str:
    """queued | running | completed | failed | none, for a recorded job (asks sacct, or the local process);
    `cached`: use the answer of the last `refresh_states`."""
    if not record:
        return "none"
    # submitit is an optional dependency (the slurm extra): imported only where a job is asked about
    import submitit

    if record.get("cluster") == "local":
        return _local_state(record)
    try:
        raw = submitit.SlurmJob.watcher.get_info(record["job_id"], mode="cache" if cached else "force").get("State")
    except Exception:  # sacct missing or failing: we cannot tell
        raw = None
    raw = raw or "UNKNOWN"
    raw = raw.split()[0].upper()  # "CANCELLED by 123"
    if raw == "UNKNOWN":
        age = time.time() - _parse_time(record.get("submitted"))
        return "queued" if age < UNKNOWN_GRACE_S else "failed"
    return SLURM_STATES.get(raw, "failed")


def _local_state(record: dict) -> str:
    # submitit is an optional dependency (the slurm extra): imported only where a job is asked about
    from submitit.core.utils import JobPaths

    pid = int(record["job_id"])
    result = JobPaths(record["folder"], record["job_id"], 0).result_pickle
    if result.is_file():
        try:
            with open(result, "rb") as f:
                return "completed" if pickle.load(f)[0] == "success" else "failed"
        except Exception:
            return "failed"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "failed"
    try:  # a pid of ours is alive unless the kernel reused it for something else
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        return "running" if b"submitit" in cmdline and b"<defunct>" not in cmdline else "failed"
    except OSError:
        return "running"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _parse_time(text: str | None) -> float:
    try:
        return datetime.fromisoformat(text).timestamp()
    except (TypeError, ValueError):
        return 0.0
