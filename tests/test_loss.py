"""Guards the loss: the seed-lesson arithmetic, the alignment of every extra depth/head with its target,
the λ/D weighting and DeepSeek's λ schedule — all through the project's own code (`mtp_cli.model.loss`,
`MTPModel.forward`, `MTPConfig.lambda_at`), checked against numbers and loops written from the definition.

Alignment (mtp_cli/model/loss.py): a chunk t_1..t_{T+1} gives inputs t_1..t_T; extra prediction k at position
i = 1..T-k predicts t_{i+k+1}; the last k positions carry no depth-k loss.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import tiny_model_config

from mtp_cli.config.recipe import MTPConfig
from mtp_cli.model import MTPModel
from mtp_cli.model import loss as L

pytestmark = pytest.mark.usefixtures("single_thread")

V = 8


def logits_giving(p: float, target: int, vocab: int = V) -> torch.Tensor:
    """A logit row whose softmax puts probability `p` on `target`, the rest spread evenly."""
    probs = torch.full((vocab,), (1 - p) / (vocab - 1), dtype=torch.float64)
    probs[target] = p
    return probs.log().float()


# ---- the seed lesson ----------------------------------------------------------------------------

def test_seed_lesson_single_position_losses():
    """p = 0.70 / 0.60 / 0.50 for the next token / depth 1 / depth 2 at one position."""
    y = torch.tensor([[3, 5, 1]])  # targets t_2, t_3, t_4 of a T = 3 chunk; position 1 is the one position
    main = L.cross_entropy(logits_giving(0.70, 3)[None, None], y[:, :1])
    d1 = L.offset_loss(logits_giving(0.60, 5)[None, None], y[:, :2], 1)  # T-1 = 1 logit row, target y[1]
    d2 = L.offset_loss(logits_giving(0.50, 1)[None, None], y, 2)  # T-2 = 1 logit row, target y[2]
    assert float(main) == pytest.approx(0.357, abs=5e-4)
    assert float(d1) == pytest.approx(0.511, abs=5e-4)
    assert float(d2) == pytest.approx(0.693, abs=5e-4)
    total = L.combine(main, [d1, d2], lam=1.0)
    assert float(total) == pytest.approx(0.959, abs=5e-4)
    assert float(total) == pytest.approx(-math.log(0.7) - 0.5 * (math.log(0.6) + math.log(0.5)), rel=1e-6)


def test_seed_lesson_through_full_length_logits():
    """The same numbers when each depth gets logits over all T positions and offset_loss drops the
    last k of them (positions without a depth-k target must not count)."""
    T = 3
    y = torch.tensor([[3, 5, 1]])
    probs = {0: 0.70, 1: 0.60, 2: 0.50}
    losses = []
    for k, p in probs.items():
        rows = []
        for i in range(T):
            if i + k < T:
                rows.append(logits_giving(p, int(y[0, i + k])))
            else:  # no target: a row that would be very wrong if it were counted
                rows.append(logits_giving(1e-6, 0))
        losses.append(L.offset_loss(torch.stack(rows)[None], y, k))
    assert [round(float(x), 3) for x in losses] == [0.357, 0.511, 0.693]
    assert round(float(L.combine(losses[0], losses[1:], 1.0)), 3) == 0.959


def test_combine_weights_extras_by_lambda_over_depth():
    main, extras = torch.tensor(2.0), [torch.tensor(1.0), torch.tensor(3.0), torch.tensor(5.0)]
    assert float(L.combine(main, extras, 0.6)) == pytest.approx(2.0 + 0.6 / 3 * 9.0)
    assert float(L.combine(main, [], 0.6)) == 2.0  # NTP: the main loss alone
    assert float(L.combine(main, extras, 0.0)) == 2.0
    assert L.extra_weight(0.6, 3) == pytest.approx(0.2)


def test_extra_targets_and_valid_positions():
    y = torch.arange(10).view(1, 10)
    assert L.extra_targets(y, 0).tolist() == [list(range(10))]
    assert L.extra_targets(y, 3).tolist() == [list(range(3, 10))]
    logits = torch.zeros(1, 10, V)
    assert L.valid_positions(logits, 3).shape == (1, 7, V)


# ---- alignment through MTPModel.forward ------------------------------------------------------------

def loop_loss(logits: torch.Tensor, chunk: torch.Tensor, k: int, shift: int = 0) -> float:
    """Mean NLL of extra prediction k, target built from the definition one position at a time.

    chunk[b] holds t_1..t_{T+1} (0-based: t_m = chunk[b, m-1]); logits[b, i-1] is position i.
    `shift` moves the target (only to show the comparison is sharp)."""
    B, T = chunk.shape[0], chunk.shape[1] - 1
    total, n = 0.0, 0
    for b in range(B):
        for i in range(1, T - k + 1):  # positions i = 1..T-k
            target = int(chunk[b, i + k + shift])  # t_{i+k+1}
            row = logits[b, i - 1].double()
            total += float(torch.logsumexp(row, 0) - row[target])
            n += 1
    return total / n


ALIGN_CASES = {
    "sequential-D3": MTPConfig(objective="sequential", depth=3, lambda_=0.5),
    "sequential-D3-prenorm": MTPConfig(objective="sequential", depth=3, lambda_=0.5, mtp_input="pre-norm"),
    "parallel-n4": MTPConfig(objective="parallel", heads=4),
}


@pytest.mark.parametrize("name", ALIGN_CASES)
def test_per_depth_loss_matches_loop_over_positions(name):
    torch.manual_seed(0)
    # a large init makes the logits far from uniform, so a misaligned target cannot hide in the tolerance
    cfg = tiny_model_config(vocab_size=64, n_layers=4, d_model=32, n_heads=2, ffn_hidden=64, context=16, init_std=0.5)
    mtp_cfg = ALIGN_CASES[name]
    model = MTPModel(cfg, mtp_cfg).eval()
    B, T = 2, 12
    chunk = torch.randint(0, cfg.vocab_size, (B, T + 1))
    x, y = chunk[:, :-1], chunk[:, 1:]
    with torch.no_grad():
        out = model(x, y)
        logits = model.all_logits(x)
    D = mtp_cfg.n_extra
    assert D == 3 and len(out.loss_extra) == D and len(logits) == D + 1
    for k in range(D + 1):
        assert logits[k].shape == (B, T - k, cfg.vocab_size), f"depth {k} must have T-k = {T - k} positions"
    assert float(out.loss_main) == pytest.approx(loop_loss(logits[0], chunk, 0), rel=1e-5)
    for k in range(1, D + 1):
        expected = loop_loss(logits[k], chunk, k)
        assert float(out.loss_extra[k - 1]) == pytest.approx(expected, rel=1e-5), f"depth {k}"
        # the comparison is sharp: a target one token early (t_{i+k}) gives a different number
        assert abs(loop_loss(logits[k], chunk, k, shift=-1) - expected) > 1e-3
    lam = mtp_cfg.lambda_at()
    expected_total = float(out.loss_main) + lam / D * sum(float(v) for v in out.loss_extra)
    assert float(out.loss) == pytest.approx(expected_total, rel=1e-6)


def test_forward_lambda_argument_overrides_default_weight():
    torch.manual_seed(0)
    cfg = tiny_model_config(vocab_size=64, n_layers=2, d_model=32, n_heads=2, ffn_hidden=64, context=16)
    model = MTPModel(cfg, MTPConfig(objective="sequential", depth=2)).eval()
    chunk = torch.randint(0, 64, (2, 11))
    x, y = chunk[:, :-1], chunk[:, 1:]
    with torch.no_grad():
        default, half = model(x, y), model(x, y, lam=0.5)
    extra = sum(float(v) for v in default.loss_extra)
    assert float(default.loss) == pytest.approx(float(default.loss_main) + 0.3 / 2 * extra, rel=1e-6)
    assert float(half.loss) == pytest.approx(float(half.loss_main) + 0.5 / 2 * extra, rel=1e-6)


def test_ntp_loss_is_the_main_loss():
    torch.manual_seed(0)
    cfg = tiny_model_config(vocab_size=64, n_layers=2, d_model=32, n_heads=2, ffn_hidden=64, context=16)
    model = MTPModel(cfg, MTPConfig(objective="ntp")).eval()
    chunk = torch.randint(0, 64, (2, 11))
    with torch.no_grad():
        out = model(chunk[:, :-1], chunk[:, 1:])
    assert out.loss_extra == []
    assert torch.equal(out.loss, out.loss_main)


# ---- the fused unembedding + cross-entropy used in training -----------------------------------------

@pytest.mark.parametrize("n_rows", [1, 7, 130])  # one row, fewer rows than a chunk, a ragged last chunk
def test_linear_cross_entropy_equals_logits_then_cross_entropy(monkeypatch, n_rows):
    """Value and both gradients equal F.cross_entropy(F.linear(h, W)), with chunks forced small
    (64 rows) so that several chunks and a partial last one are exercised; a non-unit upstream
    gradient checks the backward's scaling."""
    monkeypatch.setattr(L, "_CHUNK_ELEMENTS", 64 * 50)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, n_rows, 16, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 16, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 50, (2, n_rows), generator=g)
    fused = L.linear_cross_entropy(h, w, y)
    (3.0 * fused).backward()
    fused_grads = h.grad.clone(), w.grad.clone()
    h.grad, w.grad = None, None
    plain = torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, w).reshape(-1, 50), y.reshape(-1))
    (3.0 * plain).backward()
    assert fused.item() == pytest.approx(plain.item(), rel=1e-12)
    assert torch.allclose(fused_grads[0], h.grad, rtol=1e-10, atol=1e-12)
    assert torch.allclose(fused_grads[1], w.grad, rtol=1e-10, atol=1e-12)


def _loss_and_grads(fn, h, w, y):
    h, w = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    loss = fn(h, w, y)
    loss.backward()
    return loss.item(), h.grad, w.grad


def _plain(h, w, y):
    return torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, w).float(), y)


def test_linear_cross_entropy_skips_ignored_targets_like_f_cross_entropy():
    g = torch.Generator().manual_seed(2)
    h, w = torch.randn(10, 4, generator=g), torch.randn(V, 4, generator=g)
    y = torch.randint(0, V, (10,), generator=g)
    y[3] = -100
    fused, plain = _loss_and_grads(L.linear_cross_entropy, h, w, y), _loss_and_grads(_plain, h, w, y)
    assert fused[0] == pytest.approx(plain[0], rel=1e-6)
    assert torch.allclose(fused[1], plain[1]) and torch.allclose(fused[2], plain[2])


def test_linear_cross_entropy_stays_finite_far_from_the_target():
    """A target 150 nats below the top logit has softmax probability 0 in fp32; the loss must still be
    the exact log-sum-exp difference, as F.cross_entropy gives, not inf."""
    h = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    w = torch.tensor([[150.0, 0.0], [0.0, 0.0], [0.0, 3.0]])
    y = torch.tensor([1, 0])
    fused, plain = _loss_and_grads(L.linear_cross_entropy, h, w, y), _loss_and_grads(_plain, h, w, y)
    assert fused[0] == pytest.approx(plain[0], rel=1e-6) and math.isfinite(fused[0])
    assert torch.allclose(fused[1], plain[1]) and torch.allclose(fused[2], plain[2])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_linear_cross_entropy_half_precision_weight_gradient_does_not_overflow(dtype):
    """The weight gradient is a mean over rows: 20k rows summed before dividing would overflow fp16.
    Compared with the float64 gradient of the same (rounded) inputs."""
    g = torch.Generator().manual_seed(3)
    h = torch.full((20000, 8), 4.0, dtype=dtype)
    w = (torch.randn(64, 8, generator=g) * 0.1).to(dtype)
    y = torch.zeros(20000, dtype=torch.long)
    fused = _loss_and_grads(L.linear_cross_entropy, h, w, y)
    exact = _loss_and_grads(L.linear_cross_entropy, h.double(), w.double(), y)
    assert torch.isfinite(fused[2]).all()
    assert torch.allclose(fused[2].double(), exact[2], rtol=1e-2, atol=1e-3)


def test_linear_cross_entropy_refuses_a_weight_changed_before_backward():
    g = torch.Generator().manual_seed(4)
    h, w = torch.randn(6, 4, generator=g, requires_grad=True), torch.randn(V, 4, generator=g, requires_grad=True)
    loss = L.linear_cross_entropy(h, w, torch.randint(0, V, (6,), generator=g))
    with torch.no_grad():
        w.add_(1.0)
    with pytest.raises(RuntimeError, match="modified in place"):
        loss.backward()


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("objective,kw,memory_efficient", [
    ("ntp", {}, False), ("sequential", {"depth": 2}, False), ("parallel", {"heads": 3}, False),
    ("parallel", {"heads": 3}, True)])
def test_model_gradients_with_the_fused_loss_equal_the_plain_path(monkeypatch, tie, objective, kw, memory_efficient):
    """Every parameter's gradient, through MTPModel.forward or Meta's one-head-at-a-time backward, with
    tied or untied embeddings and two accumulated micro-batches, equals the logits → F.cross_entropy path."""
    from mtp_cli.model import parallel_backward

    torch.manual_seed(0)
    cfg = tiny_model_config(vocab_size=97, n_layers=3, d_model=32, n_heads=2, ffn_hidden=64, context=16,
                            tie_embeddings=tie, zero_init_residual=False)
    model = MTPModel(cfg, MTPConfig(objective, **kw)).double()
    x, y = torch.randint(0, 97, (4, 16)), torch.randint(0, 97, (4, 16))

    def grads() -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        for xm, ym in zip(x.chunk(2), y.chunk(2)):
            if memory_efficient:
                parallel_backward(model, xm, ym, 0.5, scale=0.5)
            else:
                (model(xm, ym, 0.5).loss * 0.5).backward()
        return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    fused = grads()
    monkeypatch.setattr(L, "linear_cross_entropy",
                        lambda h, w, t, total=None: L.cross_entropy(torch.nn.functional.linear(h, w), t, total))
    plain = grads()
    assert fused.keys() == plain.keys()
    for name in fused:  # the plain path's cross-entropy runs in fp32: agreement to fp32 precision
        assert torch.allclose(fused[name], plain[name], rtol=1e-5, atol=1e-7 * float(plain[name].abs().max())), name


@pytest.mark.parametrize("objective,kw,memory_efficient", [
    ("sequential", {"depth": 2}, False), ("parallel", {"heads": 3}, False), ("parallel", {"heads": 3}, True)])
def test_extra_losses_over_a_subset_of_the_vocabulary(objective, kw, memory_efficient):
    """mtp.draft_vocab: each extra loss equals, computed from the definition, the cross-entropy of the full
    logits' columns of the subset, over the positions whose target is in it, summed and divided by all
    valid targets at that offset; the next-token loss and every gradient outside the modules' path are
    those of the whole vocabulary, and evaluation's logits are unchanged."""
    from mtp_cli.model import parallel_backward

    torch.manual_seed(0)
    vocab, T = 97, 16
    cfg = tiny_model_config(vocab_size=vocab, n_layers=3, d_model=32, n_heads=2, ffn_hidden=64, context=T,
                            zero_init_residual=False)
    model = MTPModel(cfg, MTPConfig(objective, **kw)).double()
    x, y = torch.randint(0, vocab, (4, T)), torch.randint(0, vocab, (4, T))
    y[0, 3] = L.IGNORE
    ids = torch.randperm(vocab)[:30]
    full = [logits.detach() for logits in model.all_logits(x)]
    model.train_extra_over(ids)
    assert all(torch.equal(a, b) for a, b in zip(full, model.all_logits(x)))

    kept = set(ids.tolist())
    expected = []
    for k, logits in enumerate(full[1:], 1):
        total, n_valid = 0.0, 0
        for b in range(4):
            for i in range(T - k):
                target = int(y[b, i + k])
                if target == L.IGNORE:
                    continue
                n_valid += 1
                if target in kept:
                    row = logits[b, i, sorted(kept)]
                    total += float(torch.logsumexp(row, 0) - logits[b, i, target])
        expected.append(total / n_valid)
    if memory_efficient:
        out = parallel_backward(model, x, y, 0.5)
    else:
        out = model(x, y, 0.5)
    assert float(out.loss_main) == pytest.approx(float(L.cross_entropy(full[0], y)), rel=1e-6)  # fp32 there
    assert [float(v) for v in out.loss_extra] == pytest.approx(expected, rel=1e-9)

    model.train_extra_over(None)
    again = parallel_backward(model, x, y, 0.5) if memory_efficient else model(x, y, 0.5)
    assert [float(v) for v in again.loss_extra] == pytest.approx(
        [float(L.offset_loss(lk, y, k)) for k, lk in enumerate(full[1:], 1)], rel=1e-6)


def test_a_subset_vocabulary_refuses_sizes_outside_the_vocabulary():
    from helpers import tiny_recipe

    from mtp_cli.base.errors import UserError

    recipe = tiny_recipe("sequential", depth=1)
    recipe.mtp.draft_vocab = recipe.model.vocab_size + 1
    with pytest.raises(UserError, match="mtp.draft_vocab"):
        recipe.validate()
    recipe.mtp.draft_vocab = -1
    with pytest.raises(UserError, match="mtp.draft_vocab"):
        recipe.validate()


def test_linear_offset_loss_drops_the_last_k_positions():
    g = torch.Generator().manual_seed(1)
    h, w = torch.randn(2, 6, 4, generator=g), torch.randn(V, 4, generator=g)
    y = torch.randint(0, V, (2, 6), generator=g)
    for k in range(3):
        expected = L.offset_loss(torch.nn.functional.linear(h, w), y, k)
        assert float(L.linear_offset_loss(h, w, y, k)) == pytest.approx(float(expected), rel=1e-6)
        with_grad = L.linear_offset_loss(h.requires_grad_(), w, y, k).detach()
        assert float(with_grad) == pytest.approx(float(expected), rel=1e-6)
        h = h.detach()


# ---- λ defaults and schedule ------------------------------------------------------------------------

def test_default_lambda_per_objective():
    assert MTPConfig(objective="sequential").lambda_at() == 0.3  # DeepSeek-V3's first phase
    assert MTPConfig(objective="parallel", heads=4).lambda_at() == 3.0  # Meta: plain sum over n-1 extra heads
    assert MTPConfig(objective="sequential", lambda_=0.0).lambda_at() == 0.0  # an explicit 0 is kept


def test_lambda_schedule_switches_after_fraction_of_steps():
    cfg = MTPConfig(objective="sequential", lambda_=0.3, lambda_final=0.1, lambda_switch=0.5)
    schedule = [cfg.lambda_at(step, 10) for step in range(10)]
    assert schedule == [0.3] * 5 + [0.1] * 5


def test_lambda_constant_without_final_value():
    cfg = MTPConfig(objective="sequential", lambda_=0.3)
    assert {cfg.lambda_at(step, 10) for step in range(10)} == {0.3}


def test_lambda_schedule_edges():
    at_start = MTPConfig(objective="sequential", lambda_=0.3, lambda_final=0.1, lambda_switch=0.0)
    assert at_start.lambda_at(0, 10) == 0.1
    never = MTPConfig(objective="sequential", lambda_=0.3, lambda_final=0.1, lambda_switch=1.0)
    assert [never.lambda_at(s, 10) for s in range(10)] == [0.3] * 10


# ---- ignored targets and the global normaliser (train.accumulate across ranks) ------------------------

def test_valid_counts_per_offset():
    y = torch.tensor([[1, L.IGNORE, 2, 3], [L.IGNORE, L.IGNORE, 4, L.IGNORE]])
    assert L.valid_counts(y, 2).tolist() == [4, 3, 3]  # y[:, k:] of each offset k


@pytest.mark.parametrize("k", [0, 1, 2])
def test_a_given_total_divides_the_sum_over_valid_targets(monkeypatch, k):
    """With `total` the fused loss and both its gradients are the plain path's sum over the valid
    targets divided by it, ignored rows spread over several chunks."""
    monkeypatch.setattr(L, "_CHUNK_ELEMENTS", 64 * V)
    g = torch.Generator().manual_seed(5)
    h = torch.randn(3, 50, 8, generator=g, dtype=torch.float64)
    w = torch.randn(V, 8, generator=g, dtype=torch.float64)
    y = torch.randint(0, V, (3, 50), generator=g)
    y[torch.rand(3, 50, generator=g) < 0.4] = L.IGNORE

    def plain(h, w, y):
        hk, yk = L.valid_positions(h, k), L.extra_targets(y, k)
        per = torch.nn.functional.cross_entropy(torch.nn.functional.linear(hk, w).reshape(-1, V), yk.reshape(-1),
                                                reduction="none")
        return per.sum() / 37.5

    fused = _loss_and_grads(lambda h, w, y: L.linear_offset_loss(h, w, y, k, total=37.5), h, w, y)
    ref = _loss_and_grads(plain, h, w, y)
    assert fused[0] == pytest.approx(ref[0], rel=1e-12)
    assert torch.allclose(fused[1], ref[1], atol=1e-14) and torch.allclose(fused[2], ref[2], atol=1e-14)
    with torch.no_grad():  # the plain path used without autograd (fp32 cross-entropy) gives the same value
        assert float(L.linear_offset_loss(h, w, y, k, total=37.5)) == pytest.approx(ref[0], rel=1e-6)


# ---- distillation from the trunk (mtp.draft_target = "trunk") -------------------------------------------

def test_distill_offset_loss_is_the_kl_to_the_trunk_at_the_aligned_position(monkeypatch):
    """Prediction k at position i is scored against the trunk's distribution at position i+k (both predict
    token i+k+1): the value is Σ KL(p_trunk ‖ q) over rows with a valid target / their count, its gradient
    that of the cross-entropy against p_trunk, with small chunks forced and an ignored row skipped."""
    monkeypatch.setattr(L, "_CHUNK_ELEMENTS", 64 * 30)
    g = torch.Generator().manual_seed(0)
    k, T = 2, 70
    student = torch.randn(2, T - k, 8, generator=g, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(2, T, 8, generator=g, dtype=torch.float64)
    w = torch.randn(30, 8, generator=g, dtype=torch.float64)
    y = torch.randint(0, 30, (2, T), generator=g)
    y[1, k + 5] = L.IGNORE
    loss = L.distill_offset_loss(student, teacher, w, y, k)
    loss.backward()
    log_q = torch.log_softmax(student @ w.t(), -1)
    log_p = torch.log_softmax(teacher[:, k:] @ w.t(), -1)
    valid = (y[:, k:] != L.IGNORE).unsqueeze(-1)
    n = valid.sum()
    expected = (log_p.exp() * (log_p - log_q) * valid).sum() / n
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    grad = torch.autograd.grad(-(log_p.exp() * torch.log_softmax(student @ w.t(), -1) * valid).sum() / n, student)[0]
    assert torch.allclose(student.grad, grad, rtol=1e-10, atol=1e-13)
    assert student.grad[1, 5].abs().max() == 0  # the ignored row


def test_distill_offset_loss_is_zero_when_the_student_is_the_trunk():
    g = torch.Generator().manual_seed(1)
    states = torch.randn(1, 20, 8, generator=g, dtype=torch.float64)
    w = torch.randn(30, 8, generator=g, dtype=torch.float64)
    y = torch.randint(0, 30, (1, 20), generator=g)
    assert L.distill_offset_loss(states[:, 1:], states, w, y, 1).item() == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("objective,kw", [("sequential", {"depth": 2}), ("parallel", {"heads": 3, "compute_matched": False})])
def test_forward_distils_each_extra_prediction_from_the_trunk_logits_it_will_be_verified_by(objective, kw):
    """With mtp.draft_target = "trunk", extra prediction k's loss is the KL from the trunk's own logits at
    position i+k to its logits at i, both over the draft vocabulary (renormalized there): computed here from
    `all_logits`, the model's public output. The same with the frozen trunk's stored states (`frozen_pass`)."""
    torch.manual_seed(0)
    cfg = tiny_model_config(vocab_size=64, n_layers=2, d_model=32, n_heads=2, ffn_hidden=64, context=16)
    model = MTPModel(cfg, MTPConfig(objective=objective, draft_target="trunk", **kw)).eval()
    model.freeze_trunk()
    ids = torch.arange(0, 64, 2)
    model.train_extra_over(ids)
    chunk = torch.randint(0, 64, (2, 13))
    x, y = chunk[:, :-1], chunk[:, 1:]
    with torch.no_grad():
        out = model(x, y)
        stored = model(x, y, frozen=model.frozen_pass(x, y))
        logits = [lg[..., ids].double() for lg in model.all_logits(x)]
    for k in range(1, model.n_extra + 1):
        log_p = torch.log_softmax(logits[0][:, k:], -1)
        log_q = torch.log_softmax(logits[k], -1)
        expected = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
        assert float(out.loss_extra[k - 1]) == pytest.approx(float(expected), rel=1e-5)
        assert float(stored.loss_extra[k - 1]) == pytest.approx(float(expected), rel=1e-5)
