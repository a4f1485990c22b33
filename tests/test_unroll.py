"""Guards training-time test (mtp.unroll, model/unroll.py): each unrolled step equals the module rerun as the
drafter reruns it (decode/speculative.py: step m one position further right, reading its own last output and
attending to step 1's states up to its anchor and to its own chain), for post- and pre-norm input and GQA; step 1
is the plain depth-1 state; the training loss has one term per step, aligned like depth k; the setting is refused
where it means nothing."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_model_config

from mtp_cli.base.errors import UserError
from mtp_cli.config.recipe import MTPConfig
from mtp_cli.model import MTPModel
from mtp_cli.model import loss as L

pytestmark = pytest.mark.usefixtures("single_thread")


def build(mtp_input: str, unroll: int = 3, **cfg) -> MTPModel:
    torch.manual_seed(0)
    config = tiny_model_config(vocab_size=96, d_model=32, n_heads=4, ffn_hidden=64, context=32, init_std=0.2, **cfg)
    return MTPModel(config, MTPConfig(objective="sequential", depth=1, mtp_input=mtp_input, unroll=unroll)).eval()


def rerun_as_drafted(model: MTPModel, idx: torch.Tensor, anchor: int, steps: int) -> list[torch.Tensor]:
    """The chain from `anchor` as the drafter makes it, by rerunning the module over whole sequences: positions
    0..anchor hold step 1's inputs (trunk states and the next tokens); step m appends, at position anchor+m-1,
    the module's previous output (normed for post-norm input) and the token t_{anchor+m}."""
    trunk, module = model.trunk, model.mtp[0]
    x = trunk.embed_tokens(idx)
    cos, sin = trunk.rope(idx.shape[1], idx.device, x.dtype)
    hidden = trunk.run_layers(x, 0, trunk.n_layers, (cos, sin))
    post = model.mtp_cfg.mtp_input == "post-norm"
    h_in = list((trunk.norm(hidden) if post else hidden)[:, :anchor + 1].unbind(1))
    e_in = list(x[:, 1:anchor + 2].unbind(1))
    out = []
    for m in range(1, steps + 1):
        n = len(h_in)
        s = module(torch.stack(h_in, 1), torch.stack(e_in, 1), (cos[:n], sin[:n]))[:, -1]
        out.append(s)
        if m < steps:
            h_in.append(module.shared_head.norm(s) if post else s)
            e_in.append(x[:, anchor + m + 1])
    return out


@pytest.mark.parametrize("mtp_input,kv_heads", [("post-norm", 4), ("pre-norm", 4), ("post-norm", 2)])
def test_unrolled_steps_equal_the_module_rerun_as_drafted(mtp_input, kv_heads):
    model = build(mtp_input, unroll=3, n_kv_heads=kv_heads)
    idx = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, steps = model.hidden_states(idx, unroll=3)
        assert [s.shape[1] for s in steps] == [11, 10, 9]
        for anchor in (0, 4, 8):
            for m, want in enumerate(rerun_as_drafted(model, idx, anchor, 3), 1):
                torch.testing.assert_close(steps[m - 1][:, anchor], want, atol=1e-5, rtol=1e-5)
        # a control: step 2 is not what the module makes from trunk states alone (the plain depth-1 pass)
        _, plain = model.hidden_states(idx)
        torch.testing.assert_close(steps[0], plain[0])
        assert (steps[1][:, 4] - plain[0][:, 5]).abs().max() > 1e-2


def test_training_loss_has_one_term_per_step_aligned_like_depth_k():
    model = build("post-norm", unroll=3)
    idx = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    targets = torch.roll(idx, -1, 1)
    out = model(idx, targets, lam=0.3)
    assert len(out.loss_extra) == 3 == model.n_losses
    with torch.no_grad():
        _, steps = model.hidden_states(idx, unroll=3)
        for k, s in enumerate(steps, 1):
            logits = model.extra_logits(k, s)
            torch.testing.assert_close(out.loss_extra[k - 1], L.offset_loss(logits, targets, k))
    torch.testing.assert_close(out.loss, out.loss_main + 0.1 * torch.stack(out.loss_extra).sum())
    out.loss.backward()  # the later steps' losses reach the module through its own earlier states
    assert model.mtp[0].eh_proj.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("mtp", [dict(objective="sequential", depth=2, unroll=3), dict(objective="parallel", unroll=2),
                                 dict(objective="sequential", depth=1, unroll=0)])
def test_unroll_is_refused_where_it_means_nothing(mtp):
    with pytest.raises(UserError, match="unroll"):
        MTPConfig(**mtp).validate()
