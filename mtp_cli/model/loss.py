"""The loss alignment and the MTP loss formula — the one place these facts live.

A training chunk of T+1 tokens gives inputs x = t[0:T] and next-token targets y = t[1:T+1].
Extra prediction k (DeepSeek depth k, or Meta head k+1) at position i predicts t[i+k+1] = y[i+k],
so it exists for positions i = 0..T-1-k: its logits are the first T-k positions and its targets
are y[:, k:]. The last k positions carry no depth-k loss.

L = L_main + (λ / D) · Σ_k L_k, each L_k the mean cross-entropy over its valid positions: those
with a target, and whose target is not IGNORE (-100, F.cross_entropy's ignore_index). Each loss
takes an optional `total`, the number its sum is divided by: by default the count of valid targets
here; in training the count over the whole global batch (all ranks and micro-batches, divided by
the world size, since DDP and FSDP average gradients over ranks), so that ranks holding different
numbers of valid targets still give the gradient of the global mean (`valid_counts`).

Training computes each cross-entropy from the normed hidden states and the unembedding weight in
one step (`linear_cross_entropy`): a few hundred rows of logits at a time, with the gradient formed
while the softmax is in cache, so the (N, V) logits and their log-softmax are never stored. On the
quick recipe this makes the unembedding + loss 1.4× faster on CPU (the plain path streams four
N×V fp32 tensors through memory) and is what puts our trunk ahead of Hugging Face's step.

The extra predictions may be trained over a subset of the vocabulary (`SubVocab`, mtp.draft_vocab):
the unembedding's rows of those tokens only, and a target outside the subset carries no loss (it
still counts in `total`). The subset is the one the modules draft from at inference, so training
matches drafting and its unembedding costs |subset| / V of the full one (EAGLE-3 and FR-Spec draft
from such a subset; EAGLE-3 trains over it too).

With a frozen trunk the extra predictions may instead be distilled from it (mtp.draft_target = "trunk",
`distill_offset_loss`): prediction k at position i and the trunk at position i+k predict the same token,
so the target is the trunk's whole distribution there rather than the text's token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def extra_targets(targets: torch.Tensor, k: int) -> torch.Tensor:
    """Targets of extra prediction k >= 1 (k = 0 is the next token): y[:, k:]."""
    return targets[:, k:]


def valid_positions(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The positions of a (B, T, V) logit tensor that have a target at offset k."""
    return logits[:, : logits.shape[1] - k]


IGNORE = -100  # a target that carries no loss


def valid_counts(targets: torch.Tensor, n_extra: int) -> torch.Tensor:
    """Valid targets (not IGNORE) of the next-token loss and of each extra prediction k = 1..n_extra:
    an int64 tensor of n_extra + 1 counts."""
    valid = targets != IGNORE
    return torch.stack([valid[:, k:].sum() for k in range(n_extra + 1)])


@dataclass(frozen=True)
class SubVocab:
    """A subset of the vocabulary that a loss is computed over."""
    ids: torch.Tensor  # ascending token ids
    position: torch.Tensor  # (V,): each token's row in `ids`, IGNORE for a token outside it

    @classmethod
    def of(cls, ids: torch.Tensor, vocab_size: int) -> SubVocab:
        ids = ids.sort().values
        position = torch.full((vocab_size,), IGNORE, dtype=torch.long, device=ids.device)
        position[ids] = torch.arange(len(ids), device=ids.device)
        return cls(ids, position)

    def restrict(self, weight: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The unembedding's rows of the subset, and the targets as rows of it (IGNORE outside it)."""
        mapped = self.position[targets.clamp_min(0)]
        return weight[self.ids], torch.where(targets == IGNORE, IGNORE, mapped)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, total: float | None = None) -> torch.Tensor:
    """Token cross-entropy in nats, computed in fp32: the mean over valid targets, or with `total`
    their sum divided by it."""
    flat, y = logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1)
    if total is None:
        return F.cross_entropy(flat, y, ignore_index=IGNORE)
    return F.cross_entropy(flat, y, ignore_index=IGNORE, reduction="sum") / total


_CHUNK_ELEMENTS = 1 << 21  # logits per chunk: 8 MB of fp32, about what stays in a CPU's L2/L3


class _LinearCrossEntropy(torch.autograd.Function):
    """Σ_i CE(h_i · Wᵀ, y_i) / N over the valid rows, with its gradient formed chunk by chunk in the
    forward pass: dL/dlogits = (softmax − onehot) / N (zero on ignored rows), then dL/dh = G·W and
    dL/dW = Gᵀ·h. The backward only scales the stored gradients by the incoming one (so it is not
    twice differentiable)."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, n: float) -> torch.Tensor:
        vocab = weight.shape[0]
        valid = targets != IGNORE
        masked = not bool(valid.all())
        targets = targets.clamp_min(0)  # an ignored row's class is any one: its loss and gradient are zeroed
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        chunk = max(64, _CHUNK_ELEMENTS // vocab)
        acc = torch.promote_types(hidden.dtype, torch.float32)  # softmax and sums in fp32 at least
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_weight else None
        total = torch.zeros((), dtype=acc, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk):
            h, y, v = hidden[start:start + chunk], targets[start:start + chunk], valid[start:start + chunk]
            logits = (h @ weight.t()).to(acc)
            probs = torch.softmax(logits, dim=-1)
            rows = torch.arange(h.shape[0], device=h.device)
            p_target = probs[rows, y]
            nll = -torch.log(p_target)
            far = (p_target < 1e-30) & v  # log of an underflowing probability: take the exact log-sum-exp instead
            if bool(far.any()):
                nll[far] = torch.logsumexp(logits[far], dim=-1) - logits[rows[far], y[far]]
            probs[rows, y] = p_target - 1.0
            if masked:
                nll = torch.where(v, nll, 0.0)
                probs.masked_fill_(~v[:, None], 0.0)
            total += nll.sum()
            if need_hidden:
                torch.mm(probs.to(h.dtype), weight, out=grad_hidden[start:start + chunk])
            if need_weight:
                grad_weight.addmm_(probs.t(), h.to(acc))
        ctx.save_for_backward(grad_hidden.div_(n) if need_hidden else None,
                              grad_weight.div_(n).to(weight.dtype) if need_weight else None)
        ctx.inputs, ctx.versions = (hidden, weight), (hidden._version, weight._version)
        return total / n

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        if tuple(t._version for t in ctx.inputs) != ctx.versions:  # what autograd checks for saved inputs
            raise RuntimeError("linear_cross_entropy: its hidden states or weight were modified in place "
                               "between forward and backward; the stored gradient no longer matches them")
        return (None if grad_hidden is None else grad_hidden * grad_output.to(grad_hidden.dtype),
                None if grad_weight is None else grad_weight * grad_output.to(grad_weight.dtype), None, None)


def linear_cross_entropy(normed: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         total: float | None = None) -> torch.Tensor:
    """`cross_entropy(normed @ weight.T, targets, total)` without storing the logits. normed (..., d),
    targets (...). Without autograd or under autocast (CUDA bf16, where the plain path's kernels are
    fused already) it is the plain path."""
    needs_grad = torch.is_grad_enabled() and (normed.requires_grad or weight.requires_grad)
    if not needs_grad or torch.is_autocast_enabled(normed.device.type):
        return cross_entropy(F.linear(normed, weight), targets, total)
    n = float((targets != IGNORE).sum()) if total is None else float(total)
    return _LinearCrossEntropy.apply(normed.reshape(-1, normed.shape[-1]), weight, targets.reshape(-1), n)


def linear_offset_loss(normed: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, k: int,
                       total: float | None = None) -> torch.Tensor:
    """`offset_loss` from normed hidden states and the unembedding weight (see linear_cross_entropy)."""
    normed, targets = _aligned(normed, targets, k)
    return linear_cross_entropy(normed, weight, targets, total)


def distill_offset_loss(normed: torch.Tensor, teacher_normed: torch.Tensor, weight: torch.Tensor,
                        targets: torch.Tensor, k: int, total: float | None = None) -> torch.Tensor:
    """Prediction k's distillation loss: KL(teacher ‖ student) summed over the rows whose target is valid (not
    IGNORE), divided by `total` (default: their count). The student's rows are its states over the first T-k
    positions, the teacher's the trunk's normed states at positions k..T-1 (the trunk's own distribution for
    the same token, given the text before it); both are unembedded by `weight` (a draft vocabulary's rows:
    the teacher is then renormalized over it). The gradient is that of the cross-entropy against the
    teacher's distribution; the value is 0 where the student matches it."""
    normed, targets = _aligned(normed, targets, k)
    teacher = teacher_normed[:, k:].detach()
    valid = (targets != IGNORE).reshape(-1)
    n = float(valid.sum()) if total is None else float(total)
    h, t = normed.reshape(-1, normed.shape[-1])[valid], teacher.reshape(-1, teacher.shape[-1])[valid]
    chunk = max(64, _CHUNK_ELEMENTS // weight.shape[0])
    acc = torch.promote_types(h.dtype, torch.float32)
    parts = []
    for start in range(0, h.shape[0], chunk):
        log_q = torch.log_softmax(F.linear(h[start:start + chunk], weight).to(acc), dim=-1)
        with torch.no_grad():
            log_p = torch.log_softmax(F.linear(t[start:start + chunk], weight).to(acc), dim=-1)
        parts.append((log_p.exp() * (log_p - log_q)).sum())
    return torch.stack(parts).sum() / n if parts else h.sum() * 0.0


def offset_loss(logits: torch.Tensor, targets: torch.Tensor, k: int, total: float | None = None) -> torch.Tensor:
    """Cross-entropy of prediction k (0 = next token) given logits over all T positions or T-k."""
    return cross_entropy(*_aligned(logits, targets, k), total)


def _aligned(per_position: torch.Tensor, targets: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prediction k's rows (over all T positions or already T-k) and its targets, cut to the same length."""
    if per_position.shape[1] == targets.shape[1]:
        per_position = valid_positions(per_position, k)
    return per_position, extra_targets(targets, k)


def combine(loss_main: torch.Tensor, extra: list[torch.Tensor], lam: float) -> torch.Tensor:
    """L_main + (λ / D) Σ_k L_k; with no extra losses, L_main."""
    if not extra:
        return loss_main
    return loss_main + (lam / len(extra)) * torch.stack(extra).sum()


def extra_weight(lam: float, n_extra: int) -> float:
    """The weight each extra loss gets in `combine` (used by the one-head-at-a-time backward)."""
    return lam / n_extra
