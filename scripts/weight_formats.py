"""What one decode step's weight products cost in each weight format on this CPU: fp32, bf16 and int8
weight-only (torchao's `Int8WeightOnlyConfig`, bf16 activations), eager and under inductor with the
settings our decoder compiles with (frozen weights, max-autotune over its C++ GEMM templates and MKL).

The step is a chain with SmolLM2-135M's shapes (30 layers of q, k, v, o, gate, up, down and the tied
unembedding), one row, so each product waits for the one before it as in decoding; attention and norms
are left out, so the time is the matmuls' alone. It answers whether a weight format is worth wiring into
the decoder: a format pays only where its step approaches its smaller weight-streaming floor.

    .venv/bin/python scripts/weight_formats.py [--threads 2] [--repeats 200] [--json out.json]
    (int8 needs torchao: pip install torchao, or PYTHONPATH=<a folder holding it>)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch._dynamo
from torch import nn

D, KV, FFN, LAYERS, VOCAB = 576, 192, 1536, 30, 49152  # SmolLM2-135M


class Step(nn.Module):
    """The decode step's products, chained: each layer's input is the last one's output."""

    def __init__(self):
        super().__init__()
        shapes = {"q": (D, D), "k": (KV, D), "v": (KV, D), "o": (D, D), "gate": (FFN, D), "up": (FFN, D),
                  "down": (D, FFN)}
        self.layers = nn.ModuleList(nn.ModuleDict({n: nn.Linear(i, o, bias=False) for n, (o, i) in shapes.items()})
                                    for _ in range(LAYERS))
        self.unembed = nn.Linear(D, VOCAB, bias=False)
        for p in self.parameters():
            nn.init.normal_(p, std=0.02)

    def forward(self, h):
        for layer in self.layers:
            q, k, v = layer["q"](h), layer["k"](h), layer["v"](h)
            h = h + layer["o"](q + 1e-3 * (k.sum(-1, keepdim=True) + v.sum(-1, keepdim=True)))
            h = h + layer["down"](torch.nn.functional.silu(layer["gate"](h)) * layer["up"](h))
        return self.unembed(h)


def weight_bytes(fmt: str) -> int:
    params = LAYERS * (2 * D * D + 2 * KV * D + 3 * FFN * D) + VOCAB * D
    return params * {"fp32": 4, "bf16": 2, "int8": 1}[fmt]


def build(fmt: str) -> nn.Module:
    model = Step().eval()
    if fmt == "bf16":
        model = model.to(torch.bfloat16)
    elif fmt == "int8":
        from torchao.quantization import Int8WeightOnlyConfig, quantize_  # optional: only for this format

        model = model.to(torch.bfloat16)
        quantize_(model, Int8WeightOnlyConfig())
    return model


def timed(fn, x, repeats: int) -> tuple[float, float]:
    """(median seconds of a call, seconds the first call took: compiling where compiled)."""
    t0 = time.perf_counter()
    fn(x)
    first = time.perf_counter() - t0
    for _ in range(10):
        fn(x)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), first


def compiled(model: nn.Module):
    import torch._inductor.config as inductor  # compiling only

    inductor.freezing = True
    opts = {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN", "cpp_wrapper": True,
            "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}
    return torch.compile(model, dynamic=False, options=opts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--formats", default="fp32,bf16,int8")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    with torch.inference_mode():
        for fmt in args.formats.split(","):
            for mode in ("eager", "compiled"):
                torch._dynamo.reset()
                model = build(fmt)
                x = torch.randn(1, D, dtype=torch.float32 if fmt == "fp32" else torch.bfloat16)
                fn = compiled(model) if mode == "compiled" else model
                try:
                    step, first = timed(fn, x, args.repeats)
                except Exception as e:  # noqa: BLE001 - a format inductor cannot lower is a finding, not a crash
                    rows.append({"format": fmt, "mode": mode, "error": f"{type(e).__name__}: {e}"[:300]})
                    print(f"{fmt:5} {mode:8} failed: {rows[-1]['error']}", flush=True)
                    continue
                gbs = weight_bytes(fmt) / step / 1e9
                rows.append({"format": fmt, "mode": mode, "step_ms": step * 1e3, "first_call_s": first,
                             "weight_bytes": weight_bytes(fmt), "weights_gb_per_s": gbs})
                print(f"{fmt:5} {mode:8} {step * 1e3:7.2f} ms  {gbs:5.1f} GB/s of weights  "
                      f"(first call {first:.1f} s)", flush=True)
    out = {"threads": args.threads, "repeats": args.repeats, "torch": torch.__version__, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
