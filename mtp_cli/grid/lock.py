"""The results folder's bookkeeping: recipe.lock.json (one results folder, one recipe version; --force
discards another version's runs), each run's ablate.json of stage times, and the flock that lets
jobs running side by side update one file in turn."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

from mtp_cli.base import env
from mtp_cli.base.dist import dist_info
from mtp_cli.base.errors import UserError
from mtp_cli.base.files import write_json
from mtp_cli.grid.cells import Ablation, Cell
from mtp_cli.results import folder as results


def check_lock(ab: Ablation, force: bool) -> bool:
    """True when the folder holds results of another recipe version that --force may discard."""
    lock = results.read_lock(ab.results_dir)
    has_runs = any((ab.results_dir / results.RUNS).glob("*/run.json"))
    mine = ab.fingerprint
    if lock.get("fingerprint") == mine or (not lock and not has_runs):
        return False
    what = (f"results of another version of recipe {ab.recipe.name} (fingerprint {lock['fingerprint']}, "
            f"the recipe is now {mine})" if lock else "runs without a recipe.lock.json")
    if not force:
        raise UserError(f"{ab.results_dir} holds {what}; restore that recipe, pass another --results-root, "
                        f"or pass --force to discard them")
    return True


def discard(results_dir: Path) -> None:
    """--force: remove a stale results folder's runs, [source] run, baseline and derived files (nothing
    else in it)."""
    for name in (results.RUNS, results.PLOTS, results.SOURCE, results.BASELINE):
        shutil.rmtree(results_dir / name, ignore_errors=True)
    for name in (results.LOCK, results.SUMMARY, results.REPORT):
        (results_dir / name).unlink(missing_ok=True)


def write_lock(ab: Ablation) -> None:
    if not dist_info().main:
        return
    ab.results_dir.mkdir(parents=True, exist_ok=True)
    path = ab.results_dir / results.LOCK
    lock = results.read_lock(ab.results_dir)
    if lock.get("fingerprint") == ab.fingerprint:
        return
    write_json(path, {"recipe_name": ab.recipe.name, "fingerprint": ab.fingerprint,
                      "source": _display_path(ab.source), "created": now(), "recipe": ab.recipe.to_dict()})


def record_stage_time(ab: Ablation, cell: Cell, stage: str, seconds: float) -> None:
    if not dist_info().main:
        return
    path = cell.run_dir / results.ABLATE_JSON
    with locked(path):  # Slurm runs a run's eval and specbench jobs side by side
        log = json.loads(path.read_text()) if path.is_file() else {}
        log.update({"variant": cell.variant.name, "seed": cell.seed, "recipe": ab.recipe.name,
                    "fingerprint": ab.fingerprint})
        entry = {"seconds": round(seconds, 2), "finished": now()}
        if stage == "train":  # a resumed training: this process's time and that of the segments before it
            earlier = (results.RunFolder(cell.run_dir).run.get("segments") or [])[:-1]
            if earlier:
                entry.update(seconds=round(seconds + sum(s["seconds"] for s in earlier), 2), segments=len(earlier) + 1)
        log.setdefault("stages", {})[stage] = entry
        write_json(path, log)


@contextlib.contextmanager
def locked(path: Path):
    """An exclusive lock on `path`'s folder (flock; no lock file left behind) for a read-modify-write
    across processes."""
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(env.REPO))
    except ValueError:
        return str(path.resolve())


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
