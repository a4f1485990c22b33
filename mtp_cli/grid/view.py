"""The Rich view of a running grid: one row for the ablation (with its time remaining from the plan's
estimates), one per run, and one for the training under way, polled from its metrics.jsonl."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path

from mtp_cli.base import ui
from mtp_cli.grid.cells import Ablation, Cell
from mtp_cli.results import folder as results
from mtp_cli.results.estimate import Estimator


class GridView:
    """The Rich progress view across the grid: one row for the whole ablation, one per run (stages
    done / 4), and a row for the training under way (its steps, read from its metrics.jsonl). The whole
    ablation's time remaining comes from the plan's estimates (`mtp ablate --dry-run`), re-read as
    stages finish, not from the speed of the stages so far."""

    def __init__(self, ab: Ablation, work: list[tuple[Cell, list[str]]], disable: bool):
        self.ab = ab
        self.progress = ui.progress(disable=disable)
        self.show_nested = not disable  # eval/specbench draw their own bars inside this view
        self.work = {cell.name: stages for cell, stages in work}
        self.stages_left = [(cell, stage) for cell, stages in work for stage in stages]
        self.overall = self.progress.add_task(f"ablate {ab.recipe.name}", total=sum(map(len, self.work.values())),
                                              info="stages", eta=None)
        n = len(results.STAGES)
        self.completed = {cell.name: n - len(cell.pending) for cell, _ in work}
        self.rows = {cell.name: self.progress.add_task(f"  {cell.name}", total=n, completed=n - len(cell.pending),
                                                       info="waiting" if stages else "done") for cell, stages in work}
        self.train_task = None
        self.train_step = 0
        self.current: tuple[Cell, str, float] | None = None
        self.estimates: dict[tuple[str, str], float | None] = {}
        if not disable:
            self._estimate()

    def _estimate(self) -> None:
        est = Estimator(self.ab.results_dir, self.ab.recipe, self.ab.cells)
        self.estimates = {(cell.name, stage): est.stage(cell, stage).seconds for cell, stage in self.stages_left}
        self.show_eta()

    def show_eta(self) -> None:
        """Stages not started at their estimate, the one under way at what is left of its estimate."""
        if not self.estimates:
            return
        left, unknown = 0.0, False
        for cell, stage in self.stages_left:
            seconds = self.estimates.get((cell.name, stage))
            if self.current and self.current[:2] == (cell, stage) and seconds is not None:
                seconds = max(0.0, seconds - (time.perf_counter() - self.current[2]))
            unknown |= seconds is None
            left += seconds or 0.0
        text = str(timedelta(seconds=round(left)))
        self.progress.update(self.overall, eta=f"≥ {text}" if unknown else text)

    def start(self, cell: Cell, stage: str) -> None:
        self.current = (cell, stage, time.perf_counter())
        self.progress.update(self.rows[cell.name], info=stage)
        self.show_eta()

    def finish(self, cell: Cell, stage: str, ok: bool) -> None:
        stages = self.work[cell.name]
        skipped = stages[stages.index(stage) + 1:] if not ok else []
        self.stages_left = [(c, s) for c, s in self.stages_left if not (c is cell and (s == stage or s in skipped))]
        self.current = None
        self.progress.update(self.overall, advance=1 + len(skipped))
        self.progress.update(self.rows[cell.name], advance=1)
        self.completed[cell.name] += 1
        info = "[red]failed[/red]" if not ok else ("done" if self.completed[cell.name] == len(results.STAGES)
                                                   else f"{stage} done")
        self.progress.update(self.rows[cell.name], info=info)
        if self.estimates:
            self._estimate()  # a finished stage is a measurement the other cells' estimates borrow

    def training(self, cell: Cell, metrics: Path) -> None:
        """Show the steps of a training running in a child process (polled from its metrics)."""
        step, loss = _last_train_step(metrics)
        total = cell.recipe.train.steps
        info = f"loss {loss:.3f}" if loss is not None else ""
        self.show_eta()
        if self.train_task is None:
            self.train_task = self.progress.add_task(f"  train {cell.name}", total=total, completed=step, info=info)
        else:  # a new metrics row (every train.log_every steps) is worth a line in a log file
            self.progress.update(self.train_task, description=f"  train {cell.name}", total=total, completed=step,
                                 info=info, log=step != self.train_step)
        self.train_step = step

    def training_done(self) -> None:
        if self.train_task is not None:
            self.progress.remove_task(self.train_task)
            self.train_task = None


def _last_train_step(metrics: Path) -> tuple[int, float | None]:
    try:
        with open(metrics, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return 0, None
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("kind") == "train":
            return int(row["step"]), row.get("loss_main")
    return 0, None
