"""Export: the trunk alone, loadable by transformers with no code of ours, logits unchanged."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from mtp_cli.model import hf
from mtp_cli.model.checkpoint import load_run


@pytest.fixture(scope="module")
def exports(tiny_runs, tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    return {name: hf.export_run(run, root / name) for name, run in tiny_runs.items()}


@pytest.mark.parametrize("objective", ["ntp", "sequential", "parallel"])
def test_export_loads_in_transformers_with_equal_logits(objective, tiny_runs, exports):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = load_run(tiny_runs[objective])
    out = exports[objective]
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert tok("def f(x):\n").input_ids == run.tokenizer("def f(x):\n").input_ids
    assert model.config.num_hidden_layers == run.model.trunk.n_layers
    idx = torch.randint(0, len(run.tokenizer), (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = run.model.trunk(idx)
        theirs = model(idx).logits
    assert theirs.dtype == torch.float32
    assert (ours - theirs).abs().max().item() <= 1e-4


@pytest.mark.parametrize("objective", ["sequential", "parallel"])
def test_export_has_no_mtp_tensor(objective, tiny_runs, exports):
    run = load_run(tiny_runs[objective])
    with safe_open(exports[objective] / "model.safetensors", "pt") as f:
        names = list(f.keys())
    n_params = 0
    with safe_open(exports[objective] / "model.safetensors", "pt") as f:
        n_params = sum(f.get_tensor(n).numel() for n in names)
    assert not [n for n in names if "mtp" in n or "eh_proj" in n or "shared_head" in n]
    assert all(n.startswith("model.") or n == "lm_head.weight" for n in names)
    assert n_params == run.model.param_counts()["trunk"]
    info = json.loads((exports[objective] / hf.EXPORT_INFO).read_text())
    assert info["mtp_params_discarded"] == run.model.param_counts()["mtp"] > 0


def test_export_config_and_generation_config(tiny_runs, exports):
    cfg = json.loads((exports["ntp"] / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["tie_word_embeddings"] is True
    assert cfg["rope_parameters"]["rope_theta"] == 10000.0
    gen = json.loads((exports["ntp"] / "generation_config.json").read_text())
    run = load_run(tiny_runs["ntp"])
    assert gen["eos_token_id"] == run.tokenizer.eos_token_id
    assert (exports["ntp"] / "tokenizer.json").is_file()


def test_untied_export_roundtrip(tiny_runs):
    """An untied trunk keeps its own lm_head."""
    from helpers import tiny_model_config
    from transformers import LlamaForCausalLM

    from mtp_cli.model.trunk import Trunk, init_weights

    torch.manual_seed(0)
    trunk = Trunk(tiny_model_config(tie_embeddings=False, n_kv_heads=2))
    init_weights(trunk, 0.1)
    tok = load_run(tiny_runs["ntp"]).tokenizer
    model = hf.trunk_to_hf(trunk, tok)
    assert isinstance(model, LlamaForCausalLM)
    assert not model.config.tie_word_embeddings
    idx = torch.randint(0, 512, (1, 30))
    with torch.no_grad():
        assert (trunk.eval()(idx) - model(idx).logits).abs().max().item() <= 1e-4
