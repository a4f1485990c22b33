"""Starting from a pretrained checkpoint: tiny random Llama/Qwen2 checkpoints made with transformers
itself (tied, GQA, q/k/v biases, llama3 RoPE) load into our trunk with transformers' logits, export
back unchanged, and bad sources are one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from mtp_cli.base.errors import UserError
from mtp_cli.corpus import token_data as corpus
from mtp_cli.data import tokenizer as toklib
from mtp_cli.model import pretrained
from mtp_cli.model.trunk import rope_inv_freq

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
COMMON = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=128, rms_norm_eps=1e-6, initializer_range=0.2)
CASES = {
    "llama-tied": (LlamaForCausalLM, LlamaConfig, dict(num_key_value_heads=4, tie_word_embeddings=True)),
    "llama-gqa-untied": (LlamaForCausalLM, LlamaConfig, dict(num_key_value_heads=2, tie_word_embeddings=False)),
    "llama3-rope": (LlamaForCausalLM, LlamaConfig, dict(num_key_value_heads=2, tie_word_embeddings=True,
                                                        rope_parameters=LLAMA3_ROPE)),
    "qwen2-biased-gqa": (Qwen2ForCausalLM, Qwen2Config, dict(num_key_value_heads=2, tie_word_embeddings=False,
                                                            rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
}


def make_checkpoint(folder: Path, case: str, tokenizer_from: Path | None = None, seed: int = 0) -> Path:
    """A random checkpoint of `case` saved with save_pretrained; q/k/v biases randomised so a dropped bias shows."""
    model_cls, cfg_cls, extra = CASES[case]
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**COMMON, **extra)).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder)
    tok = toklib.load(tokenizer_from) if tokenizer_from else toklib.train_bpe(["def f(x):\n    return x + 1\n"] * 20, 290)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {case: make_checkpoint(root / case, case) for case in CASES}


def _hf_logits(folder: Path, ids: torch.Tensor) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("case", list(CASES))
def test_trunk_logits_equal_transformers(checkpoints, case):
    folder = checkpoints[case]
    trunk, tok, src = pretrained.load_trunk(folder)
    ids = torch.randint(0, 300, (2, 100), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = trunk(ids)
    ref = _hf_logits(folder, ids)
    assert ref.abs().max() > 0.5  # a real signal, not all zeros
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)
    assert src.record()["weights_sha256"] == pretrained.weights_hash(folder)



@pytest.mark.parametrize("case", list(CASES))
def test_decoder_greedy_equals_transformers_generate(checkpoints, case):
    """The decode engine lays q/k/v (and their biases) and RoPE out anew: its greedy text must equal
    transformers' own greedy `generate` on the same checkpoint."""
    from mtp_cli.decode.generate import generate

    folder = checkpoints[case]
    trunk, _tok, _src = pretrained.load_trunk(folder)
    prompts = [[5, 17, 42, 7, 99, 3], [11, 250, 8]]
    ours = generate(trunk.eval(), prompts, 24)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for prompt, got in zip(prompts, ours):
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
        assert got == out[0, len(prompt):].tolist()

def test_llama3_inverse_frequencies_match_transformers():
    cfg = LlamaConfig(**COMMON, rope_parameters=LLAMA3_ROPE)
    ref, scale = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    ours = rope_inv_freq(16, LLAMA3_ROPE["rope_theta"], {k: v for k, v in LLAMA3_ROPE.items() if k != "rope_theta"})
    assert scale == 1.0
    torch.testing.assert_close(ours, ref.float(), atol=0, rtol=1e-6)
    plain = rope_inv_freq(16, LLAMA3_ROPE["rope_theta"])
    assert not torch.allclose(plain, ours)  # the scaling does something at this context


@pytest.mark.parametrize("case", ["llama-tied", "qwen2-biased-gqa", "llama3-rope"])
def test_export_of_untrained_init_reproduces_source(checkpoints, case, tmp_path):
    """A run initialised from the source and trained 0 steps exports to a checkpoint with the source's logits."""
    from mtp_cli.config.recipe import MTPConfig, Recipe
    from mtp_cli.model import MTPModel
    from mtp_cli.model.hf import trunk_to_hf

    recipe = Recipe()
    recipe.train.init_from = str(checkpoints[case])
    src = pretrained.resolve_recipe(recipe, given=set())
    model = MTPModel(recipe.model, MTPConfig("sequential", depth=1))
    pretrained.init_model(model, src)
    hf = trunk_to_hf(model.trunk, toklib.load(checkpoints[case]))
    hf.save_pretrained(tmp_path / "export")
    ids = torch.randint(0, 300, (1, 90), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(_hf_logits(tmp_path / "export", ids), _hf_logits(checkpoints[case], ids), atol=1e-5, rtol=0)
    assert json.loads((tmp_path / "export" / "config.json").read_text())["architectures"] == \
        json.loads((checkpoints[case] / "config.json").read_text())["architectures"]


def test_modules_start_from_the_trunk(checkpoints):
    from mtp_cli.config.recipe import MTPConfig, Recipe
    from mtp_cli.model import MTPModel

    recipe = Recipe()
    recipe.train.init_from = str(checkpoints["llama-gqa-untied"])
    src = pretrained.resolve_recipe(recipe, given=set())
    for mtp in (MTPConfig("sequential", depth=2), MTPConfig("parallel", heads=3, compute_matched=False)):
        model = MTPModel(recipe.model, mtp)
        pretrained.init_model(model, src)
        last = model.trunk.layers[-1].state_dict()
        for module in model.mtp:
            block = module.block if mtp.objective == "sequential" else module
            for k, v in block.state_dict().items():
                assert torch.equal(v, last[k]), k
    with pytest.raises(UserError, match="compute_matched = false"):
        pretrained.init_model(MTPModel(recipe.model, MTPConfig("parallel", heads=2)), src)


def test_recipe_resolution(checkpoints):
    from mtp_cli.config.recipe import Recipe

    folder = checkpoints["llama-gqa-untied"]
    recipe = Recipe()
    recipe.train.init_from = str(folder)
    recipe.model.n_layers, recipe.model.context = 7, 32  # not given: the checkpoint's layers; context given: kept
    pretrained.resolve_recipe(recipe, given={"context"})
    assert (recipe.model.n_layers, recipe.model.context, recipe.model.kv_heads) == (2, 32, 2)
    assert recipe.data.tokenizer == str(folder)
    pretrained.resolve_recipe(recipe, given=None)  # a resolved recipe agrees with its source
    recipe.model.d_model = 128
    with pytest.raises(UserError, match="model.d_model = 128 contradicts"):
        pretrained.resolve_recipe(recipe, given={"d_model"})
    recipe = Recipe()
    recipe.train.init_from = str(folder)
    recipe.model.context = 4096
    with pytest.raises(UserError, match="longer than"):
        pretrained.resolve_recipe(recipe, given={"context"})


def test_the_context_is_the_shorter_of_the_default_and_the_checkpoint(checkpoints, monkeypatch):
    """Not given: min(INIT_CONTEXT, max positions), never a checkpoint's whole (possibly 8,192) context;
    given: kept, at most the checkpoint's."""
    from mtp_cli.config.recipe import Recipe, load_recipe

    assert pretrained.INIT_CONTEXT == load_recipe("quick").model.context  # "the default recipe's context"
    folder = checkpoints["llama-tied"]  # 128 positions
    for init_context, expected in ((1024, 128), (64, 64)):
        monkeypatch.setattr(pretrained, "INIT_CONTEXT", init_context)
        recipe = Recipe()
        recipe.train.init_from = str(folder)
        recipe.model.context = 100  # a recipe default, not given
        pretrained.resolve_recipe(recipe, given=set())
        assert recipe.model.context == expected
    recipe = Recipe()
    recipe.train.init_from = str(folder)
    recipe.model.context = 96
    pretrained.resolve_recipe(recipe, given={"context"})
    assert recipe.model.context == 96


def test_model_keys_set_by_a_recipe_it_extends_count_as_given(tmp_path):
    """A recipe that `extends` another keeps the [model] keys that one set: `extends = "cpu-smollm2"` trains
    at its context of 512, not at the default a recipe without one gets."""
    from mtp_cli.config.recipe import resolve_recipe_path

    (tmp_path / "base.toml").write_text("[model]\ncontext = 512\n")
    child = tmp_path / "child.toml"
    child.write_text(f'extends = "{tmp_path / "base.toml"}"\n[train]\nsteps = 3\n')
    assert pretrained.given_model_keys(child) == {"context"}
    assert pretrained.given_model_keys(child, {"d_model": 1}) == {"context", "d_model"}
    assert "context" in pretrained.given_model_keys(resolve_recipe_path("cpu-smollm2"))


def test_unsupported_and_missing_sources(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50)).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(UserError, match="GPT2LMHeadModel"):
        pretrained.read_source(tmp_path / "gpt2")
    LlamaForCausalLM(LlamaConfig(**COMMON, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0})
                     ).save_pretrained(tmp_path / "yarn")
    with pytest.raises(UserError, match="yarn"):
        pretrained.read_source(tmp_path / "yarn")
    with pytest.raises(UserError, match="no such folder"):
        pretrained.read_source(tmp_path / "nothing")


def test_bad_input_is_one_line_exit_2(checkpoints, tmp_path, capsys, monkeypatch):
    """Through the CLI entry point: a missing source, an unsupported architecture, --freeze-trunk with
    ntp, a recipe contradicting the checkpoint, and --resume with another source: one line, exit 2."""
    from helpers import cli_in_process
    from transformers import GPT2Config, GPT2LMHeadModel

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50)).save_pretrained(tmp_path / "gpt2")
    folder = checkpoints["llama-tied"]
    (tmp_path / "wide.toml").write_text("[model]\nd_model = 128\n")
    capsys.readouterr()
    cases = [
        (["train", "--init-from", "/nonexistent/model", "--steps", "1"], "/nonexistent/model"),
        (["eval", "--hf", "/nonexistent/model"], "/nonexistent/model"),
        (["eval", "--hf", tmp_path / "gpt2", "--tasks", "heldout"], "GPT2LMHeadModel"),
        (["train", "--init-from", folder, "--freeze-trunk", "--objective", "ntp", "--lr", "1e-4"], "nothing to train"),
        (["train", "--init-from", folder, "--recipe", tmp_path / "wide.toml"], "model.d_model = 128 contradicts"),
    ]
    run = tmp_path / "run"
    (run).mkdir()
    (run / "run.json").write_text(json.dumps({"recipe": {"train": {"init_from": str(folder)}}}))
    cases.append((["train", "--resume", "--out", run, "--init-from", checkpoints["llama3-rope"]], "started from"))
    for argv, needle in cases:
        code, _, err = cli_in_process(*argv, capsys=capsys)
        assert code == 2, (argv, err)
        assert len(err.strip().splitlines()) == 1 and needle in err.replace("\n", ""), (argv, err)


def _frozen_recipe(folder: Path, **data_kw):
    from helpers import TINY_FILES

    from mtp_cli.config.recipe import DataConfig, MTPConfig, Recipe, TrainConfig

    recipe = Recipe(name="posthoc", mtp=MTPConfig("sequential", depth=1),
                    data=DataConfig(**{"source": "files", "paths": list(TINY_FILES), **data_kw}),
                    train=TrainConfig(steps=6, batch_size=4, lr=1e-3, warmup=1, eval_every=6, eval_batches=1,
                                      ckpt_every=6, peak_flops=1e11, init_from=str(folder), freeze_trunk=True))
    recipe.model.context = 32
    pretrained.resolve_recipe(recipe, given={"context"})
    return recipe


@pytest.mark.parametrize("case", ["llama-tied", "qwen2-biased-gqa"])
def test_frozen_trunk_is_bit_identical_after_training(checkpoints, case, tmp_path):
    from mtp_cli.model.checkpoint import load_run
    from mtp_cli.train.loop import train

    folder = checkpoints[case]
    summary = train(_frozen_recipe(folder), tmp_path / "run", show_progress=False)
    assert summary["init_from"]["weights_sha256"] == pretrained.weights_hash(folder)
    run = load_run(tmp_path / "run")
    source, _, _ = pretrained.load_trunk(folder)
    for name, tensor in source.state_dict().items():
        assert torch.equal(run.model.trunk.state_dict()[name], tensor), name
    from mtp_cli.model import MTPModel

    start = MTPModel(run.recipe.model, run.recipe.mtp)
    pretrained.init_model(start, pretrained.read_source(folder))
    moved = [k for k, v in start.mtp.state_dict().items() if not torch.equal(v, run.model.mtp.state_dict()[k])]
    assert moved  # the modules did train


def test_bf16_trunk_pass_is_stored_in_bf16_and_read_back_the_same(checkpoints, tmp_path, monkeypatch):
    """train.trunk_dtype = "bfloat16": the frozen trunk's cached pass runs under bf16 autocast and its states are
    stored in bf16; a run reading them trains bit-identical modules to the run that stored them, and both
    differ (slightly) from the fp32 pass's, so the setting took effect."""
    from mtp_cli.model.checkpoint import load_run
    from mtp_cli.train.loop import train

    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    weights = {}
    for name, dtype in (("fp32", "float32"), ("stores", "bfloat16"), ("reads", "bfloat16")):
        recipe = _frozen_recipe(checkpoints["llama-tied"])
        recipe.mtp.draft_target = "trunk"
        recipe.train.trunk_dtype = dtype
        summary = train(recipe, tmp_path / name, show_progress=False)
        weights[name] = load_run(tmp_path / name).model.mtp.state_dict()
        if name == "reads":
            assert summary["trunk_cache"] == {"hits": 6, "misses": 0}
    stored = sorted((tmp_path / "cache").rglob("step*.pt"))
    assert len(stored) == 12  # 6 fp32 + 6 bf16 batches, under two keys
    dtypes = {torch.load(p, weights_only=True)["shared"].dtype for p in stored}
    assert dtypes == {torch.float32, torch.bfloat16}
    for key, value in weights["stores"].items():
        assert torch.equal(weights["reads"][key], value), key
    gap = max(float((weights["fp32"][k] - v).abs().max()) for k, v in weights["stores"].items())
    assert 0 < gap < 1e-2


def test_trunk_dtype_needs_a_cached_frozen_trunk():
    from mtp_cli.config.recipe import TrainConfig

    with pytest.raises(UserError, match="trunk_dtype"):
        TrainConfig(trunk_dtype="bfloat16").validate()
    with pytest.raises(UserError, match="trunk_dtype"):
        TrainConfig(trunk_dtype="float16", freeze_trunk=True).validate()


@pytest.mark.parametrize("mtp", [("sequential", {"depth": 1}), ("parallel", {"heads": 3, "compute_matched": False}),
                                 ("parallel", {"heads": 3, "compute_matched": False, "draft_target": "trunk"})])
def test_trunk_state_cache_trains_the_same_modules(checkpoints, mtp, tmp_path, monkeypatch):
    """A frozen trunk's stored states (train.trunk_cache) give the modules bit-identical weights and losses
    to running the trunk every step: on the run that stores them, and on a second run that reads them all."""
    from mtp_cli.config.recipe import MTPConfig
    from mtp_cli.model.checkpoint import load_run
    from mtp_cli.train.loop import train

    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    runs = {}
    for name, cached in (("plain", False), ("stores", True), ("reads", True)):
        recipe = _frozen_recipe(checkpoints["llama-tied"])
        recipe.mtp = MTPConfig(mtp[0], **mtp[1])
        recipe.train.trunk_cache = cached
        recipe.train.grad_accum = 2
        summary = train(recipe, tmp_path / name, show_progress=False)
        runs[name] = (summary, load_run(tmp_path / name).model.mtp.state_dict())
    assert "trunk_cache" not in runs["plain"][0]
    assert runs["stores"][0]["trunk_cache"] == {"hits": 0, "misses": 12}  # 6 steps x 2 micro-batches
    assert runs["reads"][0]["trunk_cache"] == {"hits": 12, "misses": 0}
    rows = {name: [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
            for name in runs}
    for name in ("stores", "reads"):
        for key, value in runs["plain"][1].items():
            assert torch.equal(runs[name][1][key], value), (name, key)
        for ref, row in zip(rows["plain"], rows[name]):
            assert {k: v for k, v in ref.items() if "loss" in k} == {k: v for k, v in row.items() if "loss" in k}


def test_self_distilled_data_is_the_trunks_greedy_text(checkpoints, tmp_path):
    """The self corpus is prompt + greedy continuation, as transformers' own greedy decoding writes it,
    cached under a key that carries the trunk's weights hash."""
    from helpers import TINY_FILES

    from mtp_cli.config.recipe import DataConfig
    from mtp_cli.corpus import selfdistill

    folder = checkpoints["llama-gqa-untied"]
    cfg = DataConfig(source="self", self_prompts="files", paths=list(TINY_FILES[:2]), self_samples=3,
                     self_prompt_tokens=8, self_new_tokens=12)
    docs = selfdistill.documents(cfg, str(folder), tmp_path, show_progress=False)
    assert len(docs) == 3
    tok = toklib.load(folder)
    prompts = selfdistill.prompt_ids(cfg, tok)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for doc, prompt in zip(docs, prompts):
        ids = torch.tensor([prompt])
        ref = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id)[0].tolist()
        assert doc == tok.decode(ref[:ref.index(tok.eos_token_id) + 1] if tok.eos_token_id in ref else ref,
                                 skip_special_tokens=True)
    cached = list((tmp_path / "self").glob("*.jsonl"))
    assert len(cached) == 1
    assert json.loads(cached[0].read_text().splitlines()[0])["meta"]["weights_sha256"] == pretrained.weights_hash(folder)
    other = make_checkpoint(tmp_path / "other", "llama-gqa-untied", tokenizer_from=folder, seed=5)
    selfdistill.documents(cfg, str(other), tmp_path, show_progress=False)
    assert len(list((tmp_path / "self").glob("*.jsonl"))) == 2  # other weights, another cache entry


def test_bad_combinations_are_errors(checkpoints):
    from mtp_cli.config.recipe import Recipe

    recipe = Recipe()
    recipe.train.freeze_trunk = True
    recipe.train.init_from = str(checkpoints["llama-tied"])
    with pytest.raises(UserError, match="nothing to train"):
        recipe.validate()
    recipe.train.init_from = ""
    recipe.mtp.objective = "sequential"
    with pytest.raises(UserError, match="needs --init-from"):
        recipe.validate()
    recipe.train.init_from, recipe.train.freeze_trunk = str(checkpoints["llama-tied"]), False
    recipe.mtp.draft_target = "trunk"
    with pytest.raises(UserError, match="draft_target = 'trunk' .* needs train.freeze_trunk"):
        recipe.validate()
    recipe.mtp.draft_target = "teacher"
    with pytest.raises(UserError, match="unknown mtp.draft_target 'teacher'"):
        recipe.validate()


def test_eval_hf_heldout_matches_transformers(checkpoints, tmp_path):
    """`mtp eval --hf` scores the checkpoint itself: its held-out loss is transformers' cross-entropy
    on the same validation windows."""
    from helpers import TINY_FILES

    from mtp_cli.config.recipe import EvalConfig, load_recipe
    from mtp_cli.evals.runner import hf_run, run_eval

    folder = checkpoints["qwen2-biased-gqa"]
    recipe_file = tmp_path / "r.toml"
    recipe_file.write_text(f"[model]\ncontext = 48\n[data]\nsource = 'files'\npaths = {json.dumps(TINY_FILES)}\n")
    doc = run_eval(None, EvalConfig(tasks=["heldout"], limits={"heldout": 3}), hf=str(folder), recipe=str(recipe_file),
                   json_path=tmp_path / "e.json", show_progress=False)
    assert doc["hf"]["weights_sha256"] == pretrained.weights_hash(folder) and doc["context"] == 48
    run, _ = hf_run(str(folder), str(recipe_file))
    val = corpus.prepare_for(run.recipe).val
    ids = torch.from_numpy(val[:3 * 48 + 1].astype("int64"))
    windows = torch.stack([ids[i * 48:(i + 1) * 48 + 1] for i in range(3)])
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(windows[:, :-1]).logits
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))
    assert abs(doc["results"]["heldout"]["loss"] - float(ref)) < 1e-4
    assert load_recipe("quick").model.n_layers != run.recipe.model.n_layers  # [model] is the checkpoint's


@pytest.mark.slow
def test_posthoc_ablation_end_to_end(tmp_path, monkeypatch):
    """cpu-posthoc in miniature, through `mtp ablate`: the [source] stage trains and exports an NTP run of another
    recipe, two frozen-trunk D=1 modules train from its export (self-distilled data, corpus), eval and specbench
    run, and the baseline is the export evaluated as it is. The trunk's held-out loss is the baseline's in every
    run, and the trunk weights are the source's bit for bit."""
    from helpers import ablation_toml

    from mtp_cli.ablate import run_ablation
    from mtp_cli.model.checkpoint import load_checkpoint

    monkeypatch.chdir(tmp_path)
    (tmp_path / "src.toml").write_text(ablation_toml(name="src", steps=8, variants='[[variants]]\nname = "ntp"\n'))
    variants = ('[[variants]]\nname = "self"\ndata = { source = "self" }\n\n[[variants]]\nname = "corpus"\n')
    post = ablation_toml(name="post", steps=4, eval_tasks=("heldout",), variants=variants)
    post = post.replace("[model]\nvocab_size = 512\nn_layers = 3\nd_model = 32\nn_heads = 2\nffn_hidden = 64\ncontext = 32\n",
                        "[model]\ncontext = 32\n")
    post = post.replace("[train]\n", '[train]\nfreeze_trunk = true\n')  # init_from: the [source]'s export
    post = post.replace('[data]\n', '[data]\nself_prompts = "files"\nself_samples = 8\nself_prompt_tokens = 8\n'
                        'self_new_tokens = 24\n')
    post = post.replace('[eval]\n', '[eval]\nbaseline = true\n')
    post += '\n[source]\nrecipe = "src.toml"\nvariant = "ntp"\nseed = 0\n\n[mtp]\nobjective = "sequential"\ndepth = 1\n'
    (tmp_path / "post.toml").write_text(post)

    dry = run_ablation("post.toml", dry_run=True)
    assert dry.cells[0].recipe.train.init_from == str(Path("runs/results/post/source/ntp-s0/export"))
    assert dry.extra_stages == ["source", "baseline"]
    ab = run_ablation("post.toml", show_progress=False)
    assert not ab.failures, ab.failures
    source_trunk = {k: v for k, v in load_checkpoint(tmp_path / "runs/results/post/source/ntp-s0")["model"].items()
                    if k.startswith("trunk.")}
    baseline = json.loads((tmp_path / "runs/results/post/baseline/eval.json").read_text())
    for name in ("self-s0", "corpus-s0"):
        run = tmp_path / "runs/results/post/runs" / name
        trained = load_checkpoint(run)["model"]
        for key, tensor in source_trunk.items():
            assert torch.equal(trained[key], tensor), (name, key)
        assert json.loads((run / "specbench.json").read_text())["conditions"]
        run_json = json.loads((run / "run.json").read_text())
        assert run_json["init_from"]["weights_sha256"] == baseline["hf"]["weights_sha256"]
    runs = {n: json.loads((tmp_path / f"runs/results/post/runs/{n}-s0/run.json").read_text()) for n in ("self", "corpus")}
    assert runs["self"]["recipe"]["data"]["source"] == "self" and runs["self"]["data"]["key"] != runs["corpus"]["data"]["key"]
    for name in ("corpus", "self"):  # the frozen trunk scores exactly as its source, on the same items
        scores = json.loads((tmp_path / f"runs/results/post/runs/{name}-s0/eval.json").read_text())["results"]
        for task, key in (("heldout", "loss"), ("humaneval", "gold_bpb"), ("gsm8k", "gold_bpb")):
            if task in baseline["results"]:
                assert scores[task][key] == baseline["results"][task][key], (name, task)
    assert run_ablation("post.toml", dry_run=True).extra_stages == []  # the source and baseline are done


def test_dry_run_counts_making_the_self_distilled_text_once_until_it_is_cached(checkpoints, tmp_path, monkeypatch):
    """A self-distilled variant whose text is not cached costs its generation (forward FLOPs of every prompt and
    new token over the CPU peak at the assumed utilisation) on the first cell that makes it, none on the next,
    none once the cache holds it."""
    from mtp_cli.base import env
    from mtp_cli.config.recipe import Recipe
    from mtp_cli.corpus import selfdistill
    from mtp_cli.data import shards
    from mtp_cli.model import flops
    from mtp_cli.results import estimate as cost

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("one two three four five six seven eight " * 30)
    recipe = Recipe()
    recipe.train.init_from = str(checkpoints["llama-tied"])
    pretrained.resolve_recipe(recipe, given=set())
    recipe.data.source, recipe.data.self_prompts, recipe.data.paths = "self", "files", [str(tmp_path / "docs")]
    recipe.data.self_samples, recipe.data.self_prompt_tokens, recipe.data.self_new_tokens = 4, 8, 16
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))  # this test's own: it writes a cache file
    recipe.train.freeze_trunk, recipe.train.peak_flops = True, 1e11
    monkeypatch.setattr(env, "matmul_peak", lambda device, dtype, root: 2e11)
    cell = type("Cell", (), {"recipe": recipe, "run_dir": tmp_path / "run"})()
    est = cost.Estimator(tmp_path, recipe)
    steps = est._train_steps(cell)
    first = est._train(cell)
    text_flops = flops.trunk_forward_flops_per_token(cost._meta_model(recipe), recipe.model.context) * (4 * 8 + 4 * 16)
    assert first.seconds == pytest.approx(steps.seconds + text_flops / (2e11 * cost.GENERATION_UTILISATION), rel=1e-9)
    assert "self-distilled text, not cached: 4 prompts, 96 tokens at most" in first.basis
    assert est._train(cell).seconds == pytest.approx(steps.seconds)  # another cell of the plan: made by then
    where = selfdistill.locate(recipe.data, recipe.train.init_from, shards.cache_root(recipe.data))
    where.path.parent.mkdir(parents=True)
    where.path.write_text("{}\n")
    assert cost.Estimator(tmp_path, recipe)._train(cell).basis == steps.basis
    recipe.train.init_from = str(tmp_path / "source-export")  # an earlier stage's export, not made yet
    est = cost.Estimator(tmp_path, recipe)
    assert "4 prompts of ~8 tokens, 96 tokens at most" in est._train(cell).basis
    assert est._train(cell).basis == est._train_steps(cell).basis


def test_frozen_trunk_runs_without_autograd(checkpoints):
    from mtp_cli.config.recipe import MTPConfig, Recipe
    from mtp_cli.model import MTPModel

    recipe = Recipe()
    recipe.train.init_from = str(checkpoints["llama-tied"])
    src = pretrained.resolve_recipe(recipe, given=set())
    for mtp in (MTPConfig("sequential", depth=1), MTPConfig("parallel", heads=2, compute_matched=False)):
        model = MTPModel(recipe.model, mtp)
        pretrained.init_model(model, src)
        x = torch.randint(0, 300, (2, 16))
        model.frozen_trunk = True  # the no-grad forward alone: no graph through the trunk's blocks
        model(x[:, :-1], x[:, 1:]).loss.backward()
        assert all(p.grad is None for p in model.trunk.layers.parameters())
        model.zero_grad(set_to_none=True)
        model.freeze_trunk()
        out = model(x[:, :-1], x[:, 1:])
        assert not out.loss_main.requires_grad
        out.loss.backward()
        assert all(p.grad is None for p in model.trunk.parameters())
        assert all(p.grad is not None for p in model.mtp.parameters())


def test_cli_train_init_from_uses_the_checkpoint(checkpoints, tmp_path, capsys, monkeypatch):
    """`mtp train --init-from` with a recipe that sets only the context: the checkpoint's architecture and
    tokenizer, and run.json records the source and its weights' hash."""
    from helpers import TINY_FILES, cli_in_process

    monkeypatch.chdir(tmp_path)
    folder = checkpoints["qwen2-biased-gqa"]
    (tmp_path / "r.toml").write_text(f"[model]\ncontext = 32\n[data]\nsource = 'files'\npaths = {json.dumps(TINY_FILES)}\n"
                                     "[train]\nbatch_size = 2\nwarmup = 1\neval_batches = 1\npeak_flops = 1e11\n")
    code, _, err = cli_in_process("train", "--init-from", folder, "--recipe", tmp_path / "r.toml", "--steps", "2",
                                  "--lr", "1e-4", "--depth", "1", "--out", tmp_path / "run", capsys=capsys)
    assert code == 0, err
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["init_from"] == {"source": str(folder), "path": str(folder), "architecture": "Qwen2ForCausalLM",
                                "weights_sha256": pretrained.weights_hash(folder)}
    model = run["recipe"]["model"]
    assert (model["n_layers"], model["d_model"], model["n_kv_heads"], model["qkv_bias"], model["context"]) == (2, 64, 2, True, 32)
    assert "context: training at 32 tokens" in err and "has 128 positions" in err
    assert run["data"]["tokenizer_size"] == len(toklib.load(folder))


def test_self_prompt_sets_mix_in_order_with_an_even_share(checkpoints):
    """data.self_prompts = "stdlib-functions+gsm8k": 5 samples give the first set 3 and the second 2;
    the function prompts are standard-library functions cut after their docstring (each parses as a function
    whose body so far is its docstring), the GSM8K ones training questions in lm-eval's format, never test ones."""
    import ast

    from mtp_cli.base import paths
    from mtp_cli.config.recipe import DataConfig
    from mtp_cli.corpus import selfdistill
    from mtp_cli.data import gsm8k_format
    from mtp_cli.data.prompts import load_prompts

    tok = toklib.load(checkpoints["llama-gqa-untied"])
    gsm8k = str(paths.gsm8k_data(None))
    cfg = DataConfig(source="self", self_prompts="stdlib-functions+gsm8k", paths=[gsm8k], self_samples=5)
    cfg.validate()
    texts = [tok.decode(ids) for ids in selfdistill.prompt_ids(cfg, tok)]
    assert len(texts) == 5
    every = selfdistill.function_prompts(cfg.val_fraction)
    assert texts[:3] == [every[0], every[len(every) // 3], every[2 * len(every) // 3]]
    for text in every:  # each a function whose body so far is its docstring, ending there
        (function,) = ast.parse(text).body
        assert isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) and len(function.body) == 1
        assert ast.get_docstring(function) and function.body[0].end_lineno == text.count("\n")
    train = json.loads((Path(gsm8k) / "train.jsonl").read_text().splitlines()[0])["question"]
    assert texts[3] == gsm8k_format.prompt(train)
    test_prompts = set(load_prompts("gsm8k", gsm8k_data=gsm8k))
    assert not test_prompts & set(texts[3:])
    assert len(every) > 1000 and all(len(p) <= selfdistill.MAX_FUNCTION_PROMPT_CHARS for p in every)
    swapped = DataConfig(source="self", self_prompts="gsm8k+stdlib-functions", paths=[gsm8k], self_samples=5)
    swapped_texts = [tok.decode(ids) for ids in selfdistill.prompt_ids(swapped, tok)]
    assert swapped_texts[:2] == texts[3:] and swapped_texts[3:] == [every[0], every[len(every) // 2]]


def test_self_distillation_prompts_come_from_training_documents_only(checkpoints, tmp_path, monkeypatch):
    """Corpus windows, standard-library function prompts and GSM8K questions skip the documents the validation
    split holds: a module must not train on continuations of text its held-out figures are measured on."""
    from mtp_cli.base import paths
    from mtp_cli.config.recipe import DataConfig
    from mtp_cli.corpus import selfdistill
    from mtp_cli.data import shards

    tok = toklib.load(checkpoints["llama-gqa-untied"])
    (tmp_path / "kept.txt").write_text("alpha beta gamma delta " * 40)
    (tmp_path / "held.txt").write_text("HELD OUT TEXT " * 40)
    gsm8k = str(paths.gsm8k_data(None))
    first = json.loads((Path(gsm8k) / "train.jsonl").read_text().splitlines()[0])["question"]
    held = lambda doc, fraction: "HELD" in doc or "def dedent(text)" in doc or first in doc  # noqa: E731
    monkeypatch.setattr(shards, "is_validation", held)
    questions = selfdistill.prompt_ids(DataConfig(source="self", self_prompts="gsm8k", paths=[gsm8k], self_samples=3), tok)
    assert len(questions) == 3 and not any(first in tok.decode(q) for q in questions)
    cfg = DataConfig(source="self", self_prompts="files", paths=[str(tmp_path)], self_samples=8, self_prompt_tokens=8)
    texts = [tok.decode(ids) for ids in selfdistill.prompt_ids(cfg, tok)]
    assert len(texts) == 8 and all(t.strip() for t in texts)
    assert not any(c.isupper() for t in texts for c in t)  # no window of the held-out file's (upper-case) text
    kept = selfdistill.function_prompts.__wrapped__(0.05)
    assert kept and not any(p.startswith("def dedent(text):") for p in kept)
    monkeypatch.setattr(shards, "is_validation", lambda doc, fraction: False)
    assert any(p.startswith("def dedent(text):") for p in selfdistill.function_prompts.__wrapped__(0.05))


@pytest.mark.parametrize("prompts, paths_given, message", [
    ("stdlib+bogus", True, "unknown or repeated data.self_prompts"),
    ("gsm8k+gsm8k", True, "unknown or repeated data.self_prompts"),
    ("stdlib-functions+gsm8k", False, "needs data.paths"),
])
def test_bad_self_prompt_sets_are_one_line_errors(prompts, paths_given, message):
    from mtp_cli.base import paths
    from mtp_cli.config.recipe import DataConfig

    given = [str(paths.gsm8k_data(None))] if paths_given else []
    with pytest.raises(UserError, match=message):
        DataConfig(source="self", self_prompts=prompts, paths=given).validate()
    with pytest.raises(UserError, match="at least one prompt"):
        DataConfig(source="self", self_prompts="stdlib+stdlib-functions", self_samples=1).validate()


@pytest.mark.parametrize("prompts, compared_on", [("stdlib-functions+gsm8k", "stdlib"), ("gsm8k+stdlib", "gsm8k"),
                                                  ("humaneval+files", "files")])
def test_a_mixed_self_distilled_run_is_compared_on_its_first_corpus(prompts, compared_on):
    from mtp_cli.config.recipe import DataConfig
    from mtp_cli.data.shards import comparison_config

    assert comparison_config(DataConfig(source="self", self_prompts=prompts)).source == compared_on


def test_continuations_mixed_into_a_corpus_take_their_share_by_repeats(checkpoints, tmp_path, monkeypatch):
    """data.source = "files+self": the corpus's documents, then the trunk's continuations repeated so that
    they make about data.self_share of the bytes; held-out figures are measured on the corpus alone."""
    from helpers import TINY_FILES

    from mtp_cli.config.recipe import DataConfig, Recipe
    from mtp_cli.corpus import selfdistill, token_data
    from mtp_cli.data import shards, sources

    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path))
    folder = checkpoints["llama-gqa-untied"]
    recipe = Recipe()
    recipe.data = DataConfig(source="files+self", self_prompts="files", paths=list(TINY_FILES), self_samples=3,
                             self_prompt_tokens=8, self_new_tokens=12, self_share=0.4)
    recipe.data.validate()
    recipe.train.init_from = str(folder)
    natural = sources.corpus(DataConfig(source="files", paths=list(TINY_FILES)))
    generated = selfdistill.documents(recipe.data, str(folder), tmp_path, show_progress=False)
    docs = token_data.mixed_documents(recipe)
    repeats = token_data.self_repeats(natural, generated, 0.4)
    assert docs == natural + generated * repeats and repeats > 1
    size = lambda ds: sum(len(d.encode()) for d in ds)  # noqa: E731
    share = size(generated * repeats) / size(docs)
    assert abs(share - 0.4) <= size(generated) / size(docs)  # within one copy of the target
    assert token_data.self_repeats(natural, generated, 0.0) == 1
    assert shards.comparison_config(recipe.data).source == "files"
    assert shards.comparison_config(recipe.data).self_share == 0.0
    recipe.data.self_share = 0.0  # each continuation once
    assert token_data.mixed_documents(recipe) == natural + generated


@pytest.mark.parametrize("source, share, message", [
    ("stdlib+bogus", 0.0, "unknown or repeated data.source"),
    ("stdlib+self+self", 0.0, "unknown or repeated data.source"),
    ("stdlib+self", 1.0, r"self_share must be in \[0, 1\)"),
    ("stdlib", 0.3, "needs a data.source such as"),
    ("self", 0.3, "needs a data.source such as"),
])
def test_bad_mixes_of_continuations_are_one_line_errors(source, share, message):
    from mtp_cli.config.recipe import DataConfig

    with pytest.raises(UserError, match=message):
        DataConfig(source=source, self_share=share).validate()


def test_runs_stored_before_these_keys_still_resume(tmp_path):
    """A run.json written before qkv_bias/rope_scaling/init_from/freeze_trunk/self_* existed is the same run."""
    from helpers import micro_recipe

    from mtp_cli.train.loop import check_out_dir

    recipe = micro_recipe()
    stored = recipe.to_dict()
    for section, keys in (("model", ("qkv_bias", "rope_scaling")), ("train", ("init_from", "freeze_trunk")),
                          ("data", ("self_prompts", "self_samples", "self_prompt_tokens", "self_new_tokens"))):
        for key in keys:
            del stored[section][key]
    (tmp_path / "run.json").write_text(json.dumps({"recipe": stored}))
    # the same run (no checkpoint yet: the grid's cells start it again, a user's --resume is refused)
    assert check_out_dir(tmp_path, recipe, resume=True, force=False, restart_without_checkpoint=True) is False
    with pytest.raises(UserError, match="holds no checkpoint"):
        check_out_dir(tmp_path, recipe, resume=True, force=False)
    recipe.model.qkv_bias = True
    with pytest.raises(UserError, match="model.qkv_bias False -> True"):
        check_out_dir(tmp_path, recipe, resume=True, force=False)


def test_distinct_batches_cycle_the_same_batches_and_reuse_their_trunk_states(checkpoints, tmp_path, monkeypatch):
    """train.distinct_batches = 3 over 6 steps: steps 3..5 draw batches 0..2 again (the frozen trunk's loss
    repeats exactly), their states come from the cache (6 misses, then 6 hits), and the modules trained equal
    those of the same run with the trunk recomputed every step."""
    from mtp_cli.model.checkpoint import load_run
    from mtp_cli.train.loop import train

    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    runs = {}
    for name, cached in (("plain", False), ("cached", True)):
        recipe = _frozen_recipe(checkpoints["llama-tied"])
        recipe.train.trunk_cache = cached
        recipe.train.grad_accum = 2
        recipe.train.distinct_batches = 3
        summary = train(recipe, tmp_path / name, show_progress=False)
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        runs[name] = (summary, load_run(tmp_path / name).model.mtp.state_dict(),
                      [r["loss_main"] for r in rows if r["kind"] == "train"])
    assert runs["cached"][0]["trunk_cache"] == {"hits": 6, "misses": 6}  # 3 batches x 2 micro-batches, twice
    main = runs["cached"][2]
    assert main[3:] == main[:3] and len(set(main[:3])) == 3
    assert main == runs["plain"][2]
    for key, value in runs["plain"][1].items():
        assert torch.equal(runs["cached"][1][key], value), key
