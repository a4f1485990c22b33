"""How far greedy text decoded at one weight dtype follows the text decoded at another: the quality cost of
bf16 weights measured on the tokens a benchmark produced, from two specbench runs' raw data (same run,
prompts and token budget; `mtp specbench ... --dtype fp32 --json A.json` and `--dtype bf16 --json B.json`).

Per condition: the share of prompts whose greedy text is identical, the share of generated tokens before the
first disagreement (tokens after it continue a different text, so they are not compared), and the median
position of that disagreement.

    .venv/bin/python scripts/dtype_agreement.py [A_raw.jsonl B_raw.jsonl] [--method greedy] [--windows A B]

With `--windows A_windows.jsonl B_windows.jsonl` (two `mtp eval --tasks heldout` runs' per-window files, one
per dtype, same run and limit) it also prints the held-out loss and bits per byte of each and their paired
difference, with a t interval over the windows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mtp_cli.base.files import read_json_lines  # noqa: E402
from mtp_cli.base.stats import t_interval  # noqa: E402

LN2 = 0.6931471805599453


def first_outputs(path: Path, method: str) -> dict[str, list[list[int]]]:
    """{condition: outputs of `method`'s first timed repeat at batch size 1}."""
    return {row["condition"]: row["outputs"] for row in read_json_lines(path, keys=("condition", "method"))
            if row["method"] == method and row["repeat"] == 0 and row["batch_size"] == 1}


def agreement(reference: list[list[int]], other: list[list[int]]) -> dict:
    firsts = [next((j for j, (a, b) in enumerate(zip(r, o)) if a != b), min(len(r), len(o)))
              for r, o in zip(reference, other, strict=True)]
    identical = sum(r == o for r, o in zip(reference, other))
    return {"prompts": len(reference), "identical_prompts": identical,
            "tokens_before_first_disagreement": sum(firsts) / sum(len(r) for r in reference),
            "median_first_disagreement": statistics.median(firsts)}


def _window_rows(path: Path) -> list[dict]:
    rows = read_json_lines(path)  # numbers, not strings: read_json_lines' `keys` checks strings only
    if not rows or any(not all(isinstance(r.get(k), (int, float)) for k in ("window", "loss", "tokens", "bytes"))
                       for r in rows):
        raise SystemExit(f"{path}: not an eval_heldout_windows.jsonl (each line: window, loss, tokens, bytes)")
    return rows


def heldout_difference(reference: Path, other: Path) -> dict:
    """Token-weighted held-out loss (nats/token) and bits per byte of each file, and the mean over windows
    of the paired per-window difference (other - reference) with its 95% t interval."""
    a, b = ({r["window"]: r for r in _window_rows(path)} for path in (reference, other))
    if a.keys() != b.keys():
        raise SystemExit(f"the two files hold different windows ({len(a)} and {len(b)}): same run and --limit?")

    def totals(rows):
        tokens = sum(r["tokens"] for r in rows.values())
        nats = sum(r["loss"] * r["tokens"] for r in rows.values())
        return nats / tokens, nats / LN2 / sum(r["bytes"] for r in rows.values())

    diffs = [b[w]["loss"] - a[w]["loss"] for w in sorted(a)]
    mean, lo, hi = t_interval(diffs)
    return {"windows": len(a), "reference": totals(a), "other": totals(b), "loss_diff": mean, "loss_diff_ci95": (lo, hi)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference", type=Path, nargs="?", help="the reference dtype's specbench_raw.jsonl (e.g. fp32)")
    parser.add_argument("other", type=Path, nargs="?", help="the other dtype's specbench_raw.jsonl (e.g. bf16)")
    parser.add_argument("--method", default="greedy")
    parser.add_argument("--windows", type=Path, nargs=2, metavar=("REFERENCE", "OTHER"),
                        help="two eval_heldout_windows.jsonl files, the reference dtype's first")
    args = parser.parse_args()
    if args.windows:
        h = heldout_difference(*args.windows)
        (la, ba), (lb, bb) = h["reference"], h["other"]
        lo, hi = h["loss_diff_ci95"]
        print(f"held-out, {h['windows']} windows: loss {la:.4f} -> {lb:.4f} nats/token, {ba:.4f} -> {bb:.4f} bits/byte; "
              f"paired difference {h['loss_diff']:+.4f} [{lo:+.4f}, {hi:+.4f}] nats/token (95% t over windows)")
    if not (args.reference and args.other):
        return
    ref, other = first_outputs(args.reference, args.method), first_outputs(args.other, args.method)
    for condition in ref.keys() & other.keys():
        a = agreement(ref[condition], other[condition])
        print(f"{condition}: {a['identical_prompts']}/{a['prompts']} prompts identical, "
              f"{a['tokens_before_first_disagreement']:.1%} of tokens before the first disagreement, "
              f"median first disagreement at token {a['median_first_disagreement']}")


if __name__ == "__main__":
    main()
