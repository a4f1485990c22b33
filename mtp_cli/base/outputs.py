"""Where a command may write: the one check every output flag goes through, before any work.

`folder(path, flag)` and `file(path, flag)` refuse, in one line, a path the command could not or should
not write (an existing file where a folder is meant, a system folder such as /proc, an unwritable or
missing parent) and return the path. Missing parent folders are created later by the command, but
never directly under the filesystem root: `--json /nonexistent/dir/e.json` is a typo, not a request
for `/nonexistent`. `replaceable_export(...)` is the rule for `mtp export --out`, the one flag that
replaces what is already there.
"""

from __future__ import annotations

import os
from pathlib import Path

from mtp_cli.base.errors import UserError
from mtp_cli.base.run_files import EVAL_FILE_PATTERNS, EXPORT_INFO, RUN_JSON

SYSTEM_FOLDERS = (Path("/proc"), Path("/sys"), Path("/dev"))
RUN_MARKER = RUN_JSON  # a folder holding it is a run
EXPORT_MARKER = EXPORT_INFO  # a folder holding it is an export


def folder(path: str | Path, flag: str) -> Path:
    """A folder the command will create or fill: refused unless it could be written."""
    path = Path(path)
    resolved = _resolved(path)
    if resolved.exists() and not resolved.is_dir():
        raise UserError(f"{flag} {path}: exists and is not a folder")
    _check_writable_below(path, resolved, flag)
    return path


def file(path: str | Path, flag: str) -> Path:
    """A file the command will (over)write: refused unless it could be written."""
    path = Path(path)
    resolved = _resolved(path)
    if resolved.is_dir():
        raise UserError(f"{flag} {path}: is a folder; give a file name")
    if resolved.exists() and not os.access(resolved, os.W_OK):
        raise UserError(f"{flag} {path}: the file is not writable")
    _check_writable_below(path, resolved.parent, flag)
    return path


def replaceable_export(out: str | Path, source_run: str | Path, force: bool = False) -> Path:
    """`mtp export --out`: a new folder, an empty one, or an earlier export may be replaced. A folder holding
    anything else is refused; `force` allows one that holds other files, but never a folder holding a run
    or an evaluation's files (eval JSON, samples, windows; at any depth), one the source run lives in, or
    one inside the run (its tokenizer, say)."""
    out = folder(out, "--out")
    target, source = _resolved(out), _resolved(Path(source_run))
    if target == source or target in source.parents:
        raise UserError(f"--out {out}: the run {source_run} lives in it; choose a folder outside the run's parents")
    if source in target.parents and target != source / "export":
        raise UserError(f"--out {out}: is inside the run {source_run}; only its own export folder "
                        f"({source / 'export'}) is written there")
    if not target.is_dir() or not any(target.iterdir()):
        return out
    kept = next(_results_below(target), None)
    if kept is not None:
        held = ("is a run" if kept.name == RUN_MARKER and kept.parent == target else f"holds {kept.relative_to(target)}")
        raise UserError(f"--out {out}: {held}, which an export never replaces; choose a new or empty folder "
                        "(or an earlier export)")
    if (target / EXPORT_MARKER).is_file():
        return out
    if not force:
        raise UserError(f"--out {out}: holds files that are not an export; choose a new or empty folder "
                        f"(or pass --force to replace it)")
    return out


def _results_below(folder_: Path, depth: int = 4):
    """The files below `folder_` that a replacement must never delete: runs' run.json and evaluations'
    files (EVAL_FILE_PATTERNS)."""
    if (folder_ / RUN_MARKER).is_file():
        yield folder_ / RUN_MARKER
    for pattern in EVAL_FILE_PATTERNS:
        yield from sorted(folder_.glob(pattern))
    if depth == 0:
        return
    try:
        children = [p for p in folder_.iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return
    for child in children:
        yield from _results_below(child, depth - 1)


def _resolved(path: Path) -> Path:
    try:
        return path.expanduser().resolve()
    except (OSError, RuntimeError) as exc:
        raise UserError(f"{path}: cannot be resolved ({exc})") from None


def _check_writable_below(shown: Path, resolved: Path, flag: str) -> None:
    """The nearest existing folder at or above `resolved` must be writable, not a system folder,
    and not the filesystem root when folders would have to be created in it."""
    for system in SYSTEM_FOLDERS:
        if resolved == system or system in resolved.parents:
            raise UserError(f"{flag} {shown}: {system} is a system folder; write somewhere else")
    existing = resolved
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{flag} {shown}: {existing} is a file, not a folder")
    if existing != resolved and existing == Path(existing.anchor):
        missing = resolved.relative_to(existing).parts[0]
        raise UserError(f"{flag} {shown}: the folder {existing / missing} does not exist "
                        f"(no folder is created at the filesystem root)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {shown}: {existing} is not writable")
