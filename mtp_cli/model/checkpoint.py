"""A run folder on disk: checkpoint (atomic save/load), tokenizer, run.json — and loading it back.

Layout of a run folder:
    run.json        config, parameter counts, environment, status, final metrics
    metrics.jsonl   one JSON object per logged step (and validation rows)
    checkpoint.pt   model + optimizer state at the last saved step
    sharded/        instead of checkpoint.pt in train.parallel = "fsdp" runs: DCP shards (sharded_checkpoint.py)
    tokenizer/      the run's tokenizer (Hugging Face format)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mtp_cli.base.errors import UserError
from mtp_cli.base.files import read_json_object, replacing
from mtp_cli.base.run_files import CHECKPOINT, METRICS, RUN_JSON, TOKENIZER
from mtp_cli.config.recipe import Recipe, recipe_from_dict
from mtp_cli.data import tokenizer as toklib
from mtp_cli.model import MTPModel, sharded_checkpoint

__all__ = ["CHECKPOINT", "METRICS", "RUN_JSON", "TOKENIZER"]  # the run-folder names, for its readers



def read_json(path: Path) -> dict:
    """A run's JSON file as an object; anything else (unreadable, not JSON, a list) is a one-line error."""
    return read_json_object(path)


def save_checkpoint(run_dir: Path, model: MTPModel, optimizer: torch.optim.Optimizer | None, step: int,
                    recipe: Recipe, extra: dict | None = None) -> None:
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict() if optimizer else None,
             "step": step, "recipe": recipe.to_dict(), **(extra or {})}
    with replacing(run_dir / CHECKPOINT) as tmp:
        torch.save(state, tmp)


def has_checkpoint(run_dir: Path) -> bool:
    """Whether the run folder holds a checkpoint (checkpoint.pt, or an FSDP run's sharded one)."""

    return (Path(run_dir) / CHECKPOINT).is_file() or sharded_checkpoint.exists(run_dir)


def checkpoint_stamp(run_dir: Path) -> dict:
    """Size and modification time of what a new save replaces (to tell whether an export is stale)."""

    path = Path(run_dir) / CHECKPOINT
    if not path.is_file() and sharded_checkpoint.exists(run_dir):
        return sharded_checkpoint.stamp(run_dir)
    st = path.stat()
    return {"checkpoint_size": st.st_size, "checkpoint_mtime_ns": st.st_mtime_ns}


def _load_sharded(run_dir: Path) -> dict:
    """A sharded checkpoint read whole, in the shape of checkpoint.pt's dict (no optimizer state)."""

    state = sharded_checkpoint.load_extra(run_dir)
    if not isinstance(state, dict) or "recipe" not in state:
        raise UserError(f"sharded checkpoint in {run_dir} is corrupt: missing its recipe")
    recipe = recipe_from_dict(state["recipe"])
    template = MTPModel(recipe.model, recipe.mtp).state_dict()
    try:
        model = sharded_checkpoint.load_full(run_dir, template)
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"sharded checkpoint in {run_dir} does not match its recipe or is corrupt "
                        f"({type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]})") from None
    return {**state, "model": model, "optimizer": None}


def load_checkpoint(run_dir: Path) -> dict:

    path = Path(run_dir) / CHECKPOINT
    if not path.is_file() and sharded_checkpoint.exists(run_dir):
        return _load_sharded(Path(run_dir))
    if not path.is_file():
        raise UserError(f"no checkpoint in {run_dir} (expected {path.name}; train it with `mtp train --out {run_dir}`)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise UserError(f"checkpoint {path} is corrupt or unreadable ({type(exc).__name__}); delete it or retrain") from None
    if not isinstance(state, dict) or "model" not in state or "recipe" not in state:
        raise UserError(f"checkpoint {path} is corrupt: missing model or recipe")
    return state


@dataclass
class LoadedRun:
    run_dir: Path
    recipe: Recipe
    model: MTPModel
    tokenizer: Any
    step: int
    token_counts: torch.Tensor | None = None  # training-token counts (decode/draft_vocab.py); None before they were stored


def recipe_of_run(run_dir: Path) -> Recipe:
    """The recipe a run folder was trained with (its run.json), for `mtp train --resume` without --recipe."""
    path = run_dir / RUN_JSON
    if not path.is_file():
        raise UserError(f"--resume: {run_dir} holds no run to continue (no {RUN_JSON})")
    stored = read_json(path).get("recipe")
    if not isinstance(stored, dict):
        raise UserError(f"{path} has no recipe; pass --recipe to resume it")
    return recipe_from_dict(stored)


def load_run(run_dir: str | Path, device: str | torch.device = "cpu") -> LoadedRun:
    """Model (eval mode), tokenizer and recipe of a trained run folder."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"{run_dir} is a file, not a run folder")
    if not run_dir.is_dir():
        raise UserError(f"run folder not found: {run_dir}")
    state = load_checkpoint(run_dir)
    recipe = recipe_from_dict(state["recipe"])
    tok = toklib.load(run_dir / TOKENIZER)
    if len(tok) > recipe.model.vocab_size:
        raise UserError(f"tokenizer in {run_dir / TOKENIZER} has {len(tok)} tokens but the checkpoint's "
                        f"vocabulary is {recipe.model.vocab_size}: they do not belong together")
    fp = state.get("tokenizer_fingerprint")
    if fp and fp != toklib.fingerprint(tok):
        raise UserError(f"tokenizer in {run_dir / TOKENIZER} does not match the one the checkpoint was trained with")
    model = MTPModel(recipe.model, recipe.mtp)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        raise UserError(f"checkpoint in {run_dir} does not match its recipe: {str(exc).splitlines()[0]}") from None
    model.to(device).eval()
    return LoadedRun(run_dir, recipe, model, tok, int(state["step"]), state.get("token_counts"))
