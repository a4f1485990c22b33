"""The loss alignment and the MTP loss formula — the one place these facts live.

A training chunk of T+1 tokens gives inputs x = t[0:T] and next-token targets y = t[1:T+1].
Extra prediction k (DeepSeek depth k, or Meta head k+1) at position i predicts t[i+k+1] = y[i+k],
so it exists for positions i = 0..T-1-k: its logits are the first T-k positions and its targets
are y[:, k:]. The last k positions carry no depth-k loss.

L = L_main + (λ / D) · Σ_k L_k, each L_k the mean cross-entropy over its valid positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def extra_targets(targets: torch.Tensor, k: int) -> torch.Tensor:
    """Targets of extra prediction k >= 1 (k = 0 is the next token): y[:, k:]."""
    return targets[:, k:]


def valid_positions(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The positions of a (B, T, V) logit tensor that have a target at offset k."""
    return logits[:, : logits.shape[1] - k]


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy in nats, computed in fp32."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def offset_loss(logits: torch.Tensor, targets: torch.Tensor, k: int) -> torch.Tensor:
    """Cross-entropy of prediction k (0 = next token) given logits over all T positions or T-k."""
    if logits.shape[1] == targets.shape[1]:
        logits = valid_positions(logits, k)
    return cross_entropy(logits, extra_targets(targets, k))


def combine(loss_main: torch.Tensor, extra: list[torch.Tensor], lam: float) -> torch.Tensor:
    """L_main + (λ / D) Σ_k L_k; with no extra losses, L_main."""
    if not extra:
        return loss_main
    return loss_main + (lam / len(extra)) * torch.stack(extra).sum()


def extra_weight(lam: float, n_extra: int) -> float:
    """The weight each extra loss gets in `combine` (used by the one-head-at-a-time backward)."""
    return lam / n_extra
