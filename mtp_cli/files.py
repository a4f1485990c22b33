"""Writing a file so that a reader never sees half of it: write a temporary sibling, then rename it
over the target (atomic on POSIX within one filesystem). Every result, checkpoint, cache entry and
report is written through here; a killed process leaves the old file or none, never a torn one."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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
