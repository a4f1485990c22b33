"""Guards fused features (mtp.features = "fused", EAGLE-3): the module starts as the plain one; the training
forward, the frozen trunk's stored pass and its cache give the same states; the decoder's depth-1 input equals
training's (first drafts are `all_logits`' argmax), and speculative decoding stays lossless with it, batched,
in the one-call fused loop, as a tree and at int8; transformers' layout refuses it."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from mtp_cli.base.errors import UserError
from mtp_cli.decode.engine import engine_for
from mtp_cli.decode.generate import generate, prefill
from mtp_cli.decode.speculative import SpecStats, make_drafter, speculative_generate
from mtp_cli.model import MTPModel
from mtp_cli.model.checkpoint import load_run
from mtp_cli.model.hf_mtp import check_exportable
from mtp_cli.model.mtp import feature_layers

pytestmark = pytest.mark.usefixtures("single_thread")

TEXTS = ["def split(s, sep=None):\n    ", "import os\n", "class Template:\n    \"\"\"A string class for"]


def fused_copy(model: MTPModel, scale: float = 1.0, noise: float = 0.0) -> MTPModel:
    """The trained sequential model with fused features added, `fuse` moved off its identity start by noise, and
    `noise` × each tensor's std on every other weight (the tiny runs repeat one token, which any drafter drafts)."""
    fused = MTPModel(model.cfg, dataclasses.replace(model.mtp_cfg, features="fused"))
    missing, unexpected = fused.load_state_dict(model.state_dict(), strict=False)
    assert missing == ["mtp.0.fuse.weight"] and not unexpected
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in fused.named_parameters():
            if name != "mtp.0.fuse.weight" and p.numel() > 1:
                p.add_(torch.randn(p.shape, generator=gen) * p.std() * noise)
        w = fused.mtp[0].fuse.weight
        w.add_(torch.randn(w.shape, generator=gen) * scale / math.sqrt(w.shape[1]))
    return fused.eval()


@pytest.fixture(scope="module")
def plain(tiny_runs):
    run = load_run(tiny_runs["sequential"])
    return run.model.eval(), [run.tokenizer.encode(t) for t in TEXTS]


def test_fused_module_starts_as_the_plain_one_and_reads_the_tapped_layers(plain):
    model, prompts = plain
    start = fused_copy(model, scale=0.0)
    idx = torch.tensor([prompts[0]])
    with torch.no_grad():
        for a, b in zip(model.all_logits(idx), start.all_logits(idx)):
            torch.testing.assert_close(a, b)
        moved = fused_copy(model).all_logits(idx)
    assert (moved[1] - start.all_logits(idx)[1]).abs().max() > 1e-2  # control: the taps do reach depth 1
    torch.testing.assert_close(moved[0], start.all_logits(idx)[0])  # the trunk never reads the modules
    assert start.tap_layers == feature_layers(model.trunk.n_layers) and feature_layers(30) == (2, 15)


def test_frozen_pass_stores_the_taps_and_gives_the_same_losses(plain):
    model = fused_copy(plain[0])
    model.freeze_trunk()
    idx = torch.tensor([plain[1][0]])
    x, y = idx[:, :-1], idx[:, 1:]
    with torch.no_grad():
        frozen = model.frozen_pass(x, y)
        assert frozen.taps.shape == (*x.shape, 2 * model.cfg.d_model)
        direct, stored = model(x, y), model(x, y, frozen=frozen)
        with pytest.raises(ValueError, match="taps"):
            model(x, y, frozen=dataclasses.replace(frozen, taps=None))
    torch.testing.assert_close(torch.stack(direct.loss_extra), torch.stack(stored.loss_extra))


def test_first_drafts_match_the_training_forward(plain):
    model, prompts = fused_copy(plain[0]), plain[1]
    prompt, k = prompts[0], 2
    L = len(prompt)
    drafter = make_drafter(model, k).reserve(1, 64)
    with torch.no_grad():
        cache, logits, hidden, shared = prefill(engine_for(model.trunk, model), [prompt], 64)
        assert shared.shape[-1] == 2 * model.cfg.d_model  # the engine's second output: the tapped layers
        seq = torch.zeros(1, 64, dtype=torch.long)
        seq[0, : L + 1] = torch.tensor(prompt + [int(logits.argmax(-1))])
        drafter.commit(torch.zeros(1, dtype=torch.long), cache.lengths.clone(), hidden, shared)
        drafts, _ = drafter.propose(seq, cache.lengths.clone(), 0.0, 1.0, None)
        ref = model.all_logits(torch.tensor([seq[0, : L + 1].tolist() + drafts[0].tolist()]))
    for d in range(k):
        assert int(drafts[0, d]) == int(ref[d + 1][0, L - 1].argmax())


@pytest.mark.parametrize("draft_len,width,fused_loop", [(1, 1, True), (1, 1, False), (3, 1, False), (1, 3, True)])
def test_speculative_decoding_with_fused_features_is_lossless(plain, draft_len, width, fused_loop):
    model, prompts = fused_copy(plain[0], noise=1.0), plain[1]
    stats = SpecStats(draft_len)
    for prompt in prompts:  # one row: the fused loop, or the two-call one, or a tree of candidates
        drafter = make_drafter(model, draft_len, width=width)
        assert speculative_generate(drafter, [prompt], 32, stats=stats, fused=fused_loop) == generate(model.trunk, [prompt], 32)
    assert 0 < stats.accepted < stats.drafted
    batched = speculative_generate(make_drafter(model, draft_len), prompts, 32)  # ragged rows
    assert batched == generate(model.trunk, prompts, 32)


def test_fused_features_at_int8_are_lossless_against_int8_greedy(plain):
    from mtp_cli.model.weight_format import int8_weight, use_weights

    model, prompts = fused_copy(plain[0], noise=1.0), plain[1]
    use_weights(model, "int8")
    assert int8_weight(model.mtp[0].fuse) is not None
    assert engine_for(model.trunk, model).sequential[0].w_fuse.dtype == torch.int8
    assert speculative_generate(make_drafter(model, 2), prompts, 16) == generate(model.trunk, prompts, 16)


def test_transformers_layout_and_other_objectives_refuse_fused_features(plain):
    with pytest.raises(UserError, match="fused"):
        check_exportable(fused_copy(plain[0]))
    from mtp_cli.config.recipe import MTPConfig

    with pytest.raises(UserError, match="features"):
        MTPConfig(objective="parallel", features="fused").validate()
    with pytest.raises(UserError, match="features"):
        MTPConfig(objective="sequential", features="all").validate()
