"""Sharded checkpoints of train.parallel = "fsdp" runs, through torch.distributed.checkpoint (DCP).

Layout inside the run folder (in place of checkpoint.pt):
    sharded/step-<N>-<id>/   one DCP checkpoint: every rank's shards of the model and AdamW state
                             (`.metadata` + `__<rank>_0.distcp`), and `extra.pt` (step, recipe,
                             tokenizer fingerprint, token counts, run clock), written by rank 0
    sharded/latest.json      which of those folders is the checkpoint, written last

A save writes a new folder, then replaces latest.json atomically, then removes the older folders,
so a process killed at any moment (kill -9 included) leaves latest.json naming a complete
checkpoint. DCP stores each tensor with its global shape and reshards on load: a checkpoint saved
by 2 ranks resumes on 1 (or on 4) and the reverse; at world size 1 the model is plain and the same
calls read and write whole tensors. The data position is the step (batches depend only on the data
seed and the step), as with checkpoint.pt. `load_full` reads the model back whole in one process
(`mtp export`, `mtp eval`, ...), through `checkpoint.load_checkpoint`.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from mtp_cli.base.errors import UserError
from mtp_cli.base.files import atomic_write_text
from mtp_cli.base.run_files import SHARDED

FOLDER = SHARDED
LATEST = "latest.json"
EXTRA = "extra.pt"


def latest_file(run_dir: Path) -> Path:
    return Path(run_dir) / FOLDER / LATEST


def exists(run_dir: Path) -> bool:
    return latest_file(run_dir).is_file()


def _latest(run_dir: Path) -> dict:
    path = latest_file(run_dir)
    try:
        info = json.loads(path.read_text())
        folder = Path(run_dir) / FOLDER / info["folder"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"sharded checkpoint {path} is unreadable ({type(exc).__name__}); delete "
                        f"{path.parent} or retrain") from None
    if not (folder / ".metadata").is_file() or not (folder / EXTRA).is_file():
        raise UserError(f"sharded checkpoint {folder} is incomplete; delete {path.parent} or retrain")
    return {**info, "path": folder}


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@contextlib.contextmanager
def _one_process():
    """DCP in one process: no collectives, and no warning that there are none."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save(run_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, extra: dict) -> None:
    """Save on every rank (a collective under torchrun); see the module docstring for why it is atomic."""
    from torch.distributed import checkpoint as dcp  # FSDP/DCP only: not loaded by a plain run
    from torch.distributed.checkpoint.state_dict import get_state_dict  # FSDP/DCP only: not loaded by a plain run

    root = Path(run_dir) / FOLDER
    main = not _distributed() or dist.get_rank() == 0
    name = [f"step-{step:08d}-{time.time_ns():x}"]
    if _distributed():
        dist.broadcast_object_list(name, src=0)
    folder = root / name[0]
    root.mkdir(parents=True, exist_ok=True)
    model_state, optim_state = get_state_dict(model, optimizer)
    with contextlib.nullcontext() if _distributed() else _one_process():
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=folder, no_dist=not _distributed())
    if main:
        torch.save({"step": step, **extra}, folder / EXTRA)
        world = dist.get_world_size() if _distributed() else 1
        text = json.dumps({"step": step, "folder": folder.name, "world_size": world}) + "\n"
        atomic_write_text(latest_file(run_dir), text)
        for old in root.iterdir():  # earlier checkpoints, and any left half-written by a killed save
            if old.is_dir() and old.name != folder.name:
                shutil.rmtree(old, ignore_errors=True)
    if _distributed():
        dist.barrier()


def load_extra(run_dir: Path) -> dict:
    """The latest checkpoint's step, recipe and the rest rank 0 stored beside the shards."""
    info = _latest(run_dir)
    try:
        return torch.load(info["path"] / EXTRA, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise UserError(f"sharded checkpoint {info['path']} is corrupt ({type(exc).__name__}); delete it or retrain") from None


def load_train_state(run_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Load the latest checkpoint into this rank's (sharded or whole) model and optimizer, at any world
    size; every rank calls it. Returns `load_extra`."""
    from torch.distributed import checkpoint as dcp  # FSDP/DCP only: not loaded by a plain run
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # FSDP/DCP only: not loaded by a plain run

    info = _latest(run_dir)
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    with contextlib.nullcontext() if _distributed() else _one_process():
        dcp.load(state, checkpoint_id=info["path"], no_dist=not _distributed())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    return load_extra(run_dir)


def load_full(run_dir: Path, template: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model's whole tensors, in this process alone (no process group), into `template` (a
    state_dict of the right shapes, e.g. a fresh model's); returns it."""
    from torch.distributed import checkpoint as dcp  # FSDP/DCP only: not loaded by a plain run

    info = _latest(run_dir)
    state = {"model": template}
    with _one_process():
        dcp.load(state, checkpoint_id=info["path"], no_dist=True)
    return state["model"]


def stamp(run_dir: Path) -> dict:
    """What changes when a new checkpoint is saved (for `hf.ensure_export`)."""
    st = latest_file(run_dir).stat()
    return {"checkpoint_size": st.st_size, "checkpoint_mtime_ns": st.st_mtime_ns}


def remove(run_dir: Path) -> None:
    shutil.rmtree(Path(run_dir) / FOLDER, ignore_errors=True)
