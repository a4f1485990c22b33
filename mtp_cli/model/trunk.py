"""The Llama-style decoder trunk: RMSNorm, rotate-half RoPE, SwiGLU, optional GQA.

Parameter names and layouts mirror Hugging Face `LlamaForCausalLM` (q/k/v/o_proj, gate/up/down_proj,
input_layernorm, post_attention_layernorm, norm, lm_head) so that export is a renaming. For pretrained
checkpoints (`model/pretrained.py`) the q/k/v projections may carry biases (Qwen2) and RoPE may be
scaled (linear, llama3). `Block` is
the one transformer block class: trunk layers, DeepSeek-V3 MTP modules and Meta's parallel heads
are all built from it.

These modules are the training (and full-sequence scoring) path; decoding with a KV cache runs on
`mtp_cli.decode.engine`, which reads the same parameters.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mtp_cli.config.recipe import ModelConfig


def wide_linear(x: torch.Tensor, weight: torch.Tensor, owner: nn.Module) -> torch.Tensor:
    """`F.linear(x, weight)`, but for a weight with more outputs than inputs (gate/up projections,
    the unembedding) used on CPU without autograd — decoding — it multiplies by a cached contiguous
    transpose instead: MKL reads that layout about twice as fast when only a few rows are decoded at
    once (and equally fast for many). The copy lives on `owner` (not in its state dict) and is
    rebuilt whenever the weight changes (optimizer step, load, move)."""
    if torch.is_grad_enabled() or weight.device.type != "cpu" or weight.shape[0] <= weight.shape[1]:
        return F.linear(x, weight)
    key = (weight.data_ptr(), weight._version)
    cached = owner.__dict__.get("_wide_t")
    if cached is None or cached[0] != key:
        cached = (key, weight.detach().t().contiguous())
        owner.__dict__["_wide_t"] = cached
    return torch.matmul(x, cached[1])


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == self.weight.dtype == torch.float32:  # same result, bit for bit, in fewer ops
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> torch.Tensor:
    """RoPE inverse frequencies as Hugging Face computes them for `rope_type` default, linear and
    llama3 (Llama 3.1's wavelength-dependent scaling); tests compare them with transformers' own."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    scaling = scaling or {}
    rope_type = scaling.get("rope_type", "default")
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_context = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_context / high) * ~(wavelen > old_context / low)
        return torch.where(medium, smoothed, scaled)
    if rope_type != "default":
        raise ValueError(f"unsupported rope_type {rope_type!r}")
    return inv_freq


class Rotary(nn.Module):
    """cos/sin tables for rotate-half RoPE (the Hugging Face Llama convention)."""

    def __init__(self, head_dim: int, max_len: int, theta: float, scaling: dict | None = None):
        super().__init__()
        inv_freq = rope_inv_freq(head_dim, theta, scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._build(max_len)

    def _build(self, max_len: int) -> None:
        t = torch.arange(max_len, dtype=torch.float, device=self.inv_freq.device)
        freqs = torch.outer(t, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: (T,) shared by all rows, or (B, T). Returns cos, sin broadcastable to (B, T, H, D)."""
        needed = int(positions.max()) + 1
        if needed > self.cos.shape[0]:
            self._build(max(needed, 2 * self.cos.shape[0]))
        cos, sin = self.cos[positions].to(dtype), self.sin[positions].to(dtype)
        return cos.unsqueeze(-2), sin.unsqueeze(-2)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = apply_rope(self.q_proj(x).view(B, T, self.n_heads, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(B, T, self.kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=True,
                                             enable_gqa=self.kv_heads != self.n_heads)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = wide_linear(x, self.gate_proj.weight, self.gate_proj)
        return self.down_proj(F.silu(gate) * wide_linear(x, self.up_proj.weight, self.up_proj))


class Block(nn.Module):
    """Pre-norm transformer block (Llama decoder layer), causal."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Trunk(nn.Module):
    """The causal LM kept at inference: embed → blocks → final norm → lm_head.

    `forward_hidden` returns the hidden state before the final norm; `head` applies the final
    norm and unembedding (the "OutHead" that MTP modules share). `split` lets parallel heads
    branch off at the input of the last block (Meta's shared trunk output).
    """

    def __init__(self, cfg: ModelConfig, n_layers: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.n_layers = cfg.n_layers if n_layers is None else n_layers
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(self.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.rotary = Rotary(cfg.head_dim, cfg.context, cfg.rope_theta, cfg.rope_scaling)

    @property
    def unembed_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def unembed(self, normed: torch.Tensor) -> torch.Tensor:
        return wide_linear(normed, self.unembed_weight, self)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.unembed(self.norm(hidden))

    def rope(self, T: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for positions 0..T-1."""
        return self.rotary(torch.arange(T, device=device), dtype)

    def run_layers(self, x: torch.Tensor, start: int, stop: int,
                   rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        cos, sin = rope
        for i in range(start, stop):
            x = self.layers[i](x, cos, sin)
        return x

    def forward_hidden(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(idx)
        return self.run_layers(x, 0, self.n_layers, self.rope(idx.shape[1], idx.device, x.dtype))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V) for next-token prediction."""
        return self.head(self.forward_hidden(idx))


def compile_blocks(module: nn.Module) -> int:
    """`torch.compile` every `Block` in place (regional compilation: one block's code is compiled and
    reused by all, parameter names unchanged). The rest — embedding, rotary tables, the chunked
    loss — stays eager. Returns the number of blocks compiled."""
    blocks = [m for m in module.modules() if isinstance(m, Block)]
    for block in blocks:
        block.compile()
    return len(blocks)


def init_weights(module: nn.Module, std: float, zero_residual: bool = False) -> None:
    """GPT-style init: normal(0, std) for linears/embeddings, ones for norms. With `zero_residual`,
    each block's residual-branch outputs (o_proj, down_proj) start at zero, so every block starts as
    the identity (as nanochat does): at the quick recipe's scale this leaves the unigram plateau
    much sooner (train loss 5.76 vs 6.32 over steps 31-50)."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, RMSNorm):
            nn.init.ones_(m.weight)
    if zero_residual:
        for m in module.modules():
            if isinstance(m, Block):
                nn.init.zeros_(m.self_attn.o_proj.weight)
                nn.init.zeros_(m.mlp.down_proj.weight)
