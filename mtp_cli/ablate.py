"""`mtp ablate`: a recipe's grid of variants × seeds, each run through train → export → eval → specbench.

Every stage is skipped when its output in the run folder is complete (`results.pending_stages`), so a
killed ablation started again redoes nothing finished and resumes an interrupted training from its
last checkpoint. `results/<recipe>/recipe.lock.json` ties the folder to one version of the recipe:
results of another version are never mixed in or overwritten (unless --force discards them).
Under torchrun only the (collective) train stage runs; a plain `mtp ablate` afterwards does the rest.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import os
import shlex
import shutil
import time
import tomllib
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from mtp_cli import ablate_source, env, outputs, paths, results, ui
from mtp_cli.checkpoint import write_json
from mtp_cli.config import Recipe, Variant, load_recipe, resolve_recipe_path
from mtp_cli.errors import UserError
from mtp_cli.model.pretrained import given_model_keys


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
    extra_stages: list[str] = field(default_factory=list)  # "source" / "baseline" still to do (ablate_source)
    resume_command: str = ""  # the command that carries on this ablation, printed on Ctrl-C


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
            if recipe.source.recipe and not run_recipe.train.init_from:
                run_recipe.train.init_from = str(ablate_source.source_export(results_dir, recipe))
            keys = given_model_keys(source, v.model) if run_recipe.train.init_from else set()
            cells.append(Cell(v, seed, run_recipe, run_dir,
                              results.pending_stages(results.RunFolder(run_dir), run_recipe),
                              paths.gsm8k_data(gsm8k, run_recipe.eval.gsm8k_data), keys))
    ab = Ablation(recipe, source, results_dir, cells, fingerprint(source))
    ab.extra_stages = [s for s in [ablate_source.check(ab)] if s]
    if ablate_source.baseline_pending(ab):
        ab.extra_stages.append(ablate_source.BASELINE)
    return ab


def fingerprint(source: Path) -> str:
    """The recipe version: a hash of the TOML as written (parsed, so comments and layout do not count,
    and without `description`). Defaults are not in it, so a new option in the code does not orphan
    stored results; what changed in the code is in each run's git commit. Nor is `eval.gsm8k_data`:
    where the data lives is not what the recipe is."""
    data = tomllib.loads(source.read_text())
    data.setdefault("name", source.stem)
    data.pop("description", None)
    if isinstance(data.get("eval"), dict):
        data["eval"].pop("gsm8k_data", None)
    data.pop("launcher", None)  # where the stages run, and what watches them, change no result
    if isinstance(data.get("train"), dict):
        data["train"].pop("track", None)
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_ablation(recipe_path: str | Path, only: str | list[str] | None = None, seeds: list[int] | None = None,
                 dry_run: bool = False, force: bool = False, results_root: str | Path = paths.RESULTS_ROOT,
                 show_progress: bool = True, gsm8k_data: str | Path | None = None, launcher: dict | None = None,
                 track: str | None = None, wait: bool = False) -> Ablation:
    """Run (or with dry_run only plan) the grid; returns the plan, with `summary` set after a real run.
    A dry run checks what the real run checks first (recipe, lock, output folder, GSM8K, prompts).
    `launcher`: overrides of the recipe's [launcher] section (kind "slurm" submits jobs, see mtp_cli.launch);
    `track`: overrides train.track of every run."""
    ab = plan(recipe_path, only, seeds, results_root, gsm8k_data)
    ab.resume_command = resume_command(recipe_path, only, seeds, results_root, gsm8k_data, track)
    stale = check_lock(ab, force)
    settings = _launch_settings(ab, launcher, track, wait)
    outputs.folder(results_root, "--results-root")
    _preflight_eval(ab)
    if dry_run:
        return ab
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if stale:
        if world > 1:  # every rank must see the same folder: discard it in one process first
            raise UserError(f"--force under torchrun: discard {ab.results_dir} first (remove it, or run "
                            f"`mtp ablate --recipe {ab.source} --force` without torchrun)")
        discard(ab.results_dir)
        ab = plan(recipe_path, only, seeds, results_root, gsm8k_data)
        ab.resume_command = resume_command(recipe_path, only, seeds, results_root, gsm8k_data, track)
        _launch_settings(ab, launcher, track, wait)
    write_lock(ab)
    if settings.kind != "local":
        from mtp_cli.launch import submit

        if ablate_source.SOURCE in ab.extra_stages:
            raise UserError(f"{ab.recipe.name} first trains its [source] run: make it with --launcher local, then submit")
        return submit.submit_ablation(ab, settings, wait=wait, show_progress=show_progress)
    if ablate_source.SOURCE in ab.extra_stages and rank == 0:
        ablate_source.make_source(ab, show_progress)
    stages = ("train",) if world > 1 else results.STAGES
    if world > 1 and rank == 0:
        ui.console.print(f"torchrun with {world} processes: running the train stage only; "
                         f"run `mtp ablate --recipe {ab.source}` without torchrun for the rest")
    work = [(cell, [s for s in cell.pending if s in stages]) for cell in ab.cells]
    anything_to_do = any(cell_stages for _, cell_stages in work)
    if rank == 0 and not anything_to_do:
        ui.console.print(f"nothing to do: every stage of the {len(ab.cells)} runs in {ab.results_dir} is done")
    view = GridView(ab, work, disable=not show_progress or rank != 0 or not anything_to_do)
    try:
        with view.progress:
            for cell, cell_stages in work:
                for stage in cell_stages:
                    view.start(cell, stage)
                    ok = _run_stage(ab, cell, stage, view)
                    view.finish(cell, stage, ok)
                    if not ok:
                        break
                if rank == 0:
                    results.write_summary(ab.results_dir)
    except KeyboardInterrupt:
        if rank == 0:
            results.write_summary(ab.results_dir)
            ui.console.print(f"interrupted: run `{ab.resume_command}` again to resume (finished stages are kept)",
                             markup=False, soft_wrap=True)
        raise
    if rank == 0 and world == 1 and ablate_source.BASELINE in ab.extra_stages:
        ablate_source.run_baseline(ab, show_progress)
    if rank == 0:
        ab.summary = results.write_summary(ab.results_dir)
    for cell in ab.cells:
        cell.pending = results.pending_stages(results.RunFolder(cell.run_dir), cell.recipe)
    return ab


class GridView:
    """The Rich progress view across the grid: one row for the whole ablation, one per run (stages
    done / 4), and a row for the training under way (its steps, read from its metrics.jsonl). The whole
    ablation's time remaining comes from the plan's estimates (`mtp ablate --dry-run`), re-read as
    stages finish, not from the speed of the stages so far."""

    def __init__(self, ab: Ablation, work: list[tuple[Cell, list[str]]], disable: bool):
        self.ab = ab
        self.progress = ui.progress(disable=disable)
        self.show_nested = not disable  # eval/specbench draw their own bars inside this view
        self.work = {cell.name: stages for cell, stages in work}
        self.stages_left = [(cell, stage) for cell, stages in work for stage in stages]
        self.overall = self.progress.add_task(f"ablate {ab.recipe.name}", total=sum(map(len, self.work.values())),
                                              info="stages", eta=None)
        n = len(results.STAGES)
        self.completed = {cell.name: n - len(cell.pending) for cell, _ in work}
        self.rows = {cell.name: self.progress.add_task(f"  {cell.name}", total=n, completed=n - len(cell.pending),
                                                       info="waiting" if stages else "done") for cell, stages in work}
        self.train_task = None
        self.train_step = 0
        self.current: tuple[Cell, str, float] | None = None
        self.estimates: dict[tuple[str, str], float | None] = {}
        if not disable:
            self._estimate()

    def _estimate(self) -> None:
        from mtp_cli.cost import Estimator

        est = Estimator(self.ab.results_dir, self.ab.recipe)
        self.estimates = {(cell.name, stage): est.stage(cell, stage).seconds for cell, stage in self.stages_left}
        self._show_eta()

    def _show_eta(self) -> None:
        """Stages not started at their estimate, the one under way at what is left of its estimate."""
        if not self.estimates:
            return
        left, unknown = 0.0, False
        for cell, stage in self.stages_left:
            seconds = self.estimates.get((cell.name, stage))
            if self.current and self.current[:2] == (cell, stage) and seconds is not None:
                seconds = max(0.0, seconds - (time.perf_counter() - self.current[2]))
            unknown |= seconds is None
            left += seconds or 0.0
        text = str(timedelta(seconds=round(left)))
        self.progress.update(self.overall, eta=f"≥ {text}" if unknown else text)

    def start(self, cell: Cell, stage: str) -> None:
        self.current = (cell, stage, time.perf_counter())
        self.progress.update(self.rows[cell.name], info=stage)
        self._show_eta()

    def finish(self, cell: Cell, stage: str, ok: bool) -> None:
        stages = self.work[cell.name]
        skipped = stages[stages.index(stage) + 1:] if not ok else []
        self.stages_left = [(c, s) for c, s in self.stages_left if not (c is cell and (s == stage or s in skipped))]
        self.current = None
        self.progress.update(self.overall, advance=1 + len(skipped))
        self.progress.update(self.rows[cell.name], advance=1)
        self.completed[cell.name] += 1
        info = "[red]failed[/red]" if not ok else ("done" if self.completed[cell.name] == len(results.STAGES)
                                                   else f"{stage} done")
        self.progress.update(self.rows[cell.name], info=info)
        if self.estimates:
            self._estimate()  # a finished stage is a measurement the other cells' estimates borrow

    def training(self, cell: Cell, metrics: Path) -> None:
        """Show the steps of a training running in a child process (polled from its metrics)."""
        step, loss = _last_train_step(metrics)
        total = cell.recipe.train.steps
        info = f"loss {loss:.3f}" if loss is not None else ""
        self._show_eta()
        if self.train_task is None:
            self.train_task = self.progress.add_task(f"  train {cell.name}", total=total, completed=step, info=info)
        else:  # a new metrics row (every train.log_every steps) is worth a line in a log file
            self.progress.update(self.train_task, description=f"  train {cell.name}", total=total, completed=step,
                                 info=info, log=step != self.train_step)
        self.train_step = step

    def training_done(self) -> None:
        if self.train_task is not None:
            self.progress.remove_task(self.train_task)
            self.train_task = None


def _last_train_step(metrics: Path) -> tuple[int, float | None]:
    try:
        with open(metrics, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return 0, None
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("kind") == "train":
            return int(row["step"]), row.get("loss_main")
    return 0, None


def _launch_settings(ab: Ablation, launcher: dict | None, track: str | None, wait: bool):
    """The recipe's [launcher] with the command line's overrides, and --track set on every run."""
    from mtp_cli import tracking

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


# ---- the stages -----------------------------------------------------------------------------------
def _run_stage(ab: Ablation, cell: Cell, stage: str, view: GridView) -> bool:
    """Run one stage and log its wall time; False (and the traceback in ablate.log) if it crashed.
    Bad input (UserError) and Ctrl-C stop the whole ablation instead."""
    cell.run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        STAGE_FUNCS[stage](cell, view)
    except (UserError, KeyboardInterrupt):
        raise
    except Exception as exc:  # a crash in one run must not cost the others
        with open(cell.run_dir / "ablate.log", "a") as log:
            log.write(f"--- {stage} failed at {_now()}\n{getattr(exc, 'details', None) or traceback.format_exc()}\n")
        ab.failures.append(f"{cell.name}: {stage} failed ({type(exc).__name__}: {exc}); see {cell.run_dir / 'ablate.log'}")
        ui.console.print(f"[red]{cell.name}: {stage} failed[/red] ({type(exc).__name__}: {exc})", highlight=False)
        return False
    _log_stage(ab, cell, stage, time.perf_counter() - t0)
    if int(os.environ.get("RANK", "0")) == 0:
        from mtp_cli import tracking

        tracking.log_stage(cell.recipe, cell.run_dir, stage)
    return True


def _train(cell: Cell, view: GridView) -> None:
    """Train in a fresh process, so that its peak memory is its own (not the ablation's so far) and
    no state leaks between runs. Under torchrun the ranks train in-process (the collectives need them)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from mtp_cli.train import train

        ablate_source.resolve_cell(cell)
        train(cell.recipe, cell.run_dir, resume=True, show_progress=view.show_nested)
        return
    import torch

    ablate_source.resolve_cell(cell)  # after the source stage: the checkpoint is there now
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_train_child, name=f"train {cell.name}",
                        args=(cell.recipe.to_dict(), str(cell.run_dir), torch.get_num_threads(), send))
    child.start()
    send.close()
    try:
        while child.is_alive():
            view.training(cell, cell.run_dir / "metrics.jsonl")
            child.join(0.5)
    except KeyboardInterrupt:
        child.join()  # the same Ctrl-C reached the child, which saves a checkpoint before it exits
        raise
    finally:
        view.training_done()
    message = receive.recv() if receive.poll() else ("error", f"training process exited with code {child.exitcode}")
    kind, text = message
    if kind == "user_error":
        raise UserError(text)
    if kind == "interrupted":
        raise KeyboardInterrupt
    if kind != "ok":
        raise TrainingCrashed(text)


class TrainingCrashed(RuntimeError):
    """A crash in the training child: the message is its last line, `details` its whole traceback."""

    def __init__(self, details: str):
        super().__init__(details.strip().splitlines()[-1])
        self.details = details


def _train_child(recipe_dict: dict, run_dir: str, threads: int, send) -> None:
    _die_with_parent()
    try:
        import torch

        from mtp_cli.config import recipe_from_dict
        from mtp_cli.train import train

        torch.set_num_threads(threads)  # the ablation's own setting, not the library default

        train(recipe_from_dict(recipe_dict), run_dir, resume=True, show_progress=False)
        send.send(("ok", ""))
    except UserError as exc:
        send.send(("user_error", str(exc)))
    except KeyboardInterrupt:
        send.send(("interrupted", ""))
    except BaseException:
        send.send(("error", traceback.format_exc()))


def _die_with_parent() -> None:
    """Linux: the training child is killed with the ablation, so a restart never races an orphan."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _export(cell: Cell, view: GridView) -> None:
    from transformers.utils import logging as hf_logging

    from mtp_cli.model.hf import ensure_export

    hf_logging.disable_progress_bar()
    ensure_export(cell.run_dir, cell.run_dir / results.EXPORT)


def _eval(cell: Cell, view: GridView) -> None:
    from mtp_cli.evals.runner import run_eval

    cfg = cell.recipe.eval
    run_eval(cell.run_dir, tasks=tuple(cfg.tasks), limit={t: cfg.limit(t) or 0 for t in cfg.tasks},
             gsm8k_data=cell.gsm8k, json_path=cell.run_dir / results.EVAL_JSON,
             show_progress=view.show_nested, truncate=cfg.truncate, gsm8k_fewshot=cfg.gsm8k_fewshot)


def _specbench(cell: Cell, view: GridView) -> None:
    from mtp_cli.decode.bench import run_specbench

    cfg = cell.recipe.specbench
    run_specbench(cell.run_dir, prompts=cfg.prompts, limit=cfg.limit, max_new_tokens=cfg.max_new_tokens,
                  batch_sizes=tuple(cfg.batch_sizes), repeats=cfg.repeats, draft_len=cfg.draft_len,
                  json_path=cell.run_dir / results.SPEC_JSON, show_progress=view.show_nested,
                  gsm8k_data=cell.gsm8k, temperatures=tuple(cfg.temperatures), primary=cfg.primary,
                  peers=cfg.peers, draft_vocab=cfg.draft_vocab)


STAGE_FUNCS = {"train": _train, "export": _export, "eval": _eval, "specbench": _specbench}


def _preflight_eval(ab: Ablation) -> None:
    """Before any training: the eval stage's GSM8K data and specbench's prompts must be there (not found
    out after the training)."""
    from mtp_cli.decode.conditions import plan_conditions
    from mtp_cli.decode.prompts import HELDOUT, load_prompts
    from mtp_cli.evals import gsm8k

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
                load_prompts(source, spec.limit, cell.gsm8k)
                checked.add((source, cell.gsm8k))


def gsm8k_data(recipe: Recipe) -> Path | None:
    """The recipe's GSM8K folder as `mtp ablate` resolves it without --gsm8k-data, or None for the hub."""
    return paths.gsm8k_data(None, recipe.eval.gsm8k_data)


# ---- the lock: one results folder, one recipe version -------------------------------------------------
def check_lock(ab: Ablation, force: bool) -> bool:
    """True when the folder holds results of another recipe version that --force may discard."""
    lock = results.read_lock(ab.results_dir)
    has_runs = any((ab.results_dir / results.RUNS).glob("*/run.json"))
    mine = ab.fingerprint
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
    if lock.get("fingerprint") == ab.fingerprint:
        return
    write_json(path, {"recipe_name": ab.recipe.name, "fingerprint": ab.fingerprint,
                      "source": _display_path(ab.source), "created": _now(), "recipe": ab.recipe.to_dict()})


def _log_stage(ab: Ablation, cell: Cell, stage: str, seconds: float) -> None:
    if int(os.environ.get("RANK", "0")) != 0:
        return
    path = cell.run_dir / results.ABLATE_JSON
    with _locked(path):  # Slurm runs a run's eval and specbench jobs side by side
        log = json.loads(path.read_text()) if path.is_file() else {}
        log.update({"variant": cell.variant.name, "seed": cell.seed, "recipe": ab.recipe.name,
                    "fingerprint": ab.fingerprint})
        entry = {"seconds": round(seconds, 2), "finished": _now()}
        if stage == "train":  # a resumed training: this process's time and that of the segments before it
            earlier = (results.RunFolder(cell.run_dir).run.get("segments") or [])[:-1]
            if earlier:
                entry.update(seconds=round(seconds + sum(s["seconds"] for s in earlier), 2), segments=len(earlier) + 1)
        log.setdefault("stages", {})[stage] = entry
        write_json(path, log)


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on `path`'s folder (flock; no lock file left behind) for a read-modify-write
    across processes."""
    import fcntl

    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(env.REPO))
    except ValueError:
        return str(path.resolve())


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# ---- the plan, for --dry-run ------------------------------------------------------------------------
def plan_table(ab: Ablation):
    """A table: every cell, the stages it still needs, and what they should cost."""
    from mtp_cli.cost import Estimator
    from mtp_cli.tables import Table

    est = Estimator(ab.results_dir, ab.recipe)
    rows = []
    total, unknown = 0.0, 0
    for cell in ab.cells:
        m = cell.recipe.mtp
        what = {"ntp": "ntp", "sequential": f"sequential D={m.depth} λ={m.weight:g} {m.mtp_input}",
                "parallel": f"parallel n={m.heads} λ={m.weight:g}"}[m.objective]
        if not cell.pending:
            rows.append([cell.name, what, "done", "-", ""])
            continue
        for i, stage in enumerate(cell.pending):
            e = est.stage(cell, stage)
            total += e.seconds or 0.0
            unknown += e.seconds is None
            rows.append([cell.name if i == 0 else "", what if i == 0 else "", stage, _duration(e.seconds), e.basis])
    for stage in ab.extra_stages:  # ablate_source: before the grid (source) and after it (baseline)
        what = (f"train + export {ab.recipe.source.recipe}/{ab.recipe.source.variant} (seed {ab.recipe.source.seed})"
                if stage == ablate_source.SOURCE else f"mtp eval --hf {ablate_source.baseline_source(ab)}")
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
