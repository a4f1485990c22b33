"""`mtp ablate`: the grid runs end to end, a second run redoes nothing, an interrupted training resumes
from its checkpoint (in-process Ctrl-C, and a real SIGKILL in the slow suite), a results folder is tied
to one recipe version, the dry run writes nothing, and bad input is one line with exit code 2."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import REPO, ablation_toml, cli_in_process, folder_snapshot

from mtp_cli import ablate
from mtp_cli.base.errors import UserError
from mtp_cli.grid import cells, lock, stages
from mtp_cli.grid import plan as grid_plan
from mtp_cli.results import folder as results

pytestmark = pytest.mark.usefixtures("single_thread")


mtp = cli_in_process


def test_grid_runs_every_stage_and_writes_one_summary_row_per_run(tiny_ablation):
    summary = pd.read_csv(tiny_ablation / results.SUMMARY)
    assert list(summary["run"]) == ["ntp-s0", "seq-d1-s0"]
    assert list(summary.columns[: len(results.COLUMNS)]) == [c.name for c in results.COLUMNS]
    assert set(summary["objective"]) == {"ntp", "sequential"}
    assert (summary["steps"] == 6).all() and summary["val_loss"].notna().all()
    seq = summary[summary["variant"] == "seq-d1"]
    assert seq["val_agree_1"].notna().all() and (seq["params_mtp"] > 0).all()
    # eval (trunk only) and specbench columns come from the stored JSON of those stages
    assert summary["heldout_loss"].notna().all() and summary["heldout_bpb"].notna().all()
    assert (summary["humaneval_n"] == 1).all() and (summary["gsm8k_n"] == 1).all()
    assert summary["humaneval_pass1_lo"].notna().all() and summary["gsm8k_strict_hi"].notna().all()
    assert seq["heldout_agree_1"].notna().all()
    assert bool(seq["spec_lossless"].iloc[0]) and seq["spec_mal"].iloc[0] >= 1.0
    assert seq["spec_speedup"].notna().all() and seq["greedy_tokens_per_s"].notna().all()
    ntp = summary[summary["variant"] == "ntp"]
    assert ntp["spec_speedup"].isna().all() and ntp["greedy_tokens_per_s"].notna().all()
    lock = results.read_lock(tiny_ablation)
    assert lock["recipe_name"] == "micro-abl" and [v["name"] for v in lock["recipe"]["variants"]] == ["ntp", "seq-d1"]
    assert not any(c.pending for c in grid_plan.plan(Path(lock["source"]), results_root=tiny_ablation.parent).cells)
    for run in results.run_folders(tiny_ablation):
        assert set(run.log["stages"]) == {"train", "export", "eval", "specbench"}
        assert set(run.eval["results"]) == {"heldout", "humaneval", "gsm8k"}
        assert (run.path / results.EXPORT / "model.safetensors").is_file()


def test_second_run_redoes_nothing(tiny_ablation, monkeypatch, capsys):
    source = Path(results.read_lock(tiny_ablation)["source"])
    before = folder_snapshot(tiny_ablation / results.RUNS)
    for name in stages.STAGE_FUNCS:  # any stage that runs again fails the test
        monkeypatch.setitem(stages.STAGE_FUNCS, name, lambda *a, _n=name: pytest.fail(f"{_n} ran again"))
    ab = ablate.run_ablation(source, results_root=tiny_ablation.parent, show_progress=False)
    assert all(not c.pending for c in ab.cells) and not ab.failures
    assert folder_snapshot(tiny_ablation / results.RUNS) == before
    assert "nothing to do: every stage of the" in capsys.readouterr().err


def test_dry_run_plans_and_estimates_without_writing(tmp_path, capsys):
    recipe = tmp_path / "fresh.toml"
    recipe.write_text(ablation_toml("fresh", seeds=(0, 1, 2)))
    code, out, err = mtp("ablate", "--recipe", recipe, "--dry-run", "--results-root", tmp_path / "res", capsys=capsys)
    assert code == 0, err
    assert not (tmp_path / "res").exists()
    for name in ("ntp-s0", "ntp-s2", "seq-d1-s1"):
        assert name in out
    assert "TFLOP" in out and "total" in out
    ab = grid_plan.plan(recipe, only="seq-d1", seeds=[1], results_root=tmp_path / "res")
    assert [c.name for c in ab.cells] == ["seq-d1-s1"] and ab.cells[0].pending[:2] == ["train", "export"]


def test_dry_run_uses_measured_times(tiny_ablation, capsys):
    source = Path(results.read_lock(tiny_ablation)["source"])
    ab = ablate.run_ablation(source, seeds=[0, 1, 7], dry_run=True, results_root=tiny_ablation.parent)
    pending = {c.name: c.pending for c in ab.cells}
    assert pending["ntp-s0"] == [] and pending["ntp-s7"][:2] == ["train", "export"]
    from mtp_cli.results.estimate import Estimator

    est = Estimator(ab.results_dir, ab.recipe)
    cell = next(c for c in ab.cells if c.name == "ntp-s7")
    assert "measured" in est.stage(cell, "export").basis


def test_interrupted_training_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    recipe_path = tmp_path / "resume.toml"
    recipe_path.write_text(ablation_toml("resume", seeds=(0,), steps=8, eval_tasks=(), specbench=False,
                                         variants='[[variants]]\nname = "ntp"\n'))
    ab = grid_plan.plan(recipe_path, results_root=tmp_path / "res")
    cell = ab.cells[0]

    # Interrupt the run in-process at step 5 (Ctrl-C): train() saves a checkpoint at step 5.
    import mtp_cli.train.loop as trainer

    real_lr = trainer.lr_at
    monkeypatch.setattr(
        trainer, "lr_at", lambda step, t: (_ for _ in ()).throw(KeyboardInterrupt) if step == 5 else real_lr(step, t)
    )
    lock.write_lock(ab)
    with pytest.raises(KeyboardInterrupt):
        trainer.train(cell.recipe, cell.run_dir, resume=True, show_progress=False)
    monkeypatch.setattr(trainer, "lr_at", real_lr)
    head = (cell.run_dir / "metrics.jsonl").read_text()
    assert json.loads(head.splitlines()[-1])["step"] == 5
    assert grid_plan.plan(recipe_path, results_root=tmp_path / "res").cells[0].pending[0] == "train"

    done = ablate.run_ablation(recipe_path, results_root=tmp_path / "res", show_progress=False)
    assert not done.failures and not done.cells[0].pending
    metrics = (cell.run_dir / "metrics.jsonl").read_text()
    assert metrics.startswith(head)  # steps 1-5 kept as they were: resumed, not restarted
    assert [json.loads(line)["step"] for line in metrics.splitlines() if '"train"' in line] == list(range(1, 9))

    # Same weights as an uninterrupted run of the same cell.
    from helpers import checkpoint_weights, max_state_diff

    fresh = tmp_path / "fresh"
    trainer.train(cell.recipe, fresh, show_progress=False)
    assert max_state_diff(checkpoint_weights(cell.run_dir), checkpoint_weights(fresh)) < 1e-6


@pytest.mark.slow
def test_killed_ablation_restarts_where_it_stopped(tmp_path):
    """SIGKILL the whole ablation mid-training of its second run; the restart keeps the first run's files
    untouched and resumes the second from its checkpoint."""
    recipe_path = tmp_path / "kill.toml"
    # 600 steps, the first checkpoint at 100: the kill lands while 500 steps (seconds) are left to run
    recipe_path.write_text(ablation_toml("kill", seeds=(0, 1), steps=600, eval_tasks=(), specbench=False,
                                         variants='[[variants]]\nname = "ntp"\n', ckpt_every=100))
    res = tmp_path / "res"
    cmd = [sys.executable, "-m", "mtp_cli", "ablate", "--recipe", str(recipe_path), "--results-root", str(res)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    second = res / "kill" / "runs" / "ntp-s1"
    deadline = time.time() + 240
    while not (second / "checkpoint.pt").is_file():
        assert proc.poll() is None and time.time() < deadline, "ablation ended before the kill"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = folder_snapshot(res / "kill" / "runs" / "ntp-s0")
    head = (second / "metrics.jsonl").read_text()
    step = json.loads(head.splitlines()[-1])["step"]
    assert step < 600
    rerun = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    assert folder_snapshot(res / "kill" / "runs" / "ntp-s0") == first
    lines = (second / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines if '"train"' in x] == list(range(1, 601))
    assert json.loads((second / "run.json").read_text())["status"] == "done"


def test_results_of_another_recipe_version_are_refused(tiny_ablation, tmp_path, capsys):
    source = Path(results.read_lock(tiny_ablation)["source"])
    changed = tmp_path / "micro-abl.toml"
    changed.write_text(source.read_text().replace("steps = 6", "steps = 7"))
    before = folder_snapshot(tiny_ablation)
    code, out, err = mtp("ablate", "--recipe", changed, "--results-root", tiny_ablation.parent, capsys=capsys)
    assert code == 2
    assert err.startswith("error:") and "another version of recipe micro-abl" in err and "--force" in err
    assert len(err.strip().splitlines()) == 1
    assert folder_snapshot(tiny_ablation) == before
    # The description is not part of the version.
    same = tmp_path / "same" / "micro-abl.toml"
    same.parent.mkdir()
    same.write_text(source.read_text().replace("micro ablation for the tests", "reworded"))
    assert not any(c.pending for c in ablate.run_ablation(same, dry_run=True, results_root=tiny_ablation.parent).cells)


def test_force_discards_a_stale_folder(tmp_path):
    res = tmp_path / "res" / "stale"
    (res / "runs" / "old-s0").mkdir(parents=True)
    (res / "runs" / "old-s0" / "run.json").write_text("{}")
    (res / "notes.txt").write_text("mine")
    recipe = tmp_path / "stale.toml"
    recipe.write_text(ablation_toml("stale", seeds=(0,), eval_tasks=(), specbench=False,
                                    variants='[[variants]]\nname = "ntp"\n'))
    with pytest.raises(UserError, match="runs without a recipe.lock.json"):
        ablate.run_ablation(recipe, dry_run=True, results_root=tmp_path / "res")
    ab = ablate.run_ablation(recipe, dry_run=True, force=True, results_root=tmp_path / "res")
    assert (res / "runs" / "old-s0").is_dir()  # a dry run discards nothing
    lock.discard(ab.results_dir)
    assert not (res / "runs").exists() and (res / "notes.txt").read_text() == "mine"


BAD_RECIPES = {
    "unknown top-level key": ("bogus = 1\n", "unknown key in recipe: bogus"),
    "unknown variant field": ('[[variants]]\nname = "a"\nobjective = "parallel"\n', "unknown key in variants[0]: objective"),
    "unknown key in a variant's override": ('[[variants]]\nname = "a"\nmtp = { heads = 4, bogus = 1 }\n',
                                            "unknown key in variant 'a': mtp: bogus"),
    "bad value in a variant's override": ('[[variants]]\nname = "a"\nmtp = { objective = "diagonal" }\n',
                                          "unknown objective 'diagonal'"),
    "duplicate variant name": ('[[variants]]\nname = "a"\n\n[[variants]]\nname = "a"\n', "variant name 'a' is used twice"),
    "variant without a name": ('[[variants]]\nmtp = { heads = 2 }\n', "every variant needs a name"),
    "unknown eval task": ("", "unknown eval task 'mmlu'"),
    "variant that sets its own seed": ('[[variants]]\nname = "a"\ntrain = { seed = 3 }\n',
                                       "variant 'a': the grid sets train.seed and train.data_seed"),
    "negative seed offset": ('[[variants]]\nname = "a"\ninit_seed_offset = -1\n',
                             "variant 'a': init_seed_offset must be >= 0"),
}


@pytest.mark.parametrize("case", list(BAD_RECIPES))
def test_bad_recipe_is_one_line_exit_2(case, tmp_path, capsys):
    snippet, message = BAD_RECIPES[case]
    text = ablation_toml("bad", variants=snippet) if snippet.startswith("[[") else ablation_toml("bad", extra=snippet)
    if case == "unknown eval task":
        text = text.replace('tasks = ["heldout"', 'tasks = ["mmlu"')
    recipe = tmp_path / "bad.toml"
    recipe.write_text(text)
    code, out, err = mtp("ablate", "--recipe", recipe, "--dry-run", "--results-root", tmp_path / "res", capsys=capsys)
    assert code == 2, (out, err)
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "res").exists()


def test_noise_floor_cells_pair_on_the_grid_seed(tmp_path):
    """init_seed_offset moves the initialisation only, data_seed_offset the data order only; plain variants
    keep data_seed unset (= the seed), so their run recipes are what they were before the two were apart."""
    variants = ('[[variants]]\nname = "ntp"\n\n[[variants]]\nname = "ntp-init"\ninit_seed_offset = 1000\n\n'
                '[[variants]]\nname = "ntp-data"\ndata_seed_offset = 7\n')
    recipe = tmp_path / "floor.toml"
    recipe.write_text(ablation_toml("floor", seeds=(0, 1), variants=variants))
    ab = grid_plan.plan(recipe, results_root=tmp_path / "res")
    seeds = {(c.variant.name, c.seed): (c.recipe.train.seed, c.recipe.train.data_seed, c.recipe.train.order_seed)
             for c in ab.cells}
    assert seeds == {("ntp", 0): (0, None, 0), ("ntp", 1): (1, None, 1),
                     ("ntp-init", 0): (1000, 0, 0), ("ntp-init", 1): (1001, 1, 1),
                     ("ntp-data", 0): (0, 7, 7), ("ntp-data", 1): (1, 8, 8)}
    assert {c.run_dir.name for c in ab.cells} >= {"ntp-init-s0", "ntp-data-s1"}  # folders named by the grid seed
    recipe.write_text(ablation_toml("floor", seeds=(0, 1), variants=variants, extra="").replace(
        "[train]\n", "[train]\ndata_seed = 5\n"))
    planned = grid_plan.plan(recipe, results_root=tmp_path / "r2")
    fixed = {(c.variant.name, c.seed): c.recipe.train.order_seed for c in planned.cells}
    assert fixed == {("ntp", 0): 5, ("ntp", 1): 5, ("ntp-init", 0): 5, ("ntp-init", 1): 5,
                     ("ntp-data", 0): 12, ("ntp-data", 1): 12}


def test_missing_gsm8k_data_stops_the_ablation_before_any_training(tmp_path, capsys):
    recipe = tmp_path / "no-gsm8k.toml"
    recipe.write_text(ablation_toml("no-gsm8k").replace(str(REPO / "tests" / "data" / "gsm8k"), str(tmp_path / "nowhere")))
    code, out, err = mtp("ablate", "--recipe", recipe, "--results-root", tmp_path / "res", capsys=capsys)
    assert code == 2, (out, err)
    assert "nowhere does not exist" in err and len(err.strip().splitlines()) == 1, err
    assert not list((tmp_path / "res").rglob("run.json"))


def test_only_naming_no_variant_and_bad_seeds(tmp_path, capsys):
    recipe = tmp_path / "ok.toml"
    recipe.write_text(ablation_toml("ok"))
    code, _, err = mtp("ablate", "--recipe", recipe, "--only", "seq-d9", "--dry-run", capsys=capsys)
    assert code == 2 and "--only seq-d9: no such variant in recipe ok (variants: ntp, seq-d1)" in err
    code, _, err = mtp("ablate", "--recipe", recipe, "--seeds", "0,x", "--dry-run", capsys=capsys)
    assert code == 2 and "--seeds expects comma-separated integers" in err
    code, _, err = mtp("ablate", "--recipe", tmp_path / "missing.toml", "--dry-run", capsys=capsys)
    assert code == 2 and "recipe not found" in err


def test_shipped_recipes_load_and_plan(tmp_path, monkeypatch):
    from mtp_cli.config.recipe import load_recipe, shipped_recipes
    from mtp_cli.model import gguf

    def wheel_missing(dist):
        raise importlib.metadata.PackageNotFoundError(dist)

    # a recipe on a wheel's model is refused at plan time, saying how to install it (this fast test
    # never dequantizes the real file; tests/test_gguf.py plans a short name on a tiny wheel)
    monkeypatch.setattr(importlib.metadata, "files", wheel_missing)

    assert {"quick", "depth", "cpu-small"} <= set(shipped_recipes())
    assert any(name.startswith("gpu-") for name in shipped_recipes())
    for name in shipped_recipes():
        recipe = load_recipe(name)
        if recipe.train.init_from in gguf.SHORT_NAMES:
            with pytest.raises(UserError, match="wheel is not installed; install it with make smollm2"):
                grid_plan.plan(name, results_root=tmp_path)
            continue
        ab = grid_plan.plan(name, results_root=tmp_path)
        assert len(ab.cells) == len(recipe.grid_variants()) * len(recipe.seeds)
    quick = load_recipe("quick")
    assert [v.name for v in quick.variants] == ["ntp", "parallel-n4", "seq-d1", "ntp-init"]
    runs = {v.name: quick.for_run(v, 0) for v in quick.variants}
    assert runs["parallel-n4"].mtp.heads == 4 and runs["parallel-n4"].mtp.compute_matched
    assert runs["seq-d1"].mtp.depth == 1 and runs["seq-d1"].mtp.lambda_at() == 0.3
    assert cells.gsm8k_data(quick) == REPO / "data" / "gsm8k"


def test_a_crashing_stage_costs_only_its_own_run(tiny_ablation, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "res" / tiny_ablation.name
    shutil.copytree(tiny_ablation, folder)
    (folder / "runs" / "ntp-s0" / "eval.json").unlink()
    (folder / "runs" / "seq-d1-s0" / "specbench.json").unlink()
    ran = []

    def boom(ab, cell, view):
        raise RuntimeError("boom")

    monkeypatch.setitem(stages.STAGE_FUNCS, "eval", boom)
    monkeypatch.setitem(stages.STAGE_FUNCS, "specbench", lambda ab, cell, view: ran.append(cell.name))
    source = results.read_lock(folder)["source"]
    code, out, err = mtp("ablate", "--recipe", source, "--results-root", tmp_path / "res", capsys=capsys)
    assert code == 1
    assert "ntp-s0: eval failed (RuntimeError: boom)" in err
    assert ran == ["seq-d1-s0"]  # ntp-s0's specbench waits for its eval; the other run went on
    assert "RuntimeError: boom" in (folder / "runs" / "ntp-s0" / "ablate.log").read_text()


@pytest.mark.slow
def test_torchrun_trains_the_grid_then_a_plain_ablate_finishes(tmp_path):
    recipe = tmp_path / "ddp.toml"
    recipe.write_text(ablation_toml("ddp", seeds=(0,), steps=4, eval_tasks=(), specbench=False))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    torchrun = Path(sys.executable).with_name("torchrun")
    first = subprocess.run([str(torchrun), "--nproc_per_node", "2", "-m", "mtp_cli", "ablate", "--recipe", str(recipe),
                            "--results-root", str(tmp_path / "res")], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    runs = tmp_path / "res" / "ddp" / "runs"
    for name in ("ntp-s0", "seq-d1-s0"):
        assert json.loads((runs / name / "run.json").read_text())["world_size"] == 2
        assert not (runs / name / "export").exists()  # torchrun runs the train stage only
    ab = ablate.run_ablation(recipe, results_root=tmp_path / "res", show_progress=False)
    assert not ab.failures and all(not c.pending for c in ab.cells)


def test_bad_input_found_inside_the_training_process_is_one_line_exit_2(tmp_path, capsys):
    recipe = tmp_path / "deep.toml"
    recipe.write_text(ablation_toml("deep", eval_tasks=(), specbench=False,
                                    variants='[[variants]]\nname = "par-n5"\nmtp = { objective = "parallel", heads = 5 }\n'))
    code, _, err = mtp("ablate", "--recipe", recipe, "--results-root", tmp_path / "res", capsys=capsys)
    errors = [line for line in err.splitlines() if line.startswith("error:")]  # below the grid's progress view
    assert code == 2 and len(errors) == 1 and "compute-matched parallel heads need n_layers >= heads" in errors[0]


def test_committed_results_without_checkpoints_or_exports_need_nothing(tiny_ablation, tmp_path):
    """What a fresh clone has (.gitignore drops checkpoints and exports): `mtp ablate` on it redoes nothing."""
    shutil.copytree(tiny_ablation, tmp_path / "res" / tiny_ablation.name,
                    ignore=shutil.ignore_patterns("checkpoint.pt", "export"))
    ab = grid_plan.plan(results.read_lock(tiny_ablation)["source"], results_root=tmp_path / "res")
    assert [c.pending for c in ab.cells] == [[], []]


def test_a_variant_can_switch_off_its_specbench(tmp_path):
    """A noise floor has no drafters to time: `specbench = { enabled = false }` on the variant leaves its
    runs without a specbench stage and the other variants' runs with one."""
    variants = ('[[variants]]\nname = "ntp"\n\n[[variants]]\nname = "ntp-init"\ninit_seed_offset = 1000\n'
                'specbench = { enabled = false }\n')
    recipe = tmp_path / "floor.toml"
    recipe.write_text(ablation_toml("floor", variants=variants))
    pending = {c.variant.name: c.pending for c in grid_plan.plan(recipe, results_root=tmp_path / "res").cells}
    assert pending == {"ntp": ["train", "export", "eval", "specbench"], "ntp-init": ["train", "export", "eval"]}


def test_specbench_seeds_time_only_those_seeds_runs(tmp_path):
    """`specbench.seeds = [0]`: every seed trains and evaluates, only seed 0's runs are timed."""
    recipe = tmp_path / "some.toml"
    recipe.write_text(ablation_toml("some", variants='[[variants]]\nname = "ntp"\nspecbench = { seeds = [0] }\n'))
    pending = {c.seed: c.pending for c in grid_plan.plan(recipe, seeds=[0, 1], results_root=tmp_path / "res").cells}
    assert pending == {0: ["train", "export", "eval", "specbench"], 1: ["train", "export", "eval"]}
    recipe.write_text(ablation_toml("some", variants='[[variants]]\nname = "ntp"\nspecbench = { seeds = 0 }\n'))
    with pytest.raises(UserError, match="specbench.seeds"):
        grid_plan.plan(recipe, results_root=tmp_path / "res2")

def test_a_recipe_that_extends_another_takes_its_tables_and_follows_its_changes(tmp_path):
    """`extends = "base"`: the base's tables with this file's keys over them; the fingerprint hashes the
    result, so editing the base is a new version of the extending recipe; a loop is refused."""
    from mtp_cli.base.errors import UserError
    from mtp_cli.config.recipe import load_recipe

    base = tmp_path / "base.toml"
    base.write_text(ablation_toml("base", seeds=(0,)))
    child = tmp_path / "child.toml"
    child.write_text(f'extends = "{base}"\nseeds = [0, 1, 2]\n[train]\nsteps = 9\n')
    recipe = load_recipe(child)
    assert (recipe.name, recipe.seeds, recipe.train.steps) == ("child", [0, 1, 2], 9)
    assert recipe.train.batch_size == load_recipe(base).train.batch_size and [v.name for v in recipe.variants] == [
        "ntp", "seq-d1"]
    before = cells.fingerprint(child)
    base.write_text(base.read_text().replace("batch_size = 4", "batch_size = 2"))
    assert cells.fingerprint(child) != before and load_recipe(child).train.batch_size == 2
    base.write_text(f'extends = "{child}"\n')
    with pytest.raises(UserError, match="extends .* back"):
        load_recipe(child)


def test_a_change_to_the_source_recipe_is_a_new_version_and_force_discards_the_source_run(tmp_path):
    """A recipe whose [source] trains a run of another recipe: editing that recipe changes this one's
    fingerprint (the committed source run and everything built on it are stale), and --force's discard
    removes the source run and the baseline with the runs."""
    base = tmp_path / "base.toml"
    base.write_text(ablation_toml("base", seeds=(0,)))
    posthoc = tmp_path / "posthoc.toml"
    posthoc.write_text(f'[source]\nrecipe = "{base}"\nvariant = "ntp"\n')
    before = cells.fingerprint(posthoc)
    base.write_text(base.read_text() + '\n[[variants]]\nname = "ntp-init"\ninit_seed_offset = 1000\n')
    assert cells.fingerprint(posthoc) == before  # another variant of the source recipe makes no source run
    base.write_text(base.read_text().replace("steps = 6", "steps = 7"))
    assert cells.fingerprint(posthoc) != before
    folder = tmp_path / "res" / "posthoc"
    for name in ("runs/a", "source/ntp-s0", "baseline", "plots"):
        (folder / name).mkdir(parents=True)
    (folder / "mine.txt").write_text("kept")
    lock.discard(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["mine.txt"]


@pytest.mark.parametrize("compile_", [None, True, False])
def test_the_specbench_stage_compiles_as_its_recipe_says(tmp_path, monkeypatch, compile_):
    import types

    import mtp_cli.bench.run as bench_run

    ab = grid_plan.plan("quick", results_root=tmp_path)
    cell = ab.cells[0]
    cell.recipe.specbench.compile = compile_
    seen = {}
    monkeypatch.setattr(bench_run, "run_specbench", lambda run_dir, cfg, rt, **kw: seen.update(rt=rt, cfg=cfg))
    stages.STAGE_FUNCS["specbench"](ab, cell, types.SimpleNamespace(show_nested=False))
    assert seen["rt"].compile is compile_ and seen["cfg"] is cell.recipe.specbench
    assert seen["rt"].device == cell.recipe.train.device


def test_the_training_child_logs_making_its_data_only_outside_a_terminal(monkeypatch):
    """`mtp ablate` trains in a child process whose training the view draws from metrics.jsonl. Making the
    data (a self-distilled corpus: minutes of generation) writes nothing there, so in a log file the child
    prints its own plain lines for it; in a terminal it stays quiet under the view's live bars."""
    import mtp_cli.train.loop as train
    from mtp_cli.base import ui
    from mtp_cli.config.recipe import Recipe

    calls, sent = [], []
    monkeypatch.setattr(train, "train", lambda *args, **kwargs: calls.append(kwargs))
    monkeypatch.setattr(stages, "_die_with_parent", lambda: None)
    pipe = types.SimpleNamespace(send=sent.append)
    for terminal in (False, True):
        monkeypatch.setattr(type(ui.console), "is_terminal", property(lambda self, t=terminal: t))
        stages._train_child(Recipe().to_dict(), "unused", Recipe().runtime(), pipe)
    assert sent == [("ok", ""), ("ok", "")]
    assert [(c["show_progress"], c["data_progress"]) for c in calls] == [(False, True), (False, False)]


def test_the_ablations_threads_reach_every_stage_by_value(tmp_path, monkeypatch):
    """`--threads` travels as the ablation's value to the training child and to eval's runtime, not through
    torch's global: with the global at 2, a grid asked for 1 thread trains and evaluates with 1 (the
    child's run.json records it). Control: asked for nothing, with the parent's global at 1, the child keeps
    torch's own default and eval's runtime leaves the threads alone."""

    from mtp_cli.ablate import run_ablation
    from mtp_cli.grid import stages

    seen = []
    real_runtime = stages.runtime
    monkeypatch.setattr(stages, "runtime",
                        lambda ab, recipe, stage: seen.append((stage, ab.threads)) or real_runtime(ab, recipe, stage))
    recipe = tmp_path / "threads.toml"
    recipe.write_text(ablation_toml("threads", steps=2, eval_tasks=("heldout",), specbench=False,
                                    variants='[[variants]]\nname = "ntp"\n'))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ab = run_ablation(recipe, results_root=tmp_path / "results", show_progress=False, threads=1)
    finally:
        torch.set_num_threads(before)
    assert not ab.failures, ab.failures
    run = json.loads((ab.results_dir / "runs" / "ntp-s0" / "run.json").read_text())
    assert run["env"]["torch_threads"] == 1 and seen == [("train", 1), ("eval", 1)]
    fresh = int(subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                               capture_output=True, text=True, check=True).stdout)
    if fresh == 1:
        pytest.skip("torch's default here is 1 thread: the control cannot tell it from the parent's")
    torch.set_num_threads(1)
    try:
        control = run_ablation(recipe, results_root=tmp_path / "control", show_progress=False)
    finally:
        torch.set_num_threads(before)
    run = json.loads((control.results_dir / "runs" / "ntp-s0" / "run.json").read_text())
    assert run["env"]["torch_threads"] == fresh and seen[-2:] == [("train", None), ("eval", None)]


def test_each_stage_takes_its_runtime_from_the_recipe():
    """One `Runtime` per stage, from the recipe and the command line's threads: the device is train.device
    everywhere, the compile switch the stage's own (train.compile, specbench.compile, eval's device default)."""
    from mtp_cli.base.errors import UserError
    from mtp_cli.config.recipe import Recipe

    r = Recipe()
    r.train.device, r.train.compile, r.specbench.compile = "cpu", True, False
    assert [(rt.device, rt.threads, rt.compile) for rt in (r.runtime("train", 3), r.runtime("eval", 3),
                                                           r.runtime("specbench"))] \
        == [("cpu", 3, True), ("cpu", 3, None), ("cpu", None, False)]
    with pytest.raises(UserError, match="--threads must be >= 1"):
        r.runtime("train", 0)


def test_training_runs_on_the_runtime_it_is_given(tmp_path):
    """`train(..., rt=...)` takes its threads from the value, not from torch's global: with the global at 2,
    rt.threads = 1 trains (and records) 1; control: without rt the run keeps the global's 2."""
    import torch

    from mtp_cli.config.recipe import Runtime
    from mtp_cli.train import loop as trainer

    before = torch.get_num_threads()
    try:
        recorded = []
        for name, rt in (("given", Runtime(device="cpu", threads=1)), ("control", None)):
            torch.set_num_threads(2)
            recipe = grid_plan.plan("quick", results_root=tmp_path).cells[0].recipe
            recipe.train.steps, recipe.train.eval_every, recipe.train.ckpt_every = 1, 1, 1
            trainer.train(recipe, tmp_path / name, show_progress=False, rt=rt)
            recorded.append(json.loads((tmp_path / name / "run.json").read_text())["env"]["torch_threads"])
    finally:
        torch.set_num_threads(before)
    assert recorded == [1, 2]
