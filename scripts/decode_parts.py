"""The decode engine's parts, interleaved in one process: the trunk forward at widths 1..4 (the
plain step and verifying k = 1..3 drafts), eager and compiled, and one drafting step of a sequential
D=1 module and of a parallel head, on a quick-recipe-sized model with random weights (4 layers,
d_model 256, 4 heads, ffn 688, vocab 4096; timing does not depend on the weights) after a 128-token
prompt, and verification fused with the next D=1 draft (`FusedGreedyStep`, one row greedy). Each
round times every part over `--steps` calls, the rounds rotate through all parts, and
medians over rounds are printed with the ratios the decoding targets are stated in. Also the
weight-streaming floor two ways: the bytes of weights a step reads over the memory bandwidth
measured here (one pass over a buffer several times the last-level cache), and the step's matrix
products alone (every weight byte read once, with the same kernels; the weights fit this CPU's
cache, so this one can beat memory), both timed in the same rounds.

With `--run RUN` the same parts run on a trained run's model (e.g. a cpu-smollm2 run: SmolLM2-135M
with its D=1 module or heads; drafting parts need the run's own objective), and the products alone are
also timed over 2..4 rows, so that verifying k drafts can be split into what the matrix kernels cost at
k + 1 rows and what the rest of the forward adds.

    .venv/bin/python scripts/decode_parts.py [--rounds 8] [--steps 30] [--threads 1] [--no-compile] [--run RUN]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


DRAM_BYTES = 256 * 2**20  # eight times this CPU's 32 MB last-level cache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled forward")
    ap.add_argument("--run", type=Path, help="a run folder: time its model instead of a random quick-sized one")
    args = ap.parse_args()

    import torch

    from mtp_cli.config.recipe import ModelConfig, MTPConfig
    from mtp_cli.decode.draft_vocab import DEFAULT_SHARE
    from mtp_cli.decode.engine import Engine
    from mtp_cli.decode.generate import prefill
    from mtp_cli.decode.speculative import ParallelDrafter, SequentialDrafter, fused_input, fused_verify_and_draft
    from mtp_cli.model.mtp import MTPModel

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.run:
        from mtp_cli.model.checkpoint import load_run

        model = load_run(args.run).model.eval()
        cfg = model.cfg
        sequential = model if model.objective == "sequential" else None
        parallel = model if model.objective == "parallel" else None
    else:
        cfg = ModelConfig(vocab_size=4096, n_layers=4, d_model=256, n_heads=4, ffn_hidden=688, context=512,
                          zero_init_residual=False)
        sequential = MTPModel(cfg, MTPConfig(objective="sequential", depth=1)).eval()
        parallel = MTPModel(cfg, MTPConfig(objective="parallel", heads=2, compute_matched=False)).eval()
    model = sequential or parallel
    P = args.prompt_tokens
    prompt = torch.randint(0, cfg.vocab_size, (P,)).tolist()
    parts = {}
    with torch.no_grad():
        for compiled in (False,) if args.no_compile else (False, True):
            engine = Engine(model.trunk, model, compile=compiled)
            cache, *_ = prefill(engine, [prompt], cfg.context)
            start = cache.lengths.clone()
            for width in (1, 2, 3, 4):
                tokens = torch.full((1, width), 7)

                def forward(engine=engine, cache=cache, start=start, tokens=tokens):
                    engine.step(tokens, cache)
                    cache.rollback(start)
                t0 = time.perf_counter()
                forward()
                if compiled:
                    print(f"compiled width {width}: first call {time.perf_counter() - t0:.1f} s")
                parts[f"{'compiled' if compiled else 'eager'} width {width}"] = forward
        vocab = torch.arange(0, cfg.vocab_size, DEFAULT_SHARE)  # a quarter of the vocabulary, as the default
        for compiled in (False,) if args.no_compile else (False, True):
            tag = "compiled " if compiled else ""
            for name, drafting, cls, dv in (("draft sequential D=1", sequential, SequentialDrafter, None),
                                            ("draft seq D=1, V/4", sequential, SequentialDrafter, vocab),
                                            ("draft parallel head", parallel, ParallelDrafter, None),
                                            ("draft par head, V/4", parallel, ParallelDrafter, vocab)):
                if drafting is None:
                    continue
                engine = Engine(drafting.trunk, drafting, compile=compiled)
                cache, _, hidden, shared = prefill(engine, [prompt], cfg.context)
                drafter = cls(engine, drafting, 1, dv).reserve(1, cfg.context + 8)
                seq = torch.zeros(1, cfg.context + 8, dtype=torch.long)
                seq[0, :P] = torch.tensor(prompt)
                lengths = torch.tensor([P])
                drafter.commit(torch.zeros(1, dtype=torch.long), lengths, hidden, shared)

                def draft(drafter=drafter, seq=seq, lengths=lengths):
                    drafter.exact = lengths - 1  # one committed position to run, as every step at k = 1
                    drafter.propose(seq, lengths, 0.0, 1.0, None)
                draft()
                parts[tag + name] = draft
            if sequential is None:
                continue
            # verification at width 2 fused with the next D=1 draft (V/4), as one-row greedy decoding runs
            engine = Engine(sequential.trunk, sequential, compile=compiled)
            cache, _, hidden, shared = prefill(engine, [prompt], cfg.context)
            drafter = SequentialDrafter(engine, sequential, 1, vocab).reserve(1, cfg.context + 8)
            start, tokens = cache.lengths.clone(), fused_input(torch.full((1, 2), 7))

            def fused(cache=cache, drafter=drafter, start=start, tokens=tokens):
                fused_verify_and_draft(drafter, tokens, cache)
                cache.rollback(start)
            fused()
            parts[tag + "fused verify+draft"] = fused
        floor_engine = Engine(model.trunk)
        matrices = [w for b in floor_engine.blocks for w in (b.w_qkv, b.w_o, b.w_gate_up, b.w_down)]
        matrices.append(floor_engine.unembed)
        for width in (1, 2, 3, 4) if args.run else (1,):
            rows = {n: torch.randn(width, n) for n in {m.shape[0] for m in matrices}}

            def products(rows=rows):  # the step's products alone: every weight byte read once, same kernels
                for m in matrices:
                    torch.mm(rows[m.shape[0]], m)
            parts["floor: products only" + (f", {width} rows" if width > 1 else "")] = products
        sweep = torch.ones(DRAM_BYTES // 4)

        def memory():  # one read of a buffer too big for any cache: the memory bandwidth
            sweep.sum()
        parts["memory: 256 MB read"] = memory
        times = {name: [] for name in parts}
        names = list(parts)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    parts[name]()
                times[name].append((time.perf_counter() - t0) / args.steps)
    med = {name: statistics.median(t) for name, t in times.items()}
    for name, t in med.items():
        print(f"{name:22s} {t * 1e3:7.3f} ms")
    for tag in ("eager",) if args.no_compile else ("eager", "compiled"):
        step = med[f"{tag} width 1"]
        print(f"{tag}: t_verify(k+1) / t_step " + "  ".join(f"k={w - 1}: {med[f'{tag} width {w}'] / step:.2f}"
                                                           for w in (2, 3, 4)))
    step = med["eager width 1"]
    for tag in ("eager",) if args.no_compile else ("eager", "compiled"):
        prefix = "" if tag == "eager" else "compiled "
        print(f"t_draft / t_step ({tag}): " + ", ".join(
            f"{name[len(prefix) + 6:]} {med[name] / med[f'{tag} width 1']:.2f}" for name in med
            if name.startswith(prefix + "draft")))
    for tag in ("eager",) if args.no_compile else ("eager", "compiled"):
        prefix = "" if tag == "eager" else "compiled "
        fused, verify, one = (med[f"{prefix}fused verify+draft"], med[f"{tag} width 2"], med[f"{tag} width 1"])
        print(f"fused verify+draft k=1 ({tag}): {fused / one:.2f} x t_step, of which the draft "
              f"{(fused - verify) / one:.2f} (break-even MAL {fused / one:.2f})")
    if not args.no_compile:
        print(f"compiled / eager step: {med['compiled width 1'] / step:.2f}")
    step_bytes = sum(m.numel() * m.element_size() for m in matrices)
    floor_s = med["floor: products only"]
    bandwidth = DRAM_BYTES / med["memory: 256 MB read"]
    memory_floor = step_bytes / bandwidth
    print(f"weights read per step: {step_bytes / 1e6:.1f} MB; memory bandwidth {bandwidth / 1e9:.1f} GB/s: "
          f"floor {memory_floor * 1e3:.3f} ms; the products alone take {floor_s * 1e3:.3f} ms "
          f"({step_bytes / floor_s / 1e9:.0f} GB/s, from cache)")
    tags = ("eager",) if args.no_compile else ("eager", "compiled")
    print("step / memory floor: " + ", ".join(f"{tag} {med[f'{tag} width 1'] / memory_floor:.2f}" for tag in tags))
    print("step / products alone: " + ", ".join(f"{tag} {med[f'{tag} width 1'] / floor_s:.2f}" for tag in tags))
    if args.run:
        print("products alone at k + 1 rows / at 1 row: " + "  ".join(
            f"k={w - 1}: {med[f'floor: products only, {w} rows'] / floor_s:.2f}" for w in (2, 3, 4)))
        print("forward minus its products (eager), ms: " + "  ".join(
            f"width {w}: {(med[f'eager width {w}'] - med['floor: products only' + (f', {w} rows' if w > 1 else '')]) * 1e3:.2f}"
            for w in (1, 2, 3, 4)))


if __name__ == "__main__":
    main()
