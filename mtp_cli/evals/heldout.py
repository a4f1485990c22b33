"""Held-out quality: trunk cross-entropy / top-1, and each MTP depth's loss, top-1 and agreement.

`agree_k` is the acceptance-rate proxy: how often extra prediction k's argmax at position i equals
the trunk's own greedy prediction for the same token (its argmax at position i+k, given the true
prefix). For k = 1 that is exactly what greedy self-speculative decoding accepts on this text.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from mtp_cli.model import MTPModel
from mtp_cli.model import loss as L


@torch.no_grad()
def evaluate(model: MTPModel, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
             device: torch.device | str = "cpu") -> dict[str, float]:
    """Token-weighted means over all batches. Keys: loss, top1, and per extra k: loss_k, top1_k, agree_k."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}

    def add(key: str, total: torch.Tensor, n: int) -> None:
        sums[key] = sums.get(key, 0.0) + float(total)
        counts[key] = counts.get(key, 0) + n

    was_training = model.training
    model.eval()
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        logits = model.all_logits(x)
        trunk_pred = logits[0].argmax(-1)
        n = y.numel()
        add("loss", L.cross_entropy(logits[0], y) * n, n)
        add("top1", (trunk_pred == y).sum(), n)
        for k, lk in enumerate(logits[1:], 1):
            yk = L.extra_targets(y, k)
            nk = yk.numel()
            pred = lk.argmax(-1)
            add(f"loss_{k}", L.cross_entropy(lk, yk) * nk, nk)
            add(f"top1_{k}", (pred == yk).sum(), nk)
            add(f"agree_{k}", (pred == trunk_pred[:, k:]).sum(), nk)
    model.train(was_training)
    return {key: sums[key] / counts[key] for key in sums}
