"""`mtp ablate`: a recipe's grid of variants × seeds, each run through train → export → eval → specbench.

Every stage is skipped when its output in the run folder is complete (`results.pending_stages`), so a
killed ablation started again redoes nothing finished and resumes an interrupted training from its
last checkpoint. `results/<recipe>/recipe.lock.json` ties the folder to one version of the recipe:
results of another version are never mixed in or overwritten (unless --force discards them).
Under torchrun only the (collective) train stage runs; a plain `mtp ablate` afterwards does the rest.
"""

from __future__ import annotations

from pathlib import Path

from mtp_cli.base import outputs, paths, ui
from mtp_cli.base.dist import dist_info
from mtp_cli.base.errors import Stop, Terminated, UserError
from mtp_cli.grid import lock, plan, stages
from mtp_cli.grid import source as source_stage
from mtp_cli.grid.cells import Ablation
from mtp_cli.grid.view import GridView
from mtp_cli.results import folder as results


def run_ablation(recipe_path: str | Path, only: str | list[str] | None = None, seeds: list[int] | None = None,
                 dry_run: bool = False, force: bool = False, results_root: str | Path = paths.RESULTS_ROOT,
                 show_progress: bool = True, gsm8k_data: str | Path | None = None, launcher: dict | None = None,
                 track: str | None = None, wait: bool = False, threads: int | None = None) -> Ablation:
    """Run (or with dry_run only plan) the grid; returns the plan, with `summary` set after a real run.
    A dry run checks what the real run checks first (recipe, lock, output folder, GSM8K, prompts).
    `launcher`: overrides of the recipe's [launcher] section (kind "slurm" submits jobs, see mtp_cli.launch);
    `track`: overrides train.track of every run; `threads`: every stage's torch CPU threads."""
    ab = plan.plan(recipe_path, only, seeds, results_root, gsm8k_data)
    ab.threads = threads
    ab.resume_command = plan.resume_command(recipe_path, only, seeds, results_root, gsm8k_data, track)
    stale = lock.check_lock(ab, force)
    settings = plan.launch_settings(ab, launcher, track, wait)
    outputs.folder(results_root, "--results-root")
    plan.preflight(ab)
    if dry_run:
        return ab
    info = dist_info()
    world, rank = info.world, info.rank
    if stale:
        if world > 1:  # every rank must see the same folder: discard it in one process first
            raise UserError(f"--force under torchrun: discard {ab.results_dir} first (remove it, or run "
                            f"`mtp ablate --recipe {ab.source} --force` without torchrun)")
        lock.discard(ab.results_dir)
        ab = plan.plan(recipe_path, only, seeds, results_root, gsm8k_data)
        ab.resume_command = plan.resume_command(recipe_path, only, seeds, results_root, gsm8k_data, track)
        ab.threads = threads
        plan.launch_settings(ab, launcher, track, wait)
    lock.write_lock(ab)
    if settings.kind != "local":
        from mtp_cli.launch import submit  # submitit is an optional dependency (the slurm extra)

        if results.SOURCE in ab.extra_stages:
            raise UserError(f"{ab.recipe.name} first trains its [source] run: make it with --launcher local, then submit")
        return submit.submit_ablation(ab, settings, wait=wait, show_progress=show_progress)
    if results.SOURCE in ab.extra_stages and rank == 0:
        source_stage.make_source(ab, show_progress)
    to_run = ("train",) if world > 1 else results.STAGES
    if world > 1 and rank == 0:
        ui.console.print(f"torchrun with {world} processes: running the train stage only; "
                         f"run `mtp ablate --recipe {ab.source}` without torchrun for the rest")
    work = [(cell, [s for s in cell.pending if s in to_run]) for cell in ab.cells]
    anything_to_do = any(cell_stages for _, cell_stages in work)
    if rank == 0 and not anything_to_do:
        ui.console.print(f"nothing to do: every stage of the {len(ab.cells)} runs in {ab.results_dir} is done")
    view = GridView(ab, work, disable=not show_progress or rank != 0 or not anything_to_do)
    try:
        with view.progress:
            for cell, cell_stages in work:
                for stage in cell_stages:
                    view.start(cell, stage)
                    ok = stages.run_stage(ab, cell, stage, view)
                    view.finish(cell, stage, ok)
                    if not ok:
                        break
                if rank == 0:
                    results.write_summary(ab.results_dir)
    except (KeyboardInterrupt, Terminated) as exc:
        if rank == 0:
            results.write_summary(ab.results_dir)
            what = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
            ui.console.print(f"{what}: run `{ab.resume_command}` again to resume (finished stages are kept)",
                             markup=False, soft_wrap=True)
            Stop.said = True
        raise
    if rank == 0 and world == 1 and results.BASELINE in ab.extra_stages:
        source_stage.run_baseline(ab, show_progress)
    if rank == 0:
        ab.summary = results.write_summary(ab.results_dir)
    for cell in ab.cells:
        cell.pending = results.pending_stages(results.RunFolder(cell.run_dir), cell.recipe)
    return ab
