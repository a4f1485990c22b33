"""First-draft acceptance of two drafters on the same greedy text, paired prompt by prompt, across results folders.

REPORT.md pairs each variant with the first of its own recipe; drafters of two recipes (a follow-up recipe against
the one it extends) are compared here instead. At T = 0 both runs decode the same greedy text when their trunk and
prompts are the same, so only the drafter differs: this checks it (every greedy output equal, from each run's
specbench_raw.jsonl) and then resamples the same prompts for both (`results.acceptance.paired_difference`).

    .venv/bin/python scripts/paired_acceptance.py RUN REFERENCE_RUN [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mtp_cli.base.files import read_json_lines, read_json_object  # noqa: E402
from mtp_cli.bench.raw import raw_path  # noqa: E402
from mtp_cli.results.acceptance import paired_difference, position_acceptance  # noqa: E402
from mtp_cli.results.folder import MTP_METHOD  # noqa: E402


def _greedy_outputs(run: Path) -> dict[str, list]:
    """Each condition's plain-greedy outputs (first repeat) from the run's raw specbench data."""
    return {row["condition"]: row["outputs"] for row in read_json_lines(raw_path(run / "specbench.json"))
            if row["method"] == "greedy" and row["repeat"] == 0 and row["batch_size"] == 1}


def _per_prompt(run: Path) -> dict[str, list[dict]]:
    conditions = read_json_object(run / "specbench.json")["conditions"]
    return {c["name"]: c["results"]["1"][MTP_METHOD]["per_prompt"] for c in conditions
            if c.get("temperature") == 0 and (c.get("results") or {}).get("1", {}).get(MTP_METHOD)}


def compare(run: Path, reference: Path) -> list[dict]:
    units, ref_units = _per_prompt(run), _per_prompt(reference)
    texts, ref_texts = _greedy_outputs(run), _greedy_outputs(reference)
    rows = []
    for name in sorted(set(units) & set(ref_units)):
        same_text = texts.get(name) is not None and texts.get(name) == ref_texts.get(name)
        diff, (lo, hi) = paired_difference(units[name], ref_units[name]) if same_text else (None, [None, None])
        rows.append({"condition": name, "prompts": len(units[name]), "same_greedy_text": same_text,
                     "acceptance": position_acceptance(units[name], 1)[0],
                     "reference_acceptance": position_acceptance(ref_units[name], 1)[0],
                     "difference": diff, "difference_ci95": [lo, hi]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("reference", type=Path)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rows = compare(args.run, args.reference)
    for r in rows:
        if r["difference"] is None:
            print(f"{r['condition']}: not comparable (greedy text differs or acceptance not counted)")
            continue
        lo, hi = r["difference_ci95"]
        print(f"{r['condition']}: {r['acceptance']:.1%} vs {r['reference_acceptance']:.1%}, "
              f"{100 * r['difference']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] points over {r['prompts']} prompts")
    if args.json:
        args.json.write_text(json.dumps({"run": str(args.run), "reference": str(args.reference), "rows": rows},
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
