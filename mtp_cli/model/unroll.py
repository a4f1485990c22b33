"""Training-time test (EAGLE-3 §3.3): a depth-1 module trained on its own states, as it drafts beyond depth 1.

At inference (decode/speculative.py) draft j >= 2 reruns module 1 one position further right: its input is the
module's own previous output (after the module's final norm when it reads post-norm trunk states) instead of a
trunk state, and it attends to the module's cache, which holds the states made from trunk states up to the
pending token and the chain's own earlier steps. A module trained on trunk states alone never saw such inputs,
which is why reusing it loses (Li et al. 2025; Nebius' fine-tune of DeepSeek-V3's module unrolls it too).

`unrolled_states` computes, for every anchor a (the position of the trunk state a chain starts from), the chain's
states at steps 1..K with exactly that attention: step m at anchor a sits at position a+m-1, reads step m-1's state
at a and Emb(t_{a+m}), and attends to step 1's keys at anchors <= a and to steps 2..m's keys at anchor a only
(EAGLE-3's causal-plus-diagonal mask). Step m predicts t_{a+m+1}, the token depth m predicts: its loss is prediction
k = m's (model/loss.py), against the trunk's distribution there when distilling.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mtp_cli.model.trunk import Block, apply_rope


def unrolled_states(module, h: torch.Tensor, emb: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, steps: int,
                    out_norm=None) -> list[torch.Tensor]:
    """module: an `MTPModule`; h (B, T, d): the states depth 1 reads; emb (B, T, d): Emb of the tokens; cos/sin
    over T positions; `out_norm`: applied to a step's output before the next step reads it (the module's own
    final norm for post-norm input, None for pre-norm). Returns [step 1 (B, T-1, d), ..., step K (B, T-K, d)]."""
    T = h.shape[1]
    keys: list[tuple[torch.Tensor, torch.Tensor]] = []  # each step's (k, v), its anchors in order
    states, prev = [], h
    for m in range(1, steps + 1):
        n = T - m
        if n < 1:
            break
        x = module.eh_proj(torch.cat([module.enorm(emb[:, m:m + n]), module.hnorm(prev[:, :n])], dim=-1))
        out = _block(module.block, x, cos[m - 1:m - 1 + n], sin[m - 1:m - 1 + n], keys)
        states.append(out)
        prev = out_norm(out) if out_norm is not None else out
    return states


def _block(block: Block, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
           keys: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """`Block.forward` for step len(keys) + 1: causal over step 1's keys, diagonal over the later steps' and its
    own. Appends this step's (k, v) to `keys`."""
    attn, (B, n, _) = block.self_attn, x.shape
    normed = block.input_layernorm(x)
    q = apply_rope(attn.q_proj(normed).view(B, n, attn.n_heads, attn.head_dim), cos, sin).transpose(1, 2)
    k = apply_rope(attn.k_proj(normed).view(B, n, attn.kv_heads, attn.head_dim), cos, sin).transpose(1, 2)
    v = attn.v_proj(normed).view(B, n, attn.kv_heads, attn.head_dim).transpose(1, 2)
    keys.append((k, v))
    group = attn.n_heads // attn.kv_heads
    k1, v1 = (t[:, :, :n].repeat_interleave(group, dim=1) for t in keys[0])
    scale = 1.0 / math.sqrt(attn.head_dim)
    causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
    scores = [(q @ k1.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))]
    diagonal = [(kj[:, :, :n].repeat_interleave(group, dim=1), vj[:, :, :n].repeat_interleave(group, dim=1))
                for kj, vj in keys[1:]]
    scores += [(q * kj).sum(-1, keepdim=True) * scale for kj, _ in diagonal]
    probs = F.softmax(torch.cat(scores, dim=-1).float(), dim=-1).to(q.dtype)
    out = probs[..., :n] @ v1
    for i, (_, vj) in enumerate(diagonal):
        out = out + probs[..., n + i:n + i + 1] * vj
    x = x + attn.o_proj(out.transpose(1, 2).reshape(B, n, -1))
    return x + block.mlp(block.post_attention_layernorm(x))
