"""Guards the model: causality of the trunk, of every sequential depth and every parallel head (both
trunk-state inputs); discardability (the trunk's logits do not depend on the MTP modules); the MTP loss
reaching the trunk; Meta's memory-efficient backward equal to the naive one; parameter counts
(compute-matched parallel heads); GQA. (KV-cache decoding equal to the full forward: test_engine.py.)
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import tiny_model_config

from mtp_cli.base.errors import UserError
from mtp_cli.config.recipe import MTPConfig
from mtp_cli.model import Block, MTPModel, Trunk, parallel_backward
from mtp_cli.model import trunk as trunk_mod

pytestmark = pytest.mark.usefixtures("single_thread")

VOCAB = 96  # distinct from d_model (32) and ffn_hidden (64), so shapes tell them apart


def small_cfg(**kw):
    base = dict(vocab_size=VOCAB, n_layers=3, d_model=32, n_heads=4, ffn_hidden=64, context=32, init_std=0.2)
    base.update(kw)
    return tiny_model_config(**base)


def build(mtp: MTPConfig, seed: int = 0, **cfg_kw) -> MTPModel:
    torch.manual_seed(seed)
    return MTPModel(small_cfg(**cfg_kw), mtp).eval()


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def tokens(B: int = 2, T: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


# ---- causality -----------------------------------------------------------------------------------

MODELS = {
    "ntp": MTPConfig(objective="ntp"),
    "sequential-post-norm": MTPConfig(objective="sequential", depth=3, mtp_input="post-norm"),
    "sequential-pre-norm": MTPConfig(objective="sequential", depth=3, mtp_input="pre-norm"),
    "parallel-matched": MTPConfig(objective="parallel", heads=3),
    "parallel-unmatched": MTPConfig(objective="parallel", heads=3, compute_matched=False),
}


def lookahead(model: MTPModel, k: int) -> int:
    """How far past position i output k may look: sequential depth k fuses Emb(t_{i+k}) by design;
    the trunk and every parallel head see only t_1..t_i."""
    return k if model.objective == "sequential" else 0


def causality_violations(model: MTPModel, idx: torch.Tensor, j: int) -> list[str]:
    """Change token j; report every hidden state / logit at a position it must not reach that moved,
    and every output where it must show up (position j - lookahead) that did not move."""
    changed = idx.clone()
    changed[:, j] = (idx[:, j] + 1 + torch.arange(idx.shape[0])) % VOCAB
    problems = []
    with torch.no_grad():
        runs = []
        for ids in (idx, changed):
            hidden, extras = model.hidden_states(ids)
            runs.append(([hidden, *extras], model.all_logits(ids)))
    for what, index in (("hidden", 0), ("logits", 1)):
        for k, (a, b) in enumerate(zip(runs[0][index], runs[1][index])):
            first = j - lookahead(model, k)  # first position allowed to see token j
            if first > 0 and not torch.allclose(a[:, :first], b[:, :first], rtol=0, atol=1e-6):
                problems.append(f"{what} {k}: positions < {first} changed when token {j} changed")
            if 0 <= first < a.shape[1] and torch.allclose(a[:, first], b[:, first], rtol=0, atol=1e-6):
                problems.append(f"{what} {k}: position {first} did not see token {j}")
    return problems


@pytest.mark.parametrize("name", MODELS)
def test_changing_token_j_changes_nothing_before_j(name):
    model = build(MODELS[name])
    idx = tokens()
    for j in (0, 1, 5, 9, 15):
        assert causality_violations(model, idx, j) == []


def test_causality_with_gqa_and_untied_embeddings():
    model = build(MTPConfig(objective="sequential", depth=2), n_kv_heads=2, tie_embeddings=False)
    idx = tokens()
    for j in (2, 8, 15):
        assert causality_violations(model, idx, j) == []


def test_causality_check_catches_an_unmasked_block(monkeypatch):
    """The check above can fail: an MTP block with an unmasked (encoder) attention leaks the future."""
    model = build(MODELS["sequential-post-norm"])
    sdpa = torch.nn.functional.scaled_dot_product_attention
    module_attn = {id(m.block.self_attn) for m in model.mtp}
    original = trunk_mod.Attention.forward

    def leaky_forward(self, x, cos, sin):
        if id(self) not in module_attn:
            return original(self, x, cos, sin)
        monkeypatch.setattr(trunk_mod.F, "scaled_dot_product_attention",
                            lambda q, k, v, **kw: sdpa(q, k, v, enable_gqa=kw.get("enable_gqa", False)))
        try:
            return original(self, x, cos, sin)
        finally:
            monkeypatch.setattr(trunk_mod.F, "scaled_dot_product_attention", sdpa)

    monkeypatch.setattr(trunk_mod.Attention, "forward", leaky_forward)
    problems = causality_violations(model, tokens(), 9)
    assert problems and all(p.startswith(("hidden 1", "hidden 2", "hidden 3", "logits 1", "logits 2", "logits 3"))
                            for p in problems)


# ---- discardability ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["sequential-post-norm", "sequential-pre-norm", "parallel-matched",
                                  "parallel-unmatched"])
def test_trunk_logits_identical_without_mtp_modules(name):
    model = build(MODELS[name])
    idx = tokens()
    with torch.no_grad():
        with_modules = model.all_logits(idx)[0]
        bare = Trunk(model.cfg, model.trunk.n_layers).eval()
        bare.load_state_dict(model.trunk.state_dict())
        assert torch.equal(bare(idx), with_modules)
        assert torch.equal(model.trunk(idx), with_modules)
        ntp = MTPModel(dataclasses.replace(model.cfg, n_layers=model.trunk.n_layers), MTPConfig(objective="ntp")).eval()
        ntp.trunk.load_state_dict(model.trunk.state_dict())
        assert torch.equal(ntp.all_logits(idx)[0], with_modules)
        # scrambling every MTP weight leaves the trunk's logits alone
        for p in model.mtp.parameters():
            p.add_(torch.randn_like(p))
        assert torch.equal(model.all_logits(idx)[0], with_modules)


@pytest.mark.parametrize("name", ["sequential-post-norm", "parallel-matched"])
def test_modules_share_embedding_and_unembedding_not_copies(name):
    model = build(MODELS[name], tie_embeddings=False)
    keys = model.state_dict().keys()
    assert all(k.startswith(("trunk.", "mtp.")) for k in keys)
    # no MTP module holds a vocabulary-sized matrix of its own
    assert all(VOCAB not in p.shape for p in model.mtp.parameters())
    # and the trunk's parameters are counted once
    assert model.param_counts()["total"] == n_params(model)


# ---- gradients -----------------------------------------------------------------------------------

def extra_loss_grads(model: MTPModel) -> dict[str, float]:
    idx = tokens(T=17)
    out = model.train()(idx[:, :-1], idx[:, 1:])
    torch.stack(out.loss_extra).sum().backward()
    return {name: (0.0 if p.grad is None else float(p.grad.abs().sum())) for name, p in model.trunk.named_parameters()}


@pytest.mark.parametrize("mtp_input", ["post-norm", "pre-norm"])
def test_sequential_mtp_loss_reaches_every_trunk_layer(mtp_input):
    grads = extra_loss_grads(build(MTPConfig(objective="sequential", depth=2, mtp_input=mtp_input)))
    assert grads["embed_tokens.weight"] > 0
    for name, g in grads.items():
        if name.startswith("layers."):
            assert g > 0, f"L_extra does not reach {name}"
    # post-norm feeds depth 1 through the trunk's final norm; pre-norm does not
    # (the per-depth shared_head.norm replaces it before the shared unembedding)
    assert (grads["norm.weight"] > 0) == (mtp_input == "post-norm")


def test_parallel_mtp_loss_reaches_shared_trunk_not_head_one():
    model = build(MTPConfig(objective="parallel", heads=2), n_layers=4)  # trunk: 3 layers, the last is head 1
    assert model.trunk.n_layers == 3
    grads = extra_loss_grads(model)
    assert grads["embed_tokens.weight"] > 0
    for i in (0, 1):
        assert all(g > 0 for n, g in grads.items() if n.startswith(f"layers.{i}.")), f"layer {i}"
    assert all(g == 0 for n, g in grads.items() if n.startswith("layers.2.")), "head 1 must not train on L_extra"
    assert grads["norm.weight"] > 0  # the shared output head


PARALLEL_BACKWARD = {
    "n4-matched": (dict(heads=4), dict(n_layers=5), 3.0, 1.0),
    "n3-unmatched-untied": (dict(heads=3, compute_matched=False), dict(tie_embeddings=False), 0.7, 1.0),
    "n2-accum-scale": (dict(heads=2), dict(n_layers=3), 1.0, 0.25),
    "n3-all-layers-are-heads": (dict(heads=3), dict(n_layers=3), 2.0, 1.0),
    "n3-gqa": (dict(heads=3), dict(n_layers=4, n_kv_heads=2), 2.0, 1.0),
}


@pytest.mark.parametrize("name", PARALLEL_BACKWARD)
def test_memory_efficient_parallel_backward_equals_naive(name):
    mtp_kw, cfg_kw, lam, scale = PARALLEL_BACKWARD[name]
    model = build(MTPConfig(objective="parallel", **mtp_kw), **cfg_kw).train()
    idx = tokens(T=17)
    x, y = idx[:, :-1], idx[:, 1:]
    naive = model(x, y, lam)
    (naive.loss * scale).backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    out = parallel_backward(model, x, y, lam, scale=scale)
    assert float(out.loss) == pytest.approx(naive.loss.item(), abs=1e-6)
    assert float(out.loss_main) == pytest.approx(naive.loss_main.item(), abs=1e-6)
    assert [float(v) for v in out.loss_extra] == pytest.approx([v.item() for v in naive.loss_extra], abs=1e-6)
    for n, p in model.named_parameters():
        assert p.grad is not None, n
        assert torch.allclose(p.grad, expected[n], rtol=0, atol=1e-6), f"{n}: {float((p.grad - expected[n]).abs().max())}"
        assert float(expected[n].abs().max()) > 0, n


# ---- parameter counts, GQA -----------------------------------------------------------------------

def block_params(d: int, heads: int, kv_heads: int, ffn: int) -> int:
    head_dim = d // heads
    attention = d * heads * head_dim * 2 + d * kv_heads * head_dim * 2
    return 2 * d + attention + 3 * d * ffn


def test_param_counts_from_the_architecture():
    d, V, ffn, L = 32, VOCAB, 64, 4
    block = block_params(d, 4, 4, ffn)
    ntp = build(MTPConfig(objective="ntp"), n_layers=L)
    assert ntp.param_counts() == {"trunk": V * d + L * block + d, "mtp": 0, "total": V * d + L * block + d}
    untied = build(MTPConfig(objective="ntp"), n_layers=L, tie_embeddings=False)
    assert untied.param_counts()["trunk"] == 2 * V * d + L * block + d
    seq = build(MTPConfig(objective="sequential", depth=2), n_layers=L)
    per_module = 3 * d + 2 * d * d + block  # enorm, hnorm, shared_head.norm, eh_proj (2d -> d, no bias), block
    assert seq.param_counts()["trunk"] == ntp.param_counts()["trunk"]
    assert seq.param_counts()["mtp"] == 2 * per_module
    assert seq.param_counts()["total"] == n_params(seq)


def test_compute_matched_parallel_removes_n_minus_1_trunk_layers():
    L = 4
    matched = build(MTPConfig(objective="parallel", heads=3), n_layers=L)
    unmatched = build(MTPConfig(objective="parallel", heads=3, compute_matched=False), n_layers=L)
    ntp = build(MTPConfig(objective="ntp"), n_layers=L)
    assert matched.trunk.n_layers == L - 2 and len(matched.trunk.layers) == L - 2
    assert unmatched.trunk.n_layers == L
    block = n_params(Block(small_cfg()))
    assert matched.param_counts()["mtp"] == 2 * block
    # compute-matched: the same number of blocks (and parameters) as the NTP baseline
    assert matched.param_counts()["total"] == ntp.param_counts()["total"]
    assert unmatched.param_counts()["total"] == ntp.param_counts()["total"] + 2 * block


def test_compute_matched_parallel_needs_enough_layers():
    with pytest.raises(UserError, match="n_layers"):
        build(MTPConfig(objective="parallel", heads=5), n_layers=4)


def test_gqa_projections_and_equivalence_to_repeated_heads():
    """GQA with 2 KV heads equals plain multi-head attention whose K/V heads are each repeated for
    their group (query heads 0-1 read KV head 0, 2-3 read KV head 1, as Hugging Face's repeat_kv)."""
    gqa = build(MTPConfig(objective="ntp"), n_kv_heads=2)
    hd = 32 // 4
    assert gqa.trunk.layers[0].self_attn.k_proj.weight.shape == (2 * hd, 32)
    mha = MTPModel(small_cfg(), MTPConfig(objective="ntp")).eval()
    state = gqa.state_dict()
    for name, value in list(state.items()):
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            state[name] = value.view(2, hd, 32).repeat_interleave(2, dim=0).reshape(4 * hd, 32)
    mha.load_state_dict(state)
    idx = tokens()
    with torch.no_grad():
        assert torch.allclose(gqa.trunk(idx), mha.trunk(idx), rtol=0, atol=1e-5)
    out = gqa.train()(idx[:, :-1], idx[:, 1:])
    out.loss.backward()
    assert all(p.grad is not None for p in gqa.parameters())


def test_default_init_zeroes_residual_branches_only():
    """Recipes' default: every block (trunk, MTP modules, heads) starts as the identity; the rest is random."""
    for mtp in (MTPConfig(objective="sequential", depth=2), MTPConfig(objective="parallel", heads=3)):
        model = MTPModel(small_cfg(zero_init_residual=True), mtp)
        blocks = [m for m in model.modules() if isinstance(m, Block)]
        assert len(blocks) == model.trunk.n_layers + len(model.mtp)
        for block in blocks:
            assert not block.self_attn.o_proj.weight.any() and not block.mlp.down_proj.weight.any()
            assert block.self_attn.q_proj.weight.std() > 0 and block.mlp.up_proj.weight.std() > 0


@pytest.mark.parametrize("objective,kw,blocks", [("ntp", {}, 3), ("sequential", {"depth": 2}, 5), ("parallel", {"heads": 3}, 3)])
def test_compile_blocks_compiles_every_block_in_place(objective, kw, blocks):
    """Trunk layers, sequential modules' blocks and parallel heads are all compiled; parameter names
    (the checkpoint's keys) do not change. (`Module.compile` is lazy: nothing is compiled here.)"""
    model = MTPModel(tiny_model_config(), MTPConfig(objective, **kw))
    names = list(model.state_dict())
    assert trunk_mod.compile_blocks(model) == blocks
    assert all(m._compiled_call_impl is not None for m in model.modules() if isinstance(m, Block))
    assert list(model.state_dict()) == names
