"""Every timed call's raw figures, kept beside specbench.json, so that a reader can recompute what it says.

`specbench_raw.jsonl` (beside `specbench.json`; `<name>_raw.jsonl` beside `<name>.json`) holds one line per
condition × batch size × method × timed repeat: each batch's wall seconds, time to first token (the
prefill and the first token; decoding took seconds − ttft_s) and tokens, and every generated token id.
`recheck` recomputes each method's tokens/s (median over repeats), both speed-ups with their intervals
(speedup.py) and, at temperature 0, the lossless verdict token for token over every repeat, and lists every
stored figure that the raw data does not give back.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from mtp_cli.base.errors import UserError
from mtp_cli.base.files import atomic_write_text, read_json_lines, read_json_object
from mtp_cli.base.stats import median_ci
from mtp_cli.bench.speedup import paired_speedups

SUFFIX = "_raw.jsonl"


def raw_path(json_path: Path) -> Path:
    return json_path.with_name(json_path.stem + SUFFIX)


def raw_rows(condition: str, bs: int, tallies: dict) -> list[dict]:
    """One row per method and timed repeat of one condition at one batch size (`measure`'s tallies)."""
    rows = []
    for method, runs in tallies.items():
        for repeat, t in enumerate(runs):
            tokens = [sum(len(o) for o in t.outputs[i:i + bs]) for i in range(0, len(t.outputs), bs)]
            rows.append({"condition": condition, "batch_size": bs, "method": method, "repeat": repeat,
                         "seconds": t.walls, "ttft_s": t.ttfts, "tokens": tokens, "outputs": t.outputs})
    return rows


def write_raw(json_path: Path, rows: list[dict]) -> Path:
    path = raw_path(json_path)
    atomic_write_text(path, "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
    return path


def recheck(json_path: Path) -> list[str]:
    """What specbench.json says that its raw rows do not give back (empty: every figure rechecked)."""
    json_path = Path(json_path)
    path = raw_path(json_path)
    if not path.is_file():
        raise UserError(f"{json_path}: no raw data beside it ({path.name}); it was written before specbench kept it")
    doc = read_json_object(json_path)
    runs: dict[tuple, list[dict]] = {}
    for row in read_json_lines(path, keys=("condition", "method")):
        runs.setdefault((row["condition"], row["batch_size"], row["method"]), []).append(row)
    problems = []
    for cond in doc["conditions"]:
        baseline = "greedy" if cond["temperature"] == 0 else "sample"
        for bs, methods in cond["results"].items():
            base = sorted(runs.get((cond["name"], int(bs), baseline), []), key=lambda r: r["repeat"])
            for method, entry in methods.items():
                rows = sorted(runs.get((cond["name"], int(bs), method), []), key=lambda r: r["repeat"])
                where = f"{cond['name']} bs {bs} {method}"
                if not rows or len(rows) != len(base):
                    problems.append(f"{where}: {len(rows)} raw repeats, {len(base)} of the baseline")
                    continue
                speed = [sum(r["tokens"]) / sum(r["seconds"]) for r in rows]
                figures = {"tokens_per_s": median_ci(speed)[0]} | paired_speedups(rows, base)
                for key, got in figures.items():
                    if not _same(got, entry.get(key)):
                        problems.append(f"{where}: {key} {entry.get(key)!r} stored, {got!r} from the raw data")
                if cond["temperature"] == 0:
                    same = all(r["outputs"] == base[0]["outputs"] for r in rows)
                    if same != entry["lossless"]:
                        problems.append(f"{where}: lossless {entry['lossless']} stored, the outputs say {same}")
    return problems


def _same(a, b) -> bool:
    if isinstance(a, list) or isinstance(b, list):
        return isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9) or (math.isnan(a) and math.isnan(b))
