"""Shared fixtures: tiny configs and tiny trained runs (session-scoped, trained once per test session)."""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import pytest
import torch

from mtp_cli.config import DataConfig, ModelConfig, MTPConfig, Recipe, TrainConfig

STDLIB = Path(sysconfig.get_paths()["stdlib"])
TINY_FILES = [str(STDLIB / name) for name in ("textwrap.py", "string.py", "shlex.py", "fnmatch.py", "glob.py", "bisect.py")]


def tiny_model_config(**kw) -> ModelConfig:
    base = dict(vocab_size=512, n_layers=3, d_model=64, n_heads=4, ffn_hidden=128, context=64)
    base.update(kw)
    return ModelConfig(**base)


def tiny_recipe(objective: str = "ntp", steps: int = 80, **mtp_kw) -> Recipe:
    mtp = MTPConfig(objective=objective, **mtp_kw)
    return Recipe(
        name="tiny",
        model=tiny_model_config(),
        mtp=mtp,
        data=DataConfig(source="files", paths=list(TINY_FILES), tokenizer="bpe"),
        train=TrainConfig(steps=steps, batch_size=8, lr=3e-3, warmup=10, eval_every=40, eval_batches=2, ckpt_every=40,
                          peak_flops=1e11),
    )


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Token/tokenizer caches go to a per-session temp folder, never the user's cache."""
    os.environ["MTP_CACHE_DIR"] = str(tmp_path_factory.mktemp("mtp-cache"))
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    yield


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory) -> dict[str, Path]:
    """Three trained tiny runs: {'ntp', 'sequential' (D=2), 'parallel' (n=3)} -> run folder."""
    from mtp_cli.train import train

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
