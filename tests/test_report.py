"""`mtp report`: renders REPORT.md, plots and terminal tables from stored results only (training is
booby-trapped to prove it), keeps training and inference evidence apart, says when an interval is over
one seed, and its interval arithmetic is right."""

from __future__ import annotations

import json
import math
import re
import shutil
import sys

import pandas as pd
import pytest
from rich.console import Console

from mtp_cli import cli
from mtp_cli.base import stats
from mtp_cli.grid import stages
from mtp_cli.results import compare, report, resultset
from mtp_cli.results import folder as results
from mtp_cli.results.report import helpers as report_helpers

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture
def no_training(monkeypatch):
    """Any attempt to train, export, evaluate or benchmark fails the test."""
    import mtp_cli.train.loop as trainer

    monkeypatch.setattr(trainer, "train", lambda *a, **k: pytest.fail("the report trained a model"))
    for name in list(stages.STAGE_FUNCS):
        monkeypatch.setitem(stages.STAGE_FUNCS, name, lambda *a, _n=name: pytest.fail(f"the report ran {_n}"))


def add_second_seed(folder):
    """Copy every -s0 run to -s1 with slightly different stored numbers (a stand-in for a second seed)."""
    for run in sorted((folder / "runs").glob("*-s0")):
        twin = run.with_name(run.name[:-1] + "1")
        shutil.copytree(run, twin)
        for name, bump in (("run.json", ("final", "val_loss")), ("eval.json", ("results", "heldout", "loss"))):
            doc = json.loads((twin / name).read_text())
            node = doc
            for key in bump[:-1]:
                node = node[key]
            node[bump[-1]] += 0.01 if "seq" in run.name else -0.01
            (twin / name).write_text(json.dumps(doc))
        log = json.loads((twin / "ablate.json").read_text())
        (twin / "ablate.json").write_text(json.dumps(log | {"seed": 1}))


def test_report_from_stored_results(tiny_ablation, tmp_path, no_training):
    folder = tmp_path / "copy"
    shutil.copytree(tiny_ablation, folder, ignore=shutil.ignore_patterns("checkpoint.pt", "export"))
    add_second_seed(folder)
    console = Console(record=True, width=160)
    path = report.render_report(folder, console=console)
    text = path.read_text()
    assert path == folder / "REPORT.md"
    sections = ["## Training evidence", "## Inference evidence", "## Cost", "## Claims vs measured", "## Plots",
                "## Environment"]
    positions = [text.index(s) for s in sections]
    assert positions == sorted(positions)
    training = text[positions[0]:positions[1]]
    inference = text[positions[1]:positions[2]]
    assert "Difference to NTP (ntp)" in training and "t over 2 paired seeds" in training
    assert "speedup" not in training.lower() and "acceptance" not in training.lower()
    assert "agrees with trunk's greedy" in inference and "loss" not in inference.replace("lossless", "")
    assert "tutorial claim, unsourced" in text and "DeepSeek-V3 §4.5.1" in text
    assert "Self-speculative decoding" in inference and re.search(r"\| seq-d1 \| [^|]+ × T=0 \| 1 \| 2 \| yes \|", inference)
    assert "NTP has no MTP modules" in inference
    for png in ("loss_curves.png", "quality_differences.png", "acceptance_per_position.png"):
        assert (folder / "plots" / png).stat().st_size > 1000
        assert f"](plots/{png})" in text
    assert not (folder / "plots" / "speedup_vs_batch.png").exists()  # one batch size: no speed-vs-batch curve
    stage_seconds = [s["seconds"] for f in (folder / "runs").glob("*/ablate.json")
                     for s in json.loads(f.read_text())["stages"].values()]
    assert len(stage_seconds) >= 8  # four stages of each of the runs
    assert f"wall time of all stages added up: {report_helpers.duration(sum(stage_seconds))} (every stage of every run)" in text
    terminal = console.export_text()
    assert "Trunk quality per variant" in terminal and "Training cost against NTP" in terminal
    assert (folder / "summary.csv").is_file()


def test_one_seed_says_so(tiny_ablation, tmp_path, no_training):
    folder = tmp_path / "one-seed"
    shutil.copytree(tiny_ablation, folder, ignore=shutil.ignore_patterns("checkpoint.pt", "export"))
    text = report.render_report(folder).read_text()
    assert "one seed per variant" in text
    assert "paired t" not in text


def test_report_names_the_runs_that_lack_stages(tiny_ablation, tmp_path, no_training):
    folder = tmp_path / "partial"
    shutil.copytree(tiny_ablation, folder, ignore=shutil.ignore_patterns("checkpoint.pt", "export"))
    assert "Incomplete" not in report.render_report(folder).read_text()
    victim = sorted((folder / results.RUNS).iterdir())[-1]
    (victim / results.SPEC_JSON).unlink()
    text = report.render_report(folder).read_text()
    line = next(line for line in text.splitlines() if "Incomplete" in line)
    assert "Incomplete: 1 run(s) of the grid lack stages" in line and victim.name in line and "specbench" in line


def test_report_cli_and_bad_folder(tiny_ablation, tmp_path, capsys, no_training):
    folder = tmp_path / "cli"
    shutil.copytree(tiny_ablation, folder, ignore=shutil.ignore_patterns("checkpoint.pt", "export"))
    assert _main("report", folder) == 0
    assert "report written to" in capsys.readouterr().out
    assert _main("report", tmp_path / "nowhere") == 2
    assert "results folder not found" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert _main("report", tmp_path / "empty") == 2
    assert "no runs in" in capsys.readouterr().err


def _main(*args) -> int:
    argv, sys.argv = sys.argv, ["mtp", *map(str, args)]
    try:
        cli.main()
        return 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = argv


# ---- the interval arithmetic ---------------------------------------------------------------------------
def _frame(rows):
    return pd.DataFrame(rows)


def test_difference_paired_over_seeds_and_per_run_with_one_seed():
    m = resultset.Metric("x", "x")
    variant = _frame([{"seed": 0, "x": 1.0}, {"seed": 1, "x": 2.0}, {"seed": 2, "x": 4.0}])
    base = _frame([{"seed": 0, "x": 0.5}, {"seed": 1, "x": 1.0}, {"seed": 2, "x": 3.0}])
    e = compare.seed_difference(variant, base, m)
    expected = stats.t_interval([0.5, 1.0, 1.0])  # no per-run intervals stored: no item term to add
    assert e.method.startswith("paired t over 3 seeds") and (e.value, e.lo, e.hi) == pytest.approx(expected)
    assert e.per_seed == (0.5, 1.0, 1.0)

    one_v = _frame([{"seed": 0, "x": 0.30, "x_lo": 0.20, "x_hi": 0.40}])
    one_b = _frame([{"seed": 0, "x": 0.10, "x_lo": 0.07, "x_hi": 0.13}])
    e = compare.seed_difference(one_v, one_b, m)
    half = math.sqrt(0.10**2 + 0.03**2)
    assert e.method == "one seed: no interval over seeds" and (e.lo, e.hi) == (None, None)
    assert (e.value, e.items_lo, e.items_hi) == pytest.approx((0.2, 0.2 - half, 0.2 + half))  # evaluation-set noise

    no_ci = resultset.Metric("y", "x", ci=False)
    e = compare.seed_difference(one_v, one_b, no_ci)
    assert (e.lo, e.hi, e.items_lo, e.items_hi) == (None, None, None, None)


def test_summarize_keeps_rates_inside_0_1():
    m = resultset.Metric("rate", "r", pct=True)
    e = compare.summarize(_frame([{"seed": 0, "r": 0.0}, {"seed": 1, "r": 1.0}]), m)
    assert (e.value, e.lo, e.hi, e.n_seeds) == (0.5, 0.0, 1.0, (2,))
    e = compare.summarize(_frame([{"seed": 0, "r": 0.25, "r_lo": 0.1, "r_hi": 0.5}]), m)
    assert (e.value, e.lo, e.hi, e.n_seeds) == (0.25, 0.1, 0.5, (1,))


def test_summary_columns_are_documented_once():
    from helpers import REPO

    names = [c.name for c in results.COLUMNS]
    assert len(names) == len(set(names)) and all(c.doc for c in results.COLUMNS)
    reference = (REPO / "docs" / "reference.md").read_text()  # the README links to it
    for name in [*names, *results.DEPTH_COLUMNS, results.POSITION_COLUMN[0], results.DELTA_COLUMN[0]]:
        assert f"`{name}`" in reference, f"docs/reference.md does not document summary column {name}"
