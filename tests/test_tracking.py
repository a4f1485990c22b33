"""--track: TensorBoard and wandb (offline) get the same scalars as metrics.jsonl, read back with their own
readers (TensorBoard's EventAccumulator, wandb's protobuf records); the recipe is the run's config; the
ablation's eval/specbench headline numbers follow; a tracker that is not installed is a one-line error."""

from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path

import pytest
from helpers import cli_in_process, micro_recipe

from mtp_cli.base.errors import UserError
from mtp_cli.grid import stages
from mtp_cli.results import folder as results
from mtp_cli.train import tracking

pytestmark = pytest.mark.usefixtures("single_thread")


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _event_accumulator(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_tensorboard_gets_every_metrics_row(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard not installed (pip install 'mtp[tensorboard]')")
    from mtp_cli.train.loop import train

    recipe = micro_recipe("sequential", steps=4, depth=2, lambda_=0.3)
    recipe.train.track = "tensorboard"
    run = tmp_path / "run"
    train(recipe, run, show_progress=False)
    acc = _event_accumulator(run / tracking.TENSORBOARD_DIR)
    rows = _metrics(run)
    expected: dict[str, dict[int, float]] = {}
    for row in rows:
        for key, value in row.items():
            if key not in ("kind", "step"):
                expected.setdefault(f"{row['kind']}/{key}", {})[row["step"]] = value
    assert {"train/loss_mtp_2", "train/lambda", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/mfu",
            "val/val_loss", "val/val_agree_1"} <= set(expected)
    assert set(acc.Tags()["scalars"]) == set(expected)
    for tag, by_step in expected.items():
        logged = {e.step: e.value for e in acc.Scalars(tag)}
        assert logged.keys() == by_step.keys(), tag
        for step, value in by_step.items():
            assert logged[step] == pytest.approx(value, rel=1e-6, abs=1e-12), (tag, step)
    (text,) = acc.Tensors("recipe/text_summary")
    config = text.tensor_proto.string_val[0].decode()
    assert '"objective": "sequential"' in config and '"track": "tensorboard"' in config


def test_eval_and_specbench_headlines_are_logged_after_their_stages(tiny_ablation, tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard not installed (pip install 'mtp[tensorboard]')")
    from mtp_cli.model.checkpoint import recipe_of_run

    run = tmp_path / "seq-d1-s0"
    shutil.copytree(tiny_ablation / results.RUNS / "seq-d1-s0", run, ignore=shutil.ignore_patterns("checkpoint.pt", "export"))
    recipe = recipe_of_run(run)
    recipe.train.track = "tensorboard"
    stages.track_stage(recipe, run, "eval")
    stages.track_stage(recipe, run, "specbench")
    acc = _event_accumulator(run / tracking.TENSORBOARD_DIR)
    row = results.summary_row(results.RunFolder(run))
    assert "eval/humaneval_pass1" in acc.Tags()["scalars"] and "specbench/spec_mal" in acc.Tags()["scalars"]
    for stage, columns in tracking.HEADLINES.items():
        for col in columns:
            if row.get(col) is None:
                continue
            (event,) = acc.Scalars(f"{stage}/{col}")
            assert event.step == row["steps"] and event.value == pytest.approx(float(row[col]), rel=1e-6)


def _wandb_records(path: Path) -> list:
    """The records of a .wandb file (LevelDB log framing of wandb's own Record protobufs)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, buf, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, LAST
            rec = pb.Record()
            rec.ParseFromString(buf)
            records.append(rec)
            buf = b""
        elif kind == 0:
            break
    return records


def test_wandb_offline_run_holds_the_metrics_and_the_recipe(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb not installed (pip install 'mtp[wandb]')")
    from mtp_cli.train.loop import train

    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "netrc").write_text("")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))  # not logged in: offline
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    assert tracking.wandb_mode() == "offline"
    recipe = micro_recipe("ntp", steps=3)
    recipe.train.track = "wandb"
    run = tmp_path / "run"
    train(recipe, run, show_progress=False)
    run_id = json.loads((run / tracking.STATE_JSON).read_text())["wandb_id"]
    (wandb_file,) = (run / tracking.WANDB_DIR).glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    records = _wandb_records(wandb_file)
    history = []
    for rec in records:
        if rec.WhichOneof("record_type") == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in rec.history.item})
    config = {}
    for rec in records:
        kind = rec.WhichOneof("record_type")
        if kind in ("run", "config"):
            updates = rec.run.config.update if kind == "run" else rec.config.update
            config.update({item.key: json.loads(item.value_json) for item in updates})
    assert "model" in config, ([r.WhichOneof("record_type") for r in records], config.keys())
    assert config["model"]["d_model"] == recipe.model.d_model and config["train"]["track"] == "wandb"
    rows = _metrics(run)
    logged = {(h["step"], tag): v for h in history for tag, v in h.items() if "/" in tag}
    expected = {(r["step"], tag): v for r in rows for tag, v in tracking.scalars(r).items()}
    assert logged.keys() == expected.keys()
    for key, value in expected.items():
        assert logged[key] == pytest.approx(value, rel=1e-9), key


def test_a_tracker_that_is_not_installed_is_one_line_exit_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import fails as if not installed
    with pytest.raises(UserError, match=r"pip install tensorboard"):
        tracking.require("tensorboard")
    code, _, err = cli_in_process("train", "--track", "tensorboard", "--steps", "1", capsys=capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "pip install tensorboard" in err, err
    monkeypatch.setitem(sys.modules, "wandb", None)
    code, _, err = cli_in_process("train", "--track", "wandb", "--steps", "1", capsys=capsys)
    assert code == 2 and "pip install wandb" in err and len(err.strip().splitlines()) == 1, err
    code, _, err = cli_in_process("train", "--track", "mlflow", "--steps", "1", capsys=capsys)
    assert code == 2 and "unknown tracker 'mlflow'" in err and len(err.strip().splitlines()) == 1, err


def test_no_tracker_by_default_writes_nothing_extra(tmp_path):
    from mtp_cli.train.loop import train

    run = tmp_path / "run"
    train(micro_recipe("ntp", steps=2), run, show_progress=False)
    assert not (run / tracking.TENSORBOARD_DIR).exists() and not (run / tracking.WANDB_DIR).exists()
    assert not (run / tracking.STATE_JSON).exists()
