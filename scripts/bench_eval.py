"""How long `mtp eval` takes on a trained run: full HumanEval (164 problems, up to 256 new tokens,
generation + fenced execution) and GSM8K --limit 200 (5-shot, lm-eval), end to end through
`run_eval`, repeated; prints medians. Optionally times lm-eval's HFLM on the export against our
decoder on the same GSM8K questions (the reason `mtp eval` uses its own lm-eval model class).

    .venv/bin/python scripts/bench_eval.py [--run runs/quick-ntp] [--repeats 3] [--threads 2]
                                           [--gsm8k-limit 200] [--hflm-limit 0] [--json PATH]
                                           [--tasks humaneval,gsm8k] [--compile]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def timed_eval(run: Path, task: str, limit: int | None, gsm8k_data: Path, out: Path,
               compile: bool | None = None) -> tuple[float, dict]:
    from mtp_cli.config.recipe import EvalConfig, Runtime
    from mtp_cli.evals.runner import run_eval

    t0 = time.perf_counter()
    cfg = EvalConfig(tasks=[task], limits={task: limit or 0}, gsm8k_data=str(gsm8k_data or "hub"),
                     gsm8k_fewshot=None)
    doc = run_eval(run, cfg, Runtime(compile=compile), json_path=out / f"{task}.json", show_progress=False)
    return time.perf_counter() - t0, doc["results"][task]


def new_tokens(path: str, tokenizer, field: str) -> int:
    rows = [json.loads(line) for line in open(path)]
    return sum(len(tokenizer(r[field] or "").input_ids) for r in rows)


def hflm_vs_ours(run: Path, limit: int, gsm8k_data: Path) -> dict:
    """GSM8K on the same questions: HFLM on the export vs our MTPLM (both lm-eval simple_evaluate)."""
    from lm_eval.models.huggingface import HFLM

    from mtp_cli.evals import gsm8k
    from mtp_cli.evals.lm import MTPLM
    from mtp_cli.model.hf import ensure_export, load_export

    export = ensure_export(run)
    trunk, tok = load_export(export)
    out = {}
    for name, make in (("ours", lambda: MTPLM(trunk=trunk, tokenizer=tok)),
                       ("hflm", lambda: HFLM(pretrained=str(export), max_length=4096, batch_size=16, device="cpu",
                                             dtype="float32"))):
        t0 = time.perf_counter()
        result = gsm8k.run(make(), limit, gsm8k_data)
        out[name] = {"seconds": time.perf_counter() - t0, "responses": [s["response"] for s in result["samples"]]}
    out["identical_responses"] = out["ours"]["responses"] == out["hflm"]["responses"]
    for name in ("ours", "hflm"):
        out[name].pop("responses")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, default=REPO / "runs" / "quick-ntp")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--gsm8k-limit", type=int, default=200)
    ap.add_argument("--gsm8k-data", type=Path, default=REPO / "data" / "gsm8k")
    ap.add_argument("--hflm-limit", type=int, default=0, help="also time HFLM vs ours on this many GSM8K questions")
    ap.add_argument("--tasks", default="humaneval,gsm8k")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="the decoder's torch.compile switch (default: the device's)")
    args = ap.parse_args()

    import torch
    from rich.console import Console
    from rich.table import Table

    from mtp_cli.base import env
    from mtp_cli.model.checkpoint import load_run
    from mtp_cli.model.hf import ensure_export

    if args.threads:
        torch.set_num_threads(args.threads)
    tok = load_run(args.run).tokenizer
    ensure_export(args.run)  # not timed: `mtp eval` reuses an up-to-date export
    limits = {"humaneval": None, "gsm8k": args.gsm8k_limit}
    times: dict[str, list[float]] = {}
    info: dict[str, dict] = {}
    console = Console(stderr=True)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):  # tasks interleaved so machine noise hits both alike
            for task in args.tasks.split(","):
                seconds, result = timed_eval(args.run, task, limits[task], args.gsm8k_data, Path(tmp), args.compile)
                times.setdefault(task, []).append(seconds)
                field = "completion" if task == "humaneval" else "response"
                info[task] = {"n": result["n"], "new_tokens": new_tokens(result["samples_path"], tok, field),
                              "score": result.get("pass@1", result.get("exact_match,flexible-extract"))}
                console.print(f"repeat {r + 1}: {task} {seconds:.1f} s", highlight=False)
    report = {"run": str(args.run), "threads": torch.get_num_threads(), "hardware": env.hardware(),
              "tasks": {t: {"seconds": v, "median_s": statistics.median(v), **info[t]} for t, v in times.items()}}
    if args.hflm_limit:
        report["gsm8k_hflm_vs_ours"] = hflm_vs_ours(args.run, args.hflm_limit, args.gsm8k_data) | {
            "limit": args.hflm_limit}

    table = Table(title=f"mtp eval wall time, {args.run} ({report['threads']} torch threads)")
    for col in ("task", "items", "completion tokens", "median s", "all runs (s)", "tokens/s"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for task, t in report["tasks"].items():
        table.add_row(task + (f" --limit {t['n']}" if task == "gsm8k" else " (full)"), str(t["n"]),
                      f"{t['new_tokens']:,}", f"{t['median_s']:.1f}", ", ".join(f"{s:.1f}" for s in t["seconds"]),
                      f"{t['new_tokens'] / t['median_s']:.0f}")
    Console().print(table)
    if args.hflm_limit:
        c = report["gsm8k_hflm_vs_ours"]
        Console().print(f"GSM8K --limit {args.hflm_limit}: ours {c['ours']['seconds']:.1f} s, HFLM on the export "
                        f"{c['hflm']['seconds']:.1f} s, identical responses: {c['identical_responses']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
