"""A section of REPORT.md: its title, intro, tables and images."""

from __future__ import annotations

from dataclasses import dataclass, field

from mtp_cli.base.tables import Table


@dataclass
class Section:
    title: str
    intro: str = ""
    tables: list[Table] = field(default_factory=list)
    images: list[tuple[str, str]] = field(default_factory=list)  # (caption, path relative to the report)
