"""Step time and memory per rank of 2 torchrun processes on CPU (gloo), DDP vs FSDP: the quick recipe's
model (NTP) and cpu-posthoc's frozen trunk (quick's NTP trunk, one sequential module trained). Prints the
markdown table of docs/cluster.md: median step time, parameters + gradients + AdamW state held by each
rank after the first step (`state_mb` in run.json), and each rank's peak RSS during training.

    .venv/bin/python scripts/bench_fsdp.py [--steps 12] [--work /tmp/mtp-bench-fsdp]

The frozen trunk is a quick NTP run trained for one step and exported (its weights do not matter for
time or memory). Each process runs one thread; everything else on the machine adds to the step times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
MTP = [sys.executable, "-m", "mtp_cli"]
TORCHRUN = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node", "2",
            "-m", "mtp_cli"]


def run(cmd: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{result.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--work", type=Path, default=Path("/tmp/mtp-bench-fsdp"))
    args = ap.parse_args()
    work = args.work.resolve()
    source = work / "trunk"
    if not (source / "export" / "config.json").is_file():
        run(MTP + ["train", "--objective", "ntp", "--steps", "1", "--device", "cpu", "--threads", "1",
                   "--force", "--out", str(source)])
        run(MTP + ["export", str(source), "--force"])
    cases = {"quick, NTP": ["--recipe", "quick", "--objective", "ntp"],
             "cpu-posthoc, frozen trunk + seq D=1": ["--recipe", "cpu-posthoc", "--init-from",
                                                     str(source / "export")]}
    rows = []
    for name, flags in cases.items():
        for mode in ("ddp", "fsdp"):
            out = work / f"{name.split(',')[0]}-{mode}"
            run(TORCHRUN + ["train", *flags, f"--{mode}", "--steps", str(args.steps), "--device", "cpu",
                            "--force", "--out", str(out)])
            info = json.loads((out / "run.json").read_text())
            thr = info["throughput"]
            rows.append([name, mode.upper(), f"{info['params']['total'] / 1e6:.2f}M",
                         f"{thr['step_time_s_median']:.2f}",
                         " / ".join(f"{mb:.1f}" for mb in thr["state_mb_per_rank"]),
                         " / ".join(f"{mb:.0f}" for mb in thr["peak_memory_mb_per_rank"])])
    print("| model | parallel | parameters | step time (s, median) | state per rank (MB) | peak RSS per rank (MB) |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
