"""What a candidate tree's fused verify-and-draft call costs beside a plain step: for each tree width w,
`bench.forward_cost.forward_costs` times, side by side on one prompt's cache, the plain step, the trunk's
forward at widths 2..5 and the fused call of a D=1 drafter of width w (`speculative.FusedGreedyStep._tree`),
compiled as specbench compiles them. Each width compiles its own fused graph (minutes on a CPU).

    .venv/bin/python scripts/tree_costs.py RUN [--widths 2,3,4] [--source humaneval] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from mtp_cli.bench.forward_cost import forward_costs  # noqa: E402
from mtp_cli.data.prompts import load_prompts  # noqa: E402
from mtp_cli.decode.draft_vocab import draft_vocabulary  # noqa: E402
from mtp_cli.decode.engine import engine_for  # noqa: E402
from mtp_cli.decode.speculative import make_drafter  # noqa: E402
from mtp_cli.model.checkpoint import load_run  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--widths", default="2,3,4")
    ap.add_argument("--source", default="humaneval")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    run = load_run(args.run)
    model = run.model
    vocab, _ = draft_vocabulary(run, None)
    engine = engine_for(model.trunk, model, True)
    prompts = [run.tokenizer(load_prompts(args.source, 1)[0]).input_ids]
    for w in (int(x) for x in args.widths.split(",")):
        drafter = make_drafter(model, 1, compile=True, draft_vocab=vocab, width=w)
        fused = lambda capacity, d=drafter, w=w: d.reserve(1, capacity + 2 * w + 2)  # noqa: E731
        widths = list(range(1, max(5, w + 1) + 1))  # the cache is sized for the widest forward
        ms = {k: v * 1e3 for k, v in forward_costs(engine, prompts, widths, fused=fused).items()}
        step = ms[1]
        print(f"width {w}: step {step:.2f} ms; forward at 2..5 tokens "
              + " / ".join(f"{ms[t] / step:.2f}" for t in (2, 3, 4, 5))
              + f"× a step; the tree's fused call {ms['fused']:.2f} ms = {ms['fused'] / step:.2f}× a step", flush=True)


if __name__ == "__main__":
    main()
