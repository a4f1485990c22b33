"""Self-speculative decoding: lossless against plain greedy, drafts aligned with training, rollback
exact, counters as vLLM defines them, and speculative sampling's output distribution."""

from __future__ import annotations

import pytest
import torch
from helpers import OracleDrafter, chi_square_pvalue, first_two_token_law

from mtp_cli.base.errors import UserError
from mtp_cli.corpus import token_data as corpus
from mtp_cli.decode.engine import engine_for
from mtp_cli.decode.generate import generate, prefill, probs_from_logits
from mtp_cli.decode.speculative import FusedGreedyStep, SpecStats, accept, make_drafter, speculative_generate
from mtp_cli.model.checkpoint import load_run
from mtp_cli.model.trunk import apply_rope

TEXTS = ["def split(s, sep=None):\n    ", "import os\n", "class Template:\n    \"\"\"A string class for",
         "    return '\\n'.join(lines)\n\ndef dedent(text):\n    "]


@pytest.fixture(scope="module")
def runs(tiny_runs):
    return {name: load_run(path) for name, path in tiny_runs.items()}


def encode(run, texts=TEXTS):
    return [run.tokenizer.encode(t) for t in texts]


@pytest.mark.parametrize("objective,draft_len", [("sequential", 1), ("sequential", 2), ("sequential", 4),
                                                 ("parallel", 1), ("parallel", 2)])
def test_greedy_is_lossless(runs, objective, draft_len):
    run = runs[objective]
    prompts = encode(run)  # ragged lengths, one batch
    expected = generate(run.model.trunk, prompts, 40)
    stats = SpecStats(draft_len)
    assert speculative_generate(make_drafter(run.model, draft_len), prompts, 40, stats=stats) == expected
    assert speculative_generate(make_drafter(run.model, draft_len), prompts[:1], 40) == expected[:1]
    assert stats.steps > 0 and 0 <= stats.accepted <= stats.drafted


def test_lossless_with_stop_and_eos(runs):
    run = runs["sequential"]
    prompts = encode(run)
    eos = run.tokenizer.encode("\n")[0]  # a frequent token as EOS: rows finish at different steps
    seen = {}

    def stop(i, ids):
        seen.setdefault(i, []).append(len(ids))
        return len(ids) >= 5 + 3 * i

    expected = generate(run.model.trunk, prompts, 30, stop=stop, eos_id=eos)
    calls_plain, seen = seen, {}
    assert speculative_generate(make_drafter(run.model, 3), prompts, 30, stop=stop, eos_id=eos) == expected
    assert seen == calls_plain  # the stop function sees the same calls, token by token


@pytest.mark.parametrize("draft_len", [1, 3])
def test_oracle_draft_accepts_everything(runs, draft_len):
    run = runs["ntp"]
    prompts = encode(run)
    reference = generate(run.model.trunk, prompts, 30 + draft_len + 1)
    drafter = OracleDrafter(engine_for(run.model.trunk), reference, [len(p) for p in prompts], draft_len,
                            run.recipe.model.vocab_size)
    stats = SpecStats(draft_len)
    out = speculative_generate(drafter, prompts, 30, stats=stats)
    assert out == [r[:30] for r in reference]
    assert stats.acceptance_rate == 1.0
    assert stats.mean_acceptance_length == draft_len + 1
    assert stats.per_position_acceptance == [1.0] * draft_len


def test_always_wrong_draft_is_still_exact(runs):
    run = runs["ntp"]
    prompts = encode(run)
    reference = generate(run.model.trunk, prompts, 30 + 4)
    drafter = OracleDrafter(engine_for(run.model.trunk), reference, [len(p) for p in prompts], 3,
                            run.recipe.model.vocab_size, wrong=True)
    stats = SpecStats(3)
    assert speculative_generate(drafter, prompts, 30, stats=stats) == [r[:30] for r in reference]
    assert stats.accepted == 0 and stats.mean_acceptance_length == 1.0
    assert stats.steps == sum(30 - 1 for _ in prompts)  # one token per step after the prefill's


def test_rollback_matches_cache_built_without_rejected_tokens(runs):
    trunk = runs["ntp"].model.trunk
    engine = engine_for(trunk)
    prompts = encode(runs["ntp"])[:2]
    cache, _, _, _ = prefill(engine, prompts, 64)
    lengths = cache.lengths.clone()
    drafted = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    keep = torch.tensor([1, 3])  # row 0 keeps 1 token, row 1 keeps 3
    with torch.no_grad():
        engine.forward(drafted, cache)
        cache.rollback(lengths + keep)
        engine.forward(torch.tensor([[1], [2]]), cache)
        kept = [p + drafted[i, : keep[i]].tolist() for i, p in enumerate(prompts)]
        fresh, _, _, _ = prefill(engine, kept, 64)
        engine.forward(torch.tensor([[1], [2]]), fresh)
    assert torch.equal(cache.lengths, fresh.lengths)
    for i, n in enumerate(fresh.lengths.tolist()):
        for layer in range(trunk.n_layers):
            torch.testing.assert_close(cache.k[layer][i, :, :n], fresh.k[layer][i, :, :n], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(cache.v[layer][i, :, :n], fresh.v[layer][i, :, :n], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("objective,k", [("sequential", 2), ("parallel", 2)])
def test_first_drafts_match_training_alignment(runs, objective, k):
    """The drafts equal the argmax of `MTPModel.all_logits` (the training forward) at the last position."""
    model = runs[objective].model
    prompt = encode(runs[objective])[0]
    L = len(prompt)
    drafter = make_drafter(model, k).reserve(1, 64)
    with torch.no_grad():
        cache, logits, hidden, shared = prefill(engine_for(model.trunk, model), [prompt], 64)
        pending = int(logits.argmax(-1))
        seq = torch.zeros(1, 64, dtype=torch.long)
        seq[0, : L + 1] = torch.tensor(prompt + [pending])
        drafter.commit(torch.zeros(1, dtype=torch.long), cache.lengths.clone(), hidden, shared)
        drafts, _ = drafter.propose(seq, cache.lengths.clone(), 0.0, 1.0, None)
        ref = model.all_logits(torch.tensor([prompt + [pending] + drafts[0].tolist()]))
    for d in range(k):
        assert int(drafts[0, d]) == int(ref[d + 1][0, L - 1].argmax())


@pytest.mark.parametrize("k", [3, 1])
def test_sequential_module_caches_hold_training_states(runs, k):
    """After a whole run, each module's KV cache (its exact region) equals the states the training
    forward computes on the committed sequence. k = 1 runs the fused loop (`FusedGreedyStep`), whose
    module window is the verification window: every position the trunk has fed is exact."""
    model = runs["sequential"].model
    trunk, cfg = model.trunk, model.cfg
    prompt = encode(runs["sequential"])[2]
    drafter = make_drafter(model, k).reserve(1, 128)
    out = speculative_generate(drafter, [prompt], 40)[0]
    exact = int(drafter.exact[0]) if k > 1 else len(prompt) + len(out) - 1
    idx = torch.tensor([prompt + out])
    with torch.no_grad():
        x = trunk.embed_tokens(idx)
        rope = trunk.rope(idx.shape[1], idx.device, x.dtype)
        h = trunk.norm(trunk.run_layers(x, 0, trunk.n_layers, rope))
        for d, module in enumerate(model.mtp, 1):
            n = idx.shape[1] - d
            cos, sin = rope[0][:n], rope[1][:n]
            block_in = module.eh_proj(torch.cat([module.enorm(x[:, d:]), module.hnorm(h[:, :n])], -1))
            attn = module.block.self_attn
            normed = module.block.input_layernorm(block_in)
            ref_k = apply_rope(attn.k_proj(normed).view(1, n, cfg.kv_heads, cfg.head_dim), cos, sin)
            ref_v = attn.v_proj(normed).view(1, n, cfg.kv_heads, cfg.head_dim)
            h = module(h[:, :n], x[:, d:], (cos, sin))
            if d > drafter.depth:
                break
            got_k = drafter.caches[d - 1].k[0][0, :, :exact].transpose(0, 1)
            got_v = drafter.caches[d - 1].v[0][0, :, :exact].transpose(0, 1)
            torch.testing.assert_close(got_k, ref_k[0, :exact], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(got_v, ref_v[0, :exact], rtol=1e-4, atol=1e-4)
    assert exact >= len(prompt) + len(out) - 6  # the last propose ran at most k+1 tokens before the end


@pytest.mark.parametrize("objective,k", [("sequential", 1), ("parallel", 2)])
def test_fused_step_equals_verify_then_draft(runs, objective, k):
    """Step by step, on drafts forced right or wrong in a pattern: one `FusedGreedyStep` call gives the
    acceptance, the trunk's token and the next drafts that verifying (`engine.step` + `accept`) and then
    drafting (`commit` + `propose`) give, and leaves the same exact states in the module caches."""
    model = _noised(runs[objective].model, trunk=True)  # the tiny runs repeat one token, which any position drafts
    engine = engine_for(model.trunk, model)
    prompt, L, vocab_size = encode(runs[objective])[1], len(encode(runs[objective])[1]), model.cfg.vocab_size
    ref = generate(model.trunk, [prompt], 64)[0]

    def start():
        cache, logits, hidden, shared = prefill(engine, [prompt], 96)
        drafter = make_drafter(model, k).reserve(1, 96 + 2 * k + 2)
        seq = torch.zeros(1, 96 + k + 2, dtype=torch.long)
        seq[0, : L + 1] = torch.tensor(prompt + [int(logits.argmax(-1))])
        drafter.commit(torch.zeros(1, dtype=torch.long), cache.lengths.clone(), hidden, shared)
        return cache, drafter, seq

    (cache_f, drafter_f, seq_f), (cache_s, drafter_s, seq), rejected = start(), start(), 0
    step = FusedGreedyStep(drafter_f)
    with torch.no_grad():
        drafter_f.propose(seq_f, cache_f.lengths.clone(), 0.0, 1.0, None)
        drafter_s.propose(seq, cache_s.lengths.clone(), 0.0, 1.0, None)
        for i in range(14):
            c = int(cache_s.lengths[0])
            drafts = torch.tensor([ref[c - L + 1: c - L + 1 + k]])
            drafts[0, (i % (k + 2)) :] += 1  # wrong from draft i mod (k+2) on: every acceptance count occurs
            drafts %= vocab_size
            tokens = torch.cat([seq[:, c:c + 1], drafts], 1)
            out = engine.fused_step(("test", objective, k), lambda: step, tokens, cache_f, drafter_f.caches)
            n, nxt, next_drafts = out[0, 0], out[0, 1], out[:, 2:]
            cache_f.rollback(cache_f.lengths + n + 1)
            logits, hidden, shared = engine.step(tokens, cache_s)
            n_s, nxt_s = accept(drafts, None, logits)
            seq[0, c + 1: c + 2 + k] = torch.cat([drafts[0], nxt_s]).index_put_((n_s,), nxt_s)
            drafter_s.commit(cache_s.lengths - k - 1, n_s + 1, hidden, shared)
            cache_s.rollback(torch.tensor([c]) + n_s + 1)
            expected, _ = drafter_s.propose(seq, cache_s.lengths.clone(), 0.0, 1.0, None)
            assert (int(n), int(nxt), next_drafts.tolist()) == (int(n_s), int(nxt_s), expected.tolist())
            assert torch.equal(cache_f.lengths, cache_s.lengths)
            rejected += int(n) < k
            exact = int(cache_s.lengths[0])  # every position the trunk has fed
            for f, s_ in zip(drafter_f.caches, drafter_s.caches):
                torch.testing.assert_close(f.k[0][..., :exact, :], s_.k[0][..., :exact, :], rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(f.v[0][..., :exact, :], s_.v[0][..., :exact, :], rtol=1e-5, atol=1e-5)
    assert 0 < rejected < 14


def test_fused_step_refuses_a_batch(runs):
    """The fused step is one row's: a batch gets a plain error, not a shape failure deep in a trace."""
    model = runs["sequential"].model
    engine = engine_for(model.trunk, model)
    prompt = encode(runs["sequential"])[1]
    cache, *_ = prefill(engine, [prompt, prompt], 64)
    drafter = make_drafter(model, 1).reserve(2, 70)
    with pytest.raises(ValueError, match="one row"):
        engine.fused_step(("test-batch",), lambda: FusedGreedyStep(drafter), torch.zeros(2, 2, dtype=torch.long),
                          cache, drafter.caches)


def test_stats_follow_vllm_definitions():
    stats = SpecStats(3)
    stats.record(torch.tensor([0, 3]))
    stats.record([1, 2])  # the fused loop's Python ints count the same
    assert (stats.drafted, stats.accepted, stats.steps) == (12, 6, 4)
    assert stats.acceptance_rate == 0.5
    assert stats.mean_acceptance_length == 2.5
    assert stats.per_position_acceptance == [0.75, 0.5, 0.25]


def test_accept_rule_greedy():
    logits = torch.zeros(2, 3, 5)
    logits[0, 0, 1] = logits[0, 1, 2] = logits[0, 2, 3] = 1  # trunk says 1, 2, 3
    logits[1, 0, 4] = logits[1, 1, 0] = logits[1, 2, 0] = 1  # trunk says 4, ...
    n, nxt = accept(torch.tensor([[1, 2], [1, 0]]), None, logits)
    assert n.tolist() == [2, 0] and nxt.tolist() == [3, 4]


def test_draft_len_is_checked(runs):
    with pytest.raises(UserError, match="no MTP modules"):
        speculative_generate(make_drafter(runs["ntp"].model), [[1, 2]], 4)
    with pytest.raises(UserError, match="at most 2"):
        speculative_generate(make_drafter(runs["parallel"].model, 3), [[1, 2]], 4)
    with pytest.raises(UserError, match=">= 1"):
        speculative_generate(make_drafter(runs["sequential"].model, 0), [[1, 2]], 4)


@pytest.mark.parametrize("objective", ["sequential", "parallel"])
def test_speculative_sampling_preserves_the_distribution(runs, objective):
    model = runs[objective].model
    prompt = encode(runs[objective])[0]
    temperature, n = 0.8, 4000
    p1, p2 = first_two_token_law(model.trunk, prompt, temperature)
    stats = SpecStats(2)
    out = speculative_generate(make_drafter(model, 2), [prompt] * n, 2, temperature=temperature,
                               generator=torch.Generator().manual_seed(0), stats=stats)
    assert min(stats.accepted, stats.drafted - stats.accepted) > 100  # both acceptance and the residual path ran
    V = p1.shape[0]
    c1 = torch.bincount(torch.tensor([o[0] for o in out]), minlength=V).double()
    c2 = torch.bincount(torch.tensor([o[1] for o in out]), minlength=V).double()
    assert chi_square_pvalue(c1, p1) > 1e-3
    assert chi_square_pvalue(c2, p2) > 1e-3


def test_distribution_test_has_power(runs):
    """Sampling straight from the drafts (accepting all of them) fails the same test."""
    model = runs["sequential"].model
    prompt = encode(runs["sequential"])[0]
    temperature, n = 0.8, 4000
    _, p2 = first_two_token_law(model.trunk, prompt, temperature)
    drafter = make_drafter(model, 1).reserve(n, 64)
    with torch.no_grad():
        cache, logits, hidden, shared = prefill(engine_for(model.trunk, model), [prompt] * n, 64)
        g = torch.Generator().manual_seed(0)
        first = torch.multinomial(probs_from_logits(logits, temperature), 1, generator=g).squeeze(-1)
        seq = torch.zeros(n, 64, dtype=torch.long)
        seq[:, : len(prompt)] = torch.tensor(prompt)
        seq[:, len(prompt)] = first
        drafter.commit(torch.zeros(n, dtype=torch.long), cache.lengths.clone(), hidden, shared)
        drafts, _ = drafter.propose(seq, cache.lengths.clone(), temperature, 1.0, g)
    c2 = torch.bincount(drafts[:, 0], minlength=p2.shape[0]).double()
    assert chi_square_pvalue(c2, p2) < 1e-6


# ---- the draft vocabulary (decode/draft_vocab.py) ---------------------------------------------------
def _small_vocab(run, size=64):
    from mtp_cli.decode.draft_vocab import run_counts, top_tokens

    return top_tokens(run_counts(run), size)


@pytest.mark.parametrize("objective,draft_len", [("sequential", 1), ("sequential", 3), ("parallel", 2)])
def test_draft_vocabulary_is_lossless_and_only_drafts_from_it(runs, objective, draft_len):
    run = runs[objective]
    prompts = encode(run)
    vocab = _small_vocab(run)
    expected = generate(run.model.trunk, prompts, 40)
    assert speculative_generate(make_drafter(run.model, draft_len, draft_vocab=vocab), prompts, 40) == expected
    drafter = make_drafter(run.model, draft_len, draft_vocab=vocab).reserve(1, 64)
    with torch.no_grad():
        cache, logits, hidden, shared = prefill(engine_for(run.model.trunk, run.model), prompts[:1], 64)
        seq = torch.zeros(1, 64, dtype=torch.long)
        seq[0, : len(prompts[0])] = torch.tensor(prompts[0])
        seq[0, len(prompts[0])] = logits.argmax(-1)
        drafter.commit(torch.zeros(1, dtype=torch.long), cache.lengths.clone(), hidden, shared)
        drafts, _ = drafter.propose(seq, cache.lengths.clone(), 0.0, 1.0, None)
        full = make_drafter(run.model, draft_len).reserve(1, 64)
        full.commit(torch.zeros(1, dtype=torch.long), cache.lengths.clone(), hidden, shared)
        first_full = full.propose(seq.clone(), cache.lengths.clone(), 0.0, 1.0, None)[0][0, 0]
    assert set(drafts.flatten().tolist()) <= set(vocab.tolist())
    if int(first_full) in set(vocab.tolist()):  # the subset's argmax is the full argmax when it lies inside
        assert int(drafts[0, 0]) == int(first_full)


def test_modules_trained_over_a_draft_vocabulary_draft_from_the_same_one(tmp_path, monkeypatch):
    """mtp.draft_vocab = N: training computes the module's loss over the N most frequent training tokens,
    and specbench's default draft vocabulary is those same N tokens (taken from the stored counts)."""
    from helpers import tiny_recipe

    from mtp_cli.decode.draft_vocab import count_tokens, draft_vocabulary, top_tokens
    from mtp_cli.model import MTPModel
    from mtp_cli.train.loop import train

    trained_over = []
    real = MTPModel.train_extra_over
    monkeypatch.setattr(MTPModel, "train_extra_over", lambda self, ids: (trained_over.append(ids), real(self, ids))[1])
    recipe = tiny_recipe("sequential", steps=4, depth=1)
    recipe.mtp.draft_vocab = 48
    train(recipe, tmp_path / "run", show_progress=False)
    run = load_run(tmp_path / "run")
    expected = top_tokens(count_tokens(corpus.prepare_for(run.recipe).train, run.recipe.model.vocab_size), 48)
    assert len(trained_over) == 1 and torch.equal(trained_over[0], expected)
    ids, info = draft_vocabulary(run, None)
    assert torch.equal(ids, expected) and info["size"] == 48
    assert draft_vocabulary(run, 0)[0] is None  # an explicit size still wins


def test_sampling_with_a_draft_vocabulary_preserves_the_distribution(runs):
    model = runs["sequential"].model
    prompt = encode(runs["sequential"])[0]
    temperature, n = 0.8, 4000
    p1, p2 = first_two_token_law(model.trunk, prompt, temperature)
    stats = SpecStats(2)
    out = speculative_generate(make_drafter(model, 2, draft_vocab=_small_vocab(runs["sequential"])), [prompt] * n, 2,
                               temperature=temperature, stats=stats, generator=torch.Generator().manual_seed(1))
    assert min(stats.accepted, stats.drafted - stats.accepted) > 100
    V = p1.shape[0]
    assert chi_square_pvalue(torch.bincount(torch.tensor([o[0] for o in out]), minlength=V).double(), p1) > 1e-3
    assert chi_square_pvalue(torch.bincount(torch.tensor([o[1] for o in out]), minlength=V).double(), p2) > 1e-3


def test_top_tokens_and_coverage():
    from mtp_cli.decode.draft_vocab import count_tokens, coverage, top_tokens

    counts = count_tokens(torch.tensor([5, 5, 5, 2, 2, 7, 9, 9, 9, 9]).numpy(), 12)
    assert counts.tolist() == [0, 0, 2, 0, 0, 3, 0, 1, 0, 4, 0, 0]
    ids = top_tokens(counts, 3)
    assert ids.tolist() == [2, 5, 9]  # ascending ids of the three most frequent
    assert coverage(counts, ids) == 0.9
    assert top_tokens(counts, 0) is None and top_tokens(counts, 12) is None and coverage(counts, None) == 1.0
    assert top_tokens(torch.tensor([1, 1, 1, 1]), 2).tolist() == [0, 1]  # ties: lower id first


def test_training_stores_token_counts(runs):
    run = runs["sequential"]
    from mtp_cli.decode.draft_vocab import count_tokens

    assert run.token_counts is not None
    assert torch.equal(run.token_counts, count_tokens(corpus.prepare_for(run.recipe).train, run.recipe.model.vocab_size))


@pytest.mark.parametrize("objective,draft_len,vocab", [("sequential", 1, False), ("parallel", 1, False),
                                                       ("parallel", 2, False), ("sequential", 1, True),
                                                       ("parallel", 2, True)])
def test_fused_verify_and_draft_matches_the_two_call_loop(runs, objective, draft_len, vocab):
    """One row, greedy: `FusedGreedyStep` (verify, accept and the next draft in one call) gives generate's
    output and drafts exactly what the two-call loop drafts (same acceptance, step by step)."""
    from mtp_cli.decode.timing import PhaseTimer

    run = runs[objective]
    draft_vocab = _small_vocab(run) if vocab else None
    model = _noised(run.model, scale=2.0)  # the tiny modules accept every draft: noise makes acceptance ragged
    accepted = drafted = 0
    for prompt in encode(run):
        expected = generate(model.trunk, [prompt], 48)
        fused, split = SpecStats(draft_len), SpecStats(draft_len)
        timer = PhaseTimer()
        drafter = make_drafter(model, draft_len, draft_vocab=draft_vocab)
        assert speculative_generate(drafter, [prompt], 48, stats=fused, timer=timer) == expected
        assert speculative_generate(drafter, [prompt], 48, stats=split, fused=False) == expected
        assert timer.count["verify_draft"] == fused.steps > 0 and timer.count["verify"] == 0
        assert fused.to_dict() == split.to_dict()
        accepted, drafted = accepted + fused.accepted, drafted + fused.drafted
    assert 0 < accepted < drafted  # both outcomes were drafted after



def _noised(model, trunk: bool = False, scale: float = 3.0):
    """A copy of the model with Gaussian noise (`scale` × each tensor's std) on its MTP modules, and on
    its trunk too when `trunk`."""
    import copy

    model = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in (model.parameters() if trunk else model.mtp.parameters()):
            if p.numel() > 1:
                p.add_(torch.randn(p.shape, generator=gen) * p.std() * scale)
    return model


@pytest.mark.parametrize("objective,width,vocab", [("sequential", 2, False), ("sequential", 4, True),
                                                   ("parallel", 3, False)])
def test_tree_of_candidates_is_lossless(runs, objective, width, vocab):
    """One row, greedy, the module's top `width` candidates verified as a tree each step: generate's output
    on every prompt, and at least the acceptance of the chain (top 1) on the same text overall."""
    run = runs[objective]
    draft_vocab = _small_vocab(run) if vocab else None
    model = _noised(run.model, trunk=True)  # the tiny runs repeat one token, which any position drafts
    tree, chain = SpecStats(1), SpecStats(1)
    for prompt in encode(run):
        expected = generate(model.trunk, [prompt], 48)
        tree_drafter = make_drafter(model, 1, draft_vocab=draft_vocab, width=width)
        assert speculative_generate(tree_drafter, [prompt], 48, stats=tree) == expected
        assert speculative_generate(make_drafter(model, 1, draft_vocab=draft_vocab), [prompt], 48, stats=chain) == expected
    assert 0 < tree.accepted < tree.steps
    assert tree.acceptance_rate > chain.acceptance_rate


def test_tree_wider_than_the_draft_vocabulary_is_a_user_error(runs):
    model = runs["sequential"].model
    with pytest.raises(UserError, match="exceeds the 4 tokens"):
        make_drafter(model, 1, draft_vocab=torch.arange(4), width=5)
    with pytest.raises(UserError, match="needs one draft per step"):
        make_drafter(model, 2, width=2)


def test_tree_as_wide_as_the_vocabulary_accepts_every_step(runs):
    """With every token a candidate the trunk's token is always among them: every step accepts one."""
    run = runs["sequential"]
    model = _noised(run.model, scale=3.0)
    stats = SpecStats(1)
    prompt = encode(run)[0]
    out = speculative_generate(make_drafter(model, 1, width=model.cfg.vocab_size), [prompt], 40, stats=stats)
    assert out == generate(model.trunk, [prompt], 40)
    assert stats.accepted == stats.steps == 20


@pytest.mark.parametrize("objective", ["sequential", "parallel"])
def test_tree_step_keeps_the_cache_of_the_committed_sequence(runs, objective):
    """Step by step, with the trunk's token placed at each candidate column in turn (and at none): the
    tree step accepts exactly when it is there, the trunk's cache then holds what a prefill of the committed
    sequence writes, and the next candidates are the top `width` a fresh drafter proposes on that sequence."""
    from mtp_cli.decode.speculative import fused_lead, fused_verify_and_draft

    width = 3
    model = _noised(runs[objective].model, trunk=True)
    engine = engine_for(model.trunk, model)
    prompt = encode(runs[objective])[1]
    ref = generate(model.trunk, [prompt], 40)[0]

    def fresh(committed):
        cache, logits, hidden, shared = prefill(engine, [committed], 80)
        drafter = make_drafter(model, 1, width=width).reserve(1, 80 + 4)
        seq = torch.zeros(1, 80 + width + 2, dtype=torch.long)
        seq[0, : len(committed) + 1] = torch.tensor(committed + [int(logits.argmax(-1))])
        drafter.commit(torch.zeros(1, dtype=torch.long), cache.lengths.clone(), hidden, shared)
        first, _ = drafter.propose(seq, cache.lengths.clone(), 0.0, 1.0, None)
        top = drafter.first_logits.topk(width, -1).indices
        return cache, drafter, seq, top

    cache, drafter, seq, _ = fresh(prompt)
    assert fused_lead(drafter) == 2
    committed, accepted = list(prompt), 0
    with torch.no_grad():
        for i in range(12):
            done = len(committed) - len(prompt)
            pending, true_next = ref[done], ref[done + 1]
            candidates = [(true_next + 1 + j) % model.cfg.vocab_size for j in range(width)]
            if i % (width + 1):
                candidates[i % (width + 1) - 1] = true_next
            tokens = torch.tensor([[pending, *candidates]])
            out = fused_verify_and_draft(drafter, tokens, cache)[0].tolist()
            n, target, nxt, nxt_candidates = out[0], out[1], out[2], out[3:]
            assert (n, target) == (int(true_next in candidates), true_next)
            cache.advance(n + 1)
            committed += [pending] + ([true_next] if n else [])
            accepted += n
            assert nxt == ref[len(committed) - len(prompt)]
            ref_cache, _, _, top = fresh(committed)
            length = int(cache.lengths[0])
            assert length == len(committed)
            for got, want in [(cache.k, ref_cache.k), (cache.v, ref_cache.v)]:
                for g, w in zip(got, want):
                    torch.testing.assert_close(g[..., :length, :], w[..., :length, :], rtol=1e-4, atol=1e-4)
            assert nxt_candidates == top[0].tolist()
    assert 0 < accepted < 12
