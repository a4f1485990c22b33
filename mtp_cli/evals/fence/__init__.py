"""The fence's programs, kept as real files so that they are linted and read like the rest: the trusted
supervisor, the untrusted check and the probe. Each runs as `python -I -S -c <its text>` in a fresh
interpreter (inside the fence, mtp_cli is not there); `program` hands `mtp_cli.evals.sandbox` the text."""

from __future__ import annotations

from pathlib import Path


def program(name: str) -> str:
    """The source of `name`.py in this folder, to run with `python -I -S -c`."""
    return (Path(__file__).parent / f"{name}.py").read_text()
