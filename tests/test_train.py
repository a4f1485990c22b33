"""Guards the training loop: determinism (same seed, same loss curve), resume equality after a soft
(Ctrl-C) or hard (crash) interruption, gradient accumulation, metrics.jsonl and run.json contents,
the NaN/inf stop that keeps the last good checkpoint, and atomic checkpoint writes.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers import REPO, checkpoint_weights, folder_snapshot, max_state_diff, micro_recipe

from mtp_cli.base.errors import UserError
from mtp_cli.config.recipe import recipe_from_dict
from mtp_cli.config.schedule import lr_at
from mtp_cli.model import MTPModel, flops
from mtp_cli.model import checkpoint as ckpt
from mtp_cli.train import loop as trainer

pytestmark = pytest.mark.usefixtures("single_thread")


def run(recipe, out: Path, **kw) -> dict:
    return trainer.train(recipe, out, show_progress=False, **kw)


def metrics(out: Path) -> tuple[list[dict], list[dict]]:
    rows = [json.loads(line) for line in (out / ckpt.METRICS).read_text().splitlines()]
    return [r for r in rows if r["kind"] == "train"], [r for r in rows if r["kind"] == "val"]


def loss_curve(out: Path) -> list[tuple]:
    train_rows, _ = metrics(out)
    return [(r["step"], r["loss"], r["loss_main"], r.get("loss_mtp_1"), r["grad_norm"]) for r in train_rows]


def stop_at(monkeypatch, step: int, exc: BaseException):
    """Make the loop raise `exc` when it is about to run optimizer step `step` (0-based), i.e. after
    `step` completed steps — like a Ctrl-C or a crash between two steps."""
    real = trainer.lr_at

    def lr_or_raise(s, cfg):
        if s == step:
            raise exc
        return real(s, cfg)

    monkeypatch.setattr(trainer, "lr_at", lr_or_raise)


# ---- determinism and run outputs -------------------------------------------------------------------

def seeded_recipe(seed: int = 0):
    """Sequential D=2 with DeepSeek's λ schedule (0.3 -> 0.1 at half time), validation every 3 steps."""
    r = micro_recipe("sequential", steps=6, depth=2, lambda_=0.3, lambda_final=0.1, lambda_switch=0.5)
    r.train.eval_every = 3
    r.train.seed = seed
    return r


@pytest.fixture(scope="module")
def two_seeded_runs(tmp_path_factory):
    """The same recipe trained twice into two folders."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("determinism")
    summaries = [run(seeded_recipe(), root / "a"), run(seeded_recipe(), root / "b")]
    torch.set_num_threads(threads)
    return root / "a", root / "b", seeded_recipe(), summaries


def test_same_seed_same_loss_curve_and_weights(two_seeded_runs):
    a, b, _, _ = two_seeded_runs
    assert loss_curve(a) == loss_curve(b)
    assert max_state_diff(checkpoint_weights(a), checkpoint_weights(b)) == 0.0


def test_different_seed_different_curve(two_seeded_runs, tmp_path):
    a, _, _, _ = two_seeded_runs
    run(seeded_recipe(seed=1), tmp_path / "c")
    assert loss_curve(tmp_path / "c")[0][1] != loss_curve(a)[0][1]


def test_metrics_one_row_per_step_with_all_fields(two_seeded_runs):
    a, _, recipe, _ = two_seeded_runs
    train_rows, val_rows = metrics(a)
    assert [r["step"] for r in train_rows] == list(range(1, 7))
    for r in train_rows:
        for key in ("step", "lr", "lambda", "loss", "loss_main", "loss_mtp_1", "loss_mtp_2", "grad_norm",
                    "tokens_per_s", "mfu"):
            assert isinstance(r[key], (int, float)) and math.isfinite(r[key]), key
        assert "loss_mtp_3" not in r
        assert r["lr"] == pytest.approx(lr_at(r["step"] - 1, recipe.train))
        assert r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1
        assert r["loss"] == pytest.approx(r["loss_main"] + r["lambda"] / 2 * (r["loss_mtp_1"] + r["loss_mtp_2"]), rel=1e-5)
    # DeepSeek's λ schedule as the loop applied it: 0.3 for steps 1-3, then 0.1
    assert [r["lambda"] for r in train_rows] == [0.3] * 3 + [0.1] * 3
    # validation every eval_every steps: loss and top-1 per depth, agreement with the trunk
    assert [r["step"] for r in val_rows] == [3, 6]
    for r in val_rows:
        for key in ("val_loss", "val_top1", "val_loss_1", "val_top1_1", "val_agree_1", "val_loss_2", "val_top1_2",
                    "val_agree_2"):
            assert math.isfinite(r[key]), key
        assert 0 <= r["val_top1"] <= 1


def test_run_json_summary(two_seeded_runs):
    a, _, recipe, summaries = two_seeded_runs
    info = json.loads((a / ckpt.RUN_JSON).read_text())
    assert info["status"] == "done" and info["step"] == 6 and info["objective"] == "sequential"
    model = MTPModel(recipe.model, recipe.mtp)
    assert info["params"] == model.param_counts()
    assert info["params"]["mtp"] > 0 and info["params"]["trunk"] > 0
    if (REPO / ".git").exists():
        assert re.fullmatch(r"[0-9a-f]{40}", info["git_commit"])
    else:  # an unpacked tarball, no git
        assert info["git_commit"] == "unknown"
    assert info["env"]["torch"] == torch.__version__
    assert info["env"]["cpu"] and info["env"]["cpu_count"] >= 1 and info["device"] == "cpu"
    assert recipe_from_dict(info["recipe"]).to_dict() == recipe.to_dict()
    assert info["final"]["step"] == 6 and "val_loss" in info["final"]
    assert info["throughput"]["tokens_per_s_median"] > 0
    assert "depth 1 fed the trunk's post-norm state" in info["note"]
    assert summaries[0]["params"] == info["params"]
    assert (a / ckpt.TOKENIZER / "tokenizer.json").is_file()


def test_parallel_run_says_compute_matched(tmp_path):
    recipe = micro_recipe("parallel", steps=1, heads=2)
    summary = run(recipe, tmp_path / "p")
    assert summary["trunk_layers"] == recipe.model.n_layers - 1
    assert "compute-matched: trunk has 2 layers (3 - 1)" in summary["note"]
    assert summary["lambda"] == 1.0
    train_rows, _ = metrics(tmp_path / "p")
    assert set(train_rows[0]) >= {"loss_main", "loss_mtp_1"} and "loss_mtp_2" not in train_rows[0]


# ---- resume equality -------------------------------------------------------------------------------

def test_resume_after_ctrl_c_gives_the_same_weights(tmp_path, monkeypatch):
    """Ctrl-C after 3 of 6 steps (the loop saves a checkpoint on interrupt), then --resume with the
    same recipe: the same final weights and loss curve as an uninterrupted run."""
    recipe = lambda: micro_recipe("sequential", steps=6, depth=1, lambda_=0.3, lambda_final=0.1, lambda_switch=0.6)  # noqa: E731
    run(recipe(), tmp_path / "straight")
    with monkeypatch.context() as m:
        stop_at(m, 3, KeyboardInterrupt())
        with pytest.raises(KeyboardInterrupt):
            run(recipe(), tmp_path / "resumed")
    assert torch.load(tmp_path / "resumed" / ckpt.CHECKPOINT, weights_only=True)["step"] == 3
    run(recipe(), tmp_path / "resumed", resume=True)
    assert max_state_diff(checkpoint_weights(tmp_path / "straight"), checkpoint_weights(tmp_path / "resumed")) == 0.0
    assert loss_curve(tmp_path / "resumed") == loss_curve(tmp_path / "straight")


def test_ctrl_c_in_the_middle_of_a_step_stops_after_that_step(tmp_path, monkeypatch):
    """A real SIGINT while step 3's backward runs: the step is finished and logged, then the loop stops
    with a checkpoint at step 3 — never a half-applied step saved as the one before it."""
    import os
    import signal

    recipe = micro_recipe("ntp", steps=6)
    real = trainer.accumulate
    calls = []

    def accumulate_with_sigint(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "accumulate", accumulate_with_sigint)
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN when launched in the background
    with pytest.raises(KeyboardInterrupt):
        run(recipe, tmp_path / "run")
    assert torch.load(tmp_path / "run" / ckpt.CHECKPOINT, weights_only=True)["step"] == 3
    assert [r["step"] for r in metrics(tmp_path / "run")[0]] == [1, 2, 3]
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back


@pytest.mark.parametrize("objective,kw", [("parallel", {"heads": 3}), ("ntp", {})])
def test_resume_after_crash_from_periodic_checkpoint(tmp_path, monkeypatch, objective, kw):
    """A crash after step 3 with checkpoints every 2 steps: resume restarts from step 2, drops the
    metrics rows past it, and ends with the same weights and curve as an uninterrupted run."""
    def recipe():
        r = micro_recipe(objective, steps=6, **kw)
        r.train.ckpt_every = 2
        return r

    run(recipe(), tmp_path / "straight")
    with monkeypatch.context() as m:
        stop_at(m, 3, RuntimeError("simulated crash"))
        with pytest.raises(RuntimeError, match="simulated crash"):
            run(recipe(), tmp_path / "resumed")
    assert [r["step"] for r in metrics(tmp_path / "resumed")[0]] == [1, 2, 3]
    assert torch.load(tmp_path / "resumed" / ckpt.CHECKPOINT, weights_only=True)["step"] == 2
    run(recipe(), tmp_path / "resumed", resume=True)
    assert max_state_diff(checkpoint_weights(tmp_path / "straight"), checkpoint_weights(tmp_path / "resumed")) == 0.0
    assert loss_curve(tmp_path / "resumed") == loss_curve(tmp_path / "straight")


def test_resume_survives_a_torn_metrics_line(tmp_path, monkeypatch):
    """A process killed mid-write can leave half a JSON line at the end of metrics.jsonl; resume must
    still work (the torn row is past the checkpoint anyway)."""
    def recipe():
        r = micro_recipe("ntp", steps=4)
        r.train.ckpt_every = 2
        return r

    with monkeypatch.context() as m:
        stop_at(m, 3, RuntimeError("killed"))
        with pytest.raises(RuntimeError):
            run(recipe(), tmp_path / "r")
    with open(tmp_path / "r" / ckpt.METRICS, "a") as fh:
        fh.write('{"kind": "train", "step": 4, "lr": 0.00')
    run(recipe(), tmp_path / "r", resume=True)
    assert [r["step"] for r in metrics(tmp_path / "r")[0]] == [1, 2, 3, 4]


def test_resume_of_a_finished_run_changes_nothing(tmp_path):
    """`make quick` re-runs `mtp train --resume` on finished runs: their folders, run.json with its
    throughput numbers included, must come out untouched."""
    recipe = micro_recipe("ntp", steps=2)
    summary = run(recipe, tmp_path / "r")
    before = folder_snapshot(tmp_path / "r")
    again = run(micro_recipe("ntp", steps=2), tmp_path / "r", resume=True)
    assert folder_snapshot(tmp_path / "r") == before
    assert again["throughput"] == summary["throughput"] and again["status"] == "done"
    # asking for more steps continues the finished run
    run(micro_recipe("ntp", steps=3), tmp_path / "r", resume=True)
    assert [r["step"] for r in metrics(tmp_path / "r")[0]] == [1, 2, 3]


def test_data_seed_sets_the_batch_order_and_seed_the_initialisation(tmp_path, monkeypatch):
    from mtp_cli.data import shards

    drawn, real = [], shards.train_batch
    monkeypatch.setattr(shards, "train_batch", lambda tokens, step, seed, *a, **k: drawn.append(seed) or
                        real(tokens, step, seed, *a, **k))
    recipe = micro_recipe("ntp", steps=2)
    recipe.train.seed = 3
    run(recipe, tmp_path / "default")
    assert drawn == [3, 3]  # unset: the seed, as before the two were apart
    recipe.train.data_seed, drawn[:] = 7, []
    run(recipe, tmp_path / "apart")
    assert drawn == [7, 7]
    assert max_state_diff(checkpoint_weights(tmp_path / "default"), checkpoint_weights(tmp_path / "apart")) > 0
    assert trainer.default_run_name(recipe).endswith("-s3-data7")


def test_resume_accepts_the_data_seed_spelled_out_and_refuses_another(tmp_path):
    """A run stored without data_seed drew its batches from its seed: resuming with --data-seed = the seed is
    the same run; another data seed is a different run, named."""
    run(micro_recipe("ntp", steps=1), tmp_path / "r")
    same = micro_recipe("ntp", steps=2)
    same.train.data_seed = 0
    assert run(same, tmp_path / "r", resume=True)["step"] == 2
    other = micro_recipe("ntp", steps=3)
    other.train.data_seed = 1
    with pytest.raises(UserError, match=r"train.data_seed 0 -> 1"):
        run(other, tmp_path / "r", resume=True)


def test_resume_with_a_pretrained_tokenizer(tmp_path, two_seeded_runs):
    """With a tokenizer given by path the model's vocabulary comes from the tokenizer, not the
    recipe; resuming the same recipe must still be recognised as the same run."""
    a, _, _, _ = two_seeded_runs

    def recipe(steps):
        r = micro_recipe("ntp", steps=steps)
        r.data.tokenizer = str(a / ckpt.TOKENIZER)
        r.model.vocab_size = 1000  # ignored: the tokenizer has 512 tokens
        return r

    summary = run(recipe(2), tmp_path / "r")
    assert summary["recipe"]["model"]["vocab_size"] == 512
    run(recipe(3), tmp_path / "r", resume=True)
    assert [r["step"] for r in metrics(tmp_path / "r")[0]] == [1, 2, 3]


# ---- gradient accumulation ---------------------------------------------------------------------------

@pytest.mark.parametrize("objective,kw", [("sequential", {"depth": 1}), ("parallel", {"heads": 2})])
def test_grad_accumulation_matches_the_full_batch(tmp_path, objective, kw):
    outs = []
    for accum in (1, 2):
        r = micro_recipe(objective, steps=2, **kw)
        r.train.grad_accum = accum
        run(r, tmp_path / f"accum{accum}")
        outs.append(checkpoint_weights(tmp_path / f"accum{accum}"))
    assert max_state_diff(*outs) < 1e-5


# ---- NaN stop, atomic checkpoints --------------------------------------------------------------------

def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    recipe = micro_recipe("sequential", steps=6, depth=1)
    recipe.train.ckpt_every = 2
    real_forward = MTPModel.forward
    calls = {"n": 0}

    def forward_nan_at_step_4(self, idx, targets, lam=None, totals=None, frozen=None):
        out = real_forward(self, idx, targets, lam, totals, frozen)
        calls["n"] += 1
        if calls["n"] == 4:
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(MTPModel, "forward", forward_nan_at_step_4)
    with pytest.raises(UserError) as info:
        run(recipe, tmp_path / "r")
    message = str(info.value)
    assert "\n" not in message and "loss is nan at step 4" in message
    assert "checkpoint" in message
    state = torch.load(tmp_path / "r" / ckpt.CHECKPOINT, weights_only=True)
    assert state["step"] == 2
    assert all(torch.isfinite(v).all() for v in state["model"].values())


def test_inf_gradient_stops_before_the_optimizer_step(tmp_path, monkeypatch):
    recipe = micro_recipe("ntp", steps=4)
    recipe.train.ckpt_every = 1
    from mtp_cli.model import parallel

    real = parallel.clip_grad_norm
    calls = {"n": 0}

    def clip_inf_at_step_3(params, max_norm, *a, **k):
        calls["n"] += 1
        params = list(params)
        if calls["n"] == 3:
            params[0].grad.fill_(float("inf"))
        return real(params, max_norm, *a, **k)

    monkeypatch.setattr(parallel, "clip_grad_norm", clip_inf_at_step_3)
    with pytest.raises(UserError, match="step 3"):
        run(recipe, tmp_path / "r")
    state = torch.load(tmp_path / "r" / ckpt.CHECKPOINT, weights_only=True)
    assert state["step"] == 2
    assert all(torch.isfinite(v).all() for v in state["model"].values())


def test_checkpoint_is_written_atomically(tmp_path, monkeypatch):
    recipe = micro_recipe("ntp", steps=1)
    run(recipe, tmp_path / "r")
    before = folder_snapshot(tmp_path / "r")
    good = checkpoint_weights(tmp_path / "r")

    def torn_save(obj, path, *a, **k):
        Path(path).write_bytes(b"half a checkpoint")  # a write cut short ...
        raise OSError("disk full")  # ... and the process dies

    monkeypatch.setattr(ckpt.torch, "save", torn_save)
    model = MTPModel(recipe.model, recipe.mtp)
    with pytest.raises(OSError):
        ckpt.save_checkpoint(tmp_path / "r", model, None, 5, recipe)
    after = folder_snapshot(tmp_path / "r")
    assert after[ckpt.CHECKPOINT] == before[ckpt.CHECKPOINT]
    assert max_state_diff(good, ckpt.load_checkpoint(tmp_path / "r")["model"]) == 0.0


def test_force_starts_over(tmp_path):
    run(micro_recipe("ntp", steps=2), tmp_path / "r")
    (tmp_path / "r" / "notes.txt").write_text("mine")
    run(micro_recipe("ntp", steps=1), tmp_path / "r", force=True)
    assert [r["step"] for r in metrics(tmp_path / "r")[0]] == [1]
    assert (tmp_path / "r" / "notes.txt").read_text() == "mine"  # --force replaces the run, not the user's files


def test_force_on_a_folder_that_holds_no_run_deletes_nothing_of_the_users(tmp_path):
    folder = tmp_path / "mine"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "data.txt").write_text("precious")
    (folder / "notes.md").write_text("also precious")
    with pytest.raises(UserError, match="not empty and holds no run"):
        run(micro_recipe("ntp", steps=1), folder)
    run(micro_recipe("ntp", steps=1), folder, force=True)
    assert (folder / "sub" / "data.txt").read_text() == "precious"
    assert (folder / "notes.md").read_text() == "also precious"
    assert (folder / ckpt.RUN_JSON).is_file()


def test_output_folder_checks(tmp_path):
    run(micro_recipe("ntp", steps=1), tmp_path / "r")
    before = folder_snapshot(tmp_path / "r")
    with pytest.raises(UserError, match="--resume"):
        run(micro_recipe("ntp", steps=1), tmp_path / "r")
    with pytest.raises(UserError, match="different run"):
        run(micro_recipe("sequential", steps=1, depth=1), tmp_path / "r", resume=True)
    assert folder_snapshot(tmp_path / "r") == before
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("x")
    with pytest.raises(UserError, match="not empty"):
        run(micro_recipe("ntp", steps=1), tmp_path / "other")
    shutil.rmtree(tmp_path / "r")


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGKILL"])
def test_resume_after_a_real_signal(tmp_path, sig):
    """A real `mtp train` process stopped by Ctrl-C (it saves and exits 130) or killed outright (the
    periodic checkpoint survives), then `--resume`: the same weights as an uninterrupted run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from helpers import write_recipe

    recipe = micro_recipe("sequential", steps=300, depth=1)  # long enough that the signal lands mid-run
    recipe.train.ckpt_every = 5
    path = write_recipe(recipe, tmp_path / "r.toml")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "mtp_cli", "train", "--recipe", str(path), "--out", str(tmp_path / "run")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics_path = tmp_path / "run" / ckpt.METRICS
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if metrics_path.is_file() and len(metrics_path.read_text().splitlines()) >= 12:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be interrupted"
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=120)
    if sig == "SIGINT":
        assert proc.returncode == 130, err
        assert "checkpoint saved at step" in err
    step = torch.load(tmp_path / "run" / ckpt.CHECKPOINT, weights_only=True)["step"]
    assert 5 <= step < 300
    done = subprocess.run(cmd + ["--resume"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    run(recipe, tmp_path / "straight")
    assert max_state_diff(checkpoint_weights(tmp_path / "straight"), checkpoint_weights(tmp_path / "run")) == 0.0
    assert [r["step"] for r in metrics(tmp_path / "run")[0]] == list(range(1, 301))


@pytest.mark.slow
@pytest.mark.parametrize("objective,kw", [("sequential", {"depth": 1}), ("parallel", {"heads": 2})])
def test_compiled_blocks_train_like_eager(tmp_path, objective, kw):
    """`compile = true` (every Block under torch.compile, the memory-efficient parallel path
    included) follows the eager loss curve and keeps the checkpoint's parameter names."""
    eager, compiled = micro_recipe(objective, steps=3, **kw), micro_recipe(objective, steps=3, **kw)
    compiled.train.compile = True
    run(eager, tmp_path / "eager")
    run(compiled, tmp_path / "compiled")
    for a, b in zip(loss_curve(tmp_path / "eager"), loss_curve(tmp_path / "compiled"), strict=True):
        assert a[0] == b[0] and a[1:4] == pytest.approx(b[1:4], rel=1e-4)
    assert checkpoint_weights(tmp_path / "eager").keys() == checkpoint_weights(tmp_path / "compiled").keys()
    assert max_state_diff(checkpoint_weights(tmp_path / "eager"), checkpoint_weights(tmp_path / "compiled")) < 1e-4


def test_peak_memory_counts_training_not_data_preparation():
    """A large buffer freed before training (like the BPE and shard build) is not in the peak. In a fresh
    process: the peak RSS is the process's, and what earlier tests left resident would blur it."""
    import subprocess
    import sys

    code = """
import json, torch
from mtp_cli.base import env
cpu = torch.device("cpu")
big = torch.ones(300 * 2**20 // 4)  # 300 MB, touched
del big
before = env.peak_memory_mb(cpu)
kind = env.reset_peak_memory(cpu)
print(json.dumps({"before": before, "kind": kind, "after": env.peak_memory_mb(cpu)}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    if got["kind"] != "process peak RSS during training":
        pytest.skip("this kernel does not let a process reset its peak RSS (/proc/self/clear_refs)")
    assert got["after"] < got["before"] - 250


def test_flops_per_token_counts_a_frozen_trunk_forward_only(tmp_path):
    """The training FLOPs formula, counted by hand from the config: with train.freeze_trunk the trunk
    (no-grad) costs its forward only, the modules 3 × forward, and their use of the frozen shared
    unembedding forward + input gradient (2 ×); unfrozen, everything is 3 × forward. cost.py agrees."""
    from helpers import tiny_model_config, tiny_recipe

    from mtp_cli.config.recipe import MTPConfig
    from mtp_cli.results import estimate as cost

    cfg = tiny_model_config()
    d, T, V, L = cfg.d_model, cfg.context, cfg.vocab_size, cfg.n_layers
    block = 4 * d * d + 3 * d * cfg.ffn_hidden  # q, k, v, o (no GQA) + SwiGLU gate, up, down
    module = 2 * d * d + block  # eh_proj + its block
    trunk_fwd = 2 * (L * block + V * d) + 4 * L * T * d
    module_fwd = 2 * module + 4 * T * d
    unembed_fwd = 2 * V * d
    model = MTPModel(cfg, MTPConfig(objective="sequential", depth=1))
    unfrozen = flops.flops_per_token(model, T)
    assert unfrozen == 3 * (trunk_fwd + module_fwd + unembed_fwd)
    assert flops.forward_flops_per_token(model, T) == trunk_fwd + module_fwd + unembed_fwd
    model.freeze_trunk()
    frozen = flops.flops_per_token(model, T)
    assert frozen == trunk_fwd + 3 * module_fwd + 2 * unembed_fwd
    assert frozen < unfrozen
    model.mtp_cfg.draft_target = "trunk"  # distilled: the teacher's logits, one more unembedding forward
    assert flops.flops_per_token(model, T) == frozen + unembed_fwd
    model.mtp_cfg.draft_target = "token"

    recipe = tiny_recipe("sequential", depth=1)
    assert cost.training_flops(recipe)[0] == unfrozen
    recipe.train.freeze_trunk = True
    assert cost.training_flops(recipe) == (frozen, trunk_fwd + module_fwd + unembed_fwd, recipe.train.batch_size * T)

    # train.distinct_batches: steps past the first N read the trunk states the run stored, so the dry run's
    # estimate counts the trunk's forward on N batches only
    assert flops.trunk_forward_flops_per_token(model, T) == trunk_fwd
    recipe.train.steps, recipe.train.distinct_batches, recipe.train.peak_flops = 10, 4, 1e11
    cell = type("Cell", (), {"recipe": recipe, "run_dir": tmp_path / "run"})()
    est = cost.Estimator(tmp_path, recipe)
    val_tokens = (10 // recipe.train.eval_every + 1) * recipe.train.eval_batches * recipe.train.batch_size * T
    every_step = frozen * recipe.train.batch_size * T * 10 + (trunk_fwd + module_fwd + unembed_fwd) * val_tokens
    stored = every_step - trunk_fwd * recipe.train.batch_size * T * 6
    estimate = est._train(cell)
    assert estimate.seconds == pytest.approx(stored / (1e11 * cost.ASSUMED_MFU["cpu"]), rel=1e-12)
    assert "the trunk's forward on 4 of 10 steps" in estimate.basis
    # a later run of the same plan with the same frozen trunk and batches reads the states the first stored
    # (trunk_cache's key); estimating the first again does not count the later one's
    later = type("Cell", (), {"recipe": recipe, "run_dir": tmp_path / "later"})()
    shared = est._train(later)
    no_trunk = every_step - trunk_fwd * recipe.train.batch_size * T * 10
    assert shared.seconds == pytest.approx(no_trunk / (1e11 * cost.ASSUMED_MFU["cpu"]), rel=1e-12)
    assert "the trunk's forward on 0 of 10 steps (stored states, some stored by an earlier run of this plan)" \
        in shared.basis
    assert est._train(cell).seconds == estimate.seconds
    # the plan's cells in order, the first already trained (never estimated): its states are on disk
    planned = cost.Estimator(tmp_path, recipe, [cell, later])
    assert planned._train(later).seconds == pytest.approx(shared.seconds, rel=1e-12)
    assert cost.Estimator(tmp_path, recipe, [later, cell])._train(later).seconds == pytest.approx(estimate.seconds)
    recipe.train.data_seed = 7  # another data order: other batches, nothing shared
    other = type("Cell", (), {"recipe": recipe, "run_dir": tmp_path / "other"})()
    assert est._train(other).seconds == pytest.approx(estimate.seconds, rel=1e-12)
    recipe.train.data_seed = None
    recipe.train.trunk_cache = False
    assert est._train(cell).seconds == pytest.approx(every_step / (1e11 * cost.ASSUMED_MFU["cpu"]), rel=1e-12)

    model.mtp_cfg.draft_vocab = V // 4  # the module's unembedding over a quarter of the vocabulary's rows
    assert flops.flops_per_token(model, T) == trunk_fwd + 3 * module_fwd + 2 * unembed_fwd / 4
    assert flops.forward_flops_per_token(model, T) == trunk_fwd + module_fwd + unembed_fwd  # validation: all of it


def test_run_json_and_the_summary_carry_the_lambda_schedule(two_seeded_runs):
    """λ 0.3 dropping to 0.1 at half time: run.json and summary.csv say so, not just the starting 0.3."""
    from mtp_cli.results import folder as results

    a, _, _, _ = two_seeded_runs
    stored = json.loads((a / "run.json").read_text())
    assert (stored["lambda"], stored["lambda_final"], stored["lambda_switch"]) == (0.3, 0.1, 0.5)
    row = results.summary_row(results.RunFolder(a))
    assert (row["lambda"], row["lambda_final"]) == (0.3, 0.1)
