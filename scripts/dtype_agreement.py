"""How far greedy text decoded at one weight dtype follows the text decoded at another: the quality cost of
bf16 weights measured on the tokens a benchmark produced, from two specbench runs' raw data (same run,
prompts and token budget; `mtp specbench ... --dtype fp32 --json A.json` and `--dtype bf16 --json B.json`).

Per condition: the share of prompts whose greedy text is identical, the share of generated tokens before the
first disagreement (tokens after it continue a different text, so they are not compared), and the median
position of that disagreement.

    .venv/bin/python scripts/dtype_agreement.py A_raw.jsonl B_raw.jsonl [--method greedy]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mtp_cli.base.files import read_json_lines  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference", type=Path, help="the reference dtype's specbench_raw.jsonl (e.g. fp32)")
    parser.add_argument("other", type=Path, help="the other dtype's specbench_raw.jsonl (e.g. bf16)")
    parser.add_argument("--method", default="greedy")
    args = parser.parse_args()
    ref, other = first_outputs(args.reference, args.method), first_outputs(args.other, args.method)
    for condition in ref.keys() & other.keys():
        a = agreement(ref[condition], other[condition])
        print(f"{condition}: {a['identical_prompts']}/{a['prompts']} prompts identical, "
              f"{a['tokens_before_first_disagreement']:.1%} of tokens before the first disagreement, "
              f"median first disagreement at token {a['median_first_disagreement']}")


if __name__ == "__main__":
    main()
