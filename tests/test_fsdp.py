"""Guards train.parallel = "fsdp" (FSDP2, mtp_cli/model/parallel.py), its sharded checkpoints
(mtp_cli/model/sharded_checkpoint.py) and the loss normalisation across ranks, on CPU with gloo.

Fast: with 2 processes and a batch whose ranks hold different numbers of valid targets (for the main
loss and for every depth), DDP and FSDP give every parameter the gradient of one process on the whole
batch (tests/fsdp_worker.py), where per-rank means would not; a save killed with SIGKILL leaves the
last good checkpoint; --fsdp in one process writes DCP checkpoints; docs/cluster.md's memory table is
the formula's. Slow: `torchrun -m mtp_cli train --fsdp` for NTP, sequential D=2 and parallel
n=3 logs the same losses over 5 steps as one process; its checkpoint resumes at another world size
(2 -> 1 and 1 -> 2); a frozen trunk trains under FSDP; `mtp export` reads the shards.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO, micro_recipe, write_recipe

TORCHRUN = Path(sys.executable).with_name("torchrun")
TESTS = Path(__file__).resolve().parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def torchrun(*args, cwd: Path, nproc: int = 2, timeout: float = 300) -> subprocess.CompletedProcess:
    if not TORCHRUN.exists():
        pytest.skip("torchrun not found next to the interpreter")
    return subprocess.run([str(TORCHRUN), "--standalone", "--nproc_per_node", str(nproc), *map(str, args)],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout, env=ENV)


# ---- fast: gradients with uneven valid targets ---------------------------------------------------------

@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    out = tmp_path_factory.mktemp("uneven") / "grads.pt"
    result = torchrun(TESTS / "fsdp_worker.py", out, cwd=out.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(out, weights_only=False)


def _one_process(case: str, x, y, per_rank_means: bool = False):
    """Gradients of L = L_main + λ/D Σ L_k, each the mean over the valid targets of the whole batch (the
    definition, through the plain forward); with per_rank_means, the average over the 2 ranks' halves of
    each half's own means instead (what normalising by per-rank counts gives)."""
    import fsdp_worker as W

    model = W.model_for(case)
    halves = [(x[:4], y[:4]), (x[4:], y[4:])] if per_rank_means else [(x, y)]
    losses = {}
    for xh, yh in halves:
        out = model(xh, yh, 0.3)
        (out.loss / len(halves)).backward()
        losses = {"loss": out.loss.item(), "loss_main": out.loss_main.item(),
                  **{f"loss_mtp_{k}": v.item() for k, v in enumerate(out.loss_extra, 1)}}
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, losses


def test_the_ranks_hold_different_numbers_of_valid_targets(uneven):
    from mtp_cli.model.loss import valid_counts

    y = uneven["y"]
    rank0, rank1 = valid_counts(y[:4], 3), valid_counts(y[4:], 3)
    assert (rank1 > 2 * rank0).all(), (rank0, rank1)  # main loss and depths 1-3


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
@pytest.mark.parametrize("case", ["ntp", "ntp-untied", "sequential-d2", "parallel-n3"])
def test_two_ranks_give_the_gradient_of_the_global_batch(uneven, case, mode):
    ref, ref_losses = _one_process(case, uneven["x"], uneven["y"])
    got = uneven[f"{case}/{mode}"]
    assert got["grads"].keys() == ref.keys()
    for name in ref:
        assert torch.allclose(got["grads"][name], ref[name], rtol=0, atol=1e-5), name
    for key, value in ref_losses.items():  # the logged losses: the global batch's means
        assert got["losses"][key] == pytest.approx(value, abs=1e-5), key
    norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in ref.values()])))
    assert got["grad_norm"] == pytest.approx(norm, rel=1e-5)  # clipping sees the whole (sharded) gradient


@pytest.mark.parametrize("case", ["ntp", "sequential-d2", "parallel-n3"])
def test_per_rank_means_would_give_another_gradient(uneven, case):
    """The comparison above is sharp: normalising by each rank's own counts moves the gradient by far
    more than its tolerance."""
    ref, _ = _one_process(case, uneven["x"], uneven["y"])
    naive, _ = _one_process(case, uneven["x"], uneven["y"], per_rank_means=True)
    assert max(float((naive[k] - ref[k]).abs().max()) for k in ref) > 1e-3


def test_fsdp_keeps_one_shared_embedding(uneven):
    for case in ("ntp", "sequential-d2", "parallel-n3"):
        ddp, fsdp = uneven[f"{case}/ddp"], uneven[f"{case}/fsdp"]
        assert fsdp["tied"] and fsdp["n_params"] == ddp["n_params"], case
    assert not uneven["ntp-untied/fsdp"]["tied"]


# ---- fast: a killed save leaves the last good checkpoint -------------------------------------------------

KILLED_SAVE = """
import os, signal, sys, torch
sys.path.insert(0, {tests!r})
from helpers import micro_recipe
from mtp_cli.model import sharded_checkpoint as sc
from mtp_cli.model import MTPModel
recipe = micro_recipe("sequential", depth=1)
torch.manual_seed(0)
model = MTPModel(recipe.model, recipe.mtp)
opt = torch.optim.AdamW(model.parameters())
sc.save(sys.argv[1], model, opt, 2, {{"recipe": recipe.to_dict()}})
torch.save(model.state_dict(), os.path.join(sys.argv[1], "step2.pt"))
with torch.no_grad():
    for p in model.parameters():
        p.add_(1.0)
kill = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
if sys.argv[2] == "writing":  # the shards written, the checkpoint's metadata not yet
    from torch.distributed.checkpoint import FileSystemWriter
    FileSystemWriter.finish = kill
else:  # everything written but latest.json
    os.replace = kill  # the rename that commits latest.json (mtp_cli.base.files.replacing)
sc.save(sys.argv[1], model, opt, 4, {{"recipe": recipe.to_dict()}})
"""


@pytest.mark.parametrize("when", ["writing", "committing"])
def test_a_killed_save_leaves_the_last_good_checkpoint(tmp_path, when):
    from mtp_cli.model import checkpoint as ckpt
    from mtp_cli.model import sharded_checkpoint as sc

    script = tmp_path / "save.py"
    script.write_text(KILLED_SAVE.format(tests=str(TESTS)))
    result = subprocess.run([sys.executable, str(script), str(tmp_path), when], capture_output=True, text=True,
                            timeout=120, env=ENV)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    folders = sorted(p.name for p in (tmp_path / sc.FOLDER).iterdir() if p.is_dir())
    assert len(folders) == 2  # the good one and the half-written one
    assert sc.load_extra(tmp_path)["step"] == 2
    state = ckpt.load_checkpoint(tmp_path)
    saved = torch.load(tmp_path / "step2.pt", weights_only=True)
    assert state["step"] == 2 and all(torch.equal(state["model"][k], saved[k]) for k in saved)
    # the next save removes the half-written folder
    from mtp_cli.config.recipe import recipe_from_dict
    from mtp_cli.model import MTPModel

    recipe = recipe_from_dict(state["recipe"])
    model = MTPModel(recipe.model, recipe.mtp)
    sc.save(tmp_path, model, torch.optim.AdamW(model.parameters()), 6, {"recipe": state["recipe"]})
    latest = json.loads(sc.latest_file(tmp_path).read_text())
    assert latest["step"] == 6
    assert [p.name for p in (tmp_path / sc.FOLDER).iterdir() if p.is_dir()] == [latest["folder"]]


# ---- fast: the flag, and one process ------------------------------------------------------------------

def test_fsdp_flag_in_one_process_writes_a_sharded_checkpoint_that_resumes(tmp_path, capsys, monkeypatch):
    """At world size 1 nothing is sharded, but the run's checkpoints are DCP ones (so that any world size
    resumes them); --ddp on resume is refused in one line; a bad train.parallel is one line too."""
    from helpers import cli_in_process

    from mtp_cli.base.errors import UserError
    from mtp_cli.model.checkpoint import load_run

    monkeypatch.chdir(tmp_path)
    recipe_path = write_recipe(micro_recipe(steps=1), tmp_path / "r.toml")
    out = tmp_path / "run"
    code, _, err = cli_in_process("train", "--recipe", recipe_path, "--fsdp", "--out", out, capsys=capsys)
    assert code == 0, err
    assert json.loads((out / "run.json").read_text())["recipe"]["train"]["parallel"] == "fsdp"
    assert (out / "sharded" / "latest.json").is_file() and not (out / "checkpoint.pt").exists()
    code, _, err = cli_in_process("train", "--resume", "--out", out, "--steps", "2", capsys=capsys)
    assert code == 0, err
    assert load_run(out).step == 2
    code, _, err = cli_in_process("train", "--recipe", recipe_path, "--ddp", "--resume", "--out", out, "--steps", "3",
                                  capsys=capsys)
    assert code == 2 and "train.parallel 'fsdp' -> 'ddp'" in err and len(err.strip().splitlines()) == 1
    recipe = micro_recipe()
    recipe.train.parallel = "zero"
    with pytest.raises(UserError, match="unknown train.parallel 'zero'; choose one of ddp, fsdp"):
        recipe.validate()


# ---- fast: docs/cluster.md's memory table is the formula's ------------------------------------------------

def test_the_memory_table_in_the_docs_is_computed_from_the_parameter_count():
    from helpers import state_bytes_per_rank

    assert state_bytes_per_rank(1e9, 1, "ddp") == 16e9 and state_bytes_per_rank(1e9, 8, "fsdp") == 2e9
    assert state_bytes_per_rank(1e9, 1, "ddp", trained=0) == 4e9  # a frozen parameter: its fp32 weight only
    doc = (REPO / "docs" / "cluster.md").read_text()
    rows = {"SmolLM2-135M": (135e6, None), "gpu-350m": (345e6, None), "TinyLlama-1.1B (gpu-1b)": (1.1e9, None),
            "TinyLlama-1.1B frozen + one sequential module": (1.1e9 + 52e6, 52e6),
            "Llama-2-7B": (6.74e9, None), "Llama-2-13B": (13.0e9, None)}
    for name, (params, trained) in rows.items():
        cells = [state_bytes_per_rank(params, 1, "ddp", trained)]
        cells += [state_bytes_per_rank(params, world, "fsdp", trained) for world in (8, 64)]
        text = " | ".join(f"{c / 1e9:.1f} GB" if c >= 1e9 else f"{c / 1e9:.2f} GB" for c in cells)
        assert f"| {name} | {text} |" in doc, name


# ---- slow: whole training runs under torchrun ----------------------------------------------------------

CASES = {"ntp": dict(objective="ntp"), "sequential-d2": dict(objective="sequential", depth=2),
         "parallel-n3": dict(objective="parallel", heads=3)}


def case_recipe(name: str, steps: int = 5):
    recipe = micro_recipe(steps=steps, **CASES[name])
    recipe.train.ckpt_every = 2
    recipe.train.eval_every = 3
    recipe.train.parallel = "fsdp"
    return recipe


def train_rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "train"]


def assert_same_losses(one: Path, other: Path, steps=range(1, 6)) -> None:
    rows_one = {r["step"]: r for r in train_rows(one)}
    rows_other = {r["step"]: r for r in train_rows(other)}
    assert sorted(rows_other) == list(steps)
    for step in steps:
        a, b = rows_one[step], rows_other[step]
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5), step
        for key in a:
            if key.startswith("loss"):
                assert b[key] == pytest.approx(a[key], abs=1e-5), (step, key)


def weights(run: Path) -> dict[str, torch.Tensor]:
    from mtp_cli.model import checkpoint as ckpt

    return ckpt.load_checkpoint(run)["model"]


def assert_close_weights(a: dict, b: dict) -> None:
    """As tests/test_ddp.py: Adam turns fp32 summation-order noise in near-zero gradients into ~1e-5
    update differences, while a wrong reduction moves weights by ~lr = 3e-3."""
    diffs = torch.cat([(a[k].double() - b[k].double()).abs().flatten() for k in a])
    assert float(diffs.max()) < 5e-4
    assert int((diffs > 1e-6).sum()) <= max(10, diffs.numel() // 50)


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory):
    """Each case trained by 2 FSDP processes and by one process (the plain model)."""
    from mtp_cli.train.loop import train

    root = tmp_path_factory.mktemp("fsdp")
    results = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name in CASES:
            recipe_path = write_recipe(case_recipe(name), root / f"{name}.toml")
            results[name] = torchrun("-m", "mtp_cli", "train", "--recipe", recipe_path, "--device", "cpu",
                                     "--out", root / name / "two", cwd=root)
            one = case_recipe(name)
            one.train.parallel = "ddp"
            train(one, root / name / "one", show_progress=False)
    finally:
        torch.set_num_threads(threads)
    return root, results


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_fsdp_two_processes_log_the_losses_of_one(fsdp_runs, name):
    root, results = fsdp_runs
    assert results[name].returncode == 0, results[name].stderr[-3000:]
    one, two = root / name / "one", root / name / "two"
    info = json.loads((two / "run.json").read_text())
    assert (info["world_size"], info["parallel"], info["status"]) == (2, "fsdp", "done")
    assert not (two / "checkpoint.pt").exists() and (two / "sharded" / "latest.json").is_file()
    assert_same_losses(one, two)
    assert_close_weights(weights(one), weights(two))
    # each rank holds about half of the parameters, gradients and AdamW state (plus the padding of shards)
    whole = json.loads((one / "run.json").read_text())["throughput"]["state_mb"]
    assert all(0.4 * whole < mb < 0.6 * whole for mb in info["throughput"]["state_mb_per_rank"])


@pytest.mark.slow
def test_a_sharded_checkpoint_resumes_at_another_world_size(fsdp_runs, tmp_path):
    from mtp_cli.train.loop import train

    root, _ = fsdp_runs
    recipe_path = write_recipe(case_recipe("sequential-d2"), tmp_path / "r.toml")
    # saved by 2 ranks at step 2, resumed by 1
    first = torchrun("-m", "mtp_cli", "train", "--recipe", recipe_path, "--device", "cpu", "--steps", "2",
                     "--out", tmp_path / "two-one", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    with _one_thread():
        train(case_recipe("sequential-d2"), tmp_path / "two-one", resume=True, show_progress=False)
    # saved by 1 at step 2, resumed by 2 ranks
    with _one_thread():
        train(case_recipe("sequential-d2", steps=2), tmp_path / "one-two", show_progress=False)
    second = torchrun("-m", "mtp_cli", "train", "--resume", "--out", tmp_path / "one-two", "--steps", "5",
                      cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    one = root / "sequential-d2" / "one"
    for run in (tmp_path / "two-one", tmp_path / "one-two"):
        assert_same_losses(one, run)
        assert_close_weights(weights(one), weights(run))


@pytest.mark.slow
def test_export_reads_a_sharded_checkpoint(fsdp_runs, tmp_path):
    from transformers import AutoModelForCausalLM

    from mtp_cli.model.checkpoint import load_run

    root, _ = fsdp_runs
    run = root / "sequential-d2" / "two"
    result = subprocess.run([sys.executable, "-m", "mtp_cli", "export", str(run), "--out", str(tmp_path / "hf")],
                            cwd=REPO, capture_output=True, text=True, timeout=300, env=ENV)
    assert result.returncode == 0, result.stderr[-2000:]
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    loaded = load_run(run)
    idx = torch.randint(0, loaded.recipe.model.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(hf(idx).logits, loaded.model.trunk(idx), atol=1e-4)


@pytest.mark.slow
def test_a_frozen_trunk_trains_under_fsdp(fsdp_runs, tmp_path):
    from mtp_cli.model.hf import export_run
    from mtp_cli.train.loop import train

    root, _ = fsdp_runs
    source = export_run(root / "ntp" / "one", tmp_path / "source")
    recipe = case_recipe("sequential-d2")
    recipe.mtp.depth = 1
    recipe.train.init_from, recipe.train.freeze_trunk = str(source), True
    from mtp_cli.model import pretrained

    pretrained.resolve_recipe(recipe, given={"context"})
    recipe_path = write_recipe(recipe, tmp_path / "frozen.toml")
    two = torchrun("-m", "mtp_cli", "train", "--recipe", recipe_path, "--device", "cpu", "--out", tmp_path / "two",
                   cwd=tmp_path)
    assert two.returncode == 0, two.stderr[-3000:]
    recipe.train.parallel = "ddp"
    with _one_thread():
        train(recipe, tmp_path / "one", show_progress=False)
    assert_same_losses(tmp_path / "one", tmp_path / "two")
    before, after = weights(root / "ntp" / "one"), weights(tmp_path / "two")
    assert all(torch.equal(after[k], before[k]) for k in before)  # the trunk, bit for bit


@contextlib.contextmanager
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
