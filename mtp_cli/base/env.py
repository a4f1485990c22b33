"""Facts about where code runs: device choice, hardware description, git commit, matmul peak, peak memory."""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import time
from pathlib import Path

import torch

from mtp_cli.base.errors import UserError

REPO = Path(__file__).resolve().parents[2]  # mtp_cli/base/env.py -> the checkout
PEAK_CACHE = "matmul_peak_v2.json"  # v2: best of several sizes and rounds (v1's lone trial could read low)


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("device 'cuda' requested but CUDA is not available")
    return torch.device(name)


def use_runtime(rt) -> torch.device:
    """Apply a `config.Runtime` to this process: torch's CPU threads when it names a count; returns its device."""
    if rt.threads is not None:
        torch.set_num_threads(rt.threads)
    return pick_device(rt.device)


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """bf16 autocast on CUDA; fp32 on CPU (bf16 matmul is ~100x slower on this kind of CPU)."""
    return torch.bfloat16 if device.type == "cuda" else None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def hardware() -> dict:
    info = {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
    return info


def measure_matmul_peak(device: torch.device, dtype: torch.dtype = torch.float32, sizes=(1024, 2048),
                        rounds: int = 3, repeats: int = 5) -> float:
    """Best FLOP/s of square matmuls over a few sizes and rounds a moment apart: the peak MFU is measured
    against. The best of several short trials, so a second process that held a core during one of them
    does not lower it (a lone trial on a shared machine measured below what training then reached)."""
    best = 0.0
    for r in range(rounds):
        if r:
            time.sleep(0.2)
        for n in sizes:
            a = torch.randn(n, n, device=device, dtype=dtype)
            b = torch.randn(n, n, device=device, dtype=dtype)
            for _ in range(repeats + 1):
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                a @ b
                if device.type == "cuda":
                    torch.cuda.synchronize()
                best = max(best, 2 * n**3 / (time.perf_counter() - t0))
    return best


def peak_key(device: torch.device, dtype: torch.dtype) -> str:
    return f"{cpu_model()}|{device.type}|{dtype}|{torch.get_num_threads()}"


def _peak_table(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write_peak_table(path: Path, table: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1))


def matmul_peak(device: torch.device, dtype: torch.dtype, cache_dir: Path) -> float:
    """The measured peak, cached per machine/device/dtype/thread count so it is measured once."""
    key, path = peak_key(device, dtype), cache_dir / PEAK_CACHE
    table = _peak_table(path)
    if key not in table:
        table[key] = measure_matmul_peak(device, dtype)
        _write_peak_table(path, table)
    return table[key]


def raise_matmul_peak(device: torch.device, dtype: torch.dtype, cache_dir: Path, achieved: float) -> float:
    """A run reached `achieved` FLOP/s, so the peak is at least that: the cached peak becomes the larger."""
    key, path = peak_key(device, dtype), cache_dir / PEAK_CACHE
    table = _peak_table(path)
    table[key] = max(float(table.get(key, 0.0)), achieved)
    _write_peak_table(path, table)
    return table[key]


def reset_peak_memory(device: torch.device) -> str:
    """Start the peak-memory count now, so that it measures training and not the data preparation
    before it (building the BPE and the token shards takes more memory than training the quick model).
    CPU: writing 5 to /proc/self/clear_refs resets VmHWM to the current RSS (Linux ≥ 4.0). Returns what
    the peak will mean."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return "cuda max allocated during training"
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return "process peak RSS during training"
    except OSError:
        return "process peak RSS (data preparation included)"


def peak_memory_mb(device: torch.device) -> float:
    """CUDA: max allocated. CPU: this address space's peak RSS (VmHWM). Not ru_maxrss: Linux carries it
    across exec, so a process spawned by a big parent (mtp ablate) would report the parent's peak."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = _proc_status_mb("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    """This process's resident size now (VmRSS), MB; NaN where /proc is not there."""
    rss = _proc_status_mb("VmRSS")
    return rss if rss is not None else float("nan")


def _proc_status_mb(key: str) -> float | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None
