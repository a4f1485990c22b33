"""What runs inside a Slurm job: the training (torchrun over the job's nodes and GPUs) and the stages after it.

A job carries a *cell spec*: the plain dict of one grid cell (its single-run recipe, run folder, variant,
seed, and the ablation's name and fingerprint), from which `cell_from_spec` rebuilds the `ablate` objects,
so every stage runs through `grid.stages.run_stage` exactly as `mtp ablate` runs it locally.

The training job is `submitit.helpers.Checkpointable`: when Slurm pre-empts it or its time runs out,
submitit calls `checkpoint()`, which stops torchrun and hands back the same job, and submitit requeues it;
the requeued training resumes from the run's last checkpoint (`train.ckpt_every` bounds the work lost).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import submitit

from mtp_cli.base.dist import dist_info
from mtp_cli.config.recipe import Recipe, Variant, from_dict, recipe_from_dict
from mtp_cli.grid.cells import Ablation, Cell
from mtp_cli.grid.lock import locked
from mtp_cli.grid.view import GridView
from mtp_cli.launch.records import GROUPS
from mtp_cli.results import folder as results


def cell_spec(ab: Ablation, cell: Cell) -> dict:
    return {"recipe_name": ab.recipe.name, "fingerprint": ab.fingerprint, "source": str(ab.source),
            "results_dir": str(ab.results_dir), "variant": asdict(cell.variant), "seed": cell.seed,
            "recipe": cell.recipe.to_dict(), "run_dir": str(cell.run_dir),
            "gsm8k": str(cell.gsm8k.resolve()) if cell.gsm8k else None,  # as resolved where the grid was submitted
            "threads": ab.threads}


def cell_from_spec(spec: dict):
    """(Ablation, Cell) of one grid cell, rebuilt from its spec inside a job."""
    cell = Cell(from_dict(Variant, spec["variant"], "variant"), int(spec["seed"]),
                       recipe_from_dict(spec["recipe"]), Path(spec["run_dir"]),
                       gsm8k=Path(spec["gsm8k"]) if spec.get("gsm8k") else None)
    ab = Ablation(Recipe(name=spec["recipe_name"]), Path(spec["source"]), Path(spec["results_dir"]),
                         [cell], spec["fingerprint"], threads=spec.get("threads"))
    return ab, cell


def run_stages(spec: dict, stages: tuple[str, ...]) -> list[str]:
    """Run those of `stages` the cell still lacks, in order, as `mtp ablate` does; raise on a failure."""
    ab, cell = cell_from_spec(spec)
    missing = [s for s in results.pending_stages(results.RunFolder(cell.run_dir), cell.recipe) if s in stages]
    view = GridView(ab, [(cell, missing)], disable=True)
    ran = []
    for stage in missing:
        if not stages.run_stage(ab, cell, stage, view):
            raise StageFailed(ab.failures[-1])
        ran.append(stage)
    if dist_info().main:
        write_summary(Path(spec["results_dir"]))
    return ran


def write_summary(results_dir: Path) -> None:
    """summary.csv, rewritten by whichever job finishes, one at a time."""
    with locked(results_dir / results.SUMMARY):
        results.write_summary(results_dir)


class StageFailed(RuntimeError):
    """A stage of the job crashed; the message names it and the run's ablate.log."""


class StageJob:
    """Export+eval, or specbench, of one run: one process on one node."""

    def __init__(self, spec: dict, group: str):
        self.spec, self.group = spec, group

    def __call__(self) -> list[str]:
        return run_stages(self.spec, GROUPS[self.group])


class TrainJob(submitit.helpers.Checkpointable):
    """One run's training: one task per node, each starting torchrun over that node's GPUs; the
    rendezvous (first node, a port derived from the job id, this node's rank) comes from Slurm's
    environment through submitit's TorchDistributedEnvironment."""

    def __init__(self, spec_path: str, nodes: int, gpus_per_node: int):
        self.spec_path, self.nodes, self.gpus_per_node = spec_path, nodes, gpus_per_node

    def torchrun_command(self) -> list[str]:
        nproc = max(1, self.gpus_per_node)
        head = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
        if self.nodes == 1:
            head += ["--standalone", "--nnodes", "1"]
        else:
            dist_env = submitit.helpers.TorchDistributedEnvironment()
            head += ["--nnodes", str(dist_env.world_size), "--node_rank", str(dist_env.rank),
                     "--master_addr", dist_env.master_addr, "--master_port", str(dist_env.master_port)]
        return head + ["-m", "mtp_cli.launch.worker", self.spec_path]

    def __call__(self) -> str:
        spec = json.loads(Path(self.spec_path).read_text())
        run = results.RunFolder(Path(spec["run_dir"]))

        if results.train_done(run, recipe_from_dict(spec["recipe"])):
            return "done already"
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        proc = subprocess.Popen(self.torchrun_command(), env=env, start_new_session=True)
        _CHILDREN.append(proc)
        code = proc.wait()
        _CHILDREN.remove(proc)
        if code:
            raise StageFailed(f"{Path(spec['run_dir']).name}: torchrun exited with code {code}; "
                              f"see {Path(spec['run_dir']) / 'ablate.log'} and this job's log")
        return "trained"

    def checkpoint(self, *args, **kwargs):
        """Pre-empted or out of time: stop torchrun (its last checkpoint stays) and requeue this job."""
        for proc in list(_CHILDREN):
            _stop(proc)
        return super().checkpoint(*args, **kwargs)


_CHILDREN: list[subprocess.Popen] = []  # torchrun of the job in this process (never pickled with the job)


def _stop(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM torchrun's process group, SIGKILL it after `grace_s`. This runs inside submitit's signal
    handler while the main thread sits in `proc.wait()`, which holds the Popen's lock: so no
    `proc.wait` here (it would deadlock), only a non-blocking waitpid."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            if os.waitpid(proc.pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
