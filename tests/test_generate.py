"""The batched decoder the evals use: exactly plain greedy decoding, whatever the batching."""

from __future__ import annotations

import pytest
import torch
from helpers import generate_texts

from mtp_cli.decode import generate as gen
from mtp_cli.decode.batching import generate_ids
from mtp_cli.model.checkpoint import load_run

pytestmark = pytest.mark.usefixtures("single_thread")

PROMPTS = ["def split(s, sep=None):\n    ", "import os\n", "class Template:\n    \"\"\"A string class for",
           "x = [", "# Copyright 2001\n\ndef fnmatch(name, pat):\n    \"\"\"Test whether FILENAME matches PATTERN."]


@pytest.fixture(scope="module")
def model(tiny_runs):
    """(trunk, tokenizer): large random weights decode varied text, so rows stop at different steps
    (the trained tiny models only repeat spaces)."""
    from helpers import tiny_model_config

    from mtp_cli.model.trunk import Trunk, init_weights

    torch.manual_seed(0)
    trunk = Trunk(tiny_model_config()).eval()
    init_weights(trunk, 0.3)
    return trunk, load_run(tiny_runs["ntp"]).tokenizer


def naive_greedy(trunk, prompt: list[int], n: int, stop=None, eos=None) -> list[int]:
    """Greedy decoding by recomputing the whole sequence every step (no cache, no batch)."""
    seq, out = list(prompt), []
    for _ in range(n):
        tok = int(trunk(torch.tensor([seq]))[0, -1].argmax())
        out.append(tok)
        seq.append(tok)
        if tok == eos or (stop is not None and stop(0, out)):
            break
    return out


@pytest.mark.parametrize("kv_heads", [None, 2])
def test_batched_ragged_greedy_equals_naive_greedy(kv_heads, model, tiny_runs):
    from helpers import tiny_model_config

    from mtp_cli.model.trunk import Trunk, init_weights

    trunk, tok = model
    if kv_heads:  # grouped-query attention through the same cache
        torch.manual_seed(1)
        trunk = Trunk(tiny_model_config(n_kv_heads=kv_heads)).eval()
        init_weights(trunk, 0.3)
    prompts = [tok(p).input_ids for p in PROMPTS] * 2
    stops = ["e", "):"]
    stop = gen.stop_on_strings(tok, stops, tok.eos_token_id)
    with torch.no_grad():
        expected = [naive_greedy(trunk, p, 30, stop, tok.eos_token_id) for p in prompts]
    got = generate_ids(trunk, tok, prompts, 30, stops=stops, batch_size=7)
    assert got == expected
    lengths = {len(x) for x in got}
    assert len(lengths) > 2, "rows should finish at different steps (exercises compaction)"


def test_compaction_does_not_change_sampled_output(model, monkeypatch):
    """Finished rows ride along until compaction without drawing random numbers: the same samples as
    dropping every row the moment it finishes, and as never dropping it."""
    trunk, tok = model
    prompts = [tok(p).input_ids for p in PROMPTS]
    stop = gen.stop_on_strings(tok, ["e"], tok.eos_token_id)
    outs = []
    for compact_at in (1.0, 0.75, 0.0):
        monkeypatch.setattr(gen, "COMPACT_AT", compact_at)
        outs.append(gen.generate(trunk, prompts, 25, temperature=1.0, top_p=0.9, stop=stop,
                                 eos_id=tok.eos_token_id, generator=torch.Generator().manual_seed(3)))
    assert outs[0] == outs[1] == outs[2]
    assert len({len(x) for x in outs[0]}) > 1


def test_stop_check_window_sees_stops_spanning_tokens(tiny_runs):
    run = load_run(tiny_runs["ntp"])
    tok = run.tokenizer
    stop = gen.stop_on_strings(tok, ["\nclass"], tok.eos_token_id)
    ids = tok("    return x\n" + "y = 1\n" * 10 + "class A:").input_ids
    fired = [i for i in range(1, len(ids) + 1) if stop(0, ids[:i])]
    assert fired
    assert "\nclass" in tok.decode(ids[:fired[0]]) and "\nclass" not in tok.decode(ids[:fired[0] - 1])


def test_texts_come_back_in_the_callers_order(model):
    trunk, tok = model
    texts = generate_texts(trunk, tok, PROMPTS, 8, batch_size=2)
    alone = [generate_texts(trunk, tok, [p], 8)[0] for p in PROMPTS]
    assert len(set(texts)) == len(PROMPTS)
    assert texts == alone
