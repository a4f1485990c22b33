"""The decode engine: the trunk's (and the MTP modules') forward for decoding, with few, lean calls.

Training runs the `nn.Module`s; decoding runs this. At build time the weights are laid out once for
small-batch products — q/k/v concatenated into one matrix, gate/up into one, every wide matrix
transposed contiguous (MKL reads that layout faster for a few rows), each RMSNorm's weight folded
into the product that reads its output — from the same parameters (the training modules are
untouched; the engine is rebuilt when a parameter changes). A forward is then about a dozen tensor
calls per layer: the norm's scale, one QKV product, RoPE as `x·cos + roll(x)·sin±`, two in-place
cache writes, SDPA, the output product fused with the residual (`addmm`), the norm, one gate-up
product, SiLU·up, the down product fused with the residual. Positions are explicit, so the same
code serves prefill, the 1-token step, verification at width k+1 and the MTP modules' windows.

Attention, eager: attend to the keys up to the furthest position written, with no mask for one row
and one query, SDPA's causal kernel for a fresh prefill, a view of one precomputed causal mask for a
one-row window, else an additive mask built once per forward.

Compiled (`compile=True`), four forms:
- one row on CPU (`step`): the trunk and its unembedding in one graph whose position is a symbol, so
  it attends only to the keys written and never recompiles as the sequence grows or rolls back;
- one row, greedy, speculative (`fused_step`): verification (of a chain of drafts, or of a tree of
  candidates, `tree_plan`), acceptance and the MTP modules' next draft in one graph of the same kind
  (`speculative.FusedGreedyStep`);
- several rows on CPU (`step`): one graph whose batch size, width and span of keys read are symbols,
  each row masked to its own positions (fixed-shape graphs that attend over the whole capacity
  measured slower than eager at batch size 4);
- on CUDA: every shape fixed — attend over the whole cache capacity, mask from the positions
  tensor — with `mode="reduce-overhead"` (CUDA graphs).
On CPU the weights are frozen into the graphs as constants and inductor times its own GEMM
micro-kernels against MKL per product shape (`CPU_COMPILE`): that is what keeps verifying k drafts
near the cost of one step (MKL's few-row products cost nearly a row each on some CPUs), and the graph's
kernels are called from generated C++ rather than Python (`cpp_wrapper`). Each engine
compiles its own graphs (its weights are in them); the engine is rebuilt, and recompiled, when a
parameter changes. Otherwise the MTP modules run eager: compiled the same way on its own, a module's
window ran no faster alone and slower inside the two-call speculative loop.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from mtp_cli.decode.static_cache import StaticKVCache, check_capacity
from mtp_cli.model.weight_format import int8_weight


def rms(x: Tensor, eps: Tensor) -> Tensor:
    """RMSNorm without its weight (folded into the next product): x / sqrt(mean(x²) + eps), in four calls
    (`F.rms_norm` takes about nine on CPU)."""
    n = torch.linalg.vector_norm(x, 2, -1, True)
    return x * torch.addcmul(eps, n, n, value=1 / x.shape[-1]).rsqrt_()


def _fold(norm: Tensor, weight: Tensor) -> Tensor:
    """RMSNorm's weight folded into the (in, out) matrix that reads its output: diag(norm) · W."""
    return (norm.detach()[:, None] * weight.detach().t()).contiguous()


# On CPU: the weights frozen into the graph as constants (no grad is ever on while decoding), so that
# inductor can pre-pack them and pick, per product shape, between MKL and its own AVX2/AVX-512 GEMM
# micro-kernels by timing both once (a few seconds per shape); its kernels keep a few-row product
# (verification) near the cost of one row, where MKL's cost grows with each row on some CPUs.
CPU_COMPILE = {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",  # and freezing: `Engine._timed`
               "cpp_wrapper": True,  # the graph's kernels called from C++, not Python: 7-9% off a step, ~5% off fused
               "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}  # no timing tables on stderr
ROW_WIDTH = 16  # widest one-row window the compiled CPU step takes (decode steps, verification)
CAUSAL_TABLE = 2048  # one additive causal mask, (n, n), for windows of one row up to this position
TABLE_SLACK = 64  # RoPE/mask tables reach this far past the context (cache capacity + drafts)


def _buffers(module: torch.nn.Module, **tensors: Tensor | None) -> None:
    """Register tensors as (non-persistent) buffers: a compiled forward then sees them as the module's
    constants, which inductor's freezing folds into the graph (and packs for its GEMM kernels)."""
    for name, t in tensors.items():
        module.register_buffer(name, t, persistent=False)


class BlockWeights(torch.nn.Module):
    """One `Block`'s weights in decode layout: its two norms' weights folded into the products after them;
    int8 (`model.weight_format`), each product's int8 matrix (out, in) and its scales (`s_*`), the norms
    applied as they are (folding them in would change what was quantized)."""

    def __init__(self, block):
        super().__init__()
        attn, mlp = block.self_attn, block.mlp
        self.n_heads, self.kv_heads, self.head_dim = attn.n_heads, attn.kv_heads, attn.head_dim
        self.qk_v = [(attn.n_heads + attn.kv_heads) * attn.head_dim, attn.kv_heads * attn.head_dim]  # qkv's split
        self.q_k = [attn.n_heads, attn.kv_heads]
        self.gqa = attn.n_heads != attn.kv_heads
        self.ffn = mlp.gate_proj.weight.shape[0]
        w = attn.q_proj.weight
        biased = attn.q_proj.bias is not None  # Qwen2 checkpoints: q, k and v carry biases together
        n_in, n_post = block.input_layernorm.weight.detach(), block.post_attention_layernorm.weight.detach()
        qkv, gate_up = [attn.q_proj, attn.k_proj, attn.v_proj], [mlp.gate_proj, mlp.up_proj]
        _buffers(self, eps=torch.tensor(block.input_layernorm.eps, dtype=w.dtype, device=w.device),
                 b_qkv=torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]).detach() if biased else None)
        if int8_weight(attn.q_proj) is not None:
            _buffers(self, n_in=n_in, n_post=n_post)
            _int8_buffers(self, w_qkv=qkv, w_o=[attn.o_proj], w_gate_up=gate_up, w_down=[mlp.down_proj])
        else:
            _buffers(self, n_in=None, n_post=None, s_qkv=None, s_o=None, s_gate_up=None, s_down=None,
                     w_qkv=_fold(n_in, torch.cat([m.weight for m in qkv])), w_o=attn.o_proj.weight.detach().t(),
                     w_gate_up=_fold(n_post, torch.cat([m.weight for m in gate_up])),
                     w_down=mlp.down_proj.weight.detach().t())


def _int8_buffers(module: torch.nn.Module, **products: list) -> None:
    """Each product's int8 matrix (its linear layers' rows concatenated, (out, in)) as `name` and its scales
    as `s_<name without w_>`, from `model.weight_format.use_weights(..., "int8")`."""
    for name, linears in products.items():
        parts = [int8_weight(m) for m in linears]
        _buffers(module, **{name: torch.cat([q for q, _ in parts]), "s_" + name.removeprefix("w_"):
                            torch.cat([s for _, s in parts])})


def _mm(x: Tensor, w: Tensor, scale: Tensor | None) -> Tensor:
    """x @ a decode-layout product: w (in, out), or int8 w (out, in) times its per-output scales; inductor
    lowers the int8 form to its weight-only int8 GEMM (a byte read per weight)."""
    return torch.mm(x, w) if scale is None else torch.mm(x, w.t().to(x.dtype)) * scale


def _addmm(res: Tensor, x: Tensor, w: Tensor, scale: Tensor | None) -> Tensor:
    return torch.addmm(res, x, w) if scale is None else res + _mm(x, w, scale)


def _normed(x: Tensor, eps: Tensor, weight: Tensor | None) -> Tensor:
    """RMSNorm; its weight applied here only where it is not folded into the next product."""
    return rms(x, eps) if weight is None else rms(x, eps) * weight


class SequentialWeights(torch.nn.Module):
    """One DeepSeek-V3 MTP module: the fusing projection (enorm and hnorm folded in, or applied before an
    int8 projection), its block, and the shared unembedding with the module's own output norm folded in."""

    def __init__(self, module, unembed: Tensor):
        super().__init__()
        out_norm = module.shared_head.norm.weight.detach()
        norms = torch.cat([module.enorm.weight, module.hnorm.weight]).detach()
        _buffers(self, eps=torch.tensor(module.enorm.eps, dtype=unembed.dtype, device=unembed.device),
                 out_norm=out_norm, unembed=_fold(out_norm, unembed))
        if int8_weight(module.eh_proj) is not None:
            _buffers(self, n_eh=norms)
            _int8_buffers(self, w_eh=[module.eh_proj])
        else:
            _buffers(self, n_eh=None, s_eh=None, w_eh=_fold(norms, module.eh_proj.weight))
        self.block = BlockWeights(module.block)
        fuse = getattr(module, "fuse", None)  # fused features (depth 1): (3d -> d) over [low; mid; last]
        if fuse is not None and int8_weight(fuse) is not None:
            _int8_buffers(self, w_fuse=[fuse])
        else:
            _buffers(self, s_fuse=None, w_fuse=None if fuse is None else fuse.weight.detach().t().contiguous())


@dataclass
class Plan:
    """How one forward reads and writes the cache; shared by all its layers."""
    batch: int
    width: int  # query tokens per row
    positions: Tensor  # (B, T)
    cos: Tensor  # (B*T, 1, D)
    sin: Tensor  # (B*T, 1, D), sign-folded for roll
    rows: Tensor  # (B, 1)
    start: int | None  # one row at consecutive positions: a slice write at start
    span: int  # keys 0..span-1 are read
    mask: Tensor | None  # additive (B, 1, T, span)
    causal: bool  # SDPA's own causal mask (a fresh prefill of one row)


def _rope(x: Tensor, plan: Plan) -> Tensor:
    """Rotate-half RoPE on (N, heads, D): x·cos + rotate_half(x)·sin, rotate_half as a roll against a
    sin table whose first half is negated."""
    return torch.addcmul(x * plan.cos, x.roll(x.shape[-1] // 2, -1), plan.sin)


def block_forward(w: BlockWeights, x: Tensor, plan: Plan, k_store: Tensor, v_store: Tensor) -> Tensor:
    """One Llama block on x (B*T, d), writing its keys/values at the plan's positions."""
    B, T, H, Hkv, D = plan.batch, plan.width, w.n_heads, w.kv_heads, w.head_dim
    h = _normed(x, w.eps, w.n_in)
    qkv = _mm(h, w.w_qkv, w.s_qkv) if w.b_qkv is None else _addmm(w.b_qkv, h, w.w_qkv, w.s_qkv)
    qk, v = qkv.split(w.qk_v, 1)
    q, k = _rope(qk.view(B * T, H + Hkv, D), plan).view(B, T, H + Hkv, D).split(w.q_k, 2)
    v = v.view(B, T, Hkv, D)
    s = plan.start
    if s is not None:
        k_store[:, :, s:s + T] = k.transpose(1, 2)
        v_store[:, :, s:s + T] = v.transpose(1, 2)
    else:
        k_store.transpose(1, 2)[plan.rows, plan.positions] = k
        v_store.transpose(1, 2)[plan.rows, plan.positions] = v
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k_store[:, :, :plan.span], v_store[:, :, :plan.span],
                                         attn_mask=plan.mask, is_causal=plan.causal, enable_gqa=w.gqa)
    x = _addmm(x, out.transpose(1, 2).reshape(B * T, H * D), w.w_o, w.s_o)
    gate, up = _mm(_normed(x, w.eps, w.n_post), w.w_gate_up, w.s_gate_up).split(w.ffn, 1)
    return _addmm(x, F.silu(gate).mul_(up), w.w_down, w.s_down)


def _param_key(module) -> tuple:
    return tuple((p.data_ptr(), p._version) for p in module.parameters())


class Engine(torch.nn.Module):
    """Decode-layout weights of a trunk (and of an MTP model's modules, if given) as buffers, the RoPE
    tables, and the forwards. `compile=True` compiles the trunk's step and verification (see the module
    docstring); prefill and the drafters run eager. Not a training module: nothing here has gradients."""

    def __init__(self, trunk, model=None, compile: bool = False):
        super().__init__()
        self.__dict__["trunk"] = trunk  # read for its RoPE tables; not a submodule (its weights stay out)
        self.cfg = trunk.cfg
        w = trunk.embed_tokens.weight
        self.device, self.dtype = w.device, w.dtype
        norm = trunk.norm.weight.detach()
        _buffers(self, embed=w.detach(), norm=norm, eps=torch.tensor(trunk.norm.eps, dtype=self.dtype, device=self.device),
                 unembed=_fold(norm, trunk.unembed_weight))
        self.blocks = torch.nn.ModuleList(BlockWeights(b) for b in trunk.layers)
        sequential = model is not None and model.objective == "sequential"
        parallel = model is not None and model.objective == "parallel"
        self.sequential = torch.nn.ModuleList(SequentialWeights(m, trunk.unembed_weight) for m in model.mtp) \
            if sequential else torch.nn.ModuleList()
        self.heads = torch.nn.ModuleList(BlockWeights(b) for b in model.mtp) if parallel else torch.nn.ModuleList()
        self.tap_layers = tuple(model.tap_layers) if sequential else ()  # fused features read these layers' outputs
        self._tables(trunk.cfg.context + TABLE_SLACK)  # room for the drafters' caches, so compiled graphs see one size
        self._draft_unembeds: dict[tuple, Tensor] = {}
        self.static = compile and self.device.type == "cuda"  # batches run one fixed-shape graph per shape
        self.compile_s = 0.0  # wall time of the compiled forward's calls that compiled a new graph
        self._static = self.compiled_row_step = self.compiled_batch_step = None
        self.fused_steps: dict[tuple, tuple] = {}  # verification fused with drafting: key -> (module, compiled or None)
        if self.static:
            self._static = torch.compile(self.forward_static, dynamic=False, mode="reduce-overhead")
        elif compile:  # symbolic positions and spans: no capacity-wide attention, no recompiling as rows grow
            self.__dict__["compiled_row_step"] = torch.compile(_RowStep(self), dynamic=True, options=CPU_COMPILE)
            self.__dict__["compiled_batch_step"] = torch.compile(_BatchStep(self), dynamic=True, options=CPU_COMPILE)

    # ---- tables and plans ------------------------------------------------------------------------
    def _tables(self, length: int) -> None:
        self.trunk.rotary(torch.tensor([length - 1], device=self.device), self.dtype)  # extends if needed
        self.cos = self.trunk.rotary.cos[:length].to(self.dtype)
        sin = self.trunk.rotary.sin[:length].to(self.dtype).clone()
        sin[:, : sin.shape[1] // 2] *= -1
        self.sin = sin
        self.key_index = torch.arange(length, device=self.device)
        n = min(length, CAUSAL_TABLE)
        self.causal_mask = torch.full((n, n), float("-inf"), dtype=self.dtype, device=self.device).triu_(1)

    def new_cache(self, batch: int, capacity: int, n_layers: int | None = None) -> StaticKVCache:
        if capacity > self.cos.shape[0]:
            self._tables(capacity)
        return StaticKVCache(self.trunk.n_layers if n_layers is None else n_layers, batch, capacity,
                             self.cfg.kv_heads, self.cfg.head_dim, self.device, self.dtype)

    def plan(self, positions: Tensor, capacity: int, static: bool = False) -> Plan:
        if static:
            return self.batch_plan(positions, capacity)
        B, T = positions.shape
        rows = torch.arange(B, device=positions.device)[:, None]
        lo, hi = (int(t) for t in positions.aminmax())
        check_capacity(hi, capacity)
        start = lo if B == 1 and hi - lo == T - 1 else None
        if start is not None:
            cos, sin = self.cos[lo:hi + 1], self.sin[lo:hi + 1]
        else:
            cos, sin = self.cos[positions], self.sin[positions]
        mask, causal = None, False
        if start == 0 and T > 1:
            causal = True
        elif start is not None and T > 1 and hi < self.causal_mask.shape[0]:
            mask = self.causal_mask[lo:hi + 1, : hi + 1]  # a view: no mask is built per forward
        elif T > 1 or B > 1:
            mask = self._position_mask(positions, hi + 1)
        return Plan(B, T, positions, cos.reshape(B * T, 1, -1), sin.reshape(B * T, 1, -1), rows, start, hi + 1, mask, causal)

    def batch_plan(self, positions: Tensor, span: int) -> Plan:
        """Rows at their own positions (B, T), reading keys 0..span-1, each masked to its own positions;
        from tensors and `span` only (no host sync), for the fixed-shape and the compiled batched forwards."""
        B, T = positions.shape
        rows = torch.arange(B, device=positions.device)[:, None]
        return Plan(B, T, positions, self.cos[positions].view(B * T, 1, -1), self.sin[positions].view(B * T, 1, -1),
                    rows, None, span, self._position_mask(positions, span), False)

    def _position_mask(self, positions: Tensor, span: int) -> Tensor:
        """Additive (B, 1, T, span): -inf on the keys past each query's position."""
        hidden = self.key_index[:span][None, None, None, :] > positions[:, None, :, None]
        return torch.zeros(hidden.shape, dtype=self.dtype, device=positions.device).masked_fill_(hidden, float("-inf"))

    def row_plan(self, start: int, width: int) -> Plan:
        """One row at positions start..start+width-1, from Python ints only (no host sync), so that a
        compiled forward traces `start` as a symbol: one graph serves every position."""
        positions = self.key_index[start:start + width][None]
        mask = None if width == 1 else self.key_index[: start + width] <= positions[0, :, None]  # (T, span): attend
        return Plan(1, width, positions, self.cos[start:start + width].view(width, 1, -1),
                    self.sin[start:start + width].view(width, 1, -1), None, start, start + width, mask, False)

    def tree_plan(self, start: int, width: int, depth: Tensor) -> Plan:
        """One row: the pending token at `start` and `width` candidates for the position after it, written to
        slots start+1..start+width but rotated as position start+1 (`depth`: [0, 1, ..., 1]), each attending
        to the keys up to `start` and to its own (a depth-1 token tree, as in Medusa's and EAGLE's tree
        attention). From Python ints and tensors only, like `row_plan`."""
        T = width + 1
        slots, keys = self.key_index[start:start + T], self.key_index[: start + T]
        mask = (keys[None, :] <= start) | (keys[None, :] == slots[:, None])
        cos = self.cos[start:start + 2].index_select(0, depth).view(T, 1, -1)
        sin = self.sin[start:start + 2].index_select(0, depth).view(T, 1, -1)
        return Plan(1, T, slots[None], cos, sin, None, start, start + T, mask, False)

    # ---- the trunk -------------------------------------------------------------------------------
    def run_trunk(self, tokens: Tensor, plan: Plan, cache: StaticKVCache) -> tuple[Tensor, Tensor]:
        """(hidden before the final norm (B, T, d), the input of the last layer (B, T, d), or for a model with
        fused features the outputs of its `tap_layers` (B, T, 2d), what its depth 1 reads beside hidden)."""
        B, T = tokens.shape
        x = F.embedding(tokens, self.embed).view(B * T, -1)
        shared, taps = x, {}
        for i, w in enumerate(self.blocks):
            shared = x
            x = block_forward(w, x, plan, cache.k[i], cache.v[i])
            if i in self.tap_layers:
                taps[i] = x
        if self.tap_layers:
            shared = torch.cat([taps[i] for i in self.tap_layers], -1)
        return x.view(B, T, -1), shared.view(B, T, -1)

    def forward_static(self, tokens: Tensor, positions: Tensor, k_stores: list[Tensor],
                       v_stores: list[Tensor]) -> tuple[Tensor, Tensor]:
        """The fixed-shape forward `torch.compile` traces: the cache is passed in, attended in full."""
        capacity = k_stores[0].shape[2]
        plan = self.plan(positions, capacity, static=True)
        return self.run_trunk(tokens, plan, Stores(k_stores, v_stores))

    def row_step(self, tokens: Tensor, k_stores: list[Tensor], v_stores: list[Tensor],
                 start: int) -> tuple[Tensor, Tensor, Tensor]:
        """`step` for one row at positions start.. (CPU, compiled: the unembedding inside the graph
        measured a third of a step cheaper than after it)."""
        hidden, shared = self.run_trunk(tokens, self.row_plan(start, tokens.shape[1]), Stores(k_stores, v_stores))
        return self.head(hidden), hidden, shared

    def batch_step(self, tokens: Tensor, positions: Tensor, k_stores: list[Tensor], v_stores: list[Tensor],
                   span: int) -> tuple[Tensor, Tensor, Tensor]:
        """`step` for several rows at their own positions (CPU, compiled), reading keys 0..span-1."""
        hidden, shared = self.run_trunk(tokens, self.batch_plan(positions, span), Stores(k_stores, v_stores))
        return self.head(hidden), hidden, shared

    def step(self, tokens: Tensor, cache: StaticKVCache) -> tuple[Tensor, Tensor, Tensor]:
        """`forward` and the logits of every position: (logits (B, T, V), hidden, last layer's input)."""
        T = tokens.shape[1]
        out = None
        if self.compiled_row_step is not None and cache.batch == 1:
            start = int(cache.lengths[0])
            if _row_window(start, T):
                cache.check(start + T - 1)
                out = self._timed(self.compiled_row_step, tokens, cache.k, cache.v, start)
        elif self.compiled_batch_step is not None:
            positions = cache.positions(T)
            lo, hi = (int(t) for t in positions.aminmax())
            if _row_window(lo, T):
                cache.check(hi)
                out = self._timed(self.compiled_batch_step, tokens, positions, cache.k, cache.v, hi + 1)
        if out is not None:
            cache.advance(T)
            return out
        hidden, shared = self.forward(tokens, cache)
        return self.head(hidden), hidden, shared

    def forward(self, tokens: Tensor, cache: StaticKVCache, static: bool | None = None) -> tuple[Tensor, Tensor]:
        """Feed tokens (B, T) at each row's next positions and advance the cache; returns
        (hidden (B, T, d), last layer's input (B, T, d)). `static` (default: `self.static`) runs the
        fixed-shape forward, compiled when the engine is (one row on CPU: see `step`)."""
        T = tokens.shape[1]
        static = self.static if static is None else static
        positions = cache.positions(T)
        if static:
            cache.check(int(cache.lengths.max()) + T - 1)
            out = self._run_static(tokens, positions, cache)
        else:
            out = self.run_trunk(tokens, self.plan(positions, cache.capacity), cache)
        cache.advance(T)
        return out

    def _run_static(self, tokens: Tensor, positions: Tensor, cache: StaticKVCache) -> tuple[Tensor, Tensor]:
        if self._static is None:
            return self.forward_static(tokens, positions, cache.k, cache.v)
        return self._timed(self._static, tokens, positions, cache.k, cache.v)

    def _timed(self, compiled, *args):
        """Call a compiled forward; the calls that built a graph add their wall time to `compile_s`.
        On CPU the weights are frozen into the graphs it builds (`CPU_COMPILE`): dynamo reads that flag
        from the global config while it traces, so it is set for this call only (a training model's
        compiled blocks, run under no_grad for validation, must not freeze their changing weights)."""
        graphs = compiled_graphs()
        t0 = time.perf_counter()
        if self.static:  # CUDA graphs: no freezing
            out = compiled(*args)
        else:
            from torch._inductor import config  # compiling only

            config.freezing = True
            try:
                with warnings.catch_warnings():  # inductor's GEMM autotuning reads storages the deprecated way
                    warnings.filterwarnings("ignore", message="TypedStorage is deprecated")
                    out = compiled(*args)
            finally:
                config.freezing = False
        if compiled_graphs() != graphs:
            self.compile_s += time.perf_counter() - t0
        return out

    def head_norm(self, hidden: Tensor, norm: Tensor | None = None) -> Tensor:
        """The final RMSNorm (the trunk's, or a module's own)."""
        return rms(hidden, self.eps) * (self.norm if norm is None else norm)

    def draft_unembed(self, unembed: Tensor, vocab: Tensor | None) -> Tensor:
        """An unembedding's columns for a draft vocabulary (decode/draft_vocab.py), made once per vocabulary."""
        if vocab is None:
            return unembed
        key = (unembed.data_ptr(), vocab.cpu().numpy().tobytes())
        if key not in self._draft_unembeds:
            self._draft_unembeds[key] = unembed.index_select(1, vocab.to(unembed.device)).contiguous()
        return self._draft_unembeds[key]

    def head(self, hidden: Tensor, unembed: Tensor | None = None) -> Tensor:
        """Logits from hidden states before the final norm; `unembed` a module's own (its norm folded in)."""
        return torch.matmul(rms(hidden, self.eps), self.unembed if unembed is None else unembed)

    # ---- the MTP modules -------------------------------------------------------------------------
    def depth_one_input(self, hidden: Tensor, shared: Tensor, post_norm: bool) -> Tensor:
        """What sequential depth 1 reads from the trunk's states (B, W, d) and the forward's second output: its
        final-normed or raw last state, fused with the tapped layers' outputs when the module has fused features."""
        h = self.head_norm(hidden) if post_norm else hidden
        m = self.sequential[0]
        if m.w_fuse is None:
            return h
        B, W, d = h.shape
        return _mm(torch.cat([shared, h], -1).view(B * W, -1), m.w_fuse, m.s_fuse).view(B, W, d)

    def sequential_module(self, d: int, h_prev: Tensor, tokens: Tensor, positions: Tensor, cache: StaticKVCache,
                          unembed: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """DeepSeek-V3 depth d (1-based) at explicit positions (B, W): h_prev (B, W, d), x_{j+d} tokens.
        Returns (its output (B, W, d), with `unembed` the logits at the window's last column (B, V'))."""
        return self._module_forward(d - 1, h_prev, tokens, positions, cache, unembed)

    def parallel_head(self, j: int, shared: Tensor, positions: Tensor, cache: StaticKVCache,
                      unembed: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Meta head j+2 (j 0-based over the extra heads) on the shared state (B, W, d) at positions (B, W);
        returns as `sequential_module`."""
        return self._module_forward(j, shared, None, positions, cache, unembed)

    def _module_forward(self, i: int, x: Tensor, tokens: Tensor | None, positions: Tensor, cache: StaticKVCache,
                        unembed: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Module i: sequential when `tokens` are given, else a parallel head."""
        h = self.module_window(i, x, tokens, self.plan(positions, cache.capacity), cache.k[0], cache.v[0])
        return h, None if unembed is None else self.head(h[:, -1], unembed)

    def module_window(self, i: int, x: Tensor, tokens: Tensor | None, plan: Plan, k_store: Tensor,
                      v_store: Tensor) -> Tensor:
        """Module i's output (B, W, d) over the plan's positions: sequential (x the previous depth's states,
        `tokens` the inputs x_{j+d}) when tokens are given, else parallel head i on the shared state x."""
        B, W, _ = x.shape
        if tokens is None:
            return block_forward(self.heads[i], x.reshape(B * W, -1), plan, k_store, v_store).view(B, W, -1)
        m = self.sequential[i]
        emb = F.embedding(tokens, self.embed).view(B * W, -1)
        fused = torch.cat([rms(emb, m.eps), rms(x.reshape(B * W, -1), m.eps)], -1)
        fused = fused if m.n_eh is None else fused * m.n_eh  # int8: the norms' weights, not folded in
        return block_forward(m.block, _mm(fused, m.w_eh, m.s_eh), plan, k_store, v_store).view(B, W, -1)

    # ---- verification fused with the next draft ---------------------------------------------------
    def fused_step(self, key: tuple, build, tokens: Tensor, cache: StaticKVCache,
                   module_caches: list[StaticKVCache]) -> tuple[Tensor, ...]:
        """Run a one-row step module (`speculative.FusedGreedyStep`, made by `build()` once per `key` and
        engine) over tokens (1, T) at the cache's length, compiled when the engine is; the caller sets the
        cache's new length."""
        if tokens.shape[0] != 1 or cache.batch != 1:
            raise ValueError(f"a fused step serves one row, got tokens {tuple(tokens.shape)} on a cache of "
                             f"{cache.batch} rows")
        if key not in self.fused_steps:
            step = build()
            self.fused_steps[key] = (step, torch.compile(step, dynamic=True, options=CPU_COMPILE)
                                if self.compiled_row_step is not None else None)
        step, compiled = self.fused_steps[key]
        start, T = int(cache.lengths[0]), tokens.shape[1]
        cache.check(start + T - 1)
        for c in module_caches:
            c.check(start + T - 1)
        args = (tokens, cache.k, cache.v, [c.k[0] for c in module_caches], [c.v[0] for c in module_caches], start)
        if compiled is None or not _row_window(start, T):
            return step(*args)
        return self._timed(compiled, *args)


def _row_window(start: int, width: int) -> bool:
    """Whether a window runs compiled: a decode step or verification, after position 0 (which
    torch.compile would specialise on) and no wider than `ROW_WIDTH` (wider windows are prefills, one
    per call: they run eager and compile nothing). `start`: a batch's smallest position."""
    return 0 < start and width <= ROW_WIDTH


class _RowStep(torch.nn.Module):
    """`Engine.row_step` as a module's forward, for `torch.compile`: compiled so, the engine's buffers
    are the module's own, which inductor's freezing takes as constants (a compiled bound method gets
    them as inputs). Not registered on the engine (it holds the engine, not the other way round)."""

    def __init__(self, engine: Engine):
        super().__init__()
        self.engine = engine

    def forward(self, *args):
        return self.engine.row_step(*args)


class _BatchStep(torch.nn.Module):
    """`Engine.batch_step` as a module's forward, for `torch.compile` (see `_RowStep`). A class of its own, not
    `_RowStep` with a method name: dynamo caps graphs per code object, so each form keeps its own cache."""

    def __init__(self, engine: Engine):
        super().__init__()
        self.engine = engine

    def forward(self, *args):
        return self.engine.batch_step(*args)


class Stores:
    """Per-layer key and value stores passed into a compiled forward, in a cache's shape (`.k`, `.v`)."""

    def __init__(self, k: list[Tensor], v: list[Tensor]):
        self.k, self.v = k, v


CPU_COMPILE_PAYS_AT = 16_384  # decoded tokens planned, above which compiling on CPU pays (see default_compile)


def default_compile(device: torch.device | str, decode_tokens: int | None = None) -> bool:
    """`--compile`'s default. CUDA: always (CUDA graphs remove the per-call launch cost). CPU: only when the
    work plans at least `CPU_COMPILE_PAYS_AT` decoded tokens. Compiling costs about 50 s per decoder (greedy,
    MTP) and saves about 20 ms a token on SmolLM2-135M (eager 41 ms, compiled 18 ms: docs/decoding.md), so
    it breaks even near 5,000 tokens; both the compile time and the saving grow with the layers traced, so
    the break-even hardly moves with the model's size, and the threshold keeps a 3x margin over it.
    `decode_tokens=None` (one generation, a quick evaluation): not compiled on CPU."""
    if torch.device(device).type == "cuda":
        return True
    return decode_tokens is not None and decode_tokens >= CPU_COMPILE_PAYS_AT


def compiled_graphs() -> int:
    """Graphs torch.compile has built in this process (a recompilation adds one)."""
    from torch._dynamo.utils import counters  # imported at first use: dynamo is slow to import

    return counters["stats"]["unique_graphs"]


def engine_for(trunk, model=None, compile: bool | None = False) -> Engine:
    """The trunk's engine, built once and rebuilt when any parameter changed (training, loading).
    `compile=None`: `default_compile` for the trunk's device."""
    if compile is None:
        compile = default_compile(trunk.embed_tokens.weight.device)
    owner = model if model is not None else trunk
    key = _param_key(owner)
    engines = owner.__dict__.setdefault("_decode_engines", {})  # compiled or not -> (key, engine)
    cached = engines.get(compile)
    if cached is None or cached[0] != key:
        cached = engines[compile] = (key, Engine(trunk, model, compile))
    return cached[1]
