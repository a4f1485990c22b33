"""What the frozen trunk's teacher pass costs in fp32 and in bf16, and how far bf16's distribution is from fp32's.

Distilling a drafter from natural text runs the frozen trunk once over every training batch (`MTPModel.frozen_pass`,
stored by train/trunk_cache). `train.trunk_dtype = "bfloat16"` runs that pass under autocast: worth it if it is
faster and its teacher is as good as fp32's to the precision the distillation loss needs (the student's KL to
the teacher ends near 1 nat). This times the pass on a recipe's own training batches at both dtypes, interleaved
(`--repeats` rounds, medians), and measures, over the draft vocabulary, KL(fp32 teacher ‖ bf16 teacher) per token
and how often their top tokens agree.

    .venv/bin/python scripts/teacher_pass.py [--recipe cpu-smollm2-drafters] [--batches 3] [--repeats 3]
        [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mtp_cli.config.recipe import load_recipe  # noqa: E402
from mtp_cli.corpus import token_data  # noqa: E402
from mtp_cli.data import shards  # noqa: E402
from mtp_cli.decode.draft_vocab import count_tokens, top_tokens  # noqa: E402
from mtp_cli.model import MTPModel, pretrained  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="cpu-smollm2-drafters")
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    recipe = load_recipe(args.recipe)
    source = pretrained.resolve_recipe(recipe, given={"context"})  # the recipe sets the context only
    data = token_data.prepare_for(recipe)
    model = MTPModel(recipe.model, recipe.mtp)
    pretrained.init_model(model, source)
    model.freeze_trunk()
    model.eval()
    t = recipe.train
    batches = [shards.train_batch(data.train, b, t.order_seed, t.batch_size, recipe.model.context)
               for b in range(args.batches)]
    vocab = top_tokens(count_tokens(data.train, recipe.model.vocab_size), recipe.mtp.draft_vocab or recipe.model.vocab_size)
    weight = model.trunk.unembed_weight[vocab]
    tokens = t.batch_size * recipe.model.context
    times: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    for _ in range(args.repeats):
        for name, dtype in (("float32", None), ("bfloat16", torch.bfloat16)):
            t0 = time.perf_counter()
            for x, y in batches:
                model.frozen_pass(x, y, dtype=dtype)
            times[name].append((time.perf_counter() - t0) / len(batches))
    kls, agree = [], []
    with torch.no_grad():
        for x, y in batches:
            teachers = {}
            for name, dtype in (("float32", None), ("bfloat16", torch.bfloat16)):
                frozen = model.frozen_pass(x, y, dtype=dtype)
                hidden = model.trunk.run_layers(frozen.shared, model.trunk.n_layers - 1, model.trunk.n_layers,
                                                model.trunk.rope(x.shape[1], x.device, torch.float32))
                teachers[name] = F.log_softmax(model.trunk.norm(hidden) @ weight.t(), -1)
            p, q = teachers["float32"], teachers["bfloat16"]
            kls.append((p.exp() * (p - q)).sum(-1).flatten())
            agree.append((p.argmax(-1) == q.argmax(-1)).float().flatten())
    kl, same = torch.cat(kls), torch.cat(agree)
    out = {"recipe": recipe.name, "batches": args.batches, "tokens_per_batch": tokens, "repeats": args.repeats,
           "threads": args.threads, "draft_vocab": len(vocab),
           **{f"{n}_tokens_per_s": tokens / statistics.median(v) for n, v in times.items()},
           "bf16_over_fp32": statistics.median(times["float32"]) / statistics.median(times["bfloat16"]),
           "kl_fp32_bf16_mean": float(kl.mean()), "kl_fp32_bf16_p99": float(kl.quantile(0.99)),
           "top1_agreement": float(same.mean()), "seconds": times}
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
