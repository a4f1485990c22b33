"""Greedy decoding in batches: our decoder eager, ours compiled, and Hugging Face `generate`, in one process.

`mtp specbench --batch-sizes 1,4 --compile` times batches too, but beside MTP at every batch size (whose
batched verification is one more graph to compile); this times plain greedy alone: the same prompts
(the first --limit HumanEval prompts) cut into batches of --batch-size, every method once as a warm-up
(the compiled one builds its graph there: about 1.5 min on SmolLM2-135M with inductor's disk cache warm,
several without), then --repeats interleaved timed passes; medians of tokens/s over repeats, and whether
the compiled output equals eager token for token.

    .venv/bin/python scripts/bench_batches.py RUN [--batch-size 4] [--limit 16] [--max-new-tokens 32]
        [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mtp_cli.bench.measure import measure
from mtp_cli.bench.run import _prompt_ids
from mtp_cli.bench.runners import _hf_runner, hf_model, ours_plain
from mtp_cli.decode.engine import engine_for
from mtp_cli.model.checkpoint import load_run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    run = load_run(args.run, "cpu")
    ids, _ = _prompt_ids(run, "humaneval", args.limit, args.max_new_tokens, None)
    eos, n = run.tokenizer.eos_token_id, args.max_new_tokens
    runners = {"eager": ours_plain(run.model, n, eos, False), "compiled": ours_plain(run.model, n, eos, True),
               "hf_generate": _hf_runner(hf_model(run), run.tokenizer, n, {})}
    t0 = time.time()
    tallies = measure(runners, ids, args.batch_size, args.repeats, "cpu",
                      lambda m: print(f"{time.time() - t0:7.1f} s  {m}", flush=True))
    tps = {m: statistics.median(t.tokens_per_s for t in ts) for m, ts in tallies.items()}
    print(f"batch size {args.batch_size}, {len(ids)} prompts, {n} new tokens, median of {args.repeats}: tokens/s "
          + ", ".join(f"{m} {v:.1f}" for m, v in tps.items()))
    print(f"compiled ÷ eager {tps['compiled'] / tps['eager']:.2f}×, compiled ÷ HF generate "
          f"{tps['compiled'] / tps['hf_generate']:.2f}×, eager ÷ HF generate {tps['eager'] / tps['hf_generate']:.2f}×")
    print(f"compiled output equals eager: {tallies['compiled'][0].outputs == tallies['eager'][0].outputs}; "
          f"compile {engine_for(run.model.trunk, compile=True).compile_s:.0f} s")


if __name__ == "__main__":
    main()
