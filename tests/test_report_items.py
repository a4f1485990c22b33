"""The results model and the report on planted numbers (tests/synthetic_results.py): per-item series,
Δ to NTP over seeds and items, the noise floor, context cuts, specbench conditions with the
degenerate-text warning, summary.csv's new columns, and a re-render that changes no byte."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from conftest import REPO, folder_snapshot
from mtp_cli import compare, report, resultset, stats
from synthetic_results import COMMIT, make_results, per_item_values


@pytest.fixture
def synth(tmp_path) -> Path:
    return make_results(tmp_path)


def _section(text: str, start: str, end: str) -> str:
    return text[text.index(start):text.index(end)]


def _row(text: str, first_cell: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| {first_cell} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_items_are_series_indexed_by_item_id(synth):
    r = resultset.load(synth)
    run = r.seeds("seq-d1")[1]
    series = r.items(run, "humaneval", "gold_bpb")
    assert list(series.index[:2]) == ["HumanEval/0", "HumanEval/1"]
    assert np.allclose(series.to_numpy(), per_item_values("seq-d1", 1, "humaneval", -0.05, _offsets()))
    assert list(r.items(run, "gsm8k", "gold_bpb").index[:2]) == [0, 1]
    loss, bpb = r.items(run, "heldout", "loss"), r.items(run, "heldout", "bpb")
    assert np.allclose(bpb, loss * 64 / math.log(2) / 180)  # bits of the window's tokens over its bytes
    assert r.items(run, "humaneval", "no_such_field") is None
    assert loss.mean() == pytest.approx(run.eval["results"]["heldout"]["loss"])
    (run.path / "eval_gsm8k_gold.jsonl").unlink()
    assert resultset.load(synth).items(run, "gsm8k", "gold_bpb") is None


def test_heldout_windows_average_to_the_evals_aggregate(synth):
    run = synth / "runs" / "ntp-s0"
    rows = [{"window": i, "loss": 2.0 + 0.1 * i, "tokens": 64 - 8 * (i % 2), "bytes": 150 + 17 * i} for i in range(6)]
    (run / "eval_heldout_windows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    r = resultset.load(synth)
    folder = r.seeds("ntp")[0]
    nats = sum(row["loss"] * row["tokens"] for row in rows)
    assert r.items(folder, "heldout", "loss").mean() == pytest.approx(nats / sum(row["tokens"] for row in rows))
    assert r.items(folder, "heldout", "bpb").mean() == pytest.approx(nats / math.log(2) / sum(row["bytes"] for row in rows))
    assert list(r.items(folder, "heldout", "bpb").index) == list(range(6))


def _offsets():
    seeds = (0, 1)
    return {"ntp": {s: 0.03 * (-1) ** s * (s + 1) for s in seeds},
            "seq-d1": {s: 0.02 * (-1) ** (s + 1) * (s + 1) for s in seeds}}


def test_difference_to_ntp_is_hierarchical_over_seeds_and_items(synth):
    r = resultset.load(synth)
    m = next(m for m in r.quality_metrics if m.col == "humaneval_gold_bpb")
    e = compare.difference(r, "seq-d1", m)
    planted = np.mean([per_item_values("seq-d1", s, "humaneval", -0.05, _offsets()) for s in (0, 1)]) - \
        np.mean([per_item_values("ntp", s, "humaneval", -0.05, _offsets()) for s in (0, 1)])
    assert e.value == pytest.approx(planted) and e.lo < e.value < e.hi
    assert "hierarchical" in e.method and e.n_seeds == (2, 2) and e.n_items == 40
    one_seed = stats.paired_bootstrap(r.items(r.seeds("seq-d1")[0], "humaneval", "gold_bpb"),
                                      r.items(r.seeds("ntp")[0], "humaneval", "gold_bpb"))
    assert e.hi - e.lo > 2 * (one_seed.hi - one_seed.lo)  # the seeds disagree: the interval says so
    floor = compare.noise_floor(r, m)
    expected = per_item_values("ntp", 1, "humaneval", 0, _offsets()) - per_item_values("ntp", 0, "humaneval", 0, _offsets())
    assert floor.value == pytest.approx(expected.mean()) and "paired bootstrap" in floor.method


def test_report_on_planted_results(synth):
    console = Console(record=True, width=200)
    text = report.render_report(synth, console=console).read_text()
    training = _section(text, "## Training evidence", "## Inference evidence")
    inference = _section(text, "## Inference evidence", "## Cost")
    r = resultset.load(synth)
    m = next(m for m in r.quality_metrics if m.col == "humaneval_gold_bpb")
    delta = report.fmt_estimate(m, compare.difference(r, "seq-d1", m), signed=True)
    differences = training[training.index("**Difference to NTP"):]
    header = _row(differences, "variant")
    row = _row(differences, "seq-d1 (seeds 0, 1)")
    assert row[header.index("Δ HumanEval gold bits/byte ↓")] == delta
    floor = _row(training, "noise floor: ntp s1 − s0")
    assert all(re.match(r"^[+-]\d", cell) for cell in floor[1:]), floor  # a number for every metric
    assert "hierarchical bootstrap: seeds (paired), then items (paired)" in training
    assert "HumanEval: 12/40, ≤ 40 tokens (mean 20.5), context 64" in training
    assert "GSM8K: 0/30, context 64" in training
    warning = inference.index("decoded text is degenerate in the primary condition (heldout-greedy)")
    assert "90.0% (seq-d1)" in inference and warning < inference.index("**Self-speculative decoding")
    acc_header = _row(inference, "variant")
    rows = [line for line in inference.splitlines() if line.startswith("| seq-d1 | ")]
    primary = [c.strip() for c in rows[0].strip("|").split("|")]
    other = [c.strip() for c in rows[1].strip("|").split("|")]
    assert primary[1] == "heldout × T=0 (primary)" and other[1] == "humaneval × T=0"
    assert primary[acc_header.index("degenerate")] == "90.0%" and other[acc_header.index("degenerate")] == "10.0%"
    assert re.match(r"\d+\.\d% \[\d+\.\d%, \d+\.\d%\]", primary[acc_header.index("acceptance [seeds × prompts]")])
    assert "paired_differences.png" in text and (synth / "plots" / "paired_differences.png").stat().st_size > 1000
    assert f"Results produced at commit `{COMMIT[:12]}`" in text and "docs/CLAIMS.md" in text
    terminal = console.export_text()
    assert "degenerate in the primary condition" in terminal and "noise floor" in terminal


def test_summary_gains_gold_bpb_and_text_shares(synth):
    report.render_report(synth)
    frame = pd.read_csv(synth / "summary.csv").set_index("run")
    assert frame.loc["seq-d1-s1", "humaneval_gold_bpb"] == pytest.approx(
        per_item_values("seq-d1", 1, "humaneval", -0.05, _offsets()).mean())
    assert frame.loc["ntp-s0", "gsm8k_gold_bpb_hi"] - frame.loc["ntp-s0", "gsm8k_gold_bpb_lo"] == pytest.approx(0.2)
    assert frame.loc["seq-d1-s0", "spec_degenerate_share"] == 0.9
    assert frame.loc["seq-d1-s0", "spec_whitespace_share"] == pytest.approx(0.3)


def test_one_seed_and_missing_items_say_so(tmp_path):
    text = report.render_report(make_results(tmp_path / "one", seeds=(0,))).read_text()
    training = _section(text, "## Training evidence", "## Inference evidence")
    assert "paired bootstrap over items (one seed per side)" in training
    assert _row(training, "noise floor: ntp seed vs seed")[1:] == ["needs ≥ 2 NTP seeds"] * 7
    text = report.render_report(make_results(tmp_path / "old", per_item=False)).read_text()
    assert "hierarchical" not in text and "paired t over 2 seeds" in text  # falls back to seed-level intervals


def test_rerender_changes_no_byte(synth):
    report.render_report(synth)
    before = folder_snapshot(synth)
    report.render_report(synth)
    assert folder_snapshot(synth) == before


def test_rerender_of_todays_results_changes_no_byte(tmp_path):
    quick = tmp_path / "quick"  # the committed results
    shutil.copytree(REPO / "results" / "quick", quick)
    report.render_report(quick)
    first = folder_snapshot(quick)
    text = report.render_report(quick).read_text()
    assert folder_snapshot(quick) == first
    assert "noise floor: ntp s1 − s0" in text and "Incomplete" not in text
    assert "rendered" not in text.split("## Environment")[1]
    committed = (REPO / "results" / "quick" / "REPORT.md").read_text()
    drop = lambda doc: [line for line in doc.splitlines() if "report code" not in line and "Results produced" not in line]  # noqa: E731
    assert drop(text) == drop(committed)  # the committed REPORT.md is what its results render to


def test_provenance_names_the_rendering_commit_only_when_it_differs(synth, monkeypatch):
    monkeypatch.setattr(report, "code_commit", lambda: COMMIT)
    text = report.render_report(synth).read_text()
    assert f"Results produced at commit `{COMMIT[:12]}`." in text and "rendered by code" not in text
    monkeypatch.setattr(report, "code_commit", lambda: "b" * 40)
    text = report.render_report(synth).read_text()
    assert f"Results produced at commit `{COMMIT[:12]}`; rendered by code at commit `bbbbbbbbbbbb`." in text
