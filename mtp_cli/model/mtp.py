"""MTP models: a trunk plus DeepSeek-V3 sequential modules or Meta parallel heads.

Sequential (DeepSeek-V3 §2.2, eqs. 21-25). Depth k fuses [RMSNorm(Emb(t_{i+k})) ; RMSNorm(h_i^{k-1})]
— embedding first, as Megatron-Core, vLLM and torchtitan do (the paper's eq. 21 writes h first) —
through a bias-free 2d→d projection, runs one causal `Block`, then its own final RMSNorm and the
trunk's shared unembedding. Depth 1 reads the trunk state after the final norm ("post-norm",
Megatron/vLLM) or before it ("pre-norm", torchtitan). Weight names follow DeepSeek's HF release
(enorm, hnorm, eh_proj, shared_head.norm).

Parallel (Gloeckle et al. 2024 §2). The trunk's last block is head 1 (next token, kept at
inference); heads 2..n are independent `Block`s on the same shared state (the input of that last
block); all share the trunk's final norm and unembedding. Compute-matched: the trunk loses n-1
layers. `parallel_backward` is Meta's memory-efficient training: trunk once, then forward+backward
one head at a time, accumulating the gradient at the shared state.

Fused features (mtp.features = "fused", EAGLE-3 §3.2): depth 1 reads `fuse`[low; mid; last], a learned projection
of two earlier layers' outputs (`feature_layers`) and the state it reads otherwise, started as the identity on the
last so that it begins as the plain module.

The trunk never reads the modules, so discarding them leaves its logits unchanged.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from mtp_cli.base.errors import UserError
from mtp_cli.config.recipe import ModelConfig, MTPConfig
from mtp_cli.model import loss as L
from mtp_cli.model.trunk import Block, RMSNorm, Trunk, init_weights
from mtp_cli.model.unroll import unrolled_states


class SharedHead(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)


def feature_layers(n_layers: int) -> tuple[int, int]:
    """The trunk layers (0-based) whose outputs fused features read beside the last state: EAGLE-3's low and
    middle levels, layer 3's and the middle layer's, clamped for shallow trunks."""
    return min(2, n_layers - 1), n_layers // 2


class MTPModule(nn.Module):
    """One DeepSeek-V3 depth: h'^k = eh_proj[enorm(Emb(t_{i+k})) ; hnorm(h^{k-1})], h^k = block(h'^k);
    `fused`: depth 1 also has `fuse`, (3d → d), applied to [low; mid; h^0] before it reads h^0."""

    def __init__(self, cfg: ModelConfig, fused: bool = False):
        super().__init__()
        if fused:
            self.fuse = nn.Linear(3 * cfg.d_model, cfg.d_model, bias=False)
        self.enorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.hnorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.eh_proj = nn.Linear(2 * cfg.d_model, cfg.d_model, bias=False)
        self.block = Block(cfg)
        self.shared_head = SharedHead(cfg)

    def forward(self, h_prev: torch.Tensor, emb_next: torch.Tensor, rope) -> torch.Tensor:
        cos, sin = rope
        x = self.eh_proj(torch.cat([self.enorm(emb_next), self.hnorm(h_prev)], dim=-1))
        return self.block(x, cos, sin)


@dataclass
class FrozenTrunk:
    """What a frozen trunk gives one training batch, the same every time it sees that batch (so it can be
    computed once and stored: train/trunk_cache.py): the input of its last layer, and its next-token loss."""
    shared: torch.Tensor  # (B, T, d): the last layer's input (the parallel heads' shared state)
    loss_main: torch.Tensor  # the trunk's next-token loss on the batch (its `totals[0]` division)
    taps: torch.Tensor | None = None  # (B, T, 2d): `feature_layers`' outputs, for fused features


@dataclass
class Output:
    loss: torch.Tensor  # the combined training objective
    loss_main: torch.Tensor
    loss_extra: list[torch.Tensor]  # one per extra depth/head, k = 1..D


def trunk_layers(model_cfg: ModelConfig, mtp_cfg: MTPConfig) -> int:
    if mtp_cfg.objective == "parallel" and mtp_cfg.compute_matched:
        n = model_cfg.n_layers - (mtp_cfg.heads - 1)
        if n < 1:
            raise UserError(f"compute-matched parallel heads need n_layers >= heads "
                            f"({model_cfg.n_layers} < {mtp_cfg.heads}); raise n_layers or set compute_matched = false")
        return n
    return model_cfg.n_layers


class MTPModel(nn.Module):
    def __init__(self, model_cfg: ModelConfig, mtp_cfg: MTPConfig):
        super().__init__()
        self.cfg, self.mtp_cfg = model_cfg, mtp_cfg
        self.trunk = Trunk(model_cfg, trunk_layers(model_cfg, mtp_cfg))
        fused = mtp_cfg.features == "fused"
        if mtp_cfg.objective == "sequential":
            self.mtp = nn.ModuleList(MTPModule(model_cfg, fused and k == 0) for k in range(mtp_cfg.depth))
        elif mtp_cfg.objective == "parallel":
            self.mtp = nn.ModuleList(Block(model_cfg) for _ in range(mtp_cfg.heads - 1))
        else:
            self.mtp = nn.ModuleList()
        init_weights(self, model_cfg.init_std, model_cfg.zero_init_residual)
        self.tap_layers = feature_layers(self.trunk.n_layers) if fused and self.objective == "sequential" else ()
        if self.tap_layers:
            with torch.no_grad():  # [low; mid; last] -> last: the plain module's input, to start
                d = model_cfg.d_model
                self.mtp[0].fuse.weight.zero_()[:, 2 * d:].copy_(torch.eye(d))
        self.frozen_trunk = False
        self.extra_vocab: L.SubVocab | None = None  # what the extra losses are computed over (None: all)

    def train_extra_over(self, ids: torch.Tensor | None) -> None:
        """Compute the extra predictions' training losses over these token ids only (mtp.draft_vocab;
        model/loss.py); None: the whole vocabulary. Evaluation and decoding are not affected."""
        weight = self.trunk.unembed_weight
        self.extra_vocab = None if ids is None else L.SubVocab.of(ids.to(weight.device), weight.shape[0])

    def extra_loss(self, k: int, normed: torch.Tensor, targets: torch.Tensor, total: float | None,
                   teacher: torch.Tensor | None = None) -> torch.Tensor:
        """Extra prediction k's training loss from its normed state over its vocabulary (`train_extra_over`):
        against the text's tokens, or with `teacher` (the trunk's normed states, mtp.draft_target = "trunk")
        against the trunk's own distribution for the same tokens."""
        weight = self.trunk.unembed_weight
        if teacher is not None:
            weight = weight if self.extra_vocab is None else weight[self.extra_vocab.ids]
            return L.distill_offset_loss(normed, teacher, weight, targets, k, total)
        if self.extra_vocab is not None:
            if total is None:  # a target outside the subset carries no loss but counts, as in training's totals
                total = max(float(L.valid_counts(targets, k)[k]), 1.0)
            weight, targets = self.extra_vocab.restrict(weight, targets)
        return L.linear_offset_loss(normed, weight, targets, k, total)

    def freeze_trunk(self) -> None:
        """Train only the modules: the trunk gets no gradients and runs under no-grad in `forward`."""
        self.trunk.requires_grad_(False)
        self.frozen_trunk = True

    @property
    def objective(self) -> str:
        return self.mtp_cfg.objective

    @property
    def n_extra(self) -> int:
        return len(self.mtp)

    @property
    def n_losses(self) -> int:
        """Extra predictions trained: one per module or head, or mtp.unroll recursive steps of module 1."""
        return max(self.n_extra, self.mtp_cfg.unroll) if self.n_extra else 0

    def param_counts(self) -> dict[str, int]:
        trunk = sum(p.numel() for p in self.trunk.parameters())
        mtp = sum(p.numel() for p in self.mtp.parameters())
        return {"trunk": trunk, "mtp": mtp, "total": trunk + mtp}

    # ---- forward passes -------------------------------------------------------------------
    def all_logits(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """[trunk logits (B,T,V), extra 1 logits (B,T-1,V), ..., extra D logits (B,T-D,V)]."""
        hidden, extras = self.hidden_states(idx)
        return [self.trunk.head(hidden)] + [self.extra_logits(k, h) for k, h in enumerate(extras, 1)]

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, lam: float | None = None,
                totals: list[float] | None = None, frozen: FrozenTrunk | None = None) -> Output | list[torch.Tensor]:
        """The losses (targets given; `totals`: what each loss k = 0..D divides its sum by, see
        model/loss.py), or without targets `all_logits` (so that FSDP's hooks on this root module run).
        `frozen`: this batch's `frozen_pass`, stored earlier; the trunk then runs its last layer at most."""
        if targets is None:
            return self.all_logits(idx)
        distil = self.mtp_cfg.draft_target == "trunk"
        hidden, extras = self.hidden_states(idx, frozen.shared if frozen is not None else None, need_hidden=distil,
                                            unroll=self.mtp_cfg.unroll, taps=frozen.taps if frozen is not None else None)
        weight = self.trunk.unembed_weight
        totals = totals or [None] * (len(extras) + 1)
        loss_main = (frozen.loss_main if frozen is not None
                     else L.linear_cross_entropy(self.trunk.norm(hidden), weight, targets, totals[0]))
        with torch.no_grad():
            teacher = self.trunk.norm(hidden) if distil else None
        loss_extra = [self.extra_loss(k, self.extra_normed(k, h), targets, totals[k], teacher)
                      for k, h in enumerate(extras, 1)]
        lam = self.mtp_cfg.lambda_at() if lam is None else lam
        return Output(L.combine(loss_main, loss_extra, lam), loss_main, loss_extra)

    def frozen_pass(self, idx: torch.Tensor, targets: torch.Tensor, total: float | None = None,
                    dtype: torch.dtype | None = None) -> FrozenTrunk:
        """A frozen trunk's contribution to one batch (`total`: the next-token loss's division, as
        `forward`'s totals[0]); computed exactly as `forward` computes it, or with `dtype` (bf16) under
        autocast, its shared state rounded to that dtype (what a cache stores) and returned in fp32."""
        if not self.frozen_trunk:
            raise ValueError("frozen_pass needs a frozen trunk: a trained one changes every step")
        trunk = self.trunk
        with torch.no_grad(), torch.autocast(idx.device.type, dtype=dtype, enabled=dtype is not None):
            x = trunk.embed_tokens(idx)
            rope = trunk.rope(idx.shape[1], idx.device, x.dtype)
            hidden, shared, taps = self.run_trunk(x, rope)
            loss_main = L.linear_cross_entropy(trunk.norm(hidden), trunk.unembed_weight, targets, total)
        if dtype is not None:
            shared, loss_main = shared.to(dtype).float(), loss_main.float()
            taps = None if taps is None else taps.to(dtype).float()
        return FrozenTrunk(shared, loss_main, taps)

    def run_trunk(self, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """All the trunk's layers from the embeddings x: (hidden, the last layer's input, the outputs of
        `tap_layers` concatenated, or None without fused features)."""
        trunk, outputs = self.trunk, {}
        shared = x
        for i in range(trunk.n_layers):
            shared = x
            x = trunk.run_layers(x, i, i + 1, rope)
            if i in self.tap_layers:
                outputs[i] = x
        taps = torch.cat([outputs[i] for i in self.tap_layers], -1) if self.tap_layers else None
        return x, shared, taps

    def hidden_states(self, idx: torch.Tensor, shared: torch.Tensor | None = None, need_hidden: bool = False,
                      unroll: int = 1, taps: torch.Tensor | None = None) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
        """Trunk hidden (pre-final-norm) over T positions, and each extra prediction's state over
        its valid positions (T-k), already cut to length; with `unroll` > 1 (one sequential module) its
        recursive steps 1..unroll instead (model/unroll.py). A frozen trunk runs without autograd;
        given its last layer's input (`shared`, from `frozen_pass`) it runs that layer only, and only
        for sequential modules or `need_hidden` (parallel heads otherwise return no trunk hidden: its loss
        is stored too); with fused features it then needs the stored `taps` too."""
        trunk, T = self.trunk, idx.shape[1]
        with torch.no_grad() if self.frozen_trunk else contextlib.nullcontext():
            x = trunk.embed_tokens(idx)
            rope = trunk.rope(T, idx.device, x.dtype)
            if shared is not None and self.objective == "parallel" and not need_hidden:
                hidden = None
            elif self.objective == "parallel":
                if shared is None:
                    shared = trunk.run_layers(x, 0, trunk.n_layers - 1, rope)
                hidden = trunk.run_layers(shared, trunk.n_layers - 1, trunk.n_layers, rope)
            elif shared is None and self.tap_layers:
                hidden, _, taps = self.run_trunk(x, rope)
            else:
                start = 0 if shared is None else trunk.n_layers - 1
                hidden = trunk.run_layers(x if shared is None else shared, start, trunk.n_layers, rope)
            if self.objective == "sequential":
                h = trunk.norm(hidden) if self.mtp_cfg.mtp_input == "post-norm" else hidden
        if self.tap_layers:
            if taps is None:
                raise ValueError("fused features need the stored trunk's taps beside its shared state")
            h = self.mtp[0].fuse(torch.cat([taps, h], -1))
        cos, sin = rope
        if self.objective == "parallel":
            return hidden, [head(shared, cos, sin)[:, : T - k] for k, head in enumerate(self.mtp, 1)]
        if unroll > 1:
            module = self.mtp[0]
            out_norm = module.shared_head.norm if self.mtp_cfg.mtp_input == "post-norm" else None
            return hidden, unrolled_states(module, h, x, cos, sin, unroll, out_norm)
        extras = []
        for k, module in enumerate(self.mtp, 1):
            n = T - k
            h = module(h[:, :n], x[:, k:], (cos[:n], sin[:n]))
            extras.append(h)
        return hidden, extras

    def extra_normed(self, k: int, h: torch.Tensor) -> torch.Tensor:
        """Extra prediction k's (1-based) hidden state after its final norm: the unembedding's input (beyond
        the last module, a recursive step of it)."""
        if self.objective == "parallel":
            return self.trunk.norm(h)
        return self.mtp[min(k, len(self.mtp)) - 1].shared_head.norm(h)

    def extra_logits(self, k: int, h: torch.Tensor) -> torch.Tensor:
        """Logits of extra prediction k (1-based) from its hidden state."""
        return self.trunk.unembed(self.extra_normed(k, h))


def parallel_backward(model: MTPModel, idx: torch.Tensor, targets: torch.Tensor, lam: float,
                      scale: float = 1.0, totals: list[float] | None = None) -> Output:
    """Meta's memory-efficient step: the trunk runs once; each head (head 1 = the trunk's last block)
    does forward+backward in turn, its gradient accumulated at the shared state, so only one head's
    logits are alive at once. Calls .backward() itself; returns detached losses (`totals` as in
    `MTPModel.forward`)."""
    trunk, T = model.trunk, idx.shape[1]
    x = trunk.embed_tokens(idx)
    rope = trunk.rope(T, idx.device, x.dtype)
    cos, sin = rope
    shared = trunk.run_layers(x, 0, trunk.n_layers - 1, rope)
    shared_leaf = shared.detach().requires_grad_()
    heads = [trunk.layers[trunk.n_layers - 1], *model.mtp]
    weight = L.extra_weight(lam, len(model.mtp))
    losses = []
    totals = totals or [None] * len(heads)
    for k, head in enumerate(heads):
        h = head(shared_leaf, cos, sin)
        loss_k = (L.linear_offset_loss(trunk.norm(h), trunk.unembed_weight, targets, k, totals[k]) if k == 0
                  else model.extra_loss(k, trunk.norm(h), targets, totals[k]))
        ((1.0 if k == 0 else weight) * scale * loss_k).backward()
        losses.append(loss_k.detach())
    shared.backward(shared_leaf.grad)
    total = L.combine(losses[0], losses[1:], lam)
    return Output(total, losses[0], losses[1:])
