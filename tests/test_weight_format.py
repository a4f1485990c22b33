"""Weights in int8 (weight-only, per output channel): the quantizer's error bound, the engine's int8 products
against the modules' own forward on the same weights, lossless MTP decoding at int8, compiled onto
inductor's int8 weight-only GEMM, and the one-line refusals."""

from __future__ import annotations

import pytest
import torch

from mtp_cli.decode.engine import engine_for
from mtp_cli.decode.generate import generate
from mtp_cli.model.trunk import init_weights
from mtp_cli.model.weight_format import int8_weight, quantize_int8, quantized, use_weights, weight_format

pytestmark = pytest.mark.usefixtures("single_thread")

PROMPTS = [[5, 9, 2, 7, 1, 3, 8], [4, 4, 6], [11, 3, 2, 9, 9]]


def tiny_mtp(seed: int = 0, **kw):
    from helpers import tiny_model_config

    from mtp_cli.config.recipe import MTPConfig
    from mtp_cli.model.mtp import MTPModel

    torch.manual_seed(seed)
    model = MTPModel(tiny_model_config(**kw), MTPConfig(objective="sequential", depth=1)).eval()
    init_weights(model, 0.3)
    return model


def test_quantizer_rounds_each_row_to_its_own_grid():
    """|q| <= 127, the row's largest weight maps to +-127, and every weight is within half a step of q * scale;
    control: one scale for the whole matrix misses that bound on the row of small weights."""
    w = torch.randn(6, 40) * torch.tensor([1e-3, 0.01, 0.1, 1.0, 10.0, 100.0])[:, None]
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.bfloat16 and scale.shape == (6,)
    assert int(q.abs().max()) <= 127 and (q.abs().amax(1) == 127).all()
    err = (q.float() * scale.float()[:, None] - w).abs()
    assert (err <= scale.float()[:, None] / 2 * 1.01).all()
    one_scale = w.abs().max() / 127
    assert ((torch.round(w / one_scale) * one_scale - w).abs()[0] > scale.float()[0]).any()


def test_int8_keeps_embeddings_and_norms_and_quantizes_each_linear_once():
    model = tiny_mtp()
    use_weights(model, "int8")
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(int8_weight(m) is not None for m in linears)
    assert model.trunk.embed_tokens.weight.dtype == torch.bfloat16 and weight_format(model) == "int8"
    before = {id(m): int8_weight(m)[0].clone() for m in linears}
    use_weights(model, "int8")  # a second call changes nothing
    assert all(torch.equal(int8_weight(m)[0], before[id(m)]) for m in linears)
    q, scale = int8_weight(model.trunk.layers[0].mlp.down_proj)
    torch.testing.assert_close(model.trunk.layers[0].mlp.down_proj.weight.float(), q.float() * scale.float()[:, None],
                               rtol=2 ** -8, atol=0)
    fp = tiny_mtp()
    use_weights(fp, "bf16")
    assert not quantized(fp) and weight_format(fp) == "bf16"


@pytest.mark.parametrize("cfg_kw", [{}, {"n_kv_heads": 1, "tie_embeddings": False}], ids=["mha", "mqa-untied"])
def test_engine_int8_products_equal_the_modules_forward_on_the_dequantized_weights(cfg_kw):
    """In fp32 arithmetic, the engine's int8 products (int8 matrix times scales, the norms applied, not folded)
    give the trunk's own forward with each weight set to q * scale, at every position of a chunked prefill;
    control: the same engine against the unquantized weights is off by far more than that tolerance."""
    from mtp_cli.model.weight_format import INT8_ATTR

    model = tiny_mtp(**cfg_kw)
    seq = torch.randint(0, 512, (2, 16))
    with torch.no_grad():
        original = model.trunk(seq)
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                q, scale = quantize_int8(m.weight)
                m.weight.copy_(q.float() * scale.float()[:, None])
                m.__dict__[INT8_ATTR] = (q, scale)
        ref = model.trunk(seq)
        engine = engine_for(model.trunk)
        assert engine.blocks[0].w_qkv.dtype == torch.int8
        cache = engine.new_cache(2, 20)
        got = torch.cat([engine.head(engine.forward(seq[:, a:b], cache)[0]) for a, b in [(0, 9), (9, 12), (12, 16)]], 1)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=2e-4)
    assert (got - original).abs().max() > 100 * 2e-4


def test_int8_speculative_decoding_is_lossless_against_int8_greedy():
    from mtp_cli.decode.speculative import make_drafter, speculative_generate

    model = tiny_mtp(n_layers=2)
    use_weights(model, "int8")
    greedy = generate(model.trunk, PROMPTS, 16)
    assert speculative_generate(make_drafter(model, 2), PROMPTS, 16) == greedy


@pytest.mark.slow  # two graphs to compile: about a minute on 2 cores
def test_compiled_int8_step_runs_inductors_int8_gemm_and_equals_eager():
    """Compiled on CPU (weights frozen in), each int8 product is matched to inductor's weight-only int8 GEMM
    (the pattern counter moves: the graph reads int8 weights, not a bf16 copy folded at freezing), and greedy
    text equals eager int8's; control: the bf16 model's compiled step matches no such pattern."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = tiny_mtp(n_layers=2, context=256)
    use_weights(model, "int8")
    assert generate(model.trunk, PROMPTS[:1], 12, compile=True) == generate(model.trunk, PROMPTS[:1], 12)
    assert counters["inductor"]["woq_matcher_count"] >= 4 * 2  # qkv, o, gate-up, down in each layer
    torch._dynamo.reset()
    counters.clear()
    plain = tiny_mtp(n_layers=2, context=256)
    use_weights(plain, "bf16")
    generate(plain.trunk, PROMPTS[:1], 12, compile=True)
    assert counters["inductor"]["woq_matcher_count"] == 0


def test_lm_eval_harness_refuses_int8_in_one_line():
    from mtp_cli.base.errors import UserError
    from mtp_cli.config.recipe import EvalConfig, Runtime
    from mtp_cli.evals.lm_eval_hf import run_lm_eval

    with pytest.raises(UserError, match="mtp's harness only"):
        run_lm_eval("smollm2-135m-instruct", EvalConfig(tasks=["gsm8k"]), Runtime(dtype="int8"))
