"""`mtp ablate`: a recipe's grid of variants × seeds, each run through train → export → eval → specbench.

Every stage is skipped when its output in the run folder is complete (`results.pending_stages`), so a
killed ablation started again redoes nothing finished and resumes an interrupted training from its
last checkpoint. `results/<recipe>/recipe.lock.json` ties the folder to one version of the recipe:
results of another version are never mixed in or overwritten (unless --force discards them).
Under torchrun only the (collective) train stage runs; a plain `mtp ablate` afterwards does the rest.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from mtp_cli import env, results, ui
from mtp_cli.checkpoint import write_json
from mtp_cli.config import Recipe, Variant, load_recipe, resolve_recipe_path
from mtp_cli.errors import UserError


@dataclass
class Cell:
    """One grid cell: a variant at a seed, its single-run recipe and its run folder."""

    variant: Variant
    seed: int
    recipe: Recipe
    run_dir: Path
    pending: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.run_dir.name


@dataclass
class Ablation:
    recipe: Recipe
    source: Path
    results_dir: Path
    cells: list[Cell]
    summary: Path | None = None
    failures: list[str] = field(default_factory=list)


def plan(recipe_path: str | Path, only: str | list[str] | None = None, seeds: list[int] | None = None,
         results_root: str | Path = "results") -> Ablation:
    """The grid, each cell with the stages it still needs; reads the results folder, writes nothing."""
    source = resolve_recipe_path(recipe_path)
    recipe = load_recipe(source)
    variants = recipe.grid_variants()
    if only:
        wanted = [w.strip() for w in (only.split(",") if isinstance(only, str) else only) if w.strip()]
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
            cells.append(Cell(v, seed, run_recipe, run_dir,
                              results.pending_stages(results.RunFolder(run_dir), run_recipe)))
    return Ablation(recipe, source, results_dir, cells)


def run_ablation(recipe_path: str | Path, only: str | list[str] | None = None, seeds: list[int] | None = None,
                 dry_run: bool = False, force: bool = False, results_root: str | Path = "results",
                 show_progress: bool = True) -> Ablation:
    """Run (or with dry_run only plan) the grid; returns the plan, with `summary` set after a real run."""
    ab = plan(recipe_path, only, seeds, results_root)
    stale = check_lock(ab, force)
    if dry_run:
        return ab
    if stale:
        discard(ab.results_dir)
        ab = plan(recipe_path, only, seeds, results_root)
    write_lock(ab)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    stages = ("train",) if world > 1 else results.STAGES
    if world > 1 and rank == 0:
        ui.console.print(f"torchrun with {world} processes: running the train stage only; "
                         f"run `mtp ablate --recipe {ab.source}` without torchrun for the rest")
    todo = [(cell, [s for s in cell.pending if s in stages]) for cell in ab.cells]
    grid = ui.progress(disable=not show_progress or rank != 0)
    try:
        with grid:
            overall = grid.add_task(f"ablate {ab.recipe.name}", total=sum(len(s) for _, s in todo), info="")
            rows = {cell.name: grid.add_task(f"  {cell.name}", total=len(results.STAGES),
                                             completed=len(results.STAGES) - len(cell.pending),
                                             info="done" if not stages_of else "waiting")
                    for cell, stages_of in todo}
            for cell, cell_stages in todo:
                for stage in cell_stages:
                    grid.update(rows[cell.name], info=stage)
                    ok = _run_stage(ab, cell, stage, show_progress and rank == 0)
                    grid.update(overall, advance=1)
                    grid.update(rows[cell.name], advance=1)
                    if not ok:
                        grid.update(rows[cell.name], info="[red]failed[/red]")
                        grid.update(overall, advance=len(cell_stages) - cell_stages.index(stage) - 1)
                        break
                else:
                    grid.update(rows[cell.name], info="done")
                if rank == 0:
                    results.write_summary(ab.results_dir)
    except KeyboardInterrupt:
        if rank == 0:
            results.write_summary(ab.results_dir)
            ui.console.print(f"interrupted: run `mtp ablate --recipe {ab.source}` again to resume "
                             f"(finished stages are kept)")
        raise
    if rank == 0:
        ab.summary = results.write_summary(ab.results_dir)
    for cell in ab.cells:
        cell.pending = results.pending_stages(results.RunFolder(cell.run_dir), cell.recipe)
    return ab


# ---- the stages -----------------------------------------------------------------------------------
def _run_stage(ab: Ablation, cell: Cell, stage: str, show_progress: bool) -> bool:
    """Run one stage and log its wall time; False (and the traceback in ablate.log) if it crashed.
    Bad input (UserError) and Ctrl-C stop the whole ablation instead."""
    cell.run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        STAGE_FUNCS[stage](ab, cell, show_progress)
    except (UserError, KeyboardInterrupt):
        raise
    except Exception as exc:  # a crash in one run must not cost the others
        with open(cell.run_dir / "ablate.log", "a") as log:
            log.write(f"--- {stage} failed at {_now()}\n{traceback.format_exc()}\n")
        ab.failures.append(f"{cell.name}: {stage} failed ({type(exc).__name__}: {exc}); see {cell.run_dir / 'ablate.log'}")
        ui.console.print(f"[red]{cell.name}: {stage} failed[/red] ({type(exc).__name__}: {exc})", highlight=False)
        return False
    _log_stage(ab, cell, stage, time.perf_counter() - t0)
    return True


def _train(ab: Ablation, cell: Cell, show_progress: bool) -> None:
    from mtp_cli.train import train

    train(cell.recipe, cell.run_dir, resume=True, show_progress=show_progress)


def _export(ab: Ablation, cell: Cell, show_progress: bool) -> None:
    from mtp_cli.model.hf import export_run

    export_run(cell.run_dir, cell.run_dir / results.EXPORT)


def _eval(ab: Ablation, cell: Cell, show_progress: bool) -> None:
    from mtp_cli.evals.runner import run_eval

    cfg = cell.recipe.eval
    done = results.RunFolder(cell.run_dir).eval.get("results") or {}
    for task in cfg.tasks:
        if task in done:
            continue
        run_eval(cell.run_dir, tasks=(task,), limit=cfg.limit(task), gsm8k_data=gsm8k_data(cell.recipe),
                 json_path=cell.run_dir / f"eval-{task}.json", show_progress=show_progress)
        merge_eval(cell.run_dir, task)


def _specbench(ab: Ablation, cell: Cell, show_progress: bool) -> None:
    from mtp_cli.decode.bench import run_specbench

    cfg = cell.recipe.specbench
    run_specbench(cell.run_dir, prompts=cfg.prompts, limit=cfg.limit, max_new_tokens=cfg.max_new_tokens,
                  batch_sizes=tuple(cfg.batch_sizes), repeats=cfg.repeats, draft_len=cfg.draft_len,
                  json_path=cell.run_dir / results.SPEC_JSON, show_progress=show_progress)


STAGE_FUNCS = {"train": _train, "export": _export, "eval": _eval, "specbench": _specbench}


def merge_eval(run_dir: Path, task: str) -> None:
    """Fold one task's eval JSON into the run's eval.json, so each task is done (and kept) on its own."""
    part_path = run_dir / f"eval-{task}.json"
    part = json.loads(part_path.read_text())
    merged_path = run_dir / results.EVAL_JSON
    merged = json.loads(merged_path.read_text()) if merged_path.is_file() else {}
    results_by_task = {**(merged.get("results") or {}), **(part.get("results") or {})}
    merged = {**merged, **part, "results": results_by_task}
    write_json(merged_path, merged)
    part_path.unlink()


def gsm8k_data(recipe: Recipe) -> Path | None:
    """The recipe's offline GSM8K folder (relative paths resolve against the repository), or None."""
    if not recipe.eval.gsm8k_data:
        return None
    path = Path(recipe.eval.gsm8k_data).expanduser()
    return path if path.is_absolute() else (env.REPO / path).resolve()


# ---- the lock: one results folder, one recipe version -------------------------------------------------
def check_lock(ab: Ablation, force: bool) -> bool:
    """True when the folder holds results of another recipe version that --force may discard."""
    lock = results.read_lock(ab.results_dir)
    has_runs = any((ab.results_dir / results.RUNS).glob("*/run.json"))
    mine = ab.recipe.fingerprint()
    if lock.get("fingerprint") == mine or (not lock and not has_runs):
        return False
    what = (f"results of another version of recipe {ab.recipe.name} (fingerprint {lock['fingerprint']}, "
            f"the recipe is now {mine})" if lock else "runs without a recipe.lock.json")
    if not force:
        raise UserError(f"{ab.results_dir} holds {what}; restore that recipe, pass another --results-root, "
                        f"or pass --force to discard them")
    return True


def discard(results_dir: Path) -> None:
    """--force: remove a stale results folder's runs and derived files (nothing else in it)."""
    for name in (results.RUNS, results.PLOTS):
        shutil.rmtree(results_dir / name, ignore_errors=True)
    for name in (results.LOCK, results.SUMMARY, results.REPORT):
        (results_dir / name).unlink(missing_ok=True)


def write_lock(ab: Ablation) -> None:
    if int(os.environ.get("RANK", "0")) != 0:
        return
    ab.results_dir.mkdir(parents=True, exist_ok=True)
    path = ab.results_dir / results.LOCK
    lock = results.read_lock(ab.results_dir)
    if lock.get("fingerprint") == ab.recipe.fingerprint():
        return
    write_json(path, {"recipe_name": ab.recipe.name, "fingerprint": ab.recipe.fingerprint(),
                      "source": _display_path(ab.source), "created": _now(), "recipe": ab.recipe.to_dict()})


def _log_stage(ab: Ablation, cell: Cell, stage: str, seconds: float) -> None:
    path = cell.run_dir / results.ABLATE_JSON
    log = json.loads(path.read_text()) if path.is_file() else {}
    log.update({"variant": cell.variant.name, "seed": cell.seed, "recipe": ab.recipe.name,
                "fingerprint": ab.recipe.fingerprint()})
    log.setdefault("stages", {})[stage] = {"seconds": round(seconds, 2), "finished": _now()}
    write_json(path, log)


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(env.REPO))
    except ValueError:
        return str(path)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ---- the plan, for --dry-run ------------------------------------------------------------------------
def plan_table(ab: Ablation):
    """A Rich table: every cell, the stages it still needs, and what they should cost."""
    from rich.table import Table

    from mtp_cli.cost import Estimator

    est = Estimator(ab.results_dir, ab.recipe)
    table = Table(title=f"mtp ablate {ab.recipe.name} → {ab.results_dir} (recipe {ab.recipe.fingerprint()})",
                  caption="≈ estimates; measured times replace them as runs finish")
    for col, justify in (("run", "left"), ("objective", "left"), ("to do", "left"), ("≈ time", "right"),
                         ("basis", "left")):
        table.add_column(col, justify=justify)
    total, unknown = 0.0, 0
    for cell in ab.cells:
        m = cell.recipe.mtp
        what = {"ntp": "ntp", "sequential": f"sequential D={m.depth} λ={m.weight:g} {m.mtp_input}",
                "parallel": f"parallel n={m.heads} λ={m.weight:g}"}[m.objective]
        if not cell.pending:
            table.add_row(cell.name, what, "[green]done[/green]", "-", "")
            continue
        for i, stage in enumerate(cell.pending):
            e = est.stage(cell, stage)
            total += e.seconds or 0.0
            unknown += e.seconds is None
            table.add_row(cell.name if i == 0 else "", what if i == 0 else "", stage,
                          _duration(e.seconds), e.basis)
    more = f" + {unknown} stage(s) not yet measured" if unknown else ""
    table.add_section()
    table.add_row("total", f"{len(ab.cells)} runs", f"{sum(len(c.pending) for c in ab.cells)} stages",
                  _duration(total), more.strip())
    return table


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
