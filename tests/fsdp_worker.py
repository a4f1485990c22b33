"""torchrun worker for tests/test_fsdp.py: one training step's gradients with uneven valid targets.

`torchrun --nproc_per_node 2 tests/fsdp_worker.py OUT.pt` builds micro models (NTP tied and untied,
sequential D=2, parallel n=3), gives them one global batch whose targets are partly IGNORE (-100), unevenly: rank 0's
rows hold far fewer valid targets than rank 1's, for the main loss and for every depth. Each model
makes one `train.accumulate` step on its rank's half, through DDP and through FSDP2 (gloo), and
rank 0 saves every parameter's whole gradient and the step's losses to OUT.pt, with the batch, for the
test to compare against one process on the whole batch.
"""

from __future__ import annotations

import contextlib
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from mtp_cli.base.dist import DistInfo
from mtp_cli.config.recipe import ModelConfig, MTPConfig
from mtp_cli.model import MTPModel, parallel
from mtp_cli.model.loss import IGNORE
from mtp_cli.train.loop import accumulate

MODEL = dict(vocab_size=97, n_layers=3, d_model=32, n_heads=2, ffn_hidden=64, context=16, zero_init_residual=False)
CASES = {"ntp": (MTPConfig(objective="ntp"), {}),
         "ntp-untied": (MTPConfig(objective="ntp"), {"tie_embeddings": False}),
         "sequential-d2": (MTPConfig(objective="sequential", depth=2, lambda_=0.3), {}),
         "parallel-n3": (MTPConfig(objective="parallel", heads=3), {})}
BATCH, T, ACCUM = 8, 16, 2  # 4 rows a rank, in 2 micro-batches of 2


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch: rank 0 holds rows 0-3 (most targets ignored), rank 1 rows 4-7 (few)."""
    g = torch.Generator().manual_seed(7)
    x = torch.randint(0, MODEL["vocab_size"], (BATCH, T), generator=g)
    y = torch.randint(0, MODEL["vocab_size"], (BATCH, T), generator=g)
    keep = torch.rand(BATCH, T, generator=g) < torch.tensor([0.2] * 4 + [0.9] * 4)[:, None]
    y[~keep] = IGNORE
    y[0, -3:] = IGNORE  # a row whose last positions (the deeper depths' only targets there) are all ignored
    return x, y


def model_for(case: str) -> MTPModel:
    mtp, model = CASES[case]
    torch.manual_seed(0)
    return MTPModel(ModelConfig(**{**MODEL, **model}), mtp)


def full_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in model.named_parameters():
        g = p.grad
        if g is not None:
            out[name.removeprefix("module.")] = (g.full_tensor() if isinstance(g, DTensor) else g).detach().clone()
    return out


def main(path: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = DistInfo(rank, world, 0)
    x, y = batch()
    per = BATCH // world
    xr, yr = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
    results = {"x": x, "y": y}
    for name in CASES:
        for mode in ("ddp", "fsdp"):
            model = model_for(name)
            mem_efficient = mode == "ddp" and model.objective == "parallel"  # as train.py chooses
            if mode == "fsdp":
                parallel.fully_shard_model(model, torch.device("cpu"), world)
                forward_model = model
            else:
                forward_model = DDP(model)
            losses = accumulate(forward_model, model, xr, yr, 0.3, ACCUM, mem_efficient, ddp, contextlib.nullcontext)
            norm = parallel.clip_grad_norm(model.parameters(), 1e9)
            results[f"{name}/{mode}"] = {"grads": full_grads(model), "losses": losses, "grad_norm": norm,
                                         "tied": model.trunk.unembed_weight is model.trunk.embed_tokens.weight,
                                         "n_params": len(list(model.parameters()))}
    if rank == 0:
        torch.save(results, path)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
