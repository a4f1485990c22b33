"""Run tracking in the tools people watch: TensorBoard or Weights & Biases, beside metrics.jsonl.

`metrics.jsonl` stays the record; a tracker gets the same rows (tag `<kind>/<key>`, e.g. `train/loss_main`,
`val/val_loss`, at the row's step), the recipe as the run's config, and after the ablation's eval and
specbench stages their headline numbers (`eval/<column>`, `specbench/<column>`, the summary.csv columns).
Only rank 0 tracks. Each process that logs opens the run's tracker and closes it again, so the train,
eval and specbench stages (separate processes, or separate Slurm jobs) append to one run: the wandb run id
is kept in `<run>/tracking.json`. wandb runs offline unless the user has logged in (WANDB_API_KEY or a
netrc entry) or set WANDB_MODE; offline runs are uploaded later with `wandb sync <run>/wandb`.
"""

from __future__ import annotations

import json
import math
import netrc
import os
import uuid
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from mtp_cli.base.errors import UserError
from mtp_cli.base.files import write_json
from mtp_cli.config.recipe import Recipe

TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
STATE_JSON = "tracking.json"
PIP = {"tensorboard": "pip install tensorboard  (or: pip install 'mtp[tensorboard]')",
       "wandb": "pip install wandb  (or: pip install 'mtp[wandb]')"}
# The summary.csv columns each stage's tracking logs as its headline numbers.
HEADLINES = {
    "eval": ("heldout_loss", "heldout_bpb", "humaneval_pass1", "gsm8k_strict", "gsm8k_flexible"),
    "specbench": ("spec_lossless", "spec_acceptance_rate", "spec_mal", "spec_speedup", "spec_ideal_speedup",
                  "spec_tokens_per_s", "greedy_tokens_per_s"),
}


def require(kind: str) -> None:
    """Fail early, in one line, when the chosen tracker's package is not installed."""
    if kind == "none":
        return
    try:
        if kind == "tensorboard":
            import tensorboard  # noqa: F401
        else:
            import wandb  # noqa: F401
    except ImportError:
        raise UserError(f"--track {kind} needs the {kind} package: {PIP[kind]}") from None


def scalars(row: dict) -> dict[str, float]:
    """A metrics.jsonl row as tracker scalars: `<kind>/<key>` for every finite number in it."""
    kind = row.get("kind", "train")
    out = {}
    for key, value in row.items():
        if key in ("kind", "step") or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[f"{kind}/{key}"] = float(value)
    return out


class Tracker(ABC):
    """One run's tracker in one process; `log` takes metrics.jsonl rows."""

    @abstractmethod
    def log(self, row: dict) -> None: ...

    @abstractmethod
    def log_scalars(self, values: dict[str, float], step: int) -> None: ...

    @abstractmethod
    def close(self) -> None: ...


class TensorBoardTracker(Tracker):
    def __init__(self, recipe: Recipe, run_dir: Path, resume_step: int | None):
        require("tensorboard")
        from torch.utils.tensorboard import SummaryWriter  # optional dependency (train.track = tensorboard)

        # purge_step: rows after the checkpoint a resumed training restarts from are hidden, as in metrics.jsonl
        purge = resume_step + 1 if resume_step is not None else None
        self.writer = SummaryWriter(log_dir=str(run_dir / TENSORBOARD_DIR), purge_step=purge)
        self._recipe = recipe

    def config(self) -> None:
        text = json.dumps(self._recipe.to_dict(), indent=2, default=str)
        self.writer.add_text("recipe", "```\n" + text + "\n```", global_step=0)

    def log(self, row: dict) -> None:
        self.log_scalars(scalars(row), int(row["step"]))

    def log_scalars(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, global_step=step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker(Tracker):
    def __init__(self, recipe: Recipe, run_dir: Path, resume_step: int | None):
        require("wandb")
        import wandb  # optional dependency (.[wandb])

        state = _read_state(run_dir)
        run_id = state.get("wandb_id") or uuid.uuid4().hex[:8]
        if state.get("wandb_id") != run_id:
            _write_state(run_dir, {**state, "wandb_id": run_id})
        (run_dir / WANDB_DIR).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or f"mtp-{recipe.name}", name=run_dir.name, id=run_id,
            group=recipe.name, resume="allow", dir=str(run_dir), config=recipe.to_dict(), mode=wandb_mode(),
            settings=wandb.Settings(silent=True, console="off"))
        # our step is a logged value, so a resumed training may log a step again (wandb's own must grow)
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def config(self) -> None:
        pass  # given to wandb.init

    def log(self, row: dict) -> None:
        self.log_scalars(scalars(row), int(row["step"]))

    def log_scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log({"step": step, **values})

    def close(self) -> None:
        import wandb  # optional dependency (.[wandb])

        self.run.finish()
        wandb.teardown()  # wait for wandb's service to write everything out before this process goes on


def wandb_mode() -> str:
    """WANDB_MODE when the user set it; else online when logged in (API key or netrc entry), else offline."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        return "online" if netrc.netrc(os.environ.get("NETRC")).authenticators(host) else "offline"
    except (OSError, netrc.NetrcParseError):
        return "offline"


def open_tracker(recipe: Recipe, run_dir: str | Path, resume_step: int | None = None,
                 new_run: bool = False) -> Tracker | None:
    """The run's tracker (None for `track = "none"`). `resume_step`: the checkpoint step a training resumes
    from; `new_run`: a training starting from step 0, which records the recipe as the run's config."""
    kind = recipe.train.track
    if kind == "none":
        return None
    tracker = (TensorBoardTracker if kind == "tensorboard" else WandbTracker)(recipe, Path(run_dir), resume_step)
    if new_run:
        tracker.config()
    return tracker


def _read_state(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / STATE_JSON).read_text())
    except (OSError, ValueError):
        return {}


def _write_state(run_dir: Path, state: dict[str, Any]) -> None:

    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / STATE_JSON, state)
