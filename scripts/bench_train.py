"""Training throughput and memory, side by side in one run: our NTP trunk, sequential D=1,
parallel n=4 (memory-efficient), and Hugging Face `LlamaForCausalLM` on the identical config, each
in eager mode; plus our NTP trunk and the HF model under `torch.compile` (steady state, compile
time excluded; ours compiles its blocks as `train.compile = true` does, HF the whole model).

Each configuration runs in its own subprocess (so peak RSS is its own), the configurations are
interleaved over several rounds (so machine noise hits all alike), and medians are reported.

    .venv/bin/python scripts/bench_train.py [--recipe quick] [--steps 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time

CONFIGS = ["ntp", "sequential", "parallel", "hf-llama", "ntp-compiled", "hf-llama-compiled"]


def worker(name: str, recipe_name: str, steps: int) -> dict:
    import torch

    from mtp_cli.base.env import peak_memory_mb, rss_mb
    from mtp_cli.config.recipe import MTPConfig, load_recipe
    from mtp_cli.model import MTPModel, parallel_backward
    from mtp_cli.model.flops import flops_per_token
    from mtp_cli.model.trunk import compile_blocks

    torch.manual_seed(0)
    recipe = load_recipe(recipe_name)
    cfg, t = recipe.model, recipe.train
    compiled = name.endswith("-compiled")
    name = name.removesuffix("-compiled")
    mtp_cfg = {"ntp": MTPConfig("ntp"), "sequential": MTPConfig("sequential", depth=1, lambda_=0.3),
               "parallel": MTPConfig("parallel", heads=4), "hf-llama": MTPConfig("ntp")}[name]
    ours = MTPModel(cfg, mtp_cfg)
    fpt = flops_per_token(ours, cfg.context)
    if name == "hf-llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        hf_cfg = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn_hidden,
                             num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                             num_key_value_heads=cfg.kv_heads, max_position_embeddings=cfg.context,
                             rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings,
                             attn_implementation="sdpa")
        model = LlamaForCausalLM(hf_cfg)
        forward = torch.compile(model) if compiled else model

        def step(x, y):
            logits = forward(input_ids=x).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            loss.backward()
    else:
        model = ours
        if compiled:
            compile_blocks(model)

        def step(x, y):
            if name == "parallel":
                parallel_backward(model, x, y, mtp_cfg.lambda_at())
            else:
                model(x, y).loss.backward()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, cfg.vocab_size, (t.batch_size, cfg.context + 1), generator=g) for _ in range(2)]
    warmup = 3 if compiled else 2

    def timed_step(chunk: torch.Tensor) -> float:
        t0 = time.perf_counter()
        step(chunk[:, :-1], chunk[:, 1:])
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    rss_before = rss_mb()
    times = [timed_step(batches[i % 2]) for i in range(warmup + steps)]
    # Training memory: peak RSS above the size after building the model. Compiled rows would count the
    # compiler's own memory too, so they report none.
    train_mem = float("nan") if compiled else peak_memory_mb(torch.device("cpu")) - rss_before
    med = statistics.median(times[warmup:])
    return {"config": name + ("-compiled" if compiled else ""), "params": params, "step_time_s": med,
            "tokens_per_s": t.batch_size * cfg.context / med,
            "flops_per_token": fpt, "train_mem_mb": train_mem,
            "threads": torch.get_num_threads()}


def _mb(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.0f}"


def _ratio(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.2f}×"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="quick")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="")
    ap.add_argument("--worker", default="")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.recipe, args.steps)))
        return

    import torch

    from mtp_cli.base.env import cpu_model, measure_matmul_peak

    peak = measure_matmul_peak(torch.device("cpu"), torch.float32)
    runs: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    for r in range(args.rounds):
        for name in CONFIGS:
            out = subprocess.run([sys.executable, __file__, "--worker", name, "--recipe", args.recipe,
                                  "--steps", str(args.steps)], capture_output=True, text=True, check=True)
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}/{args.rounds} {name}: {runs[name][-1]['tokens_per_s']:.0f} tok/s", file=sys.stderr)

    med = lambda name, key: statistics.median(x[key] for x in runs[name])  # noqa: E731
    base_t, base_mem, base_f = med("ntp", "step_time_s"), med("ntp", "train_mem_mb"), runs["ntp"][0]["flops_per_token"]
    rows = []
    for name in CONFIGS:
        st = med(name, "step_time_s")
        f = runs[name][0]["flops_per_token"]
        rows.append({"config": name, "params": runs[name][0]["params"], "tokens_per_s": med(name, "tokens_per_s"),
                     "step_time_s": st, "step_time_vs_ntp": st / base_t,
                     "flops_vs_ntp": f / base_f, "mfu": f * med(name, "tokens_per_s") / peak,
                     "train_mem_mb": med(name, "train_mem_mb"),
                     "train_mem_vs_ntp": med(name, "train_mem_mb") / base_mem})
    result = {"recipe": args.recipe, "cpu": cpu_model(), "threads": runs["ntp"][0]["threads"],
              "matmul_peak_gflops": peak / 1e9, "rounds": args.rounds, "steps": args.steps, "rows": rows,
              "ntp_vs_hf_tokens_per_s": med("ntp", "tokens_per_s") / med("hf-llama", "tokens_per_s"),
              "ntp_compiled_vs_hf_compiled_tokens_per_s":
                  med("ntp-compiled", "tokens_per_s") / med("hf-llama-compiled", "tokens_per_s")}
    print("| config | params | tokens/s | step time vs NTP | FLOPs vs NTP | MFU | train mem (MB) | mem vs NTP |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['params']:,} | {r['tokens_per_s']:,.0f} | {r['step_time_vs_ntp']:.2f}× | "
              f"{r['flops_vs_ntp']:.2f}× | {r['mfu']:.0%} | {_mb(r['train_mem_mb'])} | {_ratio(r['train_mem_vs_ntp'])} |")
    print(f"\nour NTP trunk vs HF LlamaForCausalLM tokens/s: {result['ntp_vs_hf_tokens_per_s']:.2f}× eager, "
          f"{result['ntp_compiled_vs_hf_compiled_tokens_per_s']:.2f}× both compiled; "
          f"fp32 matmul peak {peak / 1e9:.0f} GFLOP/s; {result['cpu']}, {result['threads']} threads")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
