"""The results model and the report on planted numbers (tests/synthetic_results.py): per-item series,
Δ to NTP with its interval over seeds and its evaluation-set interval apart, the noise floor, what each
comparison varies, context cuts, specbench conditions with the degenerate-text warning, summary.csv's
new columns, and a re-render that changes no byte."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import REPO, folder_snapshot
from rich.console import Console
from synthetic_results import COMMIT, make_results, per_item_values

from mtp_cli.base import stats
from mtp_cli.results import compare, report, resultset


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


def test_difference_to_ntp_is_a_t_over_seeds_with_the_items_apart(synth):
    r = resultset.load(synth)
    m = next(m for m in r.quality_metrics if m.col == "humaneval_gold_bpb")
    e = compare.difference(r, "seq-d1", m)
    runs = {name: np.array([per_item_values(name, s, "humaneval", -0.05 if name != "ntp" else 0, _offsets())
                            for s in (0, 1)]) for name in ("seq-d1", "ntp")}
    d = runs["seq-d1"] - runs["ntp"]  # seeds × items
    per_seed = d.mean(1)
    assert e.value == pytest.approx(per_seed.mean()) and e.per_seed == pytest.approx(tuple(per_seed))
    assert e.method == "t over 2 paired seeds, shared item variance added" and e.n_seeds == (2, 2) and e.n_items == 40
    shared = max(np.cov(d)[0, 1], 0) / d.shape[1]  # the item variance both seeds share
    half = math.sqrt(12.706204736174705**2 * per_seed.var(ddof=1) / 2 + stats.Z95**2 * shared)  # t(0.975, 1)
    assert (e.lo, e.hi) == pytest.approx((per_seed.mean() - half, per_seed.mean() + half))
    assert e.detectable == pytest.approx(math.sqrt((12.706204736174705 + 1.3763819204711734) ** 2 * per_seed.var(ddof=1) / 2
                                                   + (stats.Z95 + 0.8416212335729143) ** 2 * shared))
    # the evaluation-set interval: items resampled, seeds held fixed — far narrower, and reported apart
    assert e.items_lo < e.value < e.items_hi and e.hi - e.lo > 10 * (e.items_hi - e.items_lo)
    floor = compare.noise_floor(r, m)
    expected = per_item_values("ntp", 1, "humaneval", 0, _offsets()) - per_item_values("ntp", 0, "humaneval", 0, _offsets())
    assert floor.value == pytest.approx(expected.mean()) and (floor.lo, floor.hi) == (None, None)
    assert floor.items_lo < floor.value < floor.items_hi and "one pair of seeds" in floor.method


def _delta_rows(text: str) -> dict[tuple[str, str], list[str]]:
    """The Δ table's rows as {(metric, comparison): cells}; a blank metric cell repeats the one above."""
    table = text[text.index("**Difference to NTP"):]
    table = table[:table.index("\n\n- ")]
    rows, metric = {}, ""
    for line in table.splitlines()[4:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        metric = cells[0] or metric
        rows[(metric, cells[1])] = cells
    return rows


def test_report_on_planted_results(synth):
    console = Console(record=True, width=200)
    text = report.render_report(synth, console=console).read_text()
    training = _section(text, "## Training evidence", "## Inference evidence")
    inference = _section(text, "## Inference evidence", "## Cost")
    r = resultset.load(synth)
    m = next(m for m in r.quality_metrics if m.col == "humaneval_gold_bpb")
    e = compare.difference(r, "seq-d1", m)
    rows = _delta_rows(training)
    header = _row(training[training.index("**Difference to NTP"):], "metric")
    row = rows[(m.label, "seq-d1 − ntp")]
    assert row[header.index("Δ (per seed)")] == f"{e.value:+.3f} ({e.per_seed[0]:+.3f}, {e.per_seed[1]:+.3f})"
    assert row[header.index("95% over seeds")] == f"[{e.lo:.3f}, {e.hi:.3f}]"
    assert row[header.index("evaluation-set noise only")] == f"[{e.items_lo:.3f}, {e.items_hi:.3f}]"
    assert row[header.index("detectable (95%, ≈80% power)")] == f"{e.detectable:.3f}"
    assert row[header.index("reading")] == "not resolved: interval contains 0"  # two seeds that disagree
    floors = [cells for (metric, name), cells in rows.items() if name == "noise floor: ntp s1 − s0"]
    assert len(floors) == 7 and all(re.match(r"^[+-]\d", cells[2]) for cells in floors)  # a number for every metric
    assert all(cells[3] == "n/a (one pair of seeds)" for cells in floors)
    varies = _row(training, "seq-d1 − ntp")
    assert varies[1:] == ["mtp.objective=sequential", "init seed, data order", "seeds 0, 1"]
    assert _row(training, "noise floor: ntp s1 − s0")[1:] == ["init seed and data order (seed 1 vs 0)", "every setting",
                                                             "one pair"]
    assert "t over 2 paired seeds, shared item variance added" in training
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
    over_seeds = primary[acc_header.index("acceptance, 95% over seeds")]
    assert re.match(r"\d+\.\d% \[\d+\.\d%, \d+\.\d%\] \(\d+\.\d%, \d+\.\d%\)$", over_seeds), over_seeds
    assert re.match(r"\d+\.\d% \[\d+\.\d%, \d+\.\d%\]$", primary[acc_header.index("acceptance, evaluation-set noise only")])
    assert primary[acc_header.index("speedup vs our greedy")] == "1.20× [1.20, 1.20] (1.20, 1.20)"  # log scale
    assert "paired_differences.png" in text and (synth / "plots" / "paired_differences.png").stat().st_size > 1000
    assert f"Results produced at commit `{COMMIT[:12]}`" in text and "docs/CLAIMS.md" in text
    terminal = console.export_text()
    assert "degenerate in the primary condition" in terminal and "noise floor" in terminal


def test_parts_table_gives_the_break_even_mal(synth):
    """T_verify / T_step, T_draft / T_step and the break-even MAL, from the seed means of the stored parts."""
    from mtp_cli.results.report.inference import parts_table
    from mtp_cli.results.resultset import load

    table = parts_table(load(synth), "heldout-greedy")
    (row,) = table.rows  # NTP has no modules: one row
    step, verify, draft = (0.002 + 0.0022) / 2, (0.0022 + 0.0024) / 2, 0.0008  # seed means
    assert row[0] == "seq-d1" and row[2] == "1" and row[3] == f"{step * 1e3:.2f}"
    assert row[6] == f"{verify / step:.2f}" and row[7] == f"{draft / step:.2f}"
    assert row[8] == f"{(verify + draft) / step:.2f}"
    assert any("256 most frequent training tokens of 1024" in n for n in table.notes)


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
    rows = _delta_rows(training)
    assert len(rows) == 7 and all(cells[3] == "n/a (one seed)" and cells[4].startswith("[") and cells[5] == "n/a"
                                  and cells[6] == "not resolved: no interval over seeds" for cells in rows.values())
    assert "no noise floor: it needs ≥ 2 NTP seeds, or a noise-floor variant" in training
    text = report.render_report(make_results(tmp_path / "old", per_item=False)).read_text()
    assert "hierarchical" not in text and "paired t over 2 seeds" in text  # falls back to the runs' aggregates


def _add_noise_floor_variant(folder: Path, name: str, init_offset: int = 0, data_offset: int = 0) -> None:
    """NTP again under another name, at init seed s + init_offset and data seed s + data_offset, its
    held-out windows moved a little per seed (what another initialisation or data order would do)."""
    for seed in (0, 1):
        run = folder / "runs" / f"{name}-s{seed}"
        shutil.copytree(folder / "runs" / f"ntp-s{seed}", run)
        (run / "ablate.json").write_text(json.dumps({"variant": name, "seed": seed}))
        doc = json.loads((run / "run.json").read_text())
        doc["recipe"]["train"].update(seed=seed + init_offset, data_seed=seed + data_offset)
        (run / "run.json").write_text(json.dumps(doc))
        rows = [json.loads(line) for line in (run / "eval_heldout_windows.jsonl").read_text().splitlines()]
        for i, row in enumerate(rows):
            row["loss"] += 0.01 * (seed + 1) + 0.01 * (i % 5 - 2)  # Δ_s = 0.01 (s + 1): 25 windows, noise sums to 0
        (run / "eval_heldout_windows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        doc = json.loads((run / "eval.json").read_text())
        doc["results"]["heldout"]["loss"] += 0.01 * (seed + 1)  # the aggregate the windows average to
        (run / "eval.json").write_text(json.dumps(doc))
    lock = json.loads((folder / "recipe.lock.json").read_text())
    lock["recipe"]["variants"].append({"name": name, "init_seed_offset": init_offset, "data_seed_offset": data_offset})
    (folder / "recipe.lock.json").write_text(json.dumps(lock))


def test_noise_floor_variants_are_measured_like_a_variant_and_named_by_what_they_vary(synth):
    _add_noise_floor_variant(synth, "ntp-init", init_offset=1000)
    _add_noise_floor_variant(synth, "ntp-data", data_offset=7)
    lock = json.loads((synth / "recipe.lock.json").read_text())
    lock["recipe"]["variants"][-1]["specbench"] = {"peers": "none"}  # a variant's own benchmark settings are shown
    (synth / "recipe.lock.json").write_text(json.dumps(lock))
    text = report.render_report(synth).read_text()
    assert "| variant ntp-data | specbench: peers=none (data_seed_offset 7) |" in text
    training = _section(text, "## Training evidence", "## Inference evidence")
    assert _row(training, "noise floor (init only): ntp-init − ntp")[1:] == [
        "init seed (+1000 on the grid seed)", "every setting, data order", "seeds 0, 1"]
    assert _row(training, "noise floor (data order only): ntp-data − ntp")[1:] == [
        "data order (+7 on the grid seed)", "every setting, init seed", "seeds 0, 1"]
    assert _row(training, "seq-d1 − ntp")[1:] == ["mtp.objective=sequential", "init seed, data order", "seeds 0, 1"]
    rows = _delta_rows(training)
    floor = rows[("held-out loss ↓ (nats/token)", "noise floor (init only): ntp-init − ntp")]
    assert floor[2] == "+0.015 (+0.010, +0.020)" and floor[3].startswith("[") and floor[6] == "–"  # no verdict
    assert "| variant ntp-init | the recipe as is (init_seed_offset 1000) |" in text
    assert (synth / "plots" / "quality_differences.png").stat().st_size > 1000
    summary = pd.read_csv(synth / "summary.csv").set_index("run")
    assert list(summary.loc[["ntp-init-s1", "ntp-data-s1"], ["seed", "init_seed", "data_seed"]].itertuples(index=False)) \
        == [(1, 1001, 1), (1, 1, 8)]
    assert summary.loc["ntp-init-s1", "delta_heldout_loss"] == pytest.approx(0.02)
    assert math.isnan(summary.loc["ntp-s0", "delta_heldout_loss"])


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
    same = lambda doc: [line for line in doc.splitlines() if not line.startswith("Rendered by `mtp report")]  # noqa: E731
    assert same(text) == same(committed)  # the committed REPORT.md is what its results render to (the copy's
    # own folder name aside); no line names the rendering code, so a code commit forces no re-render


def test_the_rendering_commit_goes_to_a_sidecar_not_into_report_md(synth, monkeypatch):
    """A code change that does not change what the report says changes no byte of REPORT.md."""
    monkeypatch.setattr(report, "code_commit", lambda: "b" * 40)
    first = report.render_report(synth).read_text()
    assert f"Results produced at commit `{COMMIT[:12]}`." in first and "b" * 12 not in first
    assert json.loads((synth / report.RENDERED_BY).read_text())["report_code_commit"] == "b" * 40
    monkeypatch.setattr(report, "code_commit", lambda: "d" * 40)
    assert report.render_report(synth).read_text() == first
    assert json.loads((synth / report.RENDERED_BY).read_text())["report_code_commit"] == "d" * 40


def test_provenance_names_a_rerun_specbench_commit(synth, monkeypatch):
    """A stage run again by later code (here the specbench of one run) adds its commit to the provenance."""
    monkeypatch.setattr(report, "code_commit", lambda: COMMIT)
    spec = next((synth / "runs").iterdir()) / "specbench.json"
    spec.write_text(json.dumps({**json.loads(spec.read_text()), "git_commit": "c" * 40}))
    text = report.render_report(synth).read_text()
    assert f"Results produced at commit {', '.join(f'`{c[:12]}`' for c in sorted([COMMIT, 'c' * 40]))}" in text


def _add_baseline(folder: Path, like: str = "ntp-s0") -> dict:
    """A baseline/ folder (the source checkpoint evaluated as it is) holding a copy of one run's eval."""
    shutil.copytree(folder / "runs" / like, folder / "baseline", ignore=shutil.ignore_patterns("run.json", "ablate.json",
                                                                                               "specbench.json"))
    doc = json.loads((folder / "baseline" / "eval.json").read_text())
    doc["hf"] = {"source": "source/ntp-s0/export"}
    (folder / "baseline" / "eval.json").write_text(json.dumps(doc))
    return doc


def _freeze(folder: Path, same_eval_as: Path | None = None) -> None:
    for run in (folder / "runs").iterdir():
        doc = json.loads((run / "run.json").read_text())
        doc["recipe"]["train"]["freeze_trunk"] = True
        (run / "run.json").write_text(json.dumps(doc))
        if same_eval_as is not None:
            for f in same_eval_as.glob("eval*"):
                shutil.copy(f, run / f.name)


def test_before_row_is_the_baseline_eval(synth):
    """baseline/eval.json renders as the first row of the trunk-quality table, with its own numbers."""
    assert "source (before)" not in report.render_report(synth).read_text()  # no baseline folder, no row
    doc = _add_baseline(synth, like="seq-d1-s1")
    training = _section(report.render_report(synth).read_text(), "## Training evidence", "**Difference to NTP")
    row = _row(training, "source (before)")
    he = doc["results"]["humaneval"]
    assert row[1] == "–" and row[4] == f"{he['gold_bpb']:.3f} [{he['gold_bpb_ci95'][0]:.3f}, {he['gold_bpb_ci95'][1]:.3f}]"
    assert row[2].startswith(f"{doc['results']['heldout']['loss']:.3f} [")
    assert row[5].startswith(f"{doc['results']['gsm8k']['gold_bpb']:.3f} [")
    assert row[6] == f"{100 * he['pass@1']:.1f}% [1.0%, 20.0%]"
    assert training.index("| source (before) |") < training.index("| ntp |")
    assert "(source/ntp-s0/export), evaluated as it is" in training
    assert "trunk scores equal" not in training  # the runs trained their trunks: no equality to expect
    assert "source (before)" not in pd.read_csv(synth / "summary.csv")["variant"].tolist()


def test_frozen_trunks_are_checked_against_the_before_row(synth):
    _add_baseline(synth)
    _freeze(synth, same_eval_as=synth / "baseline")
    text = report.render_report(synth).read_text()
    assert "frozen trunk (train.freeze_trunk): trunk scores equal the source's: yes" in text
    doc = json.loads((synth / "baseline" / "eval.json").read_text())
    doc["results"]["gsm8k"]["gold_bpb"] += 1e-9  # one metric, one bit off
    (synth / "baseline" / "eval.json").write_text(json.dumps(doc))
    text = report.render_report(synth).read_text()
    assert "trunk scores equal the source's: **NO** — ntp: GSM8K gold bits/byte ↓; seq-d1: GSM8K gold bits/byte ↓" in text


def test_settings_model_is_what_the_runs_trained(synth):
    """Not the recipe's [model] (an init_from run takes the checkpoint's); runs that differ are named."""
    def set_model(run: str, **model):
        path = synth / "runs" / run / "run.json"
        doc = json.loads(path.read_text())
        doc["recipe"]["model"].update(model)
        path.write_text(json.dumps(doc))

    for run in ("ntp-s0", "ntp-s1", "seq-d1-s0", "seq-d1-s1"):
        set_model(run, context=1024)
    text = report.render_report(synth).read_text()
    assert "| model | 2 layers, d=32, 4 heads, SwiGLU 88, context 1024, vocab 256 |" in text
    set_model("seq-d1-s1", n_layers=3)
    text = report.render_report(synth).read_text()
    assert ("| model | runs differ: 2 layers, d=32, 4 heads, SwiGLU 88, context 1024, vocab 256 (ntp-s0, ntp-s1, "
            "seq-d1-s0); 3 layers, d=32, 4 heads, SwiGLU 88, context 1024, vocab 256 (seq-d1-s1) |") in text


def test_committed_posthoc_report_has_the_before_row(tmp_path):
    """The committed cpu-posthoc results: the trunk (quick's NTP export) trained at context 1024, and the
    frozen trunks score exactly what the source scored."""
    folder = tmp_path / "cpu-posthoc"
    shutil.copytree(REPO / "results" / "cpu-posthoc", folder)
    text = report.render_report(folder).read_text()
    assert "context 1024" in text.split("## Training evidence")[0]
    assert "| source (before) | – |" in text and "trunk scores equal the source's: yes" in text
    from mtp_cli.config.recipe import recipe_from_dict
    from mtp_cli.results.estimate import training_flops

    run_json = folder / "runs" / "seq-d1-self-s0" / "run.json"
    stored = json.loads(run_json.read_text())
    now = training_flops(recipe_from_dict(stored["recipe"]))[0]
    assert now == stored["flops_per_token"] and "counted as it trained" not in text  # trained by the current code
    committed = (REPO / "results" / "cpu-posthoc" / "REPORT.md").read_text()
    same = lambda doc: [line for line in doc.splitlines() if not line.startswith("Rendered by `mtp report")]  # noqa: E731
    assert same(text) == same(committed)  # the committed REPORT.md is what its results render to (the copy's
    # own folder name aside); no line names the rendering code, so a code commit forces no re-render
    # a run stored before the frozen trunk counted once (its backward counted too) is recounted in a note
    stored["flops_per_token"] = 3 * now
    run_json.write_text(json.dumps(stored))
    text = report.render_report(folder).read_text()
    assert f"stored {3 * now / 1e6:.1f} MFLOP/token" in text
    assert f"counted as it trained, {now / 1e6:.1f} MFLOP/token" in text


def test_a_speed_up_shows_its_interval_over_prompts_and_never_one_of_no_width():
    from mtp_cli.results.report.format import speed

    one_repeat = {"speedup": 0.82, "speedup_ci95": [0.82, 0.82]}
    assert speed(one_repeat, "speedup") == "0.82×"  # one timed repeat: an interval of no width says nothing
    over_prompts = {**one_repeat, "speedup_prompts_ci95": [0.74, 0.90]}
    assert speed(over_prompts, "speedup") == "0.82× [0.74, 0.90]"
    seeds = {**over_prompts, "speedup_ci95": [0.70, 0.95], "speedup_seeds": [0.80, 0.84]}
    assert speed(seeds, "speedup") == "0.82× [0.70, 0.95] (0.80, 0.84)"  # pooled over seeds: the seeds' interval


def test_parts_table_reads_a_fused_call_and_a_draft_within_noise(synth):
    """One row greedy, verification and the next draft are one call: the break-even MAL is that call over
    a step, and a draft share measured as a (noisy) difference below zero reads ≈0, not a negative time."""
    from mtp_cli.results.report.inference import parts_table
    from mtp_cli.results.resultset import load

    for path in synth.glob("runs/seq-d1-s*/specbench.json"):
        doc = json.loads(path.read_text())
        for cond in doc["conditions"]:
            cond["results"]["1"]["mtp"].update(t_draft_s=-5e-7, t_forward_verify_draft_s=0.0025)
        path.write_text(json.dumps(doc))
    (row,) = parts_table(load(synth), "heldout-greedy").rows
    step = (0.002 + 0.0022) / 2
    assert row[7] == "≈0" and row[8] == f"{0.0025 / step:.2f}"


def test_the_draft_length_table_words_each_rule_its_runs_were_chosen_by(tmp_path):
    """Runs benchmarked under different selection rules (one re-run after the rule changed) each keep
    theirs: the table names every rule with the runs it chose for."""
    import json

    from mtp_cli.results.report.inference import draft_len_table
    from mtp_cli.results.resultset import load

    root = make_results(tmp_path / "r", seeds=(0, 1))
    for seed, rule in ((0, "the fastest"), (1, "the shortest unless a longer one is faster")):
        path = root / "runs" / f"seq-d1-s{seed}" / "specbench.json"
        spec = json.loads(path.read_text())
        spec["draft_len_selection"] = {"chosen": 1, "candidates": [1, 2], "source": "humaneval", "temperature": 0.0,
                                       "prompts": 8, "plain_tokens_per_s": 10.0, "rule": rule,
                                       "by_k": {str(k): {"speedup": 1.0, "mean_acceptance_length": 1.2,
                                                         "acceptance_at": [0.2] * k} for k in (1, 2)}}
        path.write_text(json.dumps(spec))
    notes = draft_len_table(load(root)).notes
    assert "rule: the fastest (T=0) (seq-d1 s0)" in notes
    assert "rule: the shortest unless a longer one is faster (T=0) (seq-d1 s1)" in notes


def test_paired_acceptance_across_folders_equals_the_reports_own_pairing(tmp_path):
    """scripts/paired_acceptance.py pairs two runs' first-draft acceptance prompt by prompt: on two runs of one
    folder it gives REPORT.md's paired column; a run whose greedy text differs is not compared."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("paired_acceptance", REPO / "scripts" / "paired_acceptance.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    runs = REPO / "results" / "cpu-smollm2-drafters" / "runs"
    rows = {r["condition"]: r for r in script.compare(runs / "distil-1m-fused-s0", runs / "distil-1m-s0")}
    report = (REPO / "results" / "cpu-smollm2-drafters" / "REPORT.md").read_text()
    for name, row in rows.items():
        lo, hi = row["difference_ci95"]
        cell = f"{100 * row['difference']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
        assert re.search(rf"\| distil-1m-fused \| {name} \|.*\| {re.escape(cell)} \|", report), (name, cell)
    assert set(rows) == {"humaneval-greedy", "gsm8k-greedy"} and all(r["same_greedy_text"] for r in rows.values())
    other = tmp_path / "other"
    shutil.copytree(runs / "distil-1m-s0", other)
    raw = [json.loads(line) for line in (other / "specbench_raw.jsonl").read_text().splitlines()]
    for row in raw:
        if row["method"] == "greedy" and row["condition"] == "gsm8k-greedy":
            row["outputs"][0] = row["outputs"][0][:-1]
    (other / "specbench_raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in raw))
    rows = {r["condition"]: r for r in script.compare(runs / "distil-1m-fused-s0", other)}
    assert rows["gsm8k-greedy"]["difference"] is None and rows["humaneval-greedy"]["difference"] is not None
