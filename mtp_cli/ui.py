"""Terminal output shared by every command: one Rich console (stderr) and the progress bar style."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True)
out = Console()
out.soft_wrap = not out.is_terminal  # piped or redirected: Markdown tables and text lines stay whole


def progress(transient: bool = False, disable: bool = False) -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                    console=console, transient=transient, disable=disable)
