"""The grid for recipes whose runs start from a checkpoint (train.init_from).

Three jobs, kept out of the grid loop:
- the source stage: a local init_from that does not exist yet but that the recipe's `[source]` table
  says how to make (train + export a variant of another recipe, e.g. the quick recipe's NTP run) is
  made first, into results/<recipe>/source/<variant>-s<seed>/, so a fresh clone can run the recipe;
- resolving each cell's [model] against the checkpoint (the keys the recipe or the variant set must
  agree with it; the rest comes from it) — at plan time when the checkpoint is there, so `--dry-run`
  already refuses a recipe that contradicts it, else right before the cell trains;
- the baseline (`[eval] baseline = true`): `mtp eval --hf` of init_from itself, the "before" row,
  into results/<recipe>/baseline/eval.json.
"""

from __future__ import annotations

from pathlib import Path

from mtp_cli.base import ui
from mtp_cli.base.errors import UserError
from mtp_cli.config.recipe import load_recipe
from mtp_cli.grid import stages
from mtp_cli.grid.cells import Ablation, Cell, gsm8k_data
from mtp_cli.grid.view import GridView
from mtp_cli.model import gguf, pretrained
from mtp_cli.model.checkpoint import has_checkpoint
from mtp_cli.results import folder as results


def _is_local(init_from: str) -> bool:
    """A path (a folder or a .gguf file), not a Hub id or a GGUF short name."""
    if init_from in gguf.SHORT_NAMES:
        return False
    return init_from.startswith((".", "/", "~")) or init_from.count("/") != 1 or Path(init_from).expanduser().exists()


def check(ab: Ablation) -> str:
    """Validate init_from for every cell; returns what is still to do ("" | "source"). Resolves each
    cell's recipe now when its checkpoint is already there."""
    pending, notes = "", set()
    produced = results.source_run_dir(ab.results_dir, ab.recipe)
    for cell in ab.cells:
        init_from = cell.recipe.train.init_from
        if not init_from:
            continue
        path = Path(init_from).expanduser()
        if _is_local(init_from) and not path.exists():
            if produced is None or path.resolve() != (produced / results.EXPORT).resolve():
                where = f" (the recipe's [source] makes {produced / results.EXPORT})" if produced else \
                    " and the recipe has no [source] table saying how to make it"
                raise UserError(f"{cell.name}: train.init_from {init_from} does not exist{where}")
            _check_source_recipe(ab.recipe)
            pending = results.SOURCE
            continue
        if not _is_local(init_from) and not gguf.is_gguf(init_from) and not pretrained.in_hub_cache(init_from):
            notes.add(f"note: {init_from} is not in the local Hugging Face cache; it is downloaded and checked "
                      "when its first run trains")
            continue
        pretrained.resolve_recipe(cell.recipe, cell.model_keys)
    for note in sorted(notes):
        ui.console.print(note, markup=False, highlight=False)
    return pending


def _check_source_recipe(recipe) -> None:
    s = recipe.source
    src = load_recipe(s.recipe)
    names = [v.name for v in src.grid_variants()]
    if s.variant not in names:
        raise UserError(f"[source] variant {s.variant!r} is not in recipe {s.recipe} (variants: {', '.join(names)})")


def make_source(ab: Ablation, show_progress: bool = True) -> Path:
    """Train (resumably) and export the [source] run; returns its export folder."""
    from mtp_cli.model.hf import ensure_export  # see grid.stages.export

    s = ab.recipe.source
    src = load_recipe(s.recipe)
    variant = next(v for v in src.grid_variants() if v.name == s.variant)
    run_dir = results.source_run_dir(ab.results_dir, ab.recipe)
    cell = Cell(variant, s.seed, src.for_run(variant, s.seed), run_dir)
    if not results.train_done(results.RunFolder(run_dir), cell.recipe) or not has_checkpoint(run_dir):
        view = GridView(ab, [(cell, ["train"])], disable=not show_progress)
        with view.progress:
            view.start(cell, "train")
            stages.train(ab, cell, view)
    return ensure_export(run_dir, run_dir / results.EXPORT)


def baseline_source(ab: Ablation) -> str:
    """The checkpoint the baseline row evaluates: the runs' init_from (the [source]'s export, or the recipe's)."""
    return next((c.recipe.train.init_from for c in ab.cells if c.recipe.train.init_from), "")


def baseline_pending(ab: Ablation) -> bool:
    cfg = ab.recipe.eval
    if not (cfg.baseline and cfg.enabled and cfg.tasks and baseline_source(ab)):
        return False
    return not results.baseline_json(ab.results_dir).is_file()


def run_baseline(ab: Ablation, show_progress: bool = True) -> Path:
    """`mtp eval --hf init_from --recipe <this recipe>` with the recipe's eval settings."""
    from mtp_cli.evals.runner import run_eval  # see grid.stages.export

    path = results.baseline_json(ab.results_dir)
    ui.console.print(f"baseline: evaluating {baseline_source(ab)} as it is", highlight=False)
    run_eval(None, stages.eval_config(ab.recipe, gsm8k_data(ab.recipe)),
             stages.runtime(ab, ab.recipe, "eval"),  # the runs' settings
             hf=baseline_source(ab), recipe=str(ab.source), json_path=path, show_progress=show_progress)
    return path
