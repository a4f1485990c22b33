"""The training loop: one run = one model + its MTP modules, checkpointed and resumable.

AdamW with warmup + cosine/WSD, gradient clipping and accumulation, fp32 on CPU and bf16 autocast
on CUDA, optional torch.compile, DistributedDataParallel under torchrun (gloo on CPU, NCCL on CUDA).
Batches depend only on (data seed, step), so a resumed run ends with the same weights as an
uninterrupted one and N processes see the same global batch as one. train.seed sets the initialisation,
train.data_seed the batch order (unset: train.seed, as before the two were apart).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import shutil
import signal
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from mtp_cli.base import env, run_clock, ui
from mtp_cli.base.dist import DistInfo, dist_info
from mtp_cli.base.errors import Stop, Terminated, UserError
from mtp_cli.base.files import atomic_write_text, write_json
from mtp_cli.base.run_files import TRAIN_LOCK
from mtp_cli.config.recipe import Recipe, Runtime, recipe_from_dict
from mtp_cli.config.schedule import lr_at
from mtp_cli.corpus import token_data as corpus
from mtp_cli.data import shards
from mtp_cli.data import tokenizer as toklib
from mtp_cli.decode.draft_vocab import count_tokens, top_tokens
from mtp_cli.evals import heldout
from mtp_cli.model import MTPModel, parallel, parallel_backward, pretrained, sharded_checkpoint, trunk_cache
from mtp_cli.model import checkpoint as ckpt
from mtp_cli.model import loss as L
from mtp_cli.model.flops import flops_per_token
from mtp_cli.model.trunk import compile_blocks
from mtp_cli.model.trunk_cache import TrunkStateCache
from mtp_cli.train import tracking

# Keys of train.* that may change between an interrupted run and its resumption.
RESUMABLE_TRAIN_KEYS = {"steps", "log_every", "eval_every", "ckpt_every", "eval_batches", "compile", "device", "track"}


def default_run_name(recipe: Recipe) -> str:
    m = recipe.mtp
    parts = [recipe.name, m.objective]
    if m.objective == "sequential":
        parts += [f"d{m.depth}", f"lam{m.lambda_at():g}"]
        if m.mtp_input != "post-norm":
            parts.append(m.mtp_input)
    elif m.objective == "parallel":
        parts += [f"n{m.heads}", f"lam{m.lambda_at():g}"]
    parts.append(f"s{recipe.train.seed}")
    if recipe.train.order_seed != recipe.train.seed:
        parts.append(f"data{recipe.train.order_seed}")
    return "-".join(parts)


def init_distributed(device_name: str) -> DistInfo:
    """Join the torchrun job's process group (gloo on CPU, nccl on CUDA); alone, nothing to join."""
    info = dist_info()
    if info.world == 1:
        return info
    if not dist.is_initialized():
        backend = "nccl" if (device_name != "cpu" and torch.cuda.is_available()) else "gloo"
        dist.init_process_group(backend)
    if torch.cuda.is_available() and device_name != "cpu":
        torch.cuda.set_device(info.local_rank)
    return DistInfo(dist.get_rank(), dist.get_world_size(), info.local_rank)


def check_out_dir(out: Path, recipe: Recipe, resume: bool, force: bool, restart_without_checkpoint: bool = False) -> bool:
    """Validate the output folder; returns True when a checkpoint should be resumed. A run to resume that
    has no checkpoint is refused, unless `restart_without_checkpoint` (the grid's cells: one killed
    before its first checkpoint starts again from step 0, which draws the same batches)."""
    run_json = out / ckpt.RUN_JSON
    bookkeeping = ("jobs.json", TRAIN_LOCK)  # jobs.json: mtp_cli.launch
    if not out.exists() or not any(p.name not in bookkeeping for p in out.iterdir()):
        return False
    if not run_json.is_file() and not force:
        raise UserError(f"output folder {out} is not empty and holds no run; choose another --out or pass --force")
    if force:  # replace the run's own files only; anything else in the folder is the user's
        for name in (ckpt.CHECKPOINT, ckpt.RUN_JSON, ckpt.METRICS, ckpt.CHECKPOINT + ".tmp"):
            (out / name).unlink(missing_ok=True)
        if (out / ckpt.TOKENIZER).is_symlink():  # a shared copy (results/tokenizers/): unlinked, never written through
            (out / ckpt.TOKENIZER).unlink()
        shutil.rmtree(out / ckpt.TOKENIZER, ignore_errors=True)
        sharded_checkpoint.remove(out)
        return False
    stored = ckpt.read_json(run_json).get("recipe", {})
    try:  # keys added to the recipe since the run was stored take their defaults, as they did then
        stored = recipe_from_dict(stored).to_dict()
    except UserError:
        pass
    if not resume:
        raise UserError(f"output folder {out} already holds a run; pass --resume to continue it or --force to start over")
    mine = recipe.to_dict()
    if recipe.data.tokenizer != "bpe" and isinstance(stored.get("model"), dict):
        # the vocabulary comes from the tokenizer (the stored recipe has it), not from the recipe
        stored = {**stored, "model": {**stored["model"], "vocab_size": mine["model"]["vocab_size"]}}
    strip = lambda t: {k: v for k, v in _effective_data_seed(t).items() if k not in RESUMABLE_TRAIN_KEYS}  # noqa: E731
    for section in ("model", "mtp", "data", "train"):
        was, now = stored.get(section) or {}, mine[section]
        if section == "train":
            was, now = strip(was), strip(now)
        if was != now:
            raise UserError(f"output folder {out} holds a different run ({_setting_diff(section, was, now)}); "
                            f"to continue it, give only the flags it was trained with (or none), or use another --out")
    if not ckpt.has_checkpoint(out):
        if restart_without_checkpoint:
            return False
        raise UserError(f"--resume: {out} holds no checkpoint ({ckpt.CHECKPOINT}) to continue from, so it cannot be "
                        "resumed exactly; pass --force to train it again from the start")
    return True


def _effective_data_seed(train: dict) -> dict:
    """train.* with data_seed spelled out (unset = the seed), so `--data-seed S` with S = the seed
    resumes a run stored without one: both draw the same batches."""
    return {**train, "data_seed": train.get("seed") if train.get("data_seed") is None else train.get("data_seed")}


def _setting_diff(section: str, was: dict, now: dict) -> str:
    """Name the settings a refused --resume would change, e.g. `train.lr 0.003 -> 0.001`."""
    keys = sorted(k for k in set(was) | set(now) if was.get(k) != now.get(k))
    return ", ".join(f"{section}.{k} {was.get(k)!r} -> {now.get(k)!r}" for k in keys) or f"{section} settings differ"


@contextlib.contextmanager
def _interrupt_between_steps(stop: dict):
    """Ctrl-C (SIGINT) or SIGTERM during a step is held until the step is applied and logged, so the checkpoint
    saved on interrupt is the state after a whole step and metrics.jsonl has every row up to it. A
    second Ctrl-C interrupts at once (`stop["hard"]`: nothing is saved, the last periodic checkpoint stays)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum, frame):
        if stop["requested"] and signum == signal.SIGINT:
            stop["hard"] = True
            raise KeyboardInterrupt
        if not stop["requested"]:  # a SIGTERM again (one from the grid's parent, one from Slurm) changes nothing
            stop["requested"], stop["signal"] = True, signum

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _run_lock(out: Path, main: bool):
    """Hold `out/train.lock` (an flock, with our pid in it) while training into `out`: a second `mtp train`
    into the same folder is refused in one line, naming the holder. The folder is made to hold it; the
    lock file (and a folder this call made, if nothing else is in it) is removed again on the way out."""
    if not main:
        yield
        return
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    path = out / TRAIN_LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        fd = os.open(path, os.O_RDWR)
    ours = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise UserError(f"{out} is being trained by another process (pid {holder}, {path.name}); wait for it "
                            "to end or choose another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        ours = True  # held: the file is ours to remove, a stale one of a process that died included
        yield
    finally:
        if ours:
            path.unlink(missing_ok=True)  # while still holding it
            if created and not any(out.iterdir()):
                out.rmdir()
        os.close(fd)


def _check_data_size(data: shards.TokenData, context: int) -> None:
    """Both splits need at least one window of context + 1 tokens (+1 for a random start in training)."""
    for split, tokens, need in (("training", data.train, context + 2), ("validation", data.val, context + 1)):
        if len(tokens) < need:
            raise UserError(f"the {split} split has {len(tokens):,} tokens, fewer than one window of "
                            f"context + 1 = {context + 1} ({data.n_docs} documents); add data or lower model.context")
    if data.n_docs == 1:
        ui.console.print("warning: one document only — validation uses the training text", markup=False)


def _truncate_metrics(path: Path, last_step: int) -> None:
    if not path.is_file():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:  # a row torn by a kill mid-write
            continue
        if isinstance(row, dict) and isinstance(row.get("step", 0), int) and row.get("step", 0) <= last_step:
            keep.append(line)
    atomic_write_text(path, "".join(line + "\n" for line in keep))


def _optimizer(model: nn.Module, recipe: Recipe) -> torch.optim.Optimizer:
    t = recipe.train
    trained = [p for p in model.parameters() if p.requires_grad]  # a frozen trunk is not the optimizer's
    decay = [p for p in trained if p.dim() >= 2]
    no_decay = [p for p in trained if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), eps=1e-8)


def _load_state(out: Path, model: nn.Module, optimizer: torch.optim.Optimizer, kind: str) -> tuple[dict, Path]:
    """Load the run's last checkpoint into the model and optimizer: an FSDP run's sharded one (on every
    rank, saved at any world size) or checkpoint.pt. Returns the checkpoint's other entries and its path."""
    from torch.distributed.checkpoint.api import CheckpointException  # FSDP/DCP only: not loaded by a plain run

    fsdp = kind == parallel.FSDP
    where = out / (sharded_checkpoint.FOLDER if fsdp else ckpt.CHECKPOINT)
    if fsdp and not sharded_checkpoint.exists(out):
        raise UserError(f"{out} holds no sharded checkpoint ({where / sharded_checkpoint.LATEST} missing); "
                        "delete the run's checkpoint or use --force")
    try:
        if fsdp:
            return sharded_checkpoint.load_train_state(out, model, optimizer), where
        state = ckpt.load_checkpoint(out)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        return state, where
    except (RuntimeError, ValueError, KeyError, TypeError, CheckpointException) as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise UserError(f"checkpoint {where} does not match this run's recipe "
                        f"({type(exc).__name__}: {first}); delete it or use --force") from None


def _val_row(model: MTPModel, data: shards.TokenData, recipe: Recipe, device: torch.device, step: int) -> dict:
    batches = shards.val_batches(data.val, recipe.train.eval_batches, recipe.train.batch_size, recipe.model.context)
    scores = heldout.evaluate(model, batches, device)
    return {"kind": "val", "step": step, **{f"val_{k}": v for k, v in scores.items()}}


def train(recipe: Recipe, out: str | Path, resume: bool = False, force: bool = False,
          show_progress: bool = True, data_progress: bool | None = None,
          restart_without_checkpoint: bool = False, rt: Runtime | None = None) -> dict:
    """Train one run into `out` on `rt` (default: `recipe.runtime()`, the recipe's device and compile switch,
    torch's threads); returns the run summary (also written to out/run.json). `data_progress`
    (default: `show_progress`) shows making the data, e.g. a self-distilled corpus, apart from training. With
    train.init_from the recipe's [model] must already be the source's (`pretrained.resolve_recipe`).
    Under torchrun, train.parallel = "fsdp" shards the model (mtp_cli/model/parallel.py) and its checkpoints
    (mtp_cli/model/sharded_checkpoint.py); "ddp" replicates it."""
    segment_t0 = time.perf_counter()
    rt = rt or recipe.runtime()
    source, ddp, device = _check_recipe(recipe, rt)
    out = Path(out)
    with _run_lock(out, ddp.main):  # a refusal leaves no folder that was not there
        do_resume = _on_every_rank(ddp, check_out_dir(out, recipe, resume, force, restart_without_checkpoint)
                                   if ddp.main else False)
        data = _prepare_data(recipe, ddp, source, show_progress if data_progress is None else data_progress)
        out.mkdir(parents=True, exist_ok=True)
        try:
            return _train_locked(recipe, out, ddp, device, bool(rt.compile), source, data, do_resume, show_progress,
                                 segment_t0)
        except (MemoryError, torch.OutOfMemoryError, RuntimeError) as exc:
            if not isinstance(exc, (MemoryError, torch.OutOfMemoryError)) and "allocate memory" not in str(exc):
                raise
            raise UserError(f"out of memory ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}); "
                            "lower train.batch_size or the model's size, or raise train.grad_accum") from None


def _train_locked(recipe: Recipe, out: Path, ddp: DistInfo, device: torch.device, compile: bool, source,
                  data: shards.TokenData, do_resume: bool, show_progress: bool, segment_t0: float) -> dict:
    """`train`'s work once the folder is ours and the data ready: build, resume, loop, finish."""
    model, optimizer = _build_model(recipe, source, device, ddp, compile)
    start_step, clock_state = 0, None
    if do_resume:
        _check_run_tokenizer(out, data.tokenizer)
        start_step, clock_state, finished = _resume(out, model, optimizer, recipe)
        if finished is not None:
            return finished  # finished already: nothing to train, nothing rewritten (run.json keeps its numbers)
    if ddp.main:
        _truncate_metrics(out / ckpt.METRICS, start_step)
        tokenizer_dir = out / ckpt.TOKENIZER
        if tokenizer_dir.is_symlink() and not do_resume:  # a shared copy (results/tokenizers/): this run gets its own
            tokenizer_dir.unlink()
        if not tokenizer_dir.is_symlink():  # resuming, a shared copy was checked to be this very tokenizer: kept
            data.tokenizer.save_pretrained(tokenizer_dir)
    run = _Training(recipe, out, ddp, device, data, model, optimizer, source, start_step,
                    run_clock.RunClock.resumed(clock_state, start_step, segment_t0))
    step, last_val = run.loop(resumed=do_resume, show_progress=show_progress)
    return run.finish(step, last_val)


def _check_recipe(recipe: Recipe, rt: Runtime) -> tuple[pretrained.Source | None, DistInfo, torch.device]:
    """Validate what can be checked before any file is touched; take `rt`'s threads; join the torchrun job."""
    recipe.validate()
    rt.validate()
    t = recipe.train
    if (t.freeze_trunk or recipe.data.uses_self) and not t.init_from:
        raise UserError("this recipe starts from its [source]'s export: run it with `mtp ablate`, or pass --init-from")
    source = pretrained.resolve_recipe(recipe) if t.init_from else None
    tracking.require(t.track)
    ddp = init_distributed(rt.device)
    if source is not None and ddp.main:
        ui.console.print(f"context: training at {recipe.model.context:,} tokens ({t.init_from} has "
                         f"{source.model.context:,} positions; set model.context in a recipe for another)",
                         markup=False, highlight=False, soft_wrap=True)
    device = torch.device(f"cuda:{ddp.local_rank}") if env.use_runtime(rt).type == "cuda" else torch.device("cpu")
    per_rank, rem = divmod(t.batch_size, ddp.world * t.grad_accum)
    if rem or per_rank < 1:
        raise UserError(f"train.batch_size ({t.batch_size}) must be a multiple of world size × grad_accum "
                        f"({ddp.world} × {t.grad_accum})")
    if device.type == "cpu":
        _check_fits_in_memory(recipe, per_rank)
    return source, ddp, device


def _check_fits_in_memory(recipe: Recipe, micro_batch: int) -> None:
    """Refuse, before any data is made, a step whose logits alone (fp32, the next token and each extra
    prediction) need more than this machine's memory; what fits is then up to the allocator."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    m = recipe.model
    logits = micro_batch * m.context * m.vocab_size * 4 * (1 + recipe.mtp.n_extra)
    if logits > memory:
        raise UserError(f"a step of {micro_batch:,} sequences × context {m.context} × vocabulary {m.vocab_size:,} needs "
                        f"{logits / 2**30:,.0f} GiB for its logits alone, more than this machine's "
                        f"{memory / 2**30:.0f} GiB; lower train.batch_size (--batch-size) or raise train.grad_accum")


def _on_every_rank(ddp: DistInfo, value):
    """Rank 0's value, on every rank."""
    if ddp.world > 1:
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    return value


def _prepare_data(recipe: Recipe, ddp: DistInfo, source, show_progress: bool) -> shards.TokenData:
    """The run's token data (rank 0 builds the cache, the others read it), checked against the model."""
    if ddp.main:
        data = corpus.prepare_for(recipe, show_progress)
    if ddp.world > 1:
        dist.barrier()
    if not ddp.main:
        data = corpus.prepare_for(recipe)
    _check_data_size(data, recipe.model.context)
    if source is not None:  # the checkpoint's embedding may have more rows than its tokenizer
        if len(data.tokenizer) > recipe.model.vocab_size:
            raise UserError(f"the tokenizer of {recipe.train.init_from} has {len(data.tokenizer)} tokens, more than "
                            f"its vocab_size {recipe.model.vocab_size}")
    elif recipe.data.tokenizer != "bpe":
        recipe.model.vocab_size = len(data.tokenizer)
    elif len(data.tokenizer) > recipe.model.vocab_size:
        raise UserError(f"tokenizer has {len(data.tokenizer)} tokens, more than model.vocab_size {recipe.model.vocab_size}")
    return data


def _build_model(recipe: Recipe, source, device: torch.device, ddp: DistInfo,
                 compile: bool) -> tuple[MTPModel, torch.optim.Optimizer]:
    """The model at train.seed (or from the source checkpoint), compiled, sharded and moved; its optimizer."""
    t = recipe.train
    torch.manual_seed(t.seed)
    model = MTPModel(recipe.model, recipe.mtp)
    if source is not None:
        pretrained.init_model(model, source)
    if t.freeze_trunk:
        model.freeze_trunk()
    if compile:  # each block, before any sharding (as torchtitan does)
        compile_blocks(model)
    if parallel.sharded(t.parallel, ddp.world):  # before the optimizer, which then holds the local shards
        parallel.fully_shard_model(model, device, ddp.world)
    model = model.to(device)
    return model, _optimizer(model, recipe)


def _check_run_tokenizer(out: Path, tokenizer) -> None:
    """--resume: the run's own tokenizer folder must be there, load, and be the one its data uses now;
    a run is never resumed with a rebuilt one."""
    where = out / ckpt.TOKENIZER
    if not (where / "tokenizer.json").is_file():
        raise UserError(f"--resume: {where} is missing, so the run cannot be resumed exactly; pass --force to train "
                        "it again from the start")
    try:
        stored = toklib.load(where)
    except UserError as exc:
        raise UserError(f"--resume: {where} is damaged ({exc}); pass --force to train it again from the start") from None
    if toklib.fingerprint(stored) != toklib.fingerprint(tokenizer):
        raise UserError(f"--resume: {where} is not the tokenizer this run's data uses now; pass --force to train it "
                        "again from the start")


def _resume(out: Path, model: MTPModel, optimizer, recipe: Recipe) -> tuple[int, dict | None, dict | None]:
    """(the step to continue from, the stored run clock, run.json when the run had already finished)."""
    state, where = _load_state(out, model, optimizer, recipe.train.parallel)
    try:
        start_step = int(state["step"])
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"checkpoint {where} does not match this run's recipe "
                        f"({type(exc).__name__}: {exc}); delete it or use --force") from None
    if start_step < 0:
        raise UserError(f"checkpoint {where} is damaged (step {start_step}); delete it or use --force")
    if start_step > recipe.train.steps:
        raise UserError(f"--resume: the run in {out} is at step {start_step}, past train.steps = {recipe.train.steps} "
                        f"(--steps); give --steps {start_step} or more to continue it")
    stored = ckpt.read_json(out / ckpt.RUN_JSON)
    finished = start_step >= recipe.train.steps and stored.get("status") == "done" and stored.get("step") == start_step
    return start_step, state.get(run_clock.CHECKPOINT_KEY), stored if finished else None


class _Training:
    """One training segment from `start_step`: its fixed settings, the step, the loop with its logging
    and checkpoints, and the closing summary."""

    def __init__(self, recipe: Recipe, out: Path, ddp: DistInfo, device: torch.device, data: shards.TokenData,
                 model: MTPModel, optimizer: torch.optim.Optimizer, source, start_step: int, clock: run_clock.RunClock):
        t = recipe.train
        self.recipe, self.t, self.out, self.ddp, self.device, self.data = recipe, t, out, ddp, device, data
        self.model, self.optimizer, self.start_step, self.clock = model, optimizer, start_step, clock
        self.fsdp = parallel.sharded(t.parallel, ddp.world)
        self.amp_dtype = env.autocast_dtype(device)
        self.autocast = ((lambda: torch.autocast("cuda", dtype=self.amp_dtype)) if self.amp_dtype and not self.fsdp
                         else contextlib.nullcontext)
        self.peak = t.peak_flops or env.matmul_peak(device, self.amp_dtype or torch.float32, shards.cache_root(recipe.data))
        self.token_counts = count_tokens(data.train, recipe.model.vocab_size)  # the drafters' vocabulary (draft_vocab)
        if recipe.mtp.draft_vocab and model.n_extra:
            model.train_extra_over(top_tokens(self.token_counts, recipe.mtp.draft_vocab))
        self.fpt = flops_per_token(model, recipe.model.context)
        self.tokens_per_step = t.batch_size * recipe.model.context
        # the head-at-a-time backward reads the root's parameters outside its forward: not under FSDP
        self.mem_efficient = (recipe.mtp.objective == "parallel" and recipe.mtp.memory_efficient
                              and not t.freeze_trunk and not self.fsdp)
        self.forward_model: nn.Module = model
        self.trunk_states = None
        trunk_dtype = torch.bfloat16 if t.trunk_dtype == "bfloat16" else None
        if t.freeze_trunk and t.trunk_cache and not self.fsdp:
            self.trunk_states = TrunkStateCache(shards.cache_root(recipe.data), model, {
                "data": data.key, **trunk_cache.batch_settings(recipe), "rank": ddp.rank, "world": ddp.world,
                "device": device.type, "dtype": str(trunk_dtype or self.amp_dtype or torch.float32)}, trunk_dtype)
        if ddp.world > 1 and not self.fsdp:
            self.forward_model = DDP(model, device_ids=[ddp.local_rank] if device.type == "cuda" else None)
        self.tokenizer_fingerprint = toklib.fingerprint(data.tokenizer)
        self.state_mb: float | None = None
        self.summary = self._start_summary(source)
        if ddp.main:
            write_json(out / ckpt.RUN_JSON, self.summary)

    def _start_summary(self, source) -> dict:
        recipe, data, model = self.recipe, self.data, self.model
        return {
            "status": "running", "run": self.out.name, "objective": recipe.mtp.objective, "recipe": recipe.to_dict(),
            "params": model.param_counts(), "lambda": recipe.mtp.lambda_at(), "lambda_final": recipe.mtp.lambda_final,
            "lambda_switch": recipe.mtp.lambda_switch, "trunk_layers": model.trunk.n_layers,
            "note": _architecture_note(recipe, model),
            "data": {"key": data.key, "train_tokens": len(data.train), "val_tokens": len(data.val),
                     "val_bytes": data.n_bytes_val, "documents": data.n_docs, "tokenizer": recipe.data.tokenizer,
                     "tokenizer_size": len(data.tokenizer)},
            "world_size": self.ddp.world, "parallel": self.t.parallel, "device": str(self.device),
            "flops_per_token": self.fpt, "peak_flops": self.peak,
            "env": env.hardware(), "git_commit": env.git_commit(),
            **({"init_from": source.record()} if source is not None else {}),
            **self.clock.summary(),
        }

    def save(self, step: int) -> None:
        """Rank 0 writes checkpoint.pt; every rank writes its shards of a sharded one."""
        extra = {"tokenizer_fingerprint": self.tokenizer_fingerprint, "token_counts": self.token_counts,
                 run_clock.CHECKPOINT_KEY: self.clock.state()}
        if self.t.parallel == parallel.FSDP:
            sharded_checkpoint.save(self.out, self.model, self.optimizer, step, {"recipe": self.recipe.to_dict(), **extra})
        elif self.ddp.main:
            ckpt.save_checkpoint(self.out, self.model, self.optimizer, step, self.recipe, extra)

    def train_step(self, step: int) -> tuple[dict, dict]:
        """One optimizer step from `step`: (its metrics row, its losses). A non-finite loss or gradient
        stops the run, keeping the last good checkpoint."""
        t, recipe = self.t, self.recipe
        t0 = time.perf_counter()
        lr = lr_at(step, t)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        lam = recipe.mtp.lambda_at(step, t.steps)
        batch = t.batch_index(step)
        x, y = shards.train_batch(self.data.train, batch, t.order_seed, t.batch_size, recipe.model.context,
                                  self.ddp.rank, self.ddp.world)
        x, y = x.to(self.device), y.to(self.device)
        frozen = (lambda micro, xm, ym, total: self.trunk_states.get(batch, micro, xm, ym, total)) \
            if self.trunk_states is not None else None
        losses = accumulate(self.forward_model, self.model, x, y, lam, t.grad_accum, self.mem_efficient, self.ddp,
                             self.autocast, frozen)
        if not all(math.isfinite(v) for v in losses.values()):
            raise UserError(f"loss is {losses['loss']} at step {step + 1}: training stopped, the last good "
                            f"checkpoint in {self.out} is kept (lower the learning rate?)")
        grad_norm = parallel.clip_grad_norm(self.model.parameters(), t.grad_clip)
        if not math.isfinite(grad_norm):
            raise UserError(f"gradient norm is {grad_norm} at step {step + 1}: training stopped, the last good "
                            f"checkpoint in {self.out} is kept")
        self.optimizer.step()
        if self.state_mb is None:  # parameters, gradients and AdamW state, as held after the first step
            self.state_mb = parallel.state_bytes(self.model, self.optimizer) / 2**20
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        self.clock.step_done(dt)
        row = {"kind": "train", "step": step + 1, "lr": lr, "lambda": lam, **losses, "grad_norm": grad_norm,
               "step_time_s": dt, "tokens_per_s": self.tokens_per_step / dt,
               "mfu": mfu(self.fpt * self.tokens_per_step / dt / self.ddp.world, self.peak)}
        return row, losses

    def loop(self, resumed: bool, show_progress: bool) -> tuple[int, dict]:
        """Steps until train.steps, logging, validating and checkpointing on their schedules; a Ctrl-C
        between steps saves a checkpoint. Returns (the last step, the last validation row)."""
        t, ddp, out = self.t, self.ddp, self.out
        metrics_file = open(out / ckpt.METRICS, "a") if ddp.main else None
        tracker = tracking.open_tracker(self.recipe, out, self.start_step if resumed else None,
                                        new_run=not resumed) if ddp.main else None
        last_val: dict = {}
        step = self.start_step
        self.model.train()
        self.peak_memory_kind = env.reset_peak_memory(self.device)
        bar = ui.progress(disable=not (show_progress and ddp.main))
        stop = {"requested": False, "hard": False}
        try:
            with bar, _interrupt_between_steps(stop):
                task = bar.add_task(f"train {out.name}", total=t.steps, completed=self.start_step, info="")
                while step < t.steps:
                    if stop["requested"]:
                        raise Terminated() if stop.get("signal") == signal.SIGTERM else KeyboardInterrupt
                    row, losses = self.train_step(step)
                    step += 1
                    rows = [row] if (step % t.log_every == 0 or step == 1 or step == t.steps) else []
                    if step % t.eval_every == 0 or step == t.steps:
                        last_val = _val_row(self.model, self.data, self.recipe, self.device, step)
                        rows.append(last_val)
                    for r in rows:
                        if metrics_file:
                            metrics_file.write(json.dumps(r) + "\n")
                        if tracker:
                            tracker.log(r)
                    if metrics_file:
                        metrics_file.flush()
                    if step % t.ckpt_every == 0 or step == t.steps:
                        self.save(step)
                    info = f"loss {losses['loss_main']:.3f}" + (f" val {last_val['val_loss']:.3f}" if last_val else "")
                    bar.update(task, completed=step, info=info + f" {row['tokens_per_s']:,.0f} tok/s",
                               log=step % t.log_every == 0)
        except (KeyboardInterrupt, Terminated) as exc:
            what = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
            if ddp.main and ddp.world == 1 and step > self.start_step and not stop["hard"]:
                self.save(step)
                ui.console.print(f"{what}: checkpoint saved at step {step}; continue with --resume")
                Stop.said = True
            _mark_stopped(out, {**self.summary, **self.clock.summary()}, "interrupted", step, ddp)
            raise
        except UserError:
            _mark_stopped(out, {**self.summary, **self.clock.summary()}, "diverged", step, ddp)
            raise
        finally:
            if metrics_file:
                metrics_file.close()
            if tracker:
                tracker.close()
        return step, last_val

    def finish(self, step: int, last_val: dict) -> dict:
        """The final validation, memory and throughput figures, written into run.json as status "done"."""
        ddp, t = self.ddp, self.t
        final = last_val or (_val_row(self.model, self.data, self.recipe, self.device, step) if ddp.main or self.fsdp
                             else {})
        memory = {"peak_memory_mb": env.peak_memory_mb(self.device), "state_mb": self.state_mb}
        if ddp.world > 1:  # every rank's figures: under FSDP each holds its own share
            ranks: list = [None] * ddp.world
            dist.all_gather_object(ranks, memory)
            memory.update({"peak_memory_mb_per_rank": [r["peak_memory_mb"] for r in ranks],
                           "state_mb_per_rank": [r["state_mb"] for r in ranks]})
        median = self.clock.median_step_time()
        achieved = self.fpt * self.tokens_per_step / median / ddp.world if median else None
        peak_note = None
        if achieved and self.trunk_states is not None and self.trunk_states.hits:
            achieved, peak_note = None, ("the frozen trunk's states were read from its cache (trunk_cache): "
                                         "its forward did not run every step, so no FLOP/s or MFU is reported")
        elif achieved and achieved > self.peak:  # the peak was measured low (a busy machine): no MFU beats > 100%
            peak_note = (f"the matmul peak {self.peak / 1e9:.0f} GFLOP/s is below the achieved {achieved / 1e9:.0f} "
                         "GFLOP/s: unreliable, no MFU reported")
            if not t.peak_flops and ddp.main:  # later runs on this machine divide by at least what this one reached
                env.raise_matmul_peak(self.device, self.amp_dtype or torch.float32, shards.cache_root(self.recipe.data),
                                      achieved)
        summary = self.summary
        summary.update({
            "status": "done", "step": step, **self.clock.summary(),
            "finished": datetime.now(UTC).isoformat(timespec="seconds"),
            "final": final, **({"peak_note": peak_note} if peak_note else {}),
            **({"trunk_cache": {"hits": self.trunk_states.hits, "misses": self.trunk_states.misses}}
               if self.trunk_states is not None else {}),
            "throughput": {
                "step_time_s_median": median,
                "tokens_per_s_median": self.tokens_per_step / median if median else None,
                "flops_per_s_median": achieved,
                "mfu_median": mfu(achieved, self.peak) if achieved else None,
                **memory,
                "peak_memory_kind": self.peak_memory_kind,
            },
        })
        if ddp.main:
            write_json(self.out / ckpt.RUN_JSON, summary)
        return summary


def mfu(flops_per_s: float, peak: float | None) -> float | None:
    """Achieved FLOP/s over the peak; None (not a figure above 100%) when the peak is not above it."""
    return flops_per_s / peak if peak and flops_per_s <= peak else None


def _mark_stopped(out: Path, summary: dict, status: str, step: int, ddp: DistInfo) -> None:
    if ddp.main:
        write_json(out / ckpt.RUN_JSON, {**summary, "status": status, "step": step})


def accumulate(forward_model: nn.Module, model: MTPModel, x: torch.Tensor, y: torch.Tensor, lam: float,
                accum: int, mem_efficient: bool, ddp: DistInfo, autocast, frozen=None) -> dict[str, float]:
    """Forward+backward over `accum` micro-batches; returns the step's losses. Each loss (main, and each
    extra k) is its sum over this rank's valid targets divided by the count of valid targets in the
    whole global batch (every rank's micro-batches) over the world size: DDP and FSDP average the
    gradients over ranks, so the gradient is that of the global mean even when ranks hold different
    numbers of valid targets (model/loss.py), and the logged losses, averaged over ranks, are its value.
    `frozen(micro, x, y, total)`: a frozen trunk's stored states of that micro-batch (trunk_cache.py)."""
    counts = L.valid_counts(y, model.n_losses).double()
    if ddp.world > 1:
        dist.all_reduce(counts)
    totals = [max(c, 1.0) / ddp.world for c in counts.tolist()]
    sums: dict[str, float] = {}
    for i, (xm, ym) in enumerate(zip(x.chunk(accum), y.chunk(accum))):
        last = i == accum - 1
        sync_ctx = (
            forward_model.no_sync if (isinstance(forward_model, DDP) and (not last or mem_efficient)) else contextlib.nullcontext
        )
        with sync_ctx(), autocast():
            if mem_efficient:
                out = parallel_backward(model, xm, ym, lam, totals=totals)
            else:
                states = frozen(i, xm, ym, totals[0]) if frozen is not None else None
                out = forward_model(xm, ym, lam, totals, states)
                out.loss.backward()
        parts = {"loss": out.loss.detach(), "loss_main": out.loss_main.detach(),
                 **{f"loss_mtp_{k}": v.detach() for k, v in enumerate(out.loss_extra, 1)}}
        for key, value in parts.items():
            sums[key] = sums.get(key, 0.0) + float(value)
    if ddp.world > 1:
        if mem_efficient:  # the one-head-at-a-time backward ran outside DDP's hooks: average by hand
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= ddp.world
        keys = sorted(sums)
        vec = torch.tensor([sums[k] for k in keys], dtype=torch.float64, device=y.device)
        dist.all_reduce(vec)
        sums = {k: float(v) / ddp.world for k, v in zip(keys, vec)}
    return sums


def _architecture_note(recipe: Recipe, model: MTPModel) -> str:
    m = recipe.mtp
    distilled = "; each extra prediction distilled from the frozen trunk's distribution" if m.draft_target == "trunk" else ""
    return _objective_note(recipe, model) + distilled


def _objective_note(recipe: Recipe, model: MTPModel) -> str:
    m = recipe.mtp
    if m.objective == "parallel":
        matched = (f"compute-matched: trunk has {model.trunk.n_layers} layers ({recipe.model.n_layers} - {m.heads - 1}); "
                   if m.compute_matched else f"not compute-matched: trunk keeps {model.trunk.n_layers} layers; ")
        return matched + f"{m.heads} heads, head 1 = the trunk's last layer; λ = {m.lambda_at():g} over {m.heads - 1} extra heads"
    if m.objective == "sequential":
        sched = f", λ → {m.lambda_final:g} after {m.lambda_switch:.0%} of steps" if m.lambda_final is not None else ""
        return f"{m.depth} sequential module(s), depth 1 fed the trunk's {m.mtp_input} state, λ = {m.lambda_at():g}{sched}"
    return "next-token prediction only"
