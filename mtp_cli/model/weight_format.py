"""The weights a model decodes and evaluates with (`Runtime.dtype`): fp32, bf16, or int8 weight-only.

int8 is symmetric per output channel (scale = max |w| / 127, in bf16) for every linear layer of the trunk's
blocks and of the MTP modules; activations, norms and the (tied) embedding / unembedding stay bf16. On a CPU
with AVX512-VNNI, inductor lowers `mm(x, q.t().to(bf16)) * scale` to its int8 weight-only GEMM, which reads a
byte per weight (the decode engine's compiled step). Each quantized layer keeps its int8 matrix and scales
(`int8_weight`) for the engine, and its `weight` becomes their product rounded to bf16, so the modules'
own forward (held-out loss, the Hugging Face peers built from the weights) computes with the same weights,
rounded once more."""

from __future__ import annotations

import torch
from torch import nn

WEIGHT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.bfloat16}  # int8: of the products
INT8_ATTR = "int8_weight"  # an nn.Linear's (int8 (out, in), bf16 scales (out,)) once quantized


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 (out, in), scale bf16 (out,)): w ≈ q · scale per output row, |q| ≤ 127."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12).to(torch.bfloat16)
    q = torch.round(w / scale.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def use_weights(model: nn.Module, dtype: str) -> None:
    """Cast `model` to the weights of `dtype` (a key of WEIGHT_DTYPES) in place; int8 quantizes every linear
    layer but an untied unembedding (`lm_head`; the embedding and norms stay bf16). Quantizing twice is a no-op."""
    layers = [m for name, m in model.named_modules() if isinstance(m, nn.Linear) and not name.endswith("lm_head")
              and int8_weight(m) is None] if dtype == "int8" else []
    quantized_layers = [(m, *quantize_int8(m.weight)) for m in layers]  # from the weights as they are (fp32)
    model.to(WEIGHT_DTYPES[dtype])
    for module, q, scale in quantized_layers:
        with torch.no_grad():
            module.weight.copy_((q.float() * scale.float()[:, None]).to(module.weight.dtype))
        module.__dict__[INT8_ATTR] = (q.to(module.weight.device), scale.to(module.weight.device))


def int8_weight(linear: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A linear layer's (int8 matrix, scales) where `use_weights(..., "int8")` quantized it, else None."""
    return linear.__dict__.get(INT8_ATTR)


def quantized(model: nn.Module) -> bool:
    """Whether `use_weights(model, "int8")` quantized this model (any of its linear layers)."""
    return any(int8_weight(m) is not None for m in model.modules() if isinstance(m, nn.Linear))


def weight_format(model: nn.Module) -> str:
    """The key of WEIGHT_DTYPES that `model`'s weights are in: int8 where quantized, else its dtype's."""
    if quantized(model):
        return "int8"
    dtype = next(model.parameters()).dtype
    return next((k for k, v in WEIGHT_DTYPES.items() if v == dtype), str(dtype).removeprefix("torch."))
