"""FLOPs per token of a model, counted from its weights (2 × the matrix weights a token uses, plus the
attention scores and values): training (3 × forward, less for a frozen trunk) and one forward. The
trainer's MFU, the report's cost table and the dry run's estimates all count with these."""

from __future__ import annotations

from torch import nn

from mtp_cli.model.mtp import MTPModel


def _flop_parts(model: MTPModel, context: int) -> tuple[float, float, float]:
    """Forward FLOPs per token of (the trunk incl. its unembedding, the MTP modules/heads without it,
    the extra predictions' use of the shared unembedding): 2 × matmul weights used + attention
    scores/values (4 · context · d per block)."""
    cfg = model.cfg
    linears = lambda part: sum(m.weight.numel() for m in part.modules()  # noqa: E731
                               if isinstance(m, nn.Linear) and m is not model.trunk.lm_head)
    trunk = 2 * (linears(model.trunk) + cfg.vocab_size * cfg.d_model) + 4 * model.trunk.n_layers * context * cfg.d_model
    modules = 2 * linears(model.mtp) + 4 * model.n_extra * context * cfg.d_model
    return trunk, modules, 2 * cfg.vocab_size * cfg.d_model * model.n_extra


def forward_flops_per_token(model: MTPModel, context: int) -> float:
    """FLOPs per token of one forward pass (validation), trunk and modules."""
    return sum(_flop_parts(model, context))


def trunk_forward_flops_per_token(model: MTPModel, context: int) -> float:
    """FLOPs per token of the trunk's forward pass, unembedding included: what a frozen trunk's stored
    states (train.trunk_cache) save on a batch it has seen."""
    return _flop_parts(model, context)[0]


def flops_per_token(model: MTPModel, context: int) -> float:
    """Training FLOPs per token: 3 × forward (the backward is 2 ×). A frozen trunk (`model.frozen_trunk`,
    set by train.freeze_trunk) runs under no-grad: its forward only. The extra predictions' unembedding
    is then the frozen trunk's weight, so its backward forms the input's gradient only (1 × forward).
    Trained over a subset of the vocabulary (mtp.draft_vocab), that unembedding is its rows only. Distilled
    from the trunk (mtp.draft_target = "trunk"), each extra prediction's teacher logits are one more
    forward of that unembedding (no gradient)."""
    trunk, modules, extra_unembed = _flop_parts(model, context)
    if model.mtp_cfg.draft_vocab:
        extra_unembed *= min(model.mtp_cfg.draft_vocab, model.cfg.vocab_size) / model.cfg.vocab_size
    teacher = extra_unembed if model.mtp_cfg.draft_target == "trunk" else 0.0
    if model.frozen_trunk:
        return trunk + 3 * modules + 2 * extra_unembed + teacher
    return 3 * (trunk + modules + extra_unembed) + teacher
