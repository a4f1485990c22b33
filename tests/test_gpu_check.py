"""Keeps scripts/gpu_check.py working between GPU sessions: its CPU smoke run (every part at toy size), its
JSON schema, its time limits, its skips and its bad input. Nothing here measures a GPU."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from helpers import REPO

SCRIPT = REPO / "scripts" / "gpu_check.py"
sys.path.insert(0, str(SCRIPT.parent))
import gpu_check  # noqa: E402

PARTS = ["environment", "train", "distributed", "eval", "decode"]


def check_script(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    done = check_script("--device", "cpu", "--tiny", "--out", str(out))
    return done, out, json.loads((out / "gpu_check.json").read_text())


def test_the_tiny_cpu_run_passes_every_part(tiny_run):
    done, out, doc = tiny_run
    assert done.returncode == 0, done.stderr[-3000:]
    assert doc["schema"] == gpu_check.SCHEMA and doc["device"] == "cpu" and doc["tiny"] is True
    assert list(doc["parts"]) == PARTS
    for name, part in doc["parts"].items():
        assert part["status"] == "ok", (name, part)
        assert part["seconds"] <= part["limit_s"] == gpu_check.PART_LIMITS[name]
        assert part["checks"], name
        assert all(c["ok"] for c in part["checks"]), part["checks"]
        assert all(s["why"] for s in part["skipped"])
    names = {c["name"] for part in doc["parts"].values() for c in part["checks"]}
    assert {"ours ntp-eager", "ours seq-d1-eager", "ours ntp-compiled", "ours seq-d1-compiled", "hf-llama eager",
            "hf-llama compiled", "torchrun ddp", "torchrun fsdp + resume", "eval held-out loss",
            "tiny seq-d1 run mtp lossless, batch 8"} <= names
    assert (out / "gpu_check.md").read_text().startswith("| part | check | result |")


def test_the_smoke_runs_figures_are_what_the_checks_claim(tiny_run):
    _, _, doc = tiny_run
    checks = {c["name"]: c for part in doc["parts"].values() for c in part["checks"]}
    train = checks["ours ntp-eager"]["figures"]
    assert train["loss_last"] < train["loss_first"] and train["tokens_per_s"] > 0
    assert checks["torchrun fsdp + resume"]["figures"]["dcp_checkpoint"] is True
    assert checks["torchrun ddp"]["figures"]["max_rel_loss_diff"] <= gpu_check.TOLERANCE["cpu"]
    spec = checks["tiny seq-d1 run mtp lossless, batch 1"]["figures"]
    assert 1.0 <= spec["mean_acceptance_length"] <= 2.0
    assert math.isfinite(checks["eval held-out loss"]["figures"]["cpu"])
    skipped = {s["name"] for part in doc["parts"].values() for s in part["skipped"]}
    assert "smollm2-135m + distilled module" in skipped  # no module weights are committed


def test_the_rules_can_fail():
    """`falling` and `close` decide the checks: each with the case it must reject."""
    assert gpu_check.falling([6.0, 5.9, 5.5, 5.0])
    assert not gpu_check.falling([5.0, 5.5, 5.9, 6.0])  # rising
    assert not gpu_check.falling([6.0, float("nan"), 5.0, 4.0])
    assert gpu_check.close(7.0, 7.0 * (1 + 1e-5), "cpu") and not gpu_check.close(7.0, 7.01, "cpu")
    assert gpu_check.close(7.0, 7.1, "cuda") and not gpu_check.close(7.0, 7.3, "cuda")


def test_a_part_past_its_limit_is_stopped_and_reported(tmp_path):
    """--limit-scale 0.001 gives the environment part 0.03 s, less than starting Python and torch takes."""
    done = check_script("--device", "cpu", "--tiny", "--parts", "environment", "--limit-scale", "0.001",
                        "--out", str(tmp_path), timeout=120)
    assert done.returncode == 1
    part = json.loads((tmp_path / "gpu_check.json").read_text())["parts"]["environment"]
    assert part["status"] == "timeout" and part["limit_s"] == pytest.approx(0.03)


def test_without_cuda_only_the_environment_runs_and_says_why(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    done = check_script("--device", "cuda", "--out", str(tmp_path), timeout=120)
    assert done.returncode == 1
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert list(doc["parts"]) == ["environment"] and "no CUDA device" in doc["skipped_all"]
    (check,) = doc["parts"]["environment"]["checks"]
    assert check["ok"] is False and check["note"] == "torch sees no CUDA device"


@pytest.mark.parametrize("args", [["--parts", "nope"], ["--parts", ","], ["--limit-scale", "0"]])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args):
    done = check_script("--out", str(tmp_path), *args, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("error:") and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "gpu_check.json").exists()
