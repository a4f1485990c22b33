"""Rewrite specbench.json files of schema 2 as schema 3: every interval key `<key>_ci` becomes
`<key>_ci95`, the one spelling eval.json and specbench.json share (mtp_cli/base/result_docs.py). Nothing
else changes: no number is recomputed. The readers in mtp_cli know schema 3 only; this script is the
one place that still knows schema 2.

    python scripts/migrate_specbench_v3.py results/quick/runs/*/specbench.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def renamed(value):
    if isinstance(value, dict):
        return {(f"{k}95" if k.endswith("_ci") else k): renamed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [renamed(v) for v in value]
    return value


def main(paths: list[str]) -> int:
    from mtp_cli.base.result_docs import SPEC_SCHEMA, SpecbenchDoc, read_spec, write_spec

    for path in map(Path, paths):
        doc = json.loads(path.read_text())
        if doc.get("schema") == SPEC_SCHEMA:
            print(f"{path}: already schema {SPEC_SCHEMA}")
            continue
        if doc.get("schema") != 2:
            print(f"{path}: schema {doc.get('schema')}, not 2; left as it is", file=sys.stderr)
            return 2
        write_spec(path, SpecbenchDoc(**(renamed(doc) | {"schema": SPEC_SCHEMA})))
        read_spec(path)  # it now reads as schema 3
        print(f"{path}: schema 2 -> {SPEC_SCHEMA}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
