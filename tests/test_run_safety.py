"""A run folder is never silently restarted, shared or trained from damaged parts: `--resume` refuses in
one line what it cannot resume exactly (every file left as it was), a second `mtp train` into a folder
being trained is refused, SIGTERM is handled as Ctrl-C (checkpoint, exit 143), and a damaged token-shard
cache is rebuilt, with a line saying so. Each case has its control: the intact folder resumes."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import cli_in_process, folder_snapshot, micro_recipe, one_line_error, write_recipe

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-step NTP run."""
    from mtp_cli.train.loop import train

    run = tmp_path_factory.mktemp("safety") / "run"
    train(micro_recipe("ntp", steps=2), run, show_progress=False)
    return run


@pytest.fixture
def run(tmp_path, finished):
    shutil.copytree(finished, tmp_path / "run")
    return tmp_path / "run"


def refused(run: Path, capsys, pattern: str, *flags: str) -> None:
    """`mtp train --out RUN --resume FLAGS` exits 2 with one line matching `pattern`; no file changed."""
    import re

    before = folder_snapshot(run)
    code, _, err = cli_in_process("train", "--out", run, "--resume", *flags, capsys=capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and re.search(pattern, lines[0]), err
    assert folder_snapshot(run) == before


def damage_checkpoint(run: Path, **changes) -> None:
    state = torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=True)
    torch.save({**state, **changes}, run / "checkpoint.pt")


@pytest.mark.parametrize("damage, pattern", [
    (lambda run: (run / "checkpoint.pt").unlink(), r"holds no checkpoint .* cannot be resumed exactly"),
    (lambda run: shutil.rmtree(run / "tokenizer"), r"tokenizer is missing"),
    (lambda run: (run / "tokenizer" / "tokenizer.json").write_text('{"version": "1.0", "trunc'), r"tokenizer is damaged"),
    (lambda run: damage_checkpoint(run, step=-3), r"is damaged \(step -3\)"),
    (lambda run: (run / "run.json").write_text("[1, 2]"), r"run.json is not a JSON object"),
], ids=["no-checkpoint", "no-tokenizer", "corrupt-tokenizer", "negative-step", "run-json-a-list"])
def test_resume_refuses_what_it_cannot_resume_exactly(run, damage, pattern, capsys):
    damage(run)
    refused(run, capsys, pattern)


def test_resume_refuses_fewer_steps_than_the_run_has_and_continues_an_intact_run(run, capsys):
    refused(run, capsys, r"is at step 2, past train.steps = 1", "--steps", "1")
    code, _, err = cli_in_process("train", "--out", run, "--resume", "--steps", "3", capsys=capsys)
    assert code == 0, err
    assert json.loads((run / "run.json").read_text())["step"] == 3


def test_a_second_training_into_the_same_folder_is_refused(run, capsys):
    """While another process holds the run's lock (here: the test, through its own open file), `mtp train`
    into that folder is refused naming the holder's pid. Control: released, the same command resumes."""
    fd = os.open(run / "train.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.pwrite(fd, b"424242\n", 0)
        refused(run, capsys, r"is being trained by another process \(pid 424242", "--steps", "3")
    finally:
        os.close(fd)
    code, _, err = cli_in_process("train", "--out", run, "--resume", "--steps", "3", capsys=capsys)
    assert code == 0, err


def test_sigterm_is_handled_as_ctrl_c(tmp_path):
    """SIGTERM mid-training: a checkpoint at a whole step, run.json "interrupted", no temporary file, one
    line, exit 143; the run then resumes to its end."""
    recipe = micro_recipe("ntp", steps=400)
    recipe.train.ckpt_every = recipe.train.eval_every = 400
    path = write_recipe(recipe, tmp_path / "long.toml")
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "mtp_cli", "train", "--recipe", str(path), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (out / "metrics.jsonl").is_file() or \
            len((out / "metrics.jsonl").read_text().splitlines()) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    said = [line for line in (stdout + stderr).splitlines() if "SIGTERM" in line]
    assert len(said) == 1 and "checkpoint saved at step" in said[0], stdout + stderr
    step = int(said[0].split("checkpoint saved at step ")[1].split(";")[0])
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == step
    assert not [p.name for p in out.iterdir() if ".tmp" in p.name]


def test_a_damaged_shard_cache_is_rebuilt(tmp_path, monkeypatch, capsys):
    """A cached train.bin truncated to half, or changed in place: the next use says so and rebuilds it.
    Control: an intact cache is used as it is, silently."""
    from mtp_cli.data import shards

    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    cfg = micro_recipe().data
    first = shards.prepare(cfg, 512)
    train_bin = tmp_path / "cache" / "shards" / first.key / "train.bin"
    whole = train_bin.read_bytes()
    capsys.readouterr()
    assert shards.prepare(cfg, 512).train.tobytes() == whole
    assert "rebuilding" not in "".join(capsys.readouterr())
    for damage in (whole[:len(whole) // 2], bytes([whole[0] ^ 1]) + whole[1:]):
        train_bin.write_bytes(damage)
        again = shards.prepare(cfg, 512)
        said = "".join(capsys.readouterr())
        assert "do not match their record" in said and "rebuilding" in said, said
        assert train_bin.read_bytes() == whole and again.train.tobytes() == whole


def test_eval_of_a_checkpoint_writes_outside_the_committed_results():
    from mtp_cli.evals.runner import hf_json_path

    assert hf_json_path("smollm2-135m-instruct") == Path("runs/hf/smollm2-135m-instruct/eval.json")


def test_ctrl_c_and_out_of_memory_outside_the_loop_are_one_line(tmp_path, monkeypatch, capsys):
    """Ctrl-C during data preparation: "interrupted", exit 130 (typer alone exits 130 silently); an allocation
    failure while training (a model too large, as under `ulimit -v`): one line naming it, exit 2."""
    from mtp_cli.train import loop as trainer

    recipe = write_recipe(micro_recipe("ntp", steps=2), tmp_path / "micro.toml")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "_prepare_data", interrupted)
    code, _, err = cli_in_process("train", "--recipe", recipe, "--out", tmp_path / "a", capsys=capsys)
    assert code == 130 and err.strip() == "interrupted", err
    assert not (tmp_path / "a").exists()
    monkeypatch.undo()

    def no_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried "
                           "to allocate 160000000000 bytes")

    monkeypatch.setattr(trainer, "_build_model", no_memory)
    code, _, err = cli_in_process("train", "--recipe", recipe, "--out", tmp_path / "b", capsys=capsys)
    one_line_error(code, err, r"^error: out of memory")


def test_a_shared_tokenizer_link_is_never_written_through(run, tmp_path, capsys):
    """A run whose tokenizer/ links to a shared copy (as the committed runs do, results/tokenizers/):
    resuming keeps the link and leaves the copy as it was; --force gives the new run its own folder and
    leaves the copy as it was."""
    shared = tmp_path / "tokenizers" / "bpe"
    shutil.copytree(run / "tokenizer", shared)
    shutil.rmtree(run / "tokenizer")
    (run / "tokenizer").symlink_to(os.path.relpath(shared, run))
    before = folder_snapshot(shared)
    code, _, err = cli_in_process("train", "--out", run, "--resume", "--steps", "3", capsys=capsys)
    assert code == 0 and (run / "tokenizer").is_symlink() and folder_snapshot(shared) == before, err
    recipe = write_recipe(micro_recipe("ntp", steps=2), tmp_path / "micro.toml")
    code, _, err = cli_in_process("train", "--recipe", recipe, "--out", run, "--force", capsys=capsys)
    assert code == 0, err
    assert not (run / "tokenizer").is_symlink() and (run / "tokenizer" / "tokenizer.json").is_file()
    assert folder_snapshot(shared) == before
