"""Guards `mtp train` as a user meets it, through the real entry point (`python -m mtp_cli` in a fresh
process): every bad input gives one line on stderr, exit code 2, and leaves the existing run folder
byte-for-byte as it was; a NaN stop keeps the last good checkpoint; and the design card's call
`mtp train --depth 1 --lambda 0.3` works as typed (sequential objective, default folder under runs/).

Every bad input runs through `mtp_cli.cli.main` in-process (fast); two of them and the as-typed call also
run as real processes (`python -m mtp_cli`, the `mtp` script), concurrently, once per module.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from helpers import REPO, cli_in_process, folder_snapshot, micro_recipe, recipe_toml, write_recipe

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def corrupt(run: Path) -> None:
    (run / "checkpoint.pt").write_bytes(b"this is not a checkpoint")


def truncate(run: Path) -> None:
    data = (run / "checkpoint.pt").read_bytes()
    (run / "checkpoint.pt").write_bytes(data[: len(data) // 2])


def foreign_checkpoint(run: Path) -> None:
    """A readable checkpoint of a different model (d_model 64) dropped into the run folder."""
    from mtp_cli.model import MTPModel
    from mtp_cli.model import checkpoint as ckpt

    other = micro_recipe("ntp")
    other.model.d_model = 64
    ckpt.save_checkpoint(run, MTPModel(other.model, other.mtp), None, 1, micro_recipe("ntp"))


def bad_key_recipe(folder: Path) -> None:
    text = recipe_toml(micro_recipe("ntp", steps=2)).replace("[train]\n", "[train]\nstepz = 3\n")
    (folder / "bad-key.toml").write_text(text)


def bad_toml(folder: Path) -> None:
    (folder / "bad.toml").write_text("[model\nd_model = 32\n")


def foreign_files(folder: Path) -> None:
    (folder / "notes").mkdir()
    (folder / "notes" / "todo.txt").write_text("my notes")


# name -> (arguments, regex the one error line must match, preparation of the case's folder)
# {run}: a copy of a finished 2-step run (recipe {recipe}); {dir}: the case's own folder.
BAD_INPUT = {
    "unknown-objective": (["--objective", "foo"], r"unknown objective 'foo'", None),
    "depth-0": (["--objective", "sequential", "--depth", "0"], r"--depth must be >= 1", None),
    "depth-0-implied-sequential": (["--depth", "0"], r"--depth must be >= 1", None),
    "negative-lambda": (["--depth", "1", "--lambda", "-0.5"], r"lambda must be a finite number >= 0", None),
    "nan-lambda": (["--depth", "1", "--lambda", "nan"], r"lambda must be a finite number >= 0, got nan", None),
    "negative-lambda-final": (["--depth", "1", "--lambda-final=-1"], r"lambda_final must be a finite number >= 0", None),
    "inf-lr": (["--lr", "inf"], r"train.lr must be a finite number > 0", None),
    "depth-with-heads": (
        ["--depth", "1", "--heads", "4"],
        r"--depth \(sequential MTP\) and --heads \(parallel heads\) cannot be used together",
        None,
    ),
    "depth-with-ntp": (
        ["--objective", "ntp", "--depth", "2", "--lambda", "0.3"],
        r"--depth and --lambda cannot be used with the ntp objective",
        None,
    ),
    "heads-with-sequential": (
        ["--objective", "sequential", "--heads", "3"],
        r"--heads cannot be used with the sequential objective",
        None,
    ),
    "resume-of-nothing": (
        ["--resume", "--out", "{dir}/nothing-here"],
        r"--resume: .*nothing-here holds no run to continue",
        None,
    ),
    "corpus-smaller-than-a-window": (
        ["--data", "{dir}/tiny.py", "--out", "{dir}/fresh"],
        r"split has \d+ tokens, fewer than one window of context \+ 1 = 33",
        lambda d: (d / "tiny.py").write_text("x = 1\n"),
    ),
    "depth-not-below-context": (["--depth", "32"], r"32 extra predictions per position need model.context > 32", None),
    "one-parallel-head": (["--objective", "parallel", "--heads", "1"], r"--heads must be >= 2", None),
    "unknown-recipe-key": (["--recipe", "{dir}/bad-key.toml"], r"unknown key in train: stepz", bad_key_recipe),
    "recipe-not-toml": (["--recipe", "{dir}/bad.toml"], r"not valid TOML", bad_toml),
    "recipe-not-found": (["--recipe", "{dir}/nope.toml"], r"recipe not found", None),
    "missing-data-path": (["--data", "{dir}/no/such/file.py"], r"data path not found: .*no/such/file\.py", None),
    "markup-in-path": (["--data", "{dir}/x[/bold]y[red]z"], r"data path not found: .*x\[/bold\]y\[red\]z$", None),
    "run-exists-no-resume": ([], r"already holds a run; pass --resume .* or --force", None),
    "different-run-on-resume": (
        ["--depth", "1", "--resume"],
        r"holds a different run \(mtp\.objective 'ntp' -> 'sequential'\)",
        None,
    ),
    "different-train-on-resume": (["--lr", "0.1", "--resume"], r"holds a different run \(train\.lr 0\.003 -> 0\.1\)", None),
    "corrupt-checkpoint": (["--resume"], r"checkpoint .* is corrupt", lambda d: corrupt(d / "run")),
    "truncated-checkpoint": (["--resume"], r"checkpoint .* is corrupt", lambda d: truncate(d / "run")),
    "checkpoint-of-another-model": (["--resume"], r"checkpoint .* does not match", lambda d: foreign_checkpoint(d / "run")),
    "folder-holds-no-run": (["--out", "{dir}/notes"], r"not empty and holds no run", foreign_files),
    "cuda-without-cuda": (["--device", "cuda"], r"CUDA is not available", None),
    # a newcomer's findings: silent nonsense refused up front, and what used to be tracebacks
    "negative-grad-clip": (["--recipe", "{dir}/r.toml"], r"train.grad_clip must be a finite number >= 0",
                           lambda d: edited_recipe(d, "train", grad_clip=-1.0)),
    "negative-norm-eps": (["--recipe", "{dir}/r.toml"], r"model.norm_eps must be a finite number > 0",
                          lambda d: edited_recipe(d, "model", norm_eps=-1.0)),
    "nan-rope-theta": (["--recipe", "{dir}/r.toml"], r"model.rope_theta must be a finite number > 0, got nan",
                       lambda d: edited_recipe(d, "model", rope_theta=float("nan"))),
    "beta1-above-one": (["--recipe", "{dir}/r.toml"], r"train.beta1 must be in \[0, 1\), got 1.5",
                        lambda d: edited_recipe(d, "train", beta1=1.5)),
    "empty-recipe": (["--recipe", "{dir}/empty.toml"], r"has no \[model\] table.* `extends = \"quick\"`",
                     lambda d: (d / "empty.toml").write_text("")),
    "scalar-for-a-table": (["--recipe", "{dir}/r.toml"], r"model.rope_scaling: expected a table, got 3",
                           lambda d: edited_recipe(d, "model", rope_scaling=3)),
    "rope-factor-a-string": (["--recipe", "{dir}/r.toml"], r"model.rope_scaling.factor must be a finite number > 0",
                             lambda d: edited_recipe(d, "model", rope_scaling={"rope_type": "linear", "factor": "x"})),
    "seed-beyond-64-bits": (["--seed", str(2**80)], r"train.seed \(--seed\) must be in \[0, 2\*\*63\)", None),
    "steps-beyond-reason": (["--steps", str(2**70), "--out", "{dir}/fresh"], r"train.steps must be at most 10\*\*9", None),
    "batch-beyond-memory": (["--batch-size", str(10**7), "--out", "{dir}/fresh"], r"GiB for its logits alone", None),
    "data-a-fifo": (["--data", "{dir}/fifo", "--out", "{dir}/fresh"], r"is not a regular file or a folder",
                    lambda d: os.mkfifo(d / "fifo")),
    "data-a-device": (["--data", "/dev/zero", "--out", "{dir}/fresh"], r"/dev/zero is not a regular file or a folder", None),
    "run-json-a-list": (["--resume"], r"run.json is not a JSON object", lambda d: (d / "run" / "run.json").write_text("[]")),
}


def edited_recipe(folder: Path, section: str, **values) -> None:
    """The micro recipe with `values` set in `section`, as a file (no validation on the way)."""
    recipe = micro_recipe("ntp", steps=2)
    for key, value in values.items():
        setattr(getattr(recipe, section), key, value)
    (folder / "r.toml").write_text(recipe_toml(recipe))



SUBPROCESS_CASES = ("unknown-objective", "corrupt-checkpoint")


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # tiny models; a second thread only waits on a busy core
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """A finished 2-step NTP run and its recipe file."""
    from mtp_cli.train.loop import train

    root = tmp_path_factory.mktemp("cli-base")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    recipe = write_recipe(micro_recipe("ntp", steps=2), root / "micro.toml")
    train(micro_recipe("ntp", steps=2), root / "run", show_progress=False)
    torch.set_num_threads(threads)
    return root / "run", recipe


def prepare_case(name: str, folder: Path, base_run) -> list[str]:
    """The case's folder (a copy of the base run under run/, plus its preparation) and its argv."""
    base, recipe = base_run
    args, _, prepare = BAD_INPUT[name]
    shutil.copytree(base, folder / "run")
    if prepare:
        prepare(folder)
    argv = [a.format(run=folder / "run", dir=folder) for a in args]
    if "--recipe" not in argv:
        argv += ["--recipe", str(recipe)]
    if "--out" not in argv:
        argv += ["--out", str(folder / "run")]
    return ["train", *argv]


@pytest.fixture(scope="module")
def cli(tmp_path_factory, base_run):
    """Real processes, run concurrently: two bad inputs and the as-typed call."""
    root = tmp_path_factory.mktemp("cli")
    _, recipe = base_run
    jobs, snapshots, folders = {}, {}, {}
    for name in SUBPROCESS_CASES:
        folders[name] = root / name
        argv = prepare_case(name, folders[name], base_run)
        snapshots[name] = folder_snapshot(folders[name])
        jobs[name] = ([sys.executable, "-m", "mtp_cli", *argv], folders[name])
    (root / "as-typed").mkdir()
    folders["as-typed"] = root / "as-typed"
    jobs["as-typed"] = ([str(REPO / ".venv" / "bin" / "mtp"), "train", "--recipe", str(recipe),
                         "--depth", "1", "--lambda", "0.3", "--steps", "2"], root / "as-typed")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(_run, cmd, cwd) for name, (cmd, cwd) in jobs.items()}
        results = {name: f.result() for name, f in futures.items()}
    return {"results": results, "snapshots": snapshots, "folders": folders}


STATUS = "data: "  # what data preparation says it is doing before the work (not part of any error)


def error_lines(text: str) -> list[str]:
    return [ANSI.sub("", line) for line in text.splitlines() if line.strip() and not line.startswith(STATUS)]


def check_one_line_error(code, stderr: str, pattern: str) -> None:
    lines = error_lines(stderr)
    assert code == 2, stderr
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), lines[0]
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in stderr


@pytest.mark.parametrize("name", BAD_INPUT)
def test_bad_input_one_line_exit_2_nothing_lost(name, tmp_path, base_run, monkeypatch, capsys, single_thread):
    """Every case through `mtp_cli.cli.main` in this process (the CLI's own parsing and error path)."""
    from mtp_cli import cli as cli_module

    argv = prepare_case(name, tmp_path, base_run)
    before = folder_snapshot(tmp_path)
    monkeypatch.setattr(sys, "argv", ["mtp", *argv])
    with pytest.raises(SystemExit) as exit_info:
        cli_module.main()
    check_one_line_error(exit_info.value.code, capsys.readouterr().err, BAD_INPUT[name][1])
    assert folder_snapshot(tmp_path) == before, "the existing run folder changed"


@pytest.mark.parametrize("name", SUBPROCESS_CASES)
def test_bad_input_from_a_real_process(cli, name):
    result = cli["results"][name]
    check_one_line_error(result.returncode, result.stderr, BAD_INPUT[name][1])
    assert folder_snapshot(cli["folders"][name]) == cli["snapshots"][name], "the existing run folder changed"


def test_design_card_call_works_as_typed(cli):
    """`mtp train --depth 1 --lambda 0.3` picks the sequential objective and a default folder under runs/."""
    result = cli["results"]["as-typed"]
    assert result.returncode == 0, result.stderr
    run = cli["folders"]["as-typed"] / "runs" / "micro-sequential-d1-lam0.3-s0"
    info = json.loads((run / "run.json").read_text())
    assert info["objective"] == "sequential" and info["status"] == "done" and info["step"] == 2
    assert info["recipe"]["mtp"]["depth"] == 1 and info["recipe"]["mtp"]["lambda"] == 0.3
    assert (run / "checkpoint.pt").is_file()
    assert "run saved to runs/micro-sequential-d1-lam0.3-s0" in result.stdout


def test_heads_flag_picks_parallel(base_run, tmp_path, monkeypatch, single_thread):
    from mtp_cli import cli as cli_module

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["mtp", "train", "--recipe", str(base_run[1]), "--heads", "2", "--steps", "1"])
    cli_module.main()
    info = json.loads((tmp_path / "runs" / "micro-parallel-n2-lam1-s0" / "run.json").read_text())
    assert info["objective"] == "parallel" and info["recipe"]["mtp"]["heads"] == 2


def test_resume_continues_with_the_runs_own_recipe(tmp_path, monkeypatch, capsys, single_thread):
    """`mtp train --out RUN --resume`, no other flag: the run's own recipe and step count (a 4-step
    sequential run stopped at step 2 ends at step 4 — not the quick recipe's 80, not a settings error)."""
    from mtp_cli.train import loop as trainer

    recipe = micro_recipe("sequential", steps=4, depth=1)
    real = trainer.lr_at

    def stop_at_2(step, cfg):
        if step == 2:
            raise KeyboardInterrupt
        return real(step, cfg)

    monkeypatch.setattr(trainer, "lr_at", stop_at_2)
    with pytest.raises(KeyboardInterrupt):
        trainer.train(recipe, tmp_path / "run", show_progress=False)
    monkeypatch.setattr(trainer, "lr_at", real)
    code, out, err = cli_in_process("train", "--out", tmp_path / "run", "--resume", capsys=capsys)
    assert code == 0, err
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["status"] == "done" and info["step"] == 4 and info["objective"] == "sequential"
    code, _, err = cli_in_process("train", "--out", tmp_path / "run", "--resume", "--steps", "6", capsys=capsys)
    assert code == 0, err  # a flag the run allows to change on resume: train longer
    assert json.loads((tmp_path / "run" / "run.json").read_text())["step"] == 6


def test_nan_stops_with_one_line_and_keeps_last_good_checkpoint(tmp_path, monkeypatch, capsys, single_thread):
    """lr = 1e6 blows the model up within a few steps: exit 2, one error line, checkpoint of the step before."""
    from mtp_cli import cli as cli_module

    recipe = micro_recipe("ntp", steps=6)
    recipe.train.ckpt_every = 1
    recipe.train.warmup = 0
    write_recipe(recipe, tmp_path / "nan.toml")
    monkeypatch.setattr(sys, "argv", ["mtp", "train", "--recipe", str(tmp_path / "nan.toml"), "--lr", "1e6",
                                      "--out", str(tmp_path / "run")])
    with pytest.raises(SystemExit) as exit_info:
        cli_module.main()
    assert exit_info.value.code == 2
    lines = error_lines(capsys.readouterr().err)
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], lines  # only the progress bar may precede it
    assert re.search(r"(loss|gradient norm) is (nan|inf|-inf) at step \d+: training stopped, the last good "
                     r"checkpoint .* is kept", errors[0]), errors[0]
    failed_at = int(re.search(r"at step (\d+)", errors[0]).group(1))
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert state["step"] == failed_at - 1
    assert all(torch.isfinite(v).all() for v in state["model"].values())


@pytest.mark.slow
def test_design_card_call_with_the_quick_recipe(tmp_path):
    """The literal call, quick recipe and stdlib corpus included (tokenizes the whole stdlib: slow)."""
    result = _run([sys.executable, "-m", "mtp_cli", "train", "--depth", "1", "--lambda", "0.3", "--steps", "1"],
                  tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "runs" / "quick-sequential-d1-lam0.3-s0" / "run.json").is_file()


def test_ctrl_c_exits_130(base_run, monkeypatch, capsys):
    """An interrupted training must not exit 0 (`make`, shells and `mtp ablate` would take it as done)."""
    from mtp_cli import cli as cli_module
    from mtp_cli.train import loop as trainer

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "train", interrupted)
    monkeypatch.setattr(sys, "argv", ["mtp", "train", "--recipe", str(base_run[1]), "--out", "unused"])
    with pytest.raises(SystemExit) as exit_info:
        cli_module.main()
    assert exit_info.value.code == 130


@pytest.mark.parametrize("where", ["a-file", "under-proc"])
def test_a_cache_folder_that_cannot_be_one_is_refused(where, tmp_path, base_run, monkeypatch, capsys, single_thread):
    cache = {"a-file": tmp_path / "afile", "under-proc": Path("/proc/mtp-cache")}[where]
    if where == "a-file":
        cache.write_text("not a folder")
    monkeypatch.setenv("MTP_CACHE_DIR", str(cache))
    code, _, err = cli_in_process("train", "--recipe", base_run[1], "--out", tmp_path / "fresh", capsys=capsys)
    check_one_line_error(code, err, r"MTP_CACHE_DIR .*(exists and is not a folder|/proc is a system folder)")
    assert not (tmp_path / "fresh").exists()


def test_an_unreadable_data_file_is_one_line(tmp_path, base_run, monkeypatch, capsys, single_thread):
    """Read permission is refused (simulated: the tests run as root, whom a file's mode does not stop)."""
    data = tmp_path / "secret.py"
    data.write_text("x = 1\n" * 100)
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if Path(path) == data else real(path, mode, **kw))
    code, _, err = cli_in_process("train", "--recipe", base_run[1], "--data", data, "--out", tmp_path / "fresh",
                                  capsys=capsys)
    check_one_line_error(code, err, r"data file .*secret.py is not readable")
