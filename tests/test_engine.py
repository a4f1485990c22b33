"""The decode engine and its static KV cache: the trunk's and modules' forwards at explicit
positions, ragged rows, row selection, capacity, and the compiled fixed-shape step (the same greedy
output as eager, no recompilation as the sequence grows or rolls back, sampling's distribution)."""

from __future__ import annotations

import pytest
import torch

from mtp_cli.decode.engine import compiled_graphs, engine_for
from mtp_cli.decode.generate import generate, prefill
from mtp_cli.decode.static_cache import CacheFull
from mtp_cli.model.trunk import Trunk, init_weights

pytestmark = pytest.mark.usefixtures("single_thread")


def random_trunk(seed: int = 0, **kw) -> Trunk:
    from helpers import tiny_model_config

    torch.manual_seed(seed)
    trunk = Trunk(tiny_model_config(**kw)).eval()
    init_weights(trunk, 0.3)
    return trunk


PROMPTS = [[5, 9, 2, 7, 1, 3, 8], [4, 4, 6], [11, 3, 2, 9, 9], [1]]


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("cfg_kw", [{}, {"n_kv_heads": 2}, {"n_kv_heads": 1, "tie_embeddings": False}],
                         ids=["mha", "gqa", "mqa-untied"])
def test_engine_logits_equal_the_training_forward(cfg_kw, batch):
    """A chunked prefill, 1-token steps and a 4-token verify give the trunk's own logits at every
    position (one row: slice writes and SDPA's causal kernel; two rows: scattered writes and a mask)."""
    trunk = random_trunk(**cfg_kw)
    engine = engine_for(trunk)
    seq = torch.randint(0, 512, (batch, 20))
    with torch.no_grad():
        ref = trunk(seq)
        cache = engine.new_cache(batch, 24)
        chunks = [(0, 7), (7, 10), *((j, j + 1) for j in range(10, 16)), (16, 20)]
        got = torch.cat([engine.head(engine.forward(seq[:, a:b], cache)[0]) for a, b in chunks], 1)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    assert cache.lengths.tolist() == [20] * batch


def test_ragged_rows_equal_each_row_alone():
    trunk = random_trunk()
    engine = engine_for(trunk)
    with torch.no_grad():
        cache, logits, _, _ = prefill(engine, PROMPTS, 24)
        step = engine.head(engine.forward(torch.tensor([[3], [1], [4], [1]]), cache)[0][:, -1])
        for i, p in enumerate(PROMPTS):
            alone, first, _, _ = prefill(engine, [p], 24)
            torch.testing.assert_close(logits[i], first[0], rtol=1e-4, atol=1e-4)
            after = engine.head(engine.forward(torch.tensor([[[3], [1], [4], [1]][i]]), alone)[0][:, -1])
            torch.testing.assert_close(step[i], after[0], rtol=1e-4, atol=1e-4)


def test_rollback_is_a_length_change():
    """Feeding 4 drafts, rolling back to keep 1, then stepping equals never having fed the other 3."""
    trunk = random_trunk()
    engine = engine_for(trunk)
    prompt = PROMPTS[0]
    with torch.no_grad():
        cache, _, _, _ = prefill(engine, [prompt], 24)
        engine.forward(torch.tensor([[7, 8, 9, 10]]), cache)
        cache.rollback(torch.tensor([len(prompt) + 1]))
        got = engine.head(engine.forward(torch.tensor([[2]]), cache)[0][:, -1])
        fresh, _, _, _ = prefill(engine, [prompt + [7]], 24)
        want = engine.head(engine.forward(torch.tensor([[2]]), fresh)[0][:, -1])
    assert cache.lengths.tolist() == [len(prompt) + 2]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_row_selection_keeps_the_chosen_rows():
    trunk = random_trunk()
    engine = engine_for(trunk)
    with torch.no_grad():
        cache, _, _, _ = prefill(engine, PROMPTS, 24)
        cache.select(torch.tensor([2, 0]))
        got = engine.head(engine.forward(torch.tensor([[6], [6]]), cache)[0][:, -1])
        want, _, _, _ = prefill(engine, [PROMPTS[2], PROMPTS[0]], 24)
        ref = engine.head(engine.forward(torch.tensor([[6], [6]]), want)[0][:, -1])
    assert cache.batch == 2
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("static", [False, True])
def test_capacity_overflow_is_a_clear_error(static):
    trunk = random_trunk()
    engine = engine_for(trunk)
    with torch.no_grad():
        cache, _, _, _ = prefill(engine, [PROMPTS[0]], 9)  # 7 tokens, room for 2 more
        engine.forward(torch.tensor([[1]]), cache, static=static)
        with pytest.raises(CacheFull, match="need position 9, capacity 9"):
            engine.forward(torch.tensor([[1, 2]]), cache, static=static)


def test_engine_is_rebuilt_when_weights_change():
    trunk = random_trunk()
    before = generate(trunk, PROMPTS, 6)
    with torch.no_grad():
        trunk.layers[0].mlp.up_proj.weight.mul_(-1)
    after = generate(trunk, PROMPTS, 6)
    fresh = generate(random_trunk(), PROMPTS, 6)
    assert before == fresh and after != before


# ---- compiled ----------------------------------------------------------------------------------------
def _fixed_shape(engine):
    """The fixed-shape forward that CUDA compiles into graphs (whole-capacity attention, masks from
    positions, finished rows riding along), run eager: on CPU batches never take it otherwise."""
    engine.static = True
    engine.__dict__["compiled_batch_step"] = None
    return engine


def test_fixed_shape_greedy_equals_eager():
    """A 1-layer trunk: the fixed-shape path gives eager greedy's output on a ragged batch, also
    after 200 steps with ragged rollbacks of another cache."""
    trunk = random_trunk(n_layers=1, context=256)
    eager = generate(trunk, PROMPTS, 12)
    engine = _fixed_shape(engine_for(trunk, compile=True))
    assert generate(trunk, PROMPTS, 12, compile=True) == eager
    with torch.no_grad():
        cache, _, _, _ = prefill(engine, PROMPTS, 256)
        lengths = cache.lengths.clone()
        for step in range(200):
            engine.forward(torch.tensor([[step % 500]] * 4), cache)
            if step % 7 == 6:  # roll back the last 7 tokens, ragged: row i keeps i of them
                lengths = lengths + torch.arange(4)
                cache.rollback(lengths)
        assert generate(trunk, [p[::-1] for p in PROMPTS], 30, compile=True) \
            == generate(trunk, [p[::-1] for p in PROMPTS], 30)


def test_fixed_shape_speculative_equals_eager_greedy():
    """A 1-layer trunk with one DeepSeek module: fixed-shape verification (width k+1) gives plain
    greedy's output, token for token, on a ragged batch whose rows finish at different steps (they
    ride along, frozen)."""
    from helpers import tiny_model_config

    from mtp_cli.config.recipe import MTPConfig
    from mtp_cli.decode.speculative import make_drafter, speculative_generate
    from mtp_cli.model.mtp import MTPModel

    torch.manual_seed(0)
    model = MTPModel(tiny_model_config(n_layers=1), MTPConfig(objective="sequential", depth=1)).eval()
    init_weights(model, 0.3)
    _fixed_shape(engine_for(model.trunk, model, compile=True))

    def stop(i, ids):
        return len(ids) >= 6 + 4 * i

    expected = generate(model.trunk, PROMPTS, 20, stop=stop)
    assert speculative_generate(make_drafter(model, 2, compile=True), PROMPTS, 20, stop=stop) == expected
    assert speculative_generate(make_drafter(model, 2, compile=True), PROMPTS[::-1], 20) \
        == generate(model.trunk, PROMPTS[::-1], 20)


@pytest.mark.slow  # four graphs to compile: about a minute on 2 cores
def test_compiled_one_row_equals_eager_without_recompiling():
    """One row on CPU runs the compiled step with a symbolic position (the unembedding inside the
    graph, the weights frozen in), and speculative greedy its fused verify-and-draft graph: both equal
    eager token for token, each is one whole graph, and 200 steps with rollbacks, and prompts of other
    lengths, build no new graph."""
    from helpers import tiny_model_config
    from torch._dynamo.utils import counters

    from mtp_cli.config.recipe import MTPConfig
    from mtp_cli.decode.speculative import make_drafter, speculative_generate
    from mtp_cli.model.mtp import MTPModel

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = MTPModel(tiny_model_config(n_layers=1, context=256), MTPConfig(objective="sequential", depth=1)).eval()
    init_weights(model, 0.3)
    first, later = PROMPTS[0], PROMPTS[1:]
    assert generate(model.trunk, [first], 12, compile=True) == generate(model.trunk, [first], 12)
    # one fused call, its tokens made by `fused_input`; the capacities (a 14-token prompt) equal no fixed size
    # of the model, which torch.compile would take as the same constant (duck sizing)
    speculative_generate(make_drafter(model, compile=True), [first + first], 2)
    fused_graphs = compiled_graphs()
    assert speculative_generate(make_drafter(model, compile=True), [first], 12) == generate(model.trunk, [first], 12)
    assert compiled_graphs() == fused_graphs, "the fused step, fed its own output, recompiled"
    engine = engine_for(model.trunk, model, compile=True)
    assert engine.compiled_row_step is not None and engine.compile_s > 0
    with torch.no_grad():
        cache, _, _, _ = prefill(engine, [first], 256)
        engine.step(torch.tensor([[3]]), cache)  # this engine's own one-token graph (its weights are constants)
        graphs = compiled_graphs()
        start = int(cache.lengths[0])
        for step in range(200):
            engine.step(torch.tensor([[step % 500]]), cache)
            if step % 7 == 6:
                cache.rollback(cache.lengths - 3)
        assert int(cache.lengths[0]) == start + 200 - 3 * (200 // 7)
    for p in later + PROMPTS[::-1]:  # other lengths, a one-token prompt among them
        assert generate(model.trunk, [p], 16, compile=True) == generate(model.trunk, [p], 16)
        assert speculative_generate(make_drafter(model, compile=True), [p], 16) == generate(model.trunk, [p], 16)
    assert compiled_graphs() == graphs, "the one-row compiled forwards recompiled"
    broken = {**counters["graph_break"], **counters["unimplemented"]}  # a break can fall back to eager silently
    assert not broken, list(broken)
    assert len(engine.fused_steps) == 1 and all(compiled is not None for _, compiled in engine.fused_steps.values())
    # the weights were frozen into those graphs for their calls only: a training model's compiled
    # blocks, validated under no_grad, must keep reading their changing weights
    assert torch._inductor.config.freezing is False


@pytest.mark.slow  # one graph to compile: about a minute on 2 cores
def test_compiled_tree_is_lossless_without_recompiling():
    """A candidate tree (`draft_width` 3) in the compiled fused step: greedy's output on prompts of other
    lengths, one graph fed its own output (`fused_input` with the tree's lead), no graph break."""
    from helpers import tiny_model_config
    from torch._dynamo.utils import counters

    from mtp_cli.config.recipe import MTPConfig
    from mtp_cli.decode.speculative import SpecStats, make_drafter, speculative_generate
    from mtp_cli.model.mtp import MTPModel

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = MTPModel(tiny_model_config(n_layers=1, context=256), MTPConfig(objective="sequential", depth=1)).eval()
    init_weights(model, 0.3)
    first = PROMPTS[0]
    speculative_generate(make_drafter(model, compile=True, width=3), [first + first], 2)
    graphs = compiled_graphs()
    stats = SpecStats(1)
    for p in PROMPTS:
        assert speculative_generate(make_drafter(model, compile=True, width=3), [p], 16, stats=stats) \
            == generate(model.trunk, [p], 16)
    assert compiled_graphs() == graphs, "the tree's fused step, fed its own output, recompiled"
    assert stats.steps > 0
    broken = {**counters["graph_break"], **counters["unimplemented"]}
    assert not broken, list(broken)
    engine = engine_for(model.trunk, model, compile=True)
    assert [key[3] for key in engine.fused_steps] == [3] and all(c is not None for _, c in engine.fused_steps.values())


@pytest.mark.slow  # three graphs to compile: about a minute on 2 cores
def test_compiled_batches_equal_eager_in_one_graph_per_width():
    """Several rows on CPU run one compiled graph with symbolic batch size, positions and span: ragged
    rows (prompts of different lengths), rows dropped as they finish and verification at width k+1 all
    give eager's output token for token, and a second ragged batch of other lengths builds no new graph."""
    from helpers import tiny_model_config
    from torch._dynamo.utils import counters

    from mtp_cli.config.recipe import MTPConfig
    from mtp_cli.decode.speculative import make_drafter, speculative_generate
    from mtp_cli.model.mtp import MTPModel

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = MTPModel(tiny_model_config(n_layers=1, context=256), MTPConfig(objective="sequential", depth=1)).eval()
    init_weights(model, 0.3)

    def stop(i, ids):
        return len(ids) >= 6 + 4 * i

    expected = generate(model.trunk, PROMPTS, 20, stop=stop)
    assert generate(model.trunk, PROMPTS, 20, stop=stop, compile=True) == expected
    assert speculative_generate(make_drafter(model, 2, compile=True), PROMPTS, 20, stop=stop) == expected
    for engine in (engine_for(model.trunk, compile=True), engine_for(model.trunk, model, compile=True)):
        assert engine.compile_s > 0
    graphs = compiled_graphs()
    other = [p[::-1] + p[:2] for p in PROMPTS[:3]]
    assert generate(model.trunk, other, 16, compile=True) == generate(model.trunk, other, 16)
    assert speculative_generate(make_drafter(model, 2, compile=True), other, 16) == generate(model.trunk, other, 16)
    assert compiled_graphs() == graphs, "the batched compiled forward recompiled"
    broken = {**counters["graph_break"], **counters["unimplemented"]}
    assert not broken, list(broken)


@pytest.mark.slow
@pytest.mark.parametrize("objective,draft_len", [("sequential", 1), ("sequential", 3), ("parallel", 2)])
def test_compiled_speculative_is_lossless_on_trained_runs(tiny_runs, objective, draft_len):
    from mtp_cli.decode.speculative import make_drafter, speculative_generate
    from mtp_cli.model.checkpoint import load_run

    run = load_run(tiny_runs[objective])
    prompts = [run.tokenizer.encode(t) for t in ("def split(s, sep=None):\n    ", "import os\n", "class A:\n")]
    expected = generate(run.model.trunk, prompts, 30)
    assert generate(run.model.trunk, prompts, 30, compile=True) == expected
    assert speculative_generate(make_drafter(run.model, draft_len, compile=True), prompts, 30) == expected


@pytest.mark.slow
def test_compiled_sampling_preserves_the_distribution(tiny_runs):
    from helpers import chi_square_pvalue, first_two_token_law

    from mtp_cli.decode.speculative import SpecStats, make_drafter, speculative_generate
    from mtp_cli.model.checkpoint import load_run

    run = load_run(tiny_runs["sequential"])
    prompt = run.tokenizer.encode("def split(s, sep=None):\n    ")
    temperature, n = 0.8, 4000
    p1, p2 = first_two_token_law(run.model.trunk, prompt, temperature)
    stats = SpecStats(2)
    out = speculative_generate(make_drafter(run.model, 2, compile=True), [prompt] * n, 2, temperature=temperature,
                               generator=torch.Generator().manual_seed(0), stats=stats)
    assert min(stats.accepted, stats.drafted - stats.accepted) > 100
    V = p1.shape[0]
    c1 = torch.bincount(torch.tensor([o[0] for o in out]), minlength=V).double()
    c2 = torch.bincount(torch.tensor([o[1] for o in out]), minlength=V).double()
    assert chi_square_pvalue(c1, p1) > 1e-3 and chi_square_pvalue(c2, p2) > 1e-3
    plain = generate(run.model.trunk, [prompt] * n, 2, temperature=temperature,
                     generator=torch.Generator().manual_seed(1), compile=True)
    c1 = torch.bincount(torch.tensor([o[0] for o in plain]), minlength=V).double()
    c2 = torch.bincount(torch.tensor([o[1] for o in plain]), minlength=V).double()
    assert chi_square_pvalue(c1, p1) > 1e-3 and chi_square_pvalue(c2, p2) > 1e-3


@pytest.mark.parametrize("flags", [["--no-compile"], pytest.param(["--compile"], marks=pytest.mark.slow)])
def test_cli_generate_compile_switch(tiny_runs, capsys, flags):
    """`mtp generate --compile/--no-compile`: the same text as the default, plain and speculative."""
    from helpers import cli_in_process

    base = ["generate", tiny_runs["sequential"], "--prompt", "def split(s):\n", "--max-new-tokens", "16"]
    code, plain, _ = cli_in_process(*base, capsys=capsys)
    assert code == 0
    for extra in ([], ["--speculative"]):
        code, out, err = cli_in_process(*base, *extra, *flags, capsys=capsys)
        assert code == 0 and out == plain, err
