"""The four stages of a grid cell (train → export → eval → specbench), each run the same way by the
local loop (`mtp_cli.ablate`) and inside a Slurm job (`mtp_cli.launch.jobs`): its wall time logged,
its headline numbers sent to the tracker, a crash recorded in the run's ablate.log without costing
the other runs. Training runs in a child process, so its peak memory is its own."""

from __future__ import annotations

import ctypes
import dataclasses
import math
import multiprocessing
import signal
import time
import traceback
from pathlib import Path

from mtp_cli.base import paths, ui
from mtp_cli.base.dist import dist_info
from mtp_cli.base.errors import Terminated, UserError
from mtp_cli.config.recipe import EvalConfig, Recipe, Runtime, recipe_from_dict
from mtp_cli.grid.cells import Ablation, Cell
from mtp_cli.grid.lock import now, record_stage_time
from mtp_cli.grid.view import GridView
from mtp_cli.results import folder as results
from mtp_cli.train import tracking
from mtp_cli.train.flags import resolve_init


def run_stage(ab: Ablation, cell: Cell, stage: str, view: GridView) -> bool:
    """Run one stage and log its wall time; False (and the traceback in ablate.log) if it crashed.
    Bad input (UserError) and Ctrl-C stop the whole ablation instead."""
    cell.run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        STAGE_FUNCS[stage](ab, cell, view)
    except (UserError, KeyboardInterrupt):
        raise
    except Exception as exc:  # a crash in one run must not cost the others
        with open(cell.run_dir / results.ABLATE_LOG, "a") as log:
            log.write(f"--- {stage} failed at {now()}\n{getattr(exc, 'details', None) or traceback.format_exc()}\n")
        ab.failures.append(f"{cell.name}: {stage} failed ({type(exc).__name__}: {exc}); see {cell.run_dir / 'ablate.log'}")
        ui.console.print(f"[red]{cell.name}: {stage} failed[/red] ({type(exc).__name__}: {exc})", highlight=False)
        return False
    record_stage_time(ab, cell, stage, time.perf_counter() - t0)
    if dist_info().main:
        track_stage(cell.recipe, cell.run_dir, stage)
    return True


def track_stage(recipe: Recipe, run_dir: str | Path, stage: str) -> None:
    """After an ablation stage: its headline numbers (summary.csv columns) at the run's final step."""
    if recipe.train.track == "none" or stage not in tracking.HEADLINES:
        return
    run = results.RunFolder(Path(run_dir))
    row = results.summary_row(run)
    values = {f"{stage}/{col}": float(row[col]) for col in tracking.HEADLINES[stage]
              if isinstance(row.get(col), (int, float)) and math.isfinite(float(row[col]))}
    if not values:
        return
    tracker = tracking.open_tracker(recipe, run_dir)
    try:
        tracker.log_scalars(values, int(run.run.get("step") or recipe.train.steps))
    finally:
        tracker.close()


def resolve_cell(cell: Cell) -> None:
    """The cell's [model] from its init_from checkpoint (after the source stage made it), as `mtp train` does."""
    resolve_init(cell.recipe, cell.model_keys)


def train(ab: Ablation, cell: Cell, view: GridView) -> None:
    """Train in a fresh process, so that its peak memory is its own (not the ablation's so far) and
    no state leaks between runs. Under torchrun the ranks train in-process (the collectives need them)."""
    if dist_info().world > 1:
        from mtp_cli.train.loop import train as train_run  # see `export`

        resolve_cell(cell)
        train_run(cell.recipe, cell.run_dir, resume=True, show_progress=view.show_nested, restart_without_checkpoint=True,
                  rt=runtime(ab, cell.recipe, "train"))
        return
    resolve_cell(cell)  # after the source stage: the checkpoint is there now
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_train_child, name=f"train {cell.name}",
                        args=(cell.recipe.to_dict(), str(cell.run_dir), runtime(ab, cell.recipe, "train"), send))
    child.start()
    send.close()
    try:
        while child.is_alive():
            view.training(cell, cell.run_dir / results.METRICS)
            child.join(0.5)
    except KeyboardInterrupt:
        child.join()  # the same Ctrl-C reached the child, which saves a checkpoint before it exits
        raise
    except Terminated:
        child.terminate()  # a SIGTERM may have come to this process alone (`timeout`): the child saves and exits
        child.join()
        raise
    finally:
        view.training_done()
    message = receive.recv() if receive.poll() else ("error", f"training process exited with code {child.exitcode}")
    kind, text = message
    if kind == "user_error":
        raise UserError(text)
    if kind == "interrupted":
        raise KeyboardInterrupt
    if kind != "ok":
        raise TrainingCrashed(text)


class TrainingCrashed(RuntimeError):
    """A crash in the training child: the message is its last line, `details` its whole traceback."""

    def __init__(self, details: str):
        super().__init__(details.strip().splitlines()[-1])
        self.details = details


def _train_child(recipe_dict: dict, run_dir: str, rt: Runtime, send) -> None:
    _die_with_parent()
    try:
        from mtp_cli.train.loop import train as train_run  # see `export`

        # the ablation's view draws training from metrics.jsonl; making the data (minutes of self-distilled
        # text) writes nothing there, so in a log the child prints its own plain lines for it
        train_run(recipe_from_dict(recipe_dict), run_dir, resume=True, show_progress=False,
                  data_progress=not ui.console.is_terminal, restart_without_checkpoint=True, rt=rt)
        send.send(("ok", ""))
    except UserError as exc:
        send.send(("user_error", str(exc)))
    except (KeyboardInterrupt, Terminated):
        send.send(("interrupted", ""))
    except BaseException:
        send.send(("error", traceback.format_exc()))


def _die_with_parent() -> None:
    """Linux: the training child is killed with the ablation, so a restart never races an orphan."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def export(ab: Ablation, cell: Cell, view: GridView) -> None:
    # imported when the stage runs: transformers, lm-eval and the trainer cost seconds of start-up that
    # `mtp ablate --dry-run` and the Slurm submitter do not need
    from transformers.utils import logging as hf_logging

    from mtp_cli.model.hf import ensure_export

    hf_logging.disable_progress_bar()
    ensure_export(cell.run_dir, cell.run_dir / results.EXPORT)


def runtime(ab: Ablation, recipe: Recipe, stage: str) -> Runtime:
    """Where a cell's stage runs: the recipe's (`Recipe.runtime`), with the ablation's threads."""
    return recipe.runtime(stage, ab.threads)


def eval_config(recipe: Recipe, gsm8k: Path | None) -> EvalConfig:
    """The recipe's [eval] with the GSM8K folder the grid resolved once (`Cell.gsm8k`)."""
    return dataclasses.replace(recipe.eval, gsm8k_data=str(gsm8k or paths.HUB))


def evaluate(ab: Ablation, cell: Cell, view: GridView) -> None:
    from mtp_cli.evals.runner import run_eval  # see `export`

    run_eval(cell.run_dir, eval_config(cell.recipe, cell.gsm8k), runtime(ab, cell.recipe, "eval"),
             json_path=cell.run_dir / results.EVAL_JSON, show_progress=view.show_nested)


def specbench(ab: Ablation, cell: Cell, view: GridView) -> None:
    from mtp_cli.bench.run import run_specbench  # see `export`

    run_specbench(cell.run_dir, cell.recipe.specbench, runtime(ab, cell.recipe, "specbench"), gsm8k_data=cell.gsm8k,
                  json_path=cell.run_dir / results.SPEC_JSON, show_progress=view.show_nested)


STAGE_FUNCS = {"train": train, "export": export, "eval": evaluate, "specbench": specbench}
