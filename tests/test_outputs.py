"""Nothing lost, nothing misleading: every command's output flags go through one check before any work
(`mtp_cli.base.outputs`), `mtp export --out` replaces only an earlier export, and bad input gets the one-line
error the README promises. Each case failed before its fix (a traceback, a silent success, or a
deleted file)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import cli_in_process, folder_snapshot, micro_recipe, one_line_error, write_recipe

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def micro_run(tmp_path_factory):
    """A finished 2-step NTP run and its recipe file."""
    from mtp_cli.train.loop import train

    root = tmp_path_factory.mktemp("outputs")
    recipe = write_recipe(micro_recipe("ntp", steps=2), root / "micro.toml")
    train(micro_recipe("ntp", steps=2), root / "run", show_progress=False)
    return root / "run", recipe


@pytest.fixture()
def runs(tmp_path, micro_run):
    """runs/a (a run), runs/b (another run), runs/notes (a user's folder) in a fresh folder."""
    root = tmp_path / "runs"
    shutil.copytree(micro_run[0], root / "a")
    shutil.copytree(micro_run[0], root / "b")
    (root / "notes").mkdir()
    (root / "notes" / "notes.txt").write_text("mine")
    return root


@pytest.mark.parametrize("target, pattern", [
    ("notes", r"holds files that are not an export"),
    ("b", r"is a run, which an export never replaces"),
    (".", r"the run .* lives in it"),
])
def test_export_refuses_a_folder_it_would_destroy(runs, target, pattern, capsys):
    before = folder_snapshot(runs)
    code, _, err = cli_in_process("export", runs / "a", "--out", runs / target if target != "." else runs, capsys=capsys)
    one_line_error(code, err, pattern)
    assert folder_snapshot(runs) == before


def test_export_force_never_replaces_a_run_or_its_parents(runs, capsys):
    before = folder_snapshot(runs)
    for target in (runs / "b", runs):
        code, _, err = cli_in_process("export", runs / "a", "--out", target, "--force", capsys=capsys)
        assert code == 2, err
    assert folder_snapshot(runs) == before
    code, _, err = cli_in_process("export", runs / "a", "--out", runs / "notes", "--force", capsys=capsys)
    assert code == 0, err
    assert not (runs / "notes" / "notes.txt").exists() and (runs / "notes" / "config.json").is_file()


def test_export_force_never_deletes_an_evaluation_or_a_folder_inside_the_run(runs, capsys):
    """An evaluation's files (eval.json, samples, windows, at any depth) and the run's own tokenizer folder
    survive `--force`: a one-line refusal, every file unchanged. Control: the same folder without the
    evaluation's files is replaced."""
    evaluated = runs / "notes" / "hf"
    evaluated.mkdir()
    for name in ("eval.json", "eval_humaneval_samples.jsonl", "eval_heldout_windows.jsonl"):
        (evaluated / name).write_text("{}")
    before = folder_snapshot(runs)
    code, _, err = cli_in_process("export", runs / "a", "--out", runs / "notes", "--force", capsys=capsys)
    one_line_error(code, err, r"holds hf/eval\.json, which an export never replaces")
    code, _, err = cli_in_process("export", runs / "a", "--out", runs / "a" / "tokenizer", "--force", capsys=capsys)
    one_line_error(code, err, r"is inside the run")
    assert folder_snapshot(runs) == before
    shutil.rmtree(evaluated)
    assert cli_in_process("export", runs / "a", "--out", runs / "notes", "--force", capsys=capsys)[0] == 0
    assert cli_in_process("export", runs / "a", "--out", runs / "a" / "export", capsys=capsys)[0] == 0


def test_an_export_has_the_modes_of_every_other_output(runs, capsys):
    """Folders 0755 and files 0644 under the usual umask 022 (mkdtemp made the folder 0700 and safetensors
    wrote 0600)."""
    import os

    old = os.umask(0o022)
    try:
        assert cli_in_process("export", runs / "a", "--out", runs / "shared", capsys=capsys)[0] == 0
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in [runs / "shared", *(runs / "shared").rglob("*")]}
    assert modes.pop("shared") == 0o755 and modes["model.safetensors"] == 0o644
    assert set(modes.values()) <= {0o644, 0o755}, modes


def test_export_dot_is_one_line_not_a_traceback(runs, capsys, monkeypatch):
    monkeypatch.chdir(runs / "notes")
    code, _, err = cli_in_process("export", runs / "a", "--out", ".", capsys=capsys)
    one_line_error(code, err, r"--out \.: holds files that are not an export")


def test_re_export_replaces_an_earlier_export_whole(runs, capsys):
    out = runs / "exported"
    assert cli_in_process("export", runs / "a", "--out", out, capsys=capsys)[0] == 0
    (out / "stale.bin").write_bytes(b"from an older export")
    assert cli_in_process("export", runs / "a", "--out", out, capsys=capsys)[0] == 0
    assert not (out / "stale.bin").exists() and (out / "mtp_export.json").is_file()
    assert not [p for p in runs.iterdir() if p.name.startswith(".")], "a temporary folder was left beside it"


# Every output flag of every command, against the paths that gave tracebacks or wrote where they should not.
BAD_OUTPUTS = {
    "a-file": (lambda d: d / "afile", r"exists and is not a folder|is a file"),
    "proc": (lambda d: Path("/proc/mtp-run"), r"/proc is a system folder"),
    "sys": (lambda d: Path("/sys/mtp-run"), r"/sys is a system folder"),
    "at-root": (lambda d: Path("/nonexistent-mtp/dir/out"), r"does not exist \(no folder is created at the filesystem root\)"),
    "below-a-file": (lambda d: d / "afile" / "x", r"is a file, not a folder"),
}


def _commands(run: Path, recipe: Path, path: Path) -> dict[str, list]:
    return {
        "train --out": ["train", "--recipe", recipe, "--out", path],
        "export --out": ["export", run, "--out", path],
        "eval --json": ["eval", run, "--tasks", "heldout", "--json", path],
        "specbench --json": ["specbench", run, "--json", path],
        "ablate --results-root": ["ablate", "--recipe", recipe, "--results-root", path, "--dry-run"],
        "ablate --job-folder": ["ablate", "--recipe", recipe, "--job-folder", path, "--dry-run"],
    }


@pytest.mark.parametrize("case", BAD_OUTPUTS)
@pytest.mark.parametrize("command", list(_commands(Path(), Path(), Path())))
def test_every_output_flag_is_checked_before_any_work(command, case, tmp_path, micro_run, capsys):
    run, recipe = micro_run
    (tmp_path / "afile").write_text("a file")
    make_path, pattern = BAD_OUTPUTS[case]
    path = make_path(tmp_path)
    if command.startswith(("eval", "specbench")) and case == "a-file":
        pattern = r"exists and is not a folder|is a file|is a folder"
        path = tmp_path  # a --json that is an existing folder
    before = folder_snapshot(run)
    code, _, err = cli_in_process(*_commands(run, recipe, path)[command], capsys=capsys)
    one_line_error(code, err, pattern if command.startswith(("eval", "specbench")) and case == "a-file"
                   else pattern)
    assert folder_snapshot(run) == before
    assert not Path("/nonexistent-mtp").exists()


def test_messages_name_the_right_thing(tmp_path, micro_run, capsys):
    (tmp_path / "afile").write_text("x")
    one_line_error(*cli_in_process("eval", tmp_path / "afile", capsys=capsys)[::2], r"is a file, not a run folder")
    one_line_error(*cli_in_process("eval", "--hf", "/nonexistent", capsys=capsys)[::2], r"^error: --hf /nonexistent")


def test_draft_vocab_above_the_vocabulary_is_refused(tmp_path, capsys):
    from mtp_cli.train.loop import train

    train(micro_recipe("sequential", steps=2, depth=1, lambda_=0.3), tmp_path / "seq", show_progress=False)
    code, _, err = cli_in_process(
        "generate",
        tmp_path / "seq",
        "--prompt",
        "x",
        "--speculative",
        "--draft-vocab",
        "99999",
        "--max-new-tokens",
        "4",
        capsys=capsys,
    )
    one_line_error(code, err, r"--draft-vocab 99999 is above the run's vocabulary")


def test_a_prompt_longer_than_the_context_is_cut_with_a_note(micro_run, capsys):
    code, out, err = cli_in_process("generate", micro_run[0], "--prompt", "x = 1\n" * 40, "--max-new-tokens", "4",
                                    capsys=capsys)
    assert code == 0, err
    assert "note: the prompt's first" in err and "fit the trained context 32" in err


def test_empty_text_is_refused_before_any_work(tmp_path, micro_run, capsys):
    (tmp_path / "empty.txt").write_text("")
    before = folder_snapshot(micro_run[0])
    code, _, err = cli_in_process("eval", micro_run[0], "--tasks", "heldout", "--text", tmp_path / "empty.txt",
                                  capsys=capsys)
    one_line_error(code, err, r"--text .*empty\.txt: 0 tokens are fewer than one window")
    assert folder_snapshot(micro_run[0]) == before


def test_empty_data_leaves_no_run_folder(tmp_path, micro_run, capsys):
    (tmp_path / "empty.py").write_text("")
    code, _, err = cli_in_process("train", "--recipe", micro_run[1], "--data", tmp_path / "empty.py",
                                  "--out", tmp_path / "fresh", capsys=capsys)
    assert code == 2, err
    assert not (tmp_path / "fresh").exists()


# ---- resume, cost and the figures that cannot be true ----------------------------------------------------
def test_a_resumed_run_adds_up_its_segments(tmp_path):
    from mtp_cli.model import checkpoint as ckpt
    from mtp_cli.train.loop import train

    first = micro_recipe("ntp", steps=3)
    first.train.ckpt_every = 1
    out = tmp_path / "run"
    train(first, out, show_progress=False)
    started = json.loads((out / "run.json").read_text())["started"]
    longer = micro_recipe("ntp", steps=6)
    longer.train.ckpt_every = 1
    info = train(longer, out, resume=True, show_progress=False)
    assert info["started"] == started, "the resume rewrote when the run started"
    assert info["resumed"] == 1 and [(s["first_step"], s["last_step"]) for s in info["segments"]] == [(1, 3), (4, 6)]
    assert info["wall_seconds"] == pytest.approx(sum(s["seconds"] for s in info["segments"]), abs=0.01)
    clock = ckpt.load_checkpoint(out)["clock"]
    assert len(clock["step_times"]) == 6 and clock["warmup_steps"] == [0, 3]


def test_mfu_above_one_is_never_reported(tmp_path):
    from mtp_cli.train.loop import mfu, train

    assert mfu(2e9, 1e9) is None and mfu(5e8, 1e9) == 0.5
    recipe = micro_recipe("ntp", steps=3)
    recipe.train.peak_flops = 1.0  # a peak far below anything training reaches
    info = train(recipe, tmp_path / "run", show_progress=False)
    assert info["throughput"]["mfu_median"] is None and "unreliable" in info["peak_note"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r.get("mfu") is None for r in rows if r["kind"] == "train")


def test_the_cached_peak_is_raised_to_what_training_reached(tmp_path):
    import torch

    from mtp_cli.base import env

    cpu = torch.device("cpu")
    (tmp_path / env.PEAK_CACHE).write_text(json.dumps({env.peak_key(cpu, torch.float32): 1e6}))
    assert env.matmul_peak(cpu, torch.float32, tmp_path) == 1e6
    env.raise_matmul_peak(cpu, torch.float32, tmp_path, 5e9)
    assert env.matmul_peak(cpu, torch.float32, tmp_path) == 5e9
    env.raise_matmul_peak(cpu, torch.float32, tmp_path, 1e9)
    assert env.matmul_peak(cpu, torch.float32, tmp_path) == 5e9


def test_the_resume_hint_locates_the_same_ablation(monkeypatch):
    from mtp_cli.grid import plan as grid_plan

    monkeypatch.delenv(grid_plan.RESUME_ENV, raising=False)
    assert grid_plan.resume_command("quick") == "mtp ablate --recipe quick"
    hint = grid_plan.resume_command("recipes/quick.toml", only="ntp", seeds=[0], results_root="my results")
    assert hint == "mtp ablate --recipe recipes/quick.toml --results-root 'my results' --only ntp --seeds 0"
    monkeypatch.setenv(grid_plan.RESUME_ENV, "make report THREADS=1")
    assert grid_plan.resume_command("quick", results_root="runs/results") == "make report THREADS=1"


def test_make_report_and_ablate_share_one_results_root():
    from helpers import REPO

    from mtp_cli.base import paths

    make = (REPO / "Makefile").read_text()
    assert f"OUT ?= {paths.RESULTS_ROOT}" in make
    assert paths.RESULTS_ROOT.parts[0] != "results", "the default must not be the committed results"
    assert "MTP_RESUME_COMMAND=" in make and "THREADS" in make and "ARGS" in make


def test_the_grid_eta_comes_from_the_plan(tmp_path):
    from mtp_cli.grid import plan as grid_plan
    from mtp_cli.grid.view import GridView

    recipe = write_recipe(micro_recipe("ntp", steps=2), tmp_path / "micro.toml")
    ab = grid_plan.plan(recipe, results_root=tmp_path / "res")
    work = [(cell, list(cell.pending)) for cell in ab.cells]
    view = GridView(ab, work, disable=False)
    task = view.progress.tasks[0]
    assert task.fields["eta"].startswith("≥ "), "eval and specbench are not yet measured here"
    view.estimates = {key: 10.0 for key in view.estimates}
    view.show_eta()
    assert view.progress.tasks[0].fields["eta"] == "0:00:40"  # 4 stages × 10 s, none started


def test_a_partial_report_counts_the_seeds_evaluated(tmp_path):
    """One of ntp's two runs has no eval.json yet: the table says "1 of 2", not "2"."""
    from synthetic_results import make_results

    from mtp_cli.results import report

    folder = make_results(tmp_path)
    (folder / "runs" / "ntp-s1" / "eval.json").unlink()
    text = report.render_report(folder, console=None).read_text()
    row = next(line for line in text.splitlines() if line.startswith("| ntp"))
    assert row.split("|")[2].strip() == "1 of 2", row


def test_the_ablation_log_sums_a_resumed_trainings_segments(tmp_path):
    from mtp_cli.base.files import write_json
    from mtp_cli.grid import lock
    from mtp_cli.grid import plan as grid_plan

    recipe = write_recipe(micro_recipe("ntp", steps=2), tmp_path / "micro.toml")
    ab = grid_plan.plan(recipe, results_root=tmp_path / "res")
    cell = ab.cells[0]
    cell.run_dir.mkdir(parents=True)
    write_json(cell.run_dir / "run.json", {"segments": [{"seconds": 100.0}, {"seconds": 7.0}]})
    lock.record_stage_time(ab, cell, "train", 8.0)
    logged = json.loads((cell.run_dir / "ablate.json").read_text())["stages"]["train"]
    assert logged["seconds"] == 108.0 and logged["segments"] == 2
