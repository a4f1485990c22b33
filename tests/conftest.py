"""Shared fixtures: tiny trained runs and a finished micro ablation (session-scoped, made once per
test session), an isolated cache and single-threaded torch. The helpers they use are in helpers.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from helpers import ablation_toml, tiny_recipe


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Token/tokenizer caches go to a per-session temp folder, never the user's cache."""
    os.environ["MTP_CACHE_DIR"] = str(tmp_path_factory.mktemp("mtp-cache"))
    torch.set_num_threads(1)  # tiny models: threads only add overhead, and CI has 2 cores
    yield


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory) -> dict[str, Path]:
    """Three trained tiny runs: {'ntp', 'sequential' (D=2), 'parallel' (n=3)} -> run folder."""
    from mtp_cli.train.loop import train

    root = tmp_path_factory.mktemp("runs")
    runs = {}
    for name, recipe in {
        "ntp": tiny_recipe("ntp"),
        "sequential": tiny_recipe("sequential", depth=2, lambda_=0.3),
        "parallel": tiny_recipe("parallel", heads=3),
    }.items():
        runs[name] = root / name
        train(recipe, runs[name], show_progress=False)
    return runs


@pytest.fixture
def single_thread():
    """Run a test's torch ops on one thread, then restore the count. Tiny models gain nothing from a
    second thread, and on a shared 2-core machine an OpenMP barrier waiting for a descheduled thread
    makes each op ~100x slower. Use it per module: pytestmark = pytest.mark.usefixtures("single_thread")."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_ablation(tmp_path_factory) -> Path:
    """A finished `mtp ablate` of `ablation_toml()` (ntp and seq-d1, seed 0, every stage) -> its results folder."""
    from mtp_cli.ablate import run_ablation

    root = tmp_path_factory.mktemp("ablation")
    recipe = root / "micro-abl.toml"
    recipe.write_text(ablation_toml())
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the training children inherit it (see single_thread)
    try:
        ab = run_ablation(recipe, results_root=root / "results", show_progress=False)
    finally:
        torch.set_num_threads(before)
    assert not ab.failures, ab.failures
    return ab.results_dir
