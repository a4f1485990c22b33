"""How often the trunk's next greedy token is among a D=1 module's top w candidates, on the trunk's own
greedy text: what a depth-1 candidate tree of width w (`mtp specbench --draft-width w`) can accept per
step at most, before its cost. For each prompt of a source the trunk continues greedily; then, teacher-
forced over prompt + continuation, module 1 at position j (reading the trunk's state there and token
j+1) ranks its candidates for token j+2, and the script counts where the trunk's own token j+2 ranks, over
every position whose j+2 lies in the continuation.

    .venv/bin/python scripts/candidate_agreement.py RUN [--prompts humaneval,gsm8k] [--limit 24]
        [--max-new-tokens 64] [--widths 1,2,3,4,6,8] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from mtp_cli.base import paths  # noqa: E402
from mtp_cli.data.prompts import load_prompts  # noqa: E402
from mtp_cli.decode.generate import generate  # noqa: E402
from mtp_cli.model.checkpoint import load_run  # noqa: E402


def agreement(run, source: str, limit: int, max_new_tokens: int, widths: list[int]) -> tuple[int, dict[int, float]]:
    """(positions counted, {w: share of them whose trunk token is among module 1's top w})."""
    model = run.model
    data = paths.gsm8k_data(None) if source == "gsm8k" else None
    prompts = [run.tokenizer(t).input_ids for t in load_prompts(source, limit, data)]
    outputs = generate(model.trunk, prompts, max_new_tokens)
    ranks = []
    with torch.no_grad():
        for prompt, out in zip(prompts, outputs):
            ids = torch.tensor([prompt + out])
            module = model.all_logits(ids)[1][0]  # row j: module 1's logits for token j+2
            for j in range(len(prompt) - 1, len(prompt) + len(out) - 2):
                ranks.append(int((module[j] > module[j, ids[0, j + 2]]).sum()))  # 0: the trunk's token is the top one
    return len(ranks), {w: sum(r < w for r in ranks) / len(ranks) for w in widths}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--prompts", default="humaneval,gsm8k")
    ap.add_argument("--limit", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--widths", default="1,2,3,4,6,8")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    run = load_run(args.run)
    if run.model.objective != "sequential":
        sys.exit("candidate_agreement.py: the run needs sequential MTP modules")
    widths = [int(w) for w in args.widths.split(",")]
    for source in args.prompts.split(","):
        n, shares = agreement(run, source, args.limit, args.max_new_tokens, widths)
        print(f"{source}: {n} positions; " + ", ".join(f"top-{w} {s:.1%}" for w, s in shares.items()), flush=True)


if __name__ == "__main__":
    main()
