"""`mtp export --with-mtp` against transformers' own MTP decoding (`MtpModel`, `generate(use_mtp=True)`):
the export loads as the trunk alone, transformers loads our module with no missing or unexpected key, and
its self-speculative decoding gives our greedy text with our drafts, step by step. A corrupted `eh_proj` in
the export changes the drafts (the control); what transformers cannot express is refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import REPO, run_cli, tiny_recipe
from safetensors.torch import load_file, save_file

from mtp_cli.base.errors import UserError
from mtp_cli.base.run_files import EXPORT_INFO
from mtp_cli.config.recipe import MTPConfig
from mtp_cli.decode.generate import generate
from mtp_cli.decode.speculative import SpecStats, make_drafter, speculative_generate
from mtp_cli.model import MTPModel
from mtp_cli.model.checkpoint import load_run
from mtp_cli.model.hf import export_run, load_export
from mtp_cli.model.hf_mtp import check_exportable, enable_mtp

TEXTS = ["def wrap(text, width=70):\n    ", "import string\n\nclass Template:\n", "    for i in range(len(a)):\n"]
NEW = 16


@pytest.fixture(scope="module")
def d1_runs(tmp_path_factory):
    """One sequential D=1 module on the tiny trunk: trained 80 steps (its drafts are mostly accepted) and
    trained 1 step (near its random start: varied text, drafts mostly rejected)."""
    from mtp_cli.train.loop import train

    root = tmp_path_factory.mktemp("hf-mtp")
    runs = {}
    for name, steps in (("trained", 80), ("untrained", 1)):
        train(tiny_recipe("sequential", steps=steps, depth=1, lambda_=0.3), root / name, show_progress=False)
        export_run(root / name, export_of(root / name), with_mtp=True)
        runs[name] = root / name
    return runs


def export_of(run):
    return run.parent / f"{run.name}-export"  # beside the run: only a plain export goes inside it


def hf_model(export):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model, info = AutoModelForCausalLM.from_pretrained(export, output_loading_info=True)
    model.generation_config.eos_token_id = None  # every prompt runs to its token budget, as ours below
    return model, info


def hf_steps(model, prompt: list[int], new: int, monkeypatch) -> tuple[list[int], list[tuple[list[int], int]]]:
    """transformers' generate(use_mtp=True), greedy: the new tokens, and each drafting step's (drafts, accepted)."""
    from transformers.generation import candidate_generator as cg

    steps, pending = [], []
    get, update = cg.MTPCandidateGenerator.get_candidates, cg.MTPCandidateGenerator.update_candidate_strategy

    def get_candidates(self, input_ids, *args, **kwargs):
        out = get(self, input_ids, *args, **kwargs)
        pending.append(out[0][0, input_ids.shape[1]:].tolist())
        return out

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        drafts = pending.pop()
        if drafts:  # the first call only lets the main model prefill
            steps.append((drafts, int(num_matches)))
        return update(self, input_ids, scores, num_matches)

    monkeypatch.setattr(cg.MTPCandidateGenerator, "get_candidates", get_candidates)
    monkeypatch.setattr(cg.MTPCandidateGenerator, "update_candidate_strategy", update_candidate_strategy)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, use_mtp=True, do_sample=False, max_new_tokens=new, min_new_tokens=new)
    monkeypatch.undo()
    return out[0, len(prompt):].tolist(), steps


def our_steps(model, prompt: list[int], new: int) -> tuple[list[int], list[tuple[list[int], int]]]:
    """Our speculative decoding over the full vocabulary, step by step (the unfused loop, whose drafts the
    fused one equals: tests/test_speculative.py)."""
    drafter, drafts, counts = make_drafter(model), [], []
    propose = drafter.propose

    def recording(*args, **kwargs):
        d, q = propose(*args, **kwargs)
        drafts.append(d[0].tolist())
        return d, q

    class Counts(SpecStats):
        def record(self, n):
            counts.append(int(n[0]))
            super().record(n)

    drafter.propose = recording
    out = speculative_generate(drafter, [prompt], new, stats=Counts(1), fused=False)[0]
    return out, list(zip(drafts, counts, strict=True))


def test_the_export_loads_as_the_trunk_and_transformers_loads_the_module(d1_runs):
    from transformers.modeling_layers import MtpModel

    run = load_run(d1_runs["trained"])
    export = export_of(d1_runs["trained"])
    model, info = hf_model(export)
    n = run.model.trunk.n_layers
    module_keys = {f"model.layers.{n}.{k.removeprefix('block.')}" for k in run.model.mtp[0].state_dict()}
    assert not info["missing_keys"] and set(info["unexpected_keys"]) == module_keys  # the notice, nothing loaded
    assert model.config.num_mtp_layers == 1
    x = torch.randint(0, run.recipe.model.vocab_size, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, run.model.trunk(x), rtol=1e-4, atol=1e-4)
        trunk, _ = load_export(export)  # our own loader reads past the MTP layer
        torch.testing.assert_close(trunk(x), run.model.trunk(x), rtol=0, atol=0)
    enable_mtp(model)
    mtp = MtpModel.from_pretrained(model)  # raises on any missing MTP weight
    layer, ours = mtp.layers[0], run.model.mtp[0]
    for theirs, mine in ((layer.enorm, ours.enorm), (layer.hnorm, ours.hnorm), (layer.eh_proj, ours.eh_proj),
                         (layer.post_norm, ours.shared_head.norm), (layer.mtp_block, ours.block)):
        a, b = theirs.state_dict(), mine.state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    info = json.loads((export / EXPORT_INFO).read_text())
    assert info["mtp_layers"] == 1 and info["mtp_params_discarded"] == 0 and info["mtp_differences"] == []


@pytest.mark.parametrize("name", ["trained", "untrained"])
def test_transformers_mtp_decoding_is_ours_step_by_step(d1_runs, name, monkeypatch):
    run = load_run(d1_runs[name])
    model, _ = hf_model(export_of(d1_runs[name]))
    enable_mtp(model)
    accepted = []
    for text in TEXTS:
        prompt = run.tokenizer(text)["input_ids"]
        greedy = generate(run.model.trunk, [prompt], NEW)[0]
        theirs, _ = hf_steps(model, prompt, NEW, monkeypatch)
        ours, steps = our_steps(run.model, prompt, NEW)
        assert theirs == ours == greedy
        _, their_steps = hf_steps(model, prompt, NEW + 4, monkeypatch)  # its first steps are never cut by the budget
        assert their_steps[: len(steps)] == steps
        accepted.append(sum(n for _, n in steps))
    if name == "trained":
        assert sum(accepted) > 0, accepted  # the comparison covers accepted drafts ...
    else:
        assert sum(accepted) < len(TEXTS) * NEW // 2, accepted  # ... and rejected ones


def test_a_corrupted_eh_proj_changes_transformers_drafts(d1_runs, tmp_path, monkeypatch):
    """Control: the same export with eh_proj perturbed still decodes losslessly, but drafts differently."""
    import shutil

    run = load_run(d1_runs["trained"])
    export = tmp_path / "corrupted"
    shutil.copytree(export_of(d1_runs["trained"]), export)
    weights = load_file(export / "model.safetensors")
    key = f"model.layers.{run.model.trunk.n_layers}.eh_proj.weight"
    weights[key] = weights[key] + torch.randn(weights[key].shape, generator=torch.Generator().manual_seed(0))
    save_file(weights, export / "model.safetensors", metadata={"format": "pt"})
    model, _ = hf_model(export)
    enable_mtp(model)
    differ = 0
    for text in TEXTS:
        prompt = run.tokenizer(text)["input_ids"]
        theirs, their_steps = hf_steps(model, prompt, NEW + 4, monkeypatch)
        ours, steps = our_steps(run.model, prompt, NEW)
        assert theirs[:NEW] == ours  # greedy output is the trunk's whatever the drafts
        differ += their_steps[: len(steps)] != steps
    assert differ >= 2


def test_what_transformers_cannot_express_is_refused(tiny_runs, tmp_path):
    for name, why in (("parallel", "parallel heads"), ("sequential", "this run has 2")):
        done = run_cli("export", tiny_runs[name], "--with-mtp", "--out", tmp_path / name)
        assert done.returncode == 2, done.stderr
        assert why in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert not (tmp_path / name).exists()
    cfg = tiny_recipe("sequential").model
    with pytest.raises(UserError, match="before its final norm"):
        check_exportable(MTPModel(cfg, MTPConfig("sequential", depth=1, mtp_input="pre-norm")))
    (difference,) = check_exportable(MTPModel(cfg, MTPConfig("sequential", depth=1, draft_vocab=64)))
    assert "64 most frequent tokens" in difference
    assert check_exportable(MTPModel(cfg, MTPConfig("sequential", depth=1))) == []


def test_the_cli_exports_the_module(d1_runs, tmp_path):
    done = run_cli("export", d1_runs["untrained"], "--with-mtp", "--out", tmp_path / "e", cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "e" / "config.json").read_text())["num_mtp_layers"] == 1
    plain = run_cli("export", d1_runs["untrained"], "--out", tmp_path / "plain", cwd=REPO)
    assert plain.returncode == 0 and "num_mtp_layers" not in json.loads((tmp_path / "plain" / "config.json").read_text())
