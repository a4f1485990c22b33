"""How torchrun's processes share the model: DDP (train.parallel = "ddp", the default) or FSDP2 ("fsdp").

DDP: every rank holds the whole model, its gradients and its AdamW state (16 bytes a trained
parameter in fp32) and gradients are all-reduced. FSDP2 (`torch.distributed.fsdp.fully_shard`, as
torchtitan applies it): each rank holds 1/world of every parameter, gradient and optimizer state;
a block's parameters are all-gathered just before its forward and backward and its gradients
reduce-scattered after its backward. The groups:

- each trunk block, resharded after its forward (torchtitan's default without pipelining);
- each MTP module / parallel head, kept gathered after its forward: they run last in the forward
  and first in the backward (torchtitan keeps its final norm + output layer so for that reason),
  and a sequential module's final norm (`shared_head.norm`) is applied after its forward;
- the root MTPModel: the embedding, the final norm and the unembedding. FSDP keeps the root
  gathered from its forward to its backward. A tied embedding is one parameter of that group, and
  the MTP modules' shared unembedding is that same parameter, so neither is ever duplicated.

On CUDA the gathered parameters are bf16 and gradients are reduced in fp32 (MixedPrecisionPolicy,
in place of autocast); on CPU everything stays fp32. A frozen trunk is sharded like a trained one
(its parameters get no gradients). The optimizer is built after sharding, over the local shards.
At world size 1 there is nothing to shard: an "fsdp" run trains the plain model and still writes
sharded (DCP) checkpoints, so it resumes at any world size (`mtp_cli/model/sharded_checkpoint.py`).
"""

from __future__ import annotations

import torch
from torch import nn

FSDP = "fsdp"


def sharded(parallel: str, world: int) -> bool:
    """Whether the model is split across ranks (FSDP with more than one process)."""
    return parallel == FSDP and world > 1


def fully_shard_model(model: nn.Module, device: torch.device, world: int) -> None:
    """Apply FSDP2 in place to an MTPModel on the CPU or already on `device` (see the module docstring);
    fully_shard moves each rank's shards to the mesh's device."""
    from torch.distributed.device_mesh import init_device_mesh  # FSDP/DCP only: not loaded by a plain run
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # FSDP/DCP only: not loaded by a plain run

    mesh = init_device_mesh(device.type, (world,))
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if device.type == "cuda"
          else MixedPrecisionPolicy())
    for block in model.trunk.layers:
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    for module in model.mtp:
        fully_shard(module, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, mp_policy=mp)


def clip_grad_norm(parameters, max_norm: float) -> float:
    """torch.nn.utils.clip_grad_norm_ over plain or sharded (DTensor) gradients: the norm of the whole
    gradient, every rank's shards included, as torchtitan computes it; returns it as a float."""
    from torch.distributed.tensor import DTensor  # FSDP/DCP only: not loaded by a plain run

    params = [p for p in parameters if p.grad is not None]
    if not params:
        return 0.0
    total = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    if max_norm > 0:  # 0: no clipping (train.grad_clip), the norm is still reported
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor  # FSDP/DCP only: not loaded by a plain run

    return t.to_local() if isinstance(t, DTensor) else t


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of parameters, gradients and optimizer state this rank holds (its shards under FSDP)."""
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]
    tensors += [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors)

