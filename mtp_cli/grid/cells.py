"""The grid of `mtp ablate`: a recipe's variants × seeds as cells (a variant at a seed, its single-run
recipe and run folder), the whole `Ablation`, and the recipe version that ties a results folder to
one recipe. Data only; planning, running and showing the grid live beside it in this package."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from mtp_cli.base import paths
from mtp_cli.config.recipe import Recipe, Variant, recipe_data, resolve_recipe_path


@dataclass
class Cell:
    """One grid cell: a variant at a seed, its single-run recipe and its run folder."""

    variant: Variant
    seed: int
    recipe: Recipe
    run_dir: Path
    pending: list[str] = field(default_factory=list)
    gsm8k: Path | None = None  # the eval/specbench GSM8K folder (None: the hub), resolved once for the grid
    model_keys: set[str] = field(default_factory=set)  # [model] keys the recipe/variant set (checked against init_from)

    @property
    def name(self) -> str:
        return self.run_dir.name


@dataclass
class Ablation:
    recipe: Recipe
    source: Path
    results_dir: Path
    cells: list[Cell]
    fingerprint: str = ""
    summary: Path | None = None
    failures: list[str] = field(default_factory=list)
    extra_stages: list[str] = field(default_factory=list)  # "source" / "baseline" still to do (grid.source)
    resume_command: str = ""  # the command that carries on this ablation, printed on Ctrl-C
    threads: int | None = None  # --threads: every stage's torch CPU threads, passed to each (None: torch's default)


def fingerprint(source: Path) -> str:
    """The recipe version: a hash of the TOML as written (parsed, so comments and layout do not count,
    and without `description`). Defaults are not in it, so a new option in the code does not orphan
    stored results; what changed in the code is in each run's git commit. Nor is `eval.gsm8k_data`:
    where the data lives is not what the recipe is. A recipe that `extends` another hashes the tables it
    ends up with, and one whose [source] trains a run of another recipe hashes that recipe too, as far as
    it makes the source run (its tables and the variant named, not that recipe's other variants): a change
    there is a new version of this one (its source run, baseline and runs are then stale)."""
    data = recipe_data(source)
    source_table = data.get("source") or {}
    if source_table.get("recipe"):
        other = _versioned(recipe_data(resolve_recipe_path(source_table["recipe"])))
        other["variants"] = [v for v in other.get("variants", []) if v.get("name") == source_table.get("variant")]
        data["source_recipe"] = other
    return hashlib.sha256(json.dumps(_versioned(data), sort_keys=True, default=str).encode()).hexdigest()[:16]


def _versioned(data: dict) -> dict:
    """A recipe's tables (as `recipe_data` returns them: a fresh dict) without what changes no result."""
    data.pop("description", None)
    if isinstance(data.get("eval"), dict):
        data["eval"].pop("gsm8k_data", None)
    data.pop("launcher", None)  # where the stages run, and what watches them, change no result
    if isinstance(data.get("train"), dict):
        data["train"].pop("track", None)
    return data


def gsm8k_data(recipe: Recipe) -> Path | None:
    """The recipe's GSM8K folder as `mtp ablate` resolves it without --gsm8k-data, or None for the hub."""
    return paths.gsm8k_data(None, recipe.eval.gsm8k_data)
