"""Bad input to the commands after training (eval, ablate, specbench, generate, report): each is refused up
front in one line with exit 2, never run as if it meant something else, never a traceback; and a damaged
file in a results folder is named, never averaged around. Each case was silent nonsense or a traceback
before its fix."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
from helpers import cli_in_process, folder_snapshot, micro_recipe, one_line_error, write_recipe

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def micro_run(tmp_path_factory):
    """A finished 2-step D=1 run and its recipe file."""
    from mtp_cli.train.loop import train

    root = tmp_path_factory.mktemp("bad-input")
    recipe = write_recipe(micro_recipe("sequential", steps=2), root / "micro.toml")
    train(micro_recipe("sequential", steps=2), root / "run", show_progress=False)
    return root / "run", recipe


def truncated_gsm8k(folder: Path) -> Path:
    from mtp_cli.base.paths import GSM8K_DIR

    (folder / "gsm8k").mkdir()
    shutil.copy(GSM8K_DIR / "train.jsonl", folder / "gsm8k" / "train.jsonl")
    text = (GSM8K_DIR / "test.jsonl").read_text()
    (folder / "gsm8k" / "test.jsonl").write_text(text[:3000])  # its last line cut in the middle
    return folder / "gsm8k"


CASES = {
    "eval-empty-tasks": (lambda run, d: ["eval", run, "--tasks", ""], r"no eval task given|eval.tasks .* is empty"),
    "eval-huge-samples": (lambda run, d: ["eval", run, "--tasks", "humaneval", "--samples", str(10**6),
                                          "--temperature", "0.5"], r"--samples must be in \[1, 1000\]"),
    "eval-truncated-gsm8k": (lambda run, d: ["eval", run, "--tasks", "gsm8k", "--limit", "1", "--gsm8k-data",
                                             truncated_gsm8k(d)], r"test.jsonl:\d+ is not valid JSON"),
    "specbench-batch-above-prompts": (lambda run, d: ["specbench", run, "--batch-sizes", "1000000", "--limit", "2",
                                                      "--max-new-tokens", "4"], r"--batch-sizes 1000000: more than the 2"),
    "generate-seed-beyond-64-bits": (lambda run, d: ["generate", run, "--prompt", "def", "--seed", str(2**80)],
                                     r"--seed must be in \[0, 2\*\*63\)"),
    "generate-nan-temperature": (lambda run, d: ["generate", run, "--prompt", "def", "--temperature", "nan"],
                                 r"finite --temperature"),
    "generate-unknown-dtype": (lambda run, d: ["generate", run, "--prompt", "def", "--dtype", "fp8"],
                               r"unknown dtype 'fp8' \(--dtype\)"),
}


@pytest.mark.parametrize("name", CASES)
def test_bad_input_to_a_command_is_one_line(name, micro_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(micro_run[0], run)
    before = folder_snapshot(run)
    args, pattern = CASES[name]
    code, _, err = cli_in_process(*args(run, tmp_path), capsys=capsys)
    one_line_error(code, err, pattern)
    assert folder_snapshot(run) == before


def test_ablate_only_empty_is_refused_not_all(micro_run, tmp_path, capsys):
    code, _, err = cli_in_process("ablate", "--recipe", micro_run[1], "--only", "", "--dry-run",
                                  "--results-root", tmp_path, capsys=capsys)
    one_line_error(code, err, r"--only is empty")
    code, _, err = cli_in_process("ablate", "--recipe", micro_run[1], "--seeds", str(2**76), "--dry-run",
                                  "--results-root", tmp_path, capsys=capsys)
    one_line_error(code, err, r"seed.* must be in \[0, 2\*\*63\)")


def _damage_run_json(results: Path) -> str:
    path = next((results / "runs").glob("*/run.json"))
    path.write_text(path.read_text()[:40])
    return "run.json"


def _damage_lock(results: Path) -> str:
    (results / "recipe.lock.json").write_text("{}")
    return "recipe.lock.json"


def _remove_lock(results: Path) -> str:
    (results / "recipe.lock.json").unlink()
    return "recipe.lock.json"


def _nan_heldout(results: Path) -> str:
    path = next((results / "runs").glob("*/eval.json"))
    doc = json.loads(path.read_text())
    doc["results"]["heldout"]["loss"] = math.nan
    path.write_text(json.dumps(doc))
    return "eval.json"


def _garbage_metrics(results: Path) -> str:
    path = next((results / "runs").glob("*/metrics.jsonl"))
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "garbage{", *lines[1:]]) + "\n")
    return "metrics.jsonl"


@pytest.mark.parametrize("damage", [_damage_run_json, _damage_lock, _remove_lock, _nan_heldout, _garbage_metrics],
                         ids=["truncated-run-json", "empty-lock", "no-lock", "nan-heldout", "garbage-metrics"])
def test_report_names_a_damaged_file(damage, tiny_ablation, tmp_path, capsys):
    """Each damage gives one line naming the file, not a report built around it. Control: the intact copy
    renders."""
    results = tmp_path / "results"
    shutil.copytree(tiny_ablation, results)
    assert cli_in_process("report", results, capsys=capsys)[0] == 0
    name = damage(results)
    code, _, err = cli_in_process("report", results, capsys=capsys)
    one_line_error(code, err, re.escape(name))
