"""`mtp ablate --launcher slurm` without a cluster: a fake sbatch/sacct/srun on PATH records what we submit
(partition, GPUs, time, dependencies, the torchrun line) and plays the queue's states back, so the
resubmit-only-what-is-missing logic and `--status` are checked; bad settings are one line, exit 2. The
slow tests run the grid through submitit's local executor: its results equal `--launcher local`'s to the
last digit, a killed job is resumed by the rerun, and a pre-empted training is requeued by submitit's
checkpoint hook and resumes from its checkpoint."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers import ablation_toml, checkpoint_weights, cli_in_process, max_state_diff

from mtp_cli import ablate
from mtp_cli.grid import cells, lock
from mtp_cli.grid import plan as grid_plan
from mtp_cli.results import folder as results

submitit = pytest.importorskip("submitit", reason="submitit not installed (pip install 'mtp[slurm]')")
from mtp_cli.launch import records as job_records  # noqa: E402
from mtp_cli.launch import status as launch_status  # noqa: E402
from mtp_cli.launch import submit  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")

FAKE_SBATCH = r'''
import json, os, pathlib, re, sys
state = pathlib.Path(os.environ["FAKE_SLURM"])
script = pathlib.Path(sys.argv[-1]).read_text()
bad = re.search(r"#SBATCH --partition=nope", script)
if bad:
    print("sbatch: error: invalid partition specified: nope", file=sys.stderr)
    sys.exit(1)
counter = state / "next"
n = int(counter.read_text()) if counter.exists() else 1000
counter.write_text(str(n + 1))
(state / f"job{n}.sh").write_text(script)
states_file = state / "states.json"
states = json.loads(states_file.read_text()) if states_file.exists() else {}
array = re.search(r"#SBATCH --array=0-(\d+)", script)
for job in ([f"{n}_{i}" for i in range(int(array.group(1)) + 1)] if array else [str(n)]):
    states[job] = "PENDING"
states_file.write_text(json.dumps(states))
print(f"Submitted batch job {n}")
'''
FAKE_SACCT = r'''
import json, os, pathlib, sys
state = pathlib.Path(os.environ["FAKE_SLURM"])
wanted = {sys.argv[i + 1] for i, a in enumerate(sys.argv) if a == "-j"}
states = json.loads((state / "states.json").read_text())
print("JobID|State|NodeList")
for job, s in states.items():
    if job.split("_")[0] in wanted:
        print(f"{job}|{s}|node1")
'''


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """A PATH with sbatch, sacct, srun, scontrol, scancel, squeue that keep their state in a folder."""
    bin_dir, state = tmp_path / "bin", tmp_path / "slurm-state"
    bin_dir.mkdir()
    state.mkdir()
    for name, body in {"sbatch": FAKE_SBATCH, "sacct": FAKE_SACCT}.items():
        (bin_dir / name).write_text(f"#!{sys.executable}\n{body}")
    for name in ("srun", "scontrol", "scancel", "squeue"):
        (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM", str(state))
    submitit.SlurmJob.watcher.clear()  # sacct answers are cached per job id across tests
    yield state
    submitit.SlurmJob.watcher.clear()


def set_states(state: Path, **by_job: str) -> None:
    states = json.loads((state / "states.json").read_text())
    states.update({job.removeprefix("j"): s for job, s in by_job.items()})
    (state / "states.json").write_text(json.dumps(states))
    submitit.SlurmJob.watcher.clear()


def scripts(state: Path) -> dict[str, str]:
    return {p.stem.removeprefix("job"): p.read_text() for p in sorted(state.glob("job*.sh"))}


LAUNCHER = {"kind": "slurm", "partition": "gpu", "account": "proj", "qos": "high", "time": "2:00:00", "nodes": 2,
            "gpus_per_node": 4, "cpus_per_task": 16, "mem": "200G", "sbatch": {"constraint": "h100"},
            "setup": ["module load cuda"]}


def _grid(tmp_path) -> Path:
    recipe = tmp_path / "grid.toml"
    recipe.write_text(ablation_toml("grid", eval_tasks=("heldout",)))
    return recipe


def test_sbatch_scripts_carry_the_settings_dependencies_and_torchrun(tmp_path, fake_slurm, monkeypatch, capsys):
    recipe = _grid(tmp_path)
    ab = ablate.run_ablation(recipe, results_root=tmp_path / "res", launcher=LAUNCHER, show_progress=False)
    out = capsys.readouterr().out
    subs = scripts(fake_slurm)
    assert list(subs) == ["1000", "1001", "1002", "1003", "1004"]  # one array of 2 trainings, then 2 × 2 jobs
    train = subs["1000"]
    for line in ("--partition=gpu", "--account=proj", "--qos=high", "--time=2:00:00", "--nodes=2",
                 "--gpus-per-node=4", "--ntasks-per-node=1", "--cpus-per-task=16", "--mem=200G",
                 "--constraint=h100", "--array=0-1%2", "--job-name=mtp-grid-train"):
        assert f"#SBATCH {line}\n" in train, line
    assert "module load cuda" in train and "srun" in train and "--dependency" not in train
    records = {cell.name: job_records.read_jobs(cell.run_dir) for cell in ab.cells}
    assert records["ntp-s0"]["train"]["job_id"] == "1000_0" and records["seq-d1-s0"]["train"]["job_id"] == "1000_1"
    for rec in records.values():
        for group in ("eval", "specbench"):
            body = subs[rec[group]["job_id"]]
            assert f"#SBATCH --dependency=afterok:{rec['train']['job_id']}\n" in body
            assert "#SBATCH --kill-on-invalid-dep=yes\n" in body
            assert "#SBATCH --nodes=1\n" in body and "#SBATCH --gpus-per-node=1\n" in body
            assert "--array" not in body and "#SBATCH --partition=gpu\n" in body
    assert "1000_0" in out and "1004" in out  # the job ids are printed
    # The torchrun line each node of the training runs, with the rendezvous from Slurm's environment.
    from submitit.core.utils import DelayedSubmission, JobPaths

    rec = records["seq-d1-s0"]["train"]
    job = DelayedSubmission.load(JobPaths(rec["folder"], rec["job_id"]).submitted_pickle).function
    lines = []
    for node in (0, 1):
        monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
        for key, value in {"SLURM_JOB_ID": "1001", "SLURM_ARRAY_JOB_ID": "1000", "SLURM_ARRAY_TASK_ID": "1",
                           "SLURM_JOB_NODELIST": "gpu-a[07-08]", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "2",
                           "SLURM_NODEID": str(node), "SLURM_PROCID": str(node), "SLURM_LOCALID": "0"}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("MASTER_PORT", raising=False)
        lines.append(job.torchrun_command())
    for node, cmd in enumerate(lines):
        text = " ".join(cmd)
        assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
        assert f"--nproc_per_node 4 --nnodes 2 --node_rank {node} --master_addr gpu-a07 --master_port" in text
        assert text.endswith(f"-m mtp_cli.launch.worker {Path(rec['folder']).parent / 'cells' / 'seq-d1-s0.json'}")
    port = lambda cmd: int(cmd[cmd.index("--master_port") + 1])  # noqa: E731
    assert port(lines[0]) == port(lines[1]) and 20000 <= port(lines[0]) <= 60000  # both nodes meet there
    spec = json.loads((Path(rec["folder"]).parent / "cells" / "seq-d1-s0.json").read_text())
    assert spec["recipe"]["mtp"]["objective"] == "sequential" and spec["run_dir"] == str(ab.cells[1].run_dir)


def test_rerun_submits_only_what_is_missing_and_not_queued(tmp_path, fake_slurm, capsys):
    recipe = _grid(tmp_path)
    kw = dict(results_root=tmp_path / "res", launcher=LAUNCHER, show_progress=False)
    ablate.run_ablation(recipe, **kw)
    assert len(scripts(fake_slurm)) == 5
    ablate.run_ablation(recipe, **kw)  # everything is queued: nothing goes out again
    assert len(scripts(fake_slurm)) == 5
    assert "not submitted again" in capsys.readouterr().err
    # ntp's training runs; seq-d1's failed, so Slurm cancelled the jobs waiting on it
    set_states(fake_slurm, j1000_0="RUNNING", j1000_1="FAILED", j1003="CANCELLED by 0", j1004="CANCELLED by 0")
    ab = ablate.run_ablation(recipe, **kw)
    subs = scripts(fake_slurm)
    assert list(subs)[5:] == ["1005", "1006", "1007"]
    assert "--array" not in subs["1005"] and "#SBATCH --nodes=2\n" in subs["1005"]
    assert "#SBATCH --dependency=afterok:1005\n" in subs["1006"] and "#SBATCH --dependency=afterok:1005\n" in subs["1007"]
    seq = job_records.read_jobs(ab.cells[1].run_dir)
    assert {g: r["job_id"] for g, r in seq.items()} == {"train": "1005", "eval": "1006", "specbench": "1007"}
    assert job_records.read_jobs(ab.cells[0].run_dir)["train"]["job_id"] == "1000_0"
    # A timed-out training goes out again, and so do its eval/specbench, cancelled with it (kill-on-invalid-dep).
    set_states(fake_slurm, j1000_0="TIMEOUT", j1001="CANCELLED", j1002="CANCELLED")
    ablate.run_ablation(recipe, **kw)
    new = list(scripts(fake_slurm))[8:]
    assert len(new) == 3 and f"afterok:{new[0]}" in scripts(fake_slurm)[new[1]]


def test_status_lists_every_stage_with_its_state_and_the_log_tail(tmp_path, fake_slurm, capsys):
    recipe = _grid(tmp_path)
    ab = ablate.run_ablation(recipe, results_root=tmp_path / "res", launcher=LAUNCHER, show_progress=False)
    set_states(fake_slurm, j1000_0="RUNNING", j1000_1="OUT_OF_MEMORY", j1003="CANCELLED", j1004="CANCELLED")
    failed = job_records.read_jobs(ab.cells[1].run_dir)["train"]
    Path(failed["stderr"]).parent.mkdir(parents=True, exist_ok=True)
    Path(failed["stderr"]).write_text("loading\nslurmstepd: error: Detected 1 oom-kill event(s)\n")
    rows = launch_status.grid_status(grid_plan.plan(recipe, results_root=tmp_path / "res"))
    by = {(r.run, r.stage): r for r in rows}
    assert by[("ntp-s0", "train")].state == "running" and by[("ntp-s0", "eval")].state == "queued"
    assert by[("ntp-s0", "export")].job_id == by[("ntp-s0", "eval")].job_id == "1001"
    assert by[("seq-d1-s0", "train")].state == "failed" and "oom-kill" in by[("seq-d1-s0", "train")].detail
    assert by[("seq-d1-s0", "specbench")].state == "failed"
    code, out, err = cli_in_process("ablate", "--status", recipe, "--results-root", tmp_path / "res", capsys=capsys)
    assert code == 0, err
    assert "oom-kill" in out and "running" in out and "queued" in out and "1000_1" in out


def test_bad_launcher_input_is_one_line_exit_2(tmp_path, fake_slurm, monkeypatch, capsys):
    recipe = _grid(tmp_path)
    res = ["--results-root", tmp_path / "res"]
    cases = [
        (["--launcher", "pbs"], "unknown launcher 'pbs'"),
        (["--launcher", "slurm", "--partition", "nope"], "sbatch rejected the training jobs of ntp-s0, seq-d1-s0: "
                                                         "sbatch: error: invalid partition specified: nope"),
        (["--launcher", "slurm", "--time", "soon"], "launcher time 'soon' is not a Slurm time limit"),
        (["--launcher", "slurm", "--sbatch", "constraint"], "--sbatch expects KEY=VALUE"),
        (["--wait"], "--wait follows submitted jobs"),
    ]
    for args, message in cases:
        code, out, err = cli_in_process("ablate", "--recipe", recipe, *args, *res, capsys=capsys)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (args, err)
    assert not list((tmp_path / "res").rglob("jobs.json"))
    monkeypatch.setitem(sys.modules, "submitit", None)  # as if not installed
    code, _, err = cli_in_process("ablate", "--recipe", recipe, "--launcher", "slurm", *res, capsys=capsys)
    assert code == 2 and "pip install submitit" in err and len(err.strip().splitlines()) == 1, err
    monkeypatch.undo()
    monkeypatch.setenv("PATH", "/nonexistent")
    code, _, err = cli_in_process("ablate", "--recipe", recipe, "--launcher", "slurm", *res, capsys=capsys)
    assert code == 2 and "srun not found" in err and len(err.strip().splitlines()) == 1, err


def test_launcher_and_track_do_not_change_the_recipe_version(tmp_path):
    plain = tmp_path / "a.toml"
    plain.write_text(ablation_toml("v"))
    with_launcher = tmp_path / "b.toml"
    with_launcher.write_text(ablation_toml("v", extra='[launcher]\nkind = "slurm"\npartition = "gpu"\n')
                             .replace("peak_flops = 1e11", 'peak_flops = 1e11\ntrack = "tensorboard"'))
    assert cells.fingerprint(plain) == cells.fingerprint(with_launcher)
    assert grid_plan.plan(with_launcher).recipe.launcher.partition == "gpu"


def test_missing_runs_names_what_the_folder_lacks(tiny_ablation, tmp_path):
    assert results.missing_runs(tiny_ablation) == []
    import shutil

    folder = tmp_path / tiny_ablation.name
    shutil.copytree(tiny_ablation, folder, ignore=shutil.ignore_patterns("checkpoint.pt", "export"))
    (folder / "runs" / "seq-d1-s0" / "specbench.json").unlink()
    shutil.rmtree(folder / "runs" / "ntp-s0")
    assert results.missing_runs(folder) == [("ntp-s0", ["train", "export", "eval", "specbench"]),
                                                  ("seq-d1-s0", ["export", "specbench"])]  # no export copied
    assert results.missing_runs(tmp_path / "nowhere") == []


# ---- submitit's local executor: real jobs on this machine -------------------------------------------------
TIMING = {"step_time_s", "tokens_per_s", "mfu", "seconds", "finished", "started", "created", "timestamp", "wall_seconds",
          "peak_memory_mb_per_rank", "peak_note"}  # the clock, the load, the process's memory


def _strip(obj):
    """A stored JSON document without what depends on the clock or the machine's load."""
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in TIMING and not k.endswith(("_s", "_ms", "per_s"))
                and k not in ("throughput", "env", "hardware", "speedup", "ideal_speedup", "launcher", "git_commit")}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _local_executor(ab_recipe, root, **kw):
    ab = grid_plan.plan(ab_recipe, results_root=root)
    lock.check_lock(ab, False)
    lock.write_lock(ab)
    settings = grid_plan.launch_settings(ab, {"kind": "slurm", "gpus_per_node": 0, **kw}, None, False)
    return submit.submit_ablation(ab, settings, wait=True, show_progress=False, cluster="local", poll_s=0.5)


@pytest.mark.slow
def test_local_executor_grid_equals_the_local_launcher(tiny_ablation, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the jobs' torch threads, as the local ablation's
    source = Path(results.read_lock(tiny_ablation)["source"])
    ab = _local_executor(source, tmp_path / "res")
    assert not ab.failures, ab.failures
    mine = ab.results_dir
    files = lambda d: sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()  # noqa: E731
                             and "slurm" not in p.relative_to(d).parts and p.name != job_records.JOBS_JSON)
    assert files(mine) == files(tiny_ablation)
    for run in ("ntp-s0", "seq-d1-s0"):
        a, b = tiny_ablation / "runs" / run, mine / "runs" / run
        assert max_state_diff(checkpoint_weights(a), checkpoint_weights(b)) == 0.0
        rows = lambda d: [_strip(json.loads(x)) for x in (d / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
        assert rows(a) == rows(b)
        for name in ("run.json", "eval.json"):  # (paths inside name the results folder)
            docs = [_strip(json.loads((d / name).read_text().replace(str(root), "ROOT")))
                    for d, root in ((a, tiny_ablation), (b, mine))]
            assert docs[0] == docs[1], name
        spec_a, spec_b = (results.spec_batches(json.loads((d / "specbench.json").read_text()))[1] for d in (a, b))
        for method in spec_a:
            for key in ("lossless", "acceptance_rate", "mean_acceptance_length", "per_position_acceptance", "tokens"):
                assert spec_a[method].get(key) == spec_b[method].get(key), (run, method, key)
        assert (a / "export" / "model.safetensors").read_bytes() == (b / "export" / "model.safetensors").read_bytes()
    summary_a, summary_b = pd.read_csv(tiny_ablation / results.SUMMARY), pd.read_csv(mine / results.SUMMARY)
    same = [c for c in summary_a.columns if not any(t in c for t in ("_s", "tokens_per_s", "mfu", "speedup", "memory"))]
    pd.testing.assert_frame_equal(summary_a[same], summary_b[same])


def _submit_until_first_checkpoint(tmp_path, name: str):
    """A one-variant grid submitted through the local executor in the background, once its training job
    has written its first checkpoint: (plan, run folder, training job record, the submission's thread)."""
    recipe = tmp_path / f"{name}.toml"
    recipe.write_text(ablation_toml(name, steps=STEPS, eval_tasks=(), specbench=False, ckpt_every=100,
                                    variants='[[variants]]\nname = "ntp"\n'))
    ab = grid_plan.plan(recipe, results_root=tmp_path / "res")
    lock.write_lock(ab)
    settings = grid_plan.launch_settings(ab, {"kind": "slurm", "gpus_per_node": 0}, None, False)
    submission = _in_background(submit.submit_ablation, ab, settings, show_progress=False, cluster="local", poll_s=0.2)
    run = ab.cells[0].run_dir
    while "train" not in job_records.read_jobs(run):
        time.sleep(0.1)
    job = job_records.read_jobs(run)["train"]
    deadline = time.time() + 300
    while not (run / "checkpoint.pt").is_file():
        assert time.time() < deadline and job_records.job_state(job) == "running"
        time.sleep(0.2)
    return ab, run, job, submission


@pytest.mark.slow
def test_a_killed_training_job_is_resumed_by_the_rerun(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ab, run, job, submission = _submit_until_first_checkpoint(tmp_path, "kill")
    _kill_tree(int(job["job_id"]))  # the job controller and everything under it, as a node failure would
    deadline = time.time() + 30
    while job_records.job_state(job) == "running":
        assert time.time() < deadline
        time.sleep(0.2)
    head = (run / "metrics.jsonl").read_text()
    step = json.loads(head.splitlines()[-1])["step"]
    assert step < STEPS and job_records.job_state(job) == "failed"
    submission.join(60)  # it followed the training (no dependencies here) and stops with it
    assert not submission.is_alive()
    row = launch_status.grid_status(grid_plan.plan(ab.source, results_root=tmp_path / "res"))[0]
    assert (row.stage, row.state, row.job_id) == ("train", "failed", job["job_id"])
    ab = _local_executor(ab.source, tmp_path / "res")
    assert not ab.failures, ab.failures
    assert job_records.read_jobs(run)["train"]["job_id"] != job["job_id"]
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines if '"train"' in x] == list(range(1, STEPS + 1))
    assert json.loads((run / "run.json").read_text())["status"] == "done"
    # resumed, not restarted: the rows up to the checkpoint that existed at the kill are kept as they were
    kept = "".join(line + "\n" for line in head.splitlines() if json.loads(line)["step"] <= 100)
    assert (run / "metrics.jsonl").read_text().startswith(kept)


def _in_background(func, *args, **kwargs):
    """func (a submission that follows its jobs) in a thread, so the test can act on the job meanwhile."""
    import threading

    thread = threading.Thread(target=func, args=args, kwargs=kwargs, daemon=True)
    thread.start()
    return thread


STEPS = 2000  # micro steps take milliseconds: the signal must land while most of the training is left


def _kill_tree(pid: int) -> None:
    """SIGKILL a process and every descendant (the job controller, its task, torchrun, the trainer)."""
    import contextlib

    with contextlib.suppress(ProcessLookupError, FileNotFoundError):
        os.kill(pid, signal.SIGSTOP)  # frozen, it starts nothing new while its children go
        for kid in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            _kill_tree(int(kid))
        os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_preempted_training_is_requeued_and_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    """Slurm's pre-emption warning (USR2, as `--signal` sends it) reaches the job: submitit calls our
    checkpoint(), which stops torchrun, and requeues the job (the local executor restarts it in place);
    the training goes on from its last checkpoint."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ab, run, job, submission = _submit_until_first_checkpoint(tmp_path, "pre")
    controller = int(job["job_id"])
    (task,) = [int(x) for x in Path(f"/proc/{controller}/task/{controller}/children").read_text().split()]
    os.kill(task, signal.SIGUSR2)
    deadline = time.time() + 600
    while job_records.job_state(job) == "running":
        assert time.time() < deadline
        time.sleep(0.5)
    assert job_records.job_state(job) == "completed"
    submission.join(300)
    log = Path(job["stderr"]).read_text() + Path(job["stdout"]).read_text()
    assert "Requeued job" in log and "preempted" in log
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(1, STEPS + 1))
    assert json.loads((run / "run.json").read_text())["status"] == "done"
    fresh = tmp_path / "fresh"
    from mtp_cli.train.loop import train

    train(ab.cells[0].recipe, fresh, show_progress=False)
    assert max_state_diff(checkpoint_weights(run), checkpoint_weights(fresh)) < 1e-6
