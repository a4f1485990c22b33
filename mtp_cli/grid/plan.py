"""What `mtp ablate` would do, decided before it does anything: the grid with each cell's pending
stages, the checks a dry run makes (launcher, tracker, GSM8K data, prompt sets), the command that
resumes it, and the `--dry-run` table of stages with their estimated cost."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from mtp_cli.base import paths
from mtp_cli.base.errors import UserError
from mtp_cli.base.tables import Table
from mtp_cli.config.conditions import HELDOUT, plan_conditions
from mtp_cli.config.recipe import load_recipe, resolve_recipe_path
from mtp_cli.data.prompts import load_prompts
from mtp_cli.evals import gsm8k
from mtp_cli.grid import source as source_stage
from mtp_cli.grid.cells import Ablation, Cell, fingerprint
from mtp_cli.model.pretrained import given_model_keys
from mtp_cli.results import folder as results
from mtp_cli.results.estimate import Estimator
from mtp_cli.train import tracking

RESUME_ENV = "MTP_RESUME_COMMAND"  # set by `make report`: the command a user typed is the one to repeat


def resume_command(recipe_path, only=None, seeds=None, results_root=paths.RESULTS_ROOT, gsm8k_data=None,
                   track=None) -> str:
    """The command that resumes this ablation: `make report ...` when that started it, else `mtp ablate`
    with every flag that locates the same results (recipe, results root, variants, seeds, data)."""
    if os.environ.get(RESUME_ENV):
        return os.environ[RESUME_ENV]
    argv = ["mtp", "ablate", "--recipe", str(recipe_path)]
    if Path(results_root) != paths.RESULTS_ROOT:
        argv += ["--results-root", str(results_root)]
    if only:
        argv += ["--only", only if isinstance(only, str) else ",".join(only)]
    if seeds:
        argv += ["--seeds", ",".join(map(str, seeds))]
    if gsm8k_data is not None:
        argv += ["--gsm8k-data", str(gsm8k_data)]
    if track is not None:
        argv += ["--track", track]
    return shlex.join(argv)


def plan(recipe_path: str | Path, only: str | list[str] | None = None, seeds: list[int] | None = None,
         results_root: str | Path = paths.RESULTS_ROOT, gsm8k: str | Path | None = None) -> Ablation:
    """The grid, each cell with the stages it still needs; reads the results folder, writes nothing."""
    source = resolve_recipe_path(recipe_path)
    recipe = load_recipe(source)
    variants = recipe.grid_variants()
    if only is not None:
        wanted = [w.strip() for w in (only.split(",") if isinstance(only, str) else only) if w.strip()]
        if not wanted:
            raise UserError("--only is empty; name one or more variants (or leave --only out for all)")
        known = [v.name for v in variants]
        missing = [w for w in wanted if w not in known]
        if missing:
            raise UserError(f"--only {', '.join(missing)}: no such variant in recipe {recipe.name} "
                            f"(variants: {', '.join(known)})")
        variants = [v for v in variants if v.name in wanted]
    seed_list = list(seeds) if seeds else list(recipe.seeds)
    if len(set(seed_list)) != len(seed_list):
        raise UserError(f"--seeds lists a seed twice: {seed_list}")
    results_dir = Path(results_root) / recipe.name
    cells = []
    for v in variants:
        for seed in seed_list:
            run_recipe = recipe.for_run(v, seed)
            run_dir = results_dir / results.RUNS / results.run_name(v.name, seed)
            if recipe.source.recipe and not run_recipe.train.init_from:
                run_recipe.train.init_from = str(results.source_export(results_dir, recipe))
            keys = given_model_keys(source, v.model) if run_recipe.train.init_from else set()
            cells.append(Cell(v, seed, run_recipe, run_dir,
                              results.pending_stages(results.RunFolder(run_dir), run_recipe),
                              paths.gsm8k_data(gsm8k, run_recipe.eval.gsm8k_data), keys))
    ab = Ablation(recipe, source, results_dir, cells, fingerprint(source))
    ab.extra_stages = [s for s in [source_stage.check(ab)] if s]
    if source_stage.baseline_pending(ab):
        ab.extra_stages.append(results.BASELINE)
    return ab


def launch_settings(ab: Ablation, launcher: dict | None, track: str | None, wait: bool):
    """The recipe's [launcher] with the command line's overrides, and --track set on every run."""
    overrides = dict(launcher or {})
    if overrides.get("sbatch"):
        overrides["sbatch"] = {**ab.recipe.launcher.sbatch, **overrides["sbatch"]}
    ab.recipe.override("launcher", **overrides)
    ab.recipe.launcher.validate()
    if wait and ab.recipe.launcher.kind == "local":
        raise UserError("--wait follows submitted jobs: use it with --launcher slurm")
    for cell in ab.cells:
        cell.recipe.override("train", track=track)
        cell.recipe.train.validate()
    tracking.require(ab.cells[0].recipe.train.track if ab.cells else "none")
    return ab.recipe.launcher


def preflight(ab: Ablation) -> None:
    """Before any training: the eval stage's GSM8K data and specbench's prompts must be there (not found
    out after the training)."""
    checked = set()
    for cell in ab.cells:
        if "eval" in cell.pending and "gsm8k" in cell.recipe.eval.tasks and ("gsm8k", cell.gsm8k) not in checked:
            gsm8k.preflight(cell.gsm8k)
            checked.add(("gsm8k", cell.gsm8k))
        spec = cell.recipe.specbench
        if "specbench" not in cell.pending:
            continue
        conditions, _ = plan_conditions(spec.prompts, spec.temperatures, spec.primary)
        for source in {c.source for c in conditions} - {HELDOUT}:  # heldout: the run's own data, made by training
            if (source, cell.gsm8k) not in checked:
                load_prompts(source, spec.limit or None, cell.gsm8k)
                checked.add((source, cell.gsm8k))


def plan_table(ab: Ablation):
    """A table: every cell, the stages it still needs, and what they should cost."""
    est = Estimator(ab.results_dir, ab.recipe, ab.cells)
    rows = []
    total, unknown = 0.0, 0
    for cell in ab.cells:
        m = cell.recipe.mtp
        what = {"ntp": "ntp", "sequential": f"sequential D={m.depth} λ={m.lambda_at():g} {m.mtp_input}",
                "parallel": f"parallel n={m.heads} λ={m.lambda_at():g}"}[m.objective]
        if not cell.pending:
            rows.append([cell.name, what, "done", "-", ""])
            continue
        for i, stage in enumerate(cell.pending):
            e = est.stage(cell, stage)
            total += e.seconds or 0.0
            unknown += e.seconds is None
            rows.append([cell.name if i == 0 else "", what if i == 0 else "", stage, _duration(e.seconds), e.basis])
    for stage in ab.extra_stages:  # grid.source: before the grid (source) and after it (baseline)
        what = (f"train + export {ab.recipe.source.recipe}/{ab.recipe.source.variant} (seed {ab.recipe.source.seed})"
                if stage == results.SOURCE else f"mtp eval --hf {source_stage.baseline_source(ab)}")
        rows.append([stage, what, stage, "?", ""])
        unknown += 1
    more = f" + {unknown} stage(s) not yet measured" if unknown else ""
    rows.append(["total", f"{len(ab.cells)} runs", f"{sum(len(c.pending) for c in ab.cells)} stages",
                 _duration(total) + (" + ?" if unknown else ""), more.strip()])
    return Table(f"mtp ablate {ab.recipe.name} → {ab.results_dir} (recipe {ab.fingerprint})",
                 ["run", "objective", "to do", "≈ time", "basis"], rows,
                 ["≈ estimates; measured times replace them as runs finish"])


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
