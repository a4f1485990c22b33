"""Writing a file so that a reader never sees half of it: write a temporary sibling, then rename it
over the target (atomic on POSIX within one filesystem). Every result, checkpoint, cache entry and
report is written through here; a killed process leaves the old file or none, never a torn one.
Reading them back: a JSON object or JSON lines, where a damaged file is a one-line error naming it."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mtp_cli.base.errors import UserError


@contextlib.contextmanager
def replacing(path: Path, tag: str = "") -> Iterator[Path]:
    """Yield the temporary sibling to write (`<name>.tmp<tag>`; a tag such as the pid keeps concurrent
    writers apart), then move it over `path`; on an error the temporary file is removed instead."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp{tag}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str, tag: str = "") -> None:
    with replacing(path, tag) as tmp:
        tmp.write_text(text)


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


def read_json_object(path: Path) -> dict:
    """The JSON object in `path`; unreadable, not JSON or not an object is a one-line error naming it."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path}: {exc} (the file is damaged; restore or delete it)") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} is not a JSON object (found {type(data).__name__}; the file is damaged)")
    return data


def read_json_lines(path: Path, keys: tuple[str, ...] = (), partial_last: bool = False) -> list[dict]:
    """The JSON object on each non-blank line of `path`, each with a string under every one of `keys`; any
    other line is a one-line error naming the file and line. `partial_last`: a last line without its newline
    is one being written (an append-only log) and is left out."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    lines = text.split("\n")
    lines = lines[:-1] if partial_last else lines
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise UserError(f"{path}:{n} is not valid JSON (a damaged or truncated file)") from None
        if not isinstance(row, dict):
            raise UserError(f"{path}:{n} is not a JSON object (a damaged file)")
        missing = [k for k in keys if not isinstance(row.get(k), str)]
        if missing:
            raise UserError(f"{path}:{n} has no string field {missing[0]!r}")
        rows.append(row)
    return rows
