"""Frozen-trunk states on disk, so that runs training modules on one frozen trunk run it once per batch.

A frozen trunk gives the same states for the same batch every time. Runs that draw the same batches
(the variants of a post-hoc recipe on one corpus and data order, or a resumed run) would each run the
whole trunk forward over them, which on a real pretrained model costs more than training the module.
This cache stores, per step and micro-batch, the input of the trunk's last layer and its next-token
loss (`MTPModel.frozen_pass`), with fused features also the outputs of the layers they read, under
`<cache>/trunk_states/<key>/`. The key hashes the trunk's weights with everything that decides a batch
(the token data, context, batch size, data order, rank and world size, micro-batches), the layers tapped,
and how it is computed (device type, dtype: train.trunk_dtype = "bfloat16" runs the pass under autocast
and stores its states in bf16, half the disk), so a different trunk or batch never reads another's
states. A hit is bit-identical to recomputing (the test compares them).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from mtp_cli.base.files import replacing
from mtp_cli.model.mtp import FrozenTrunk, MTPModel


def batch_settings(recipe) -> dict:
    """The recipe's settings that decide a run's batches beside its token data (part of the cache key)."""
    t = recipe.train
    return {"context": recipe.model.context, "batch_size": t.batch_size, "order_seed": t.order_seed,
            "grad_accum": t.grad_accum}


def weights_sha256(module: torch.nn.Module) -> str:
    """A hash of a module's parameters and buffers: names, shapes, dtypes and bytes."""
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


class TrunkStateCache:
    """One run's view of the cache: `get(step, micro, idx, targets, total)` returns the stored
    `FrozenTrunk` of that micro-batch, computing and storing it on a miss."""

    def __init__(self, root: Path, model: MTPModel, batch_key: dict, dtype: torch.dtype | None = None):
        trunk_sha = weights_sha256(model.trunk)
        taps = {"taps": list(model.tap_layers)} if model.tap_layers else {}  # fused features: those layers too
        key = hashlib.sha256(json.dumps({"trunk": trunk_sha, **batch_key, **taps}, sort_keys=True).encode()).hexdigest()[:20]
        self.dir = Path(root) / "trunk_states" / key
        self.model, self.dtype = model, dtype  # dtype: the pass runs in it and its states are stored in it
        self.hits = self.misses = 0

    def get(self, step: int, micro: int, idx: torch.Tensor, targets: torch.Tensor,
            total: float | None) -> FrozenTrunk:
        path = self.dir / f"step{step:07d}-{micro:03d}.pt"
        if path.is_file():
            stored = torch.load(path, map_location=idx.device, weights_only=True)
            self.hits += 1
            taps = stored.get("taps")
            return FrozenTrunk(stored["shared"].float(), stored["loss_main"], None if taps is None else taps.float())
        frozen = self.model.frozen_pass(idx, targets, total, self.dtype)
        self.dir.mkdir(parents=True, exist_ok=True)
        with replacing(path, f".{os.getpid()}") as tmp:
            dtype = self.dtype or frozen.shared.dtype
            taps = {} if frozen.taps is None else {"taps": frozen.taps.to(dtype).cpu()}
            torch.save({"shared": frozen.shared.to(dtype).cpu(), "loss_main": frozen.loss_main.cpu(), **taps}, tmp)
        self.misses += 1
        return frozen
