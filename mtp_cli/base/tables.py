"""One table type for every command: Markdown in files and pipes, a Rich table that fits the terminal.

A `Table` is a Rich renderable. Printed to a terminal it is drawn to the terminal's width: when the
full headers do not fit, they are first folded at spaces, then replaced by short forms (the caller's,
or the words' initials) explained in a legend line under the table, so cells are never squeezed into
"tok…" or one character per line. Printed to anything else (a pipe, a file, a test's capture) it is
plain Markdown, the same text `markdown()` writes into REPORT.md.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.table import Table as RichTable
from rich.text import Text

PAD = 1  # the space between two columns in the compact box below (padding collapsed)


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    empty: str = "nothing stored yet."
    short: dict[str, str] = field(default_factory=dict)  # header -> its short form for narrow terminals

    def markdown(self) -> str:
        esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
        if not self.rows:
            return f"**{self.title}**: {self.empty}\n"
        lines = [f"**{self.title}**", "", "| " + " | ".join(map(esc, self.columns)) + " |",
                 "|" + "|".join("---" for _ in self.columns) + "|"]
        lines += ["| " + " | ".join(map(esc, row)) + " |" for row in self.rows]
        lines += [""] + [f"- {note}" for note in self.notes]
        return "\n".join(lines).rstrip() + "\n"

    def rich(self) -> Table:
        """The renderable itself: how it is drawn depends on the console it is printed to."""
        return self

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not console.is_terminal:
            yield Text(self.markdown(), no_wrap=True, overflow="ignore")
            return
        yield self.fitted(options.max_width)

    def headers_for(self, width: int) -> tuple[list[str], list[str]]:
        """Headers that fit `width` columns, and the legend lines for any that were shortened."""
        cells = [max([len(str(row[i])) for row in self.rows] + [1]) for i in range(len(self.columns))]
        room = width - PAD * len(self.columns)

        def need(headers: list[str]) -> int:
            return sum(max(c, *(len(line) for line in h.split("\n"))) for c, h in zip(cells, headers))

        if need(self.columns) <= room:
            return list(self.columns), []
        folded = [_fold(h, c) for h, c in zip(self.columns, cells)]
        if need(folded) <= room:
            return folded, []
        headers, legend = [], []
        for header, fold, c in zip(self.columns, folded, cells):
            if len(header) <= c:
                headers.append(header)
                continue
            short = self.short.get(header) or _initials(header, taken=set(headers))
            if len(short) >= len(header):
                headers.append(fold)
                continue
            headers.append(short)
            legend.append(f"{short} = {header}")
        return headers, legend

    def fitted(self, width: int):
        if not self.rows:
            return Text(f"{self.title}: {self.empty}")
        headers, legend = self.headers_for(width)
        caption = "\n".join(([f"({'; '.join(legend)})"] if legend else []) + list(self.notes))
        table = RichTable(title=escape(self.title), title_justify="left", caption=escape(caption) or None,
                          caption_justify="left", box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1),
                          collapse_padding=True)
        longest_words = [max((len(w) for row in self.rows for w in str(row[i]).split()), default=1)
                         for i in range(len(headers))]
        longest_words = [max([n] + [len(line) for line in h.split("\n")]) for n, h in zip(longest_words, headers)]
        keep_words = sum(longest_words) + PAD * (len(headers) + 1) <= width  # else words must fold too
        for i, header in enumerate(headers):
            numeric = i > 0 and all(_numeric(str(row[i])) for row in self.rows)
            one_word = all(" " not in str(row[i]).strip() for row in self.rows)  # numbers, names: never split
            table.add_column(escape(header), justify="right" if numeric else "left", overflow="fold",
                             no_wrap=one_word and keep_words, min_width=longest_words[i] if keep_words else None)
        for row in self.rows:
            table.add_row(*(escape(str(cell)) for cell in row))
        return table


def _fold(header: str, cell_width: int) -> str:
    """The header on several lines, none longer than its widest cell (or its longest word)."""
    longest_word = max((len(w) for w in header.split()), default=1)
    return "\n".join(textwrap.wrap(header, width=max(cell_width, longest_word))) or header


def _initials(header: str, taken: set[str]) -> str:
    words = re.findall(r"[A-Za-z0-9]+", header)
    short = "".join(w[0] for w in words).lower() if len(words) > 1 else header[:3]
    candidate, n = short, 2
    while candidate in taken:
        candidate, n = f"{short}{n}", n + 1
    return candidate


def _numeric(text: str) -> bool:
    return text[:1] in set("0123456789+-–−.")
