"""Terminal output shared by every command: one Rich console (stderr) and the progress bar style."""

from __future__ import annotations

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


def progress(transient: bool = False, disable: bool = False) -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("eta"), RemainingColumn(),
                    console=console, transient=transient, disable=disable)
