"""Start from a pretrained Hugging Face checkpoint: find it, check it is one we can run exactly, read it.

A source is a local folder holding `config.json` + safetensors weights (an `mtp export`, a
`save_pretrained` folder), a Hub id, fetched through `huggingface_hub` (its local cache is
honoured; `HF_HUB_OFFLINE=1` reads only the cache), or a `.gguf` file or short name such as
`smollm2-135m-instruct` (`model/gguf.py`: dequantized once into a cached plain folder, then read
like any other). Accepted: `LlamaForCausalLM` (Llama 3.x, SmolLM2, TinyLlama) and
`Qwen2ForCausalLM` (q/k/v biases), tied or untied, GQA, RoPE of type default, linear or llama3.
Everything else is refused in one line naming what is unsupported.

`resolve_recipe` makes a recipe's `[model]` the checkpoint's (a given value that contradicts it is
an error, except a shorter training context). The training context is the recipe's `model.context`
when it sets one (no longer than the checkpoint's maximum positions), else min(INIT_CONTEXT, that
maximum), so a checkpoint's 8,192 positions do not silently make each step 8 times the default
recipe's; `mtp train` prints the context it trains at. `init_model` loads the trunk into an `MTPModel` and
starts its MTP modules the way the references do when they add modules to a trained model:
a parallel head (Meta) or a sequential module's block (DeepSeek-V3 style, as FastMTP does) is a copy
of the trunk's last block, a module's final norm a copy of the trunk's final norm, enorm/hnorm are
ones and the fusion projection `eh_proj` is random (normal, the checkpoint's initializer_range).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from safetensors.torch import load_file

from mtp_cli.base import paths
from mtp_cli.base.errors import UserError
from mtp_cli.config.recipe import ModelConfig, Recipe, recipe_data
from mtp_cli.data import tokenizer as toklib
from mtp_cli.model import gguf
from mtp_cli.model.mtp import MTPModule
from mtp_cli.model.trunk import Trunk

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
# The [model] settings a checkpoint decides; `context` may be shortened, the init_* keys are ours.
SOURCE_KEYS = ("vocab_size", "n_layers", "d_model", "n_heads", "n_kv_heads", "ffn_hidden", "rope_theta", "norm_eps",
               "tie_embeddings", "qkv_bias", "rope_scaling")
_HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken"]
INIT_CONTEXT = 1024  # the default recipe's (quick's) context: --init-from trains at it unless the recipe asks for another


@dataclass
class Source:
    name: str  # as the user gave it
    path: Path  # the local folder holding it
    architecture: str
    model: ModelConfig

    def record(self) -> dict:
        """What run.json keeps: the source as given, where it was read, and the hash of its weights."""
        return {"source": self.name, "path": paths.portable(self.path), "architecture": self.architecture,
                "weights_sha256": weights_hash(self.path), **gguf.record(self.path)}


def locate(source: str | Path, flag: str = "--init-from") -> Path:
    """The local folder of a source: the folder itself, the Hub snapshot (downloaded or cached), or a GGUF
    file's dequantized folder. `flag` names the option the source came from in error messages."""
    name = str(source)
    if gguf.is_gguf(name):
        return gguf.locate(name, flag)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(f"{flag} {name}: no Hugging Face checkpoint there (config.json missing)")
        return path
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise UserError(f"{flag} {name}: no such folder, and not a Hub id (owner/name)")
    try:
        from huggingface_hub import snapshot_download  # only for sources on the Hub

        return Path(snapshot_download(repo_id=name, allow_patterns=_HUB_FILES))
    except Exception as exc:  # network, unknown repo, gated, not in the offline cache
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"{flag} {name}: not a local folder and not found on the Hub or in its cache ({first})") from None


def in_hub_cache(name: str) -> bool:
    """Whether Hub id `name` has a snapshot in the local Hugging Face cache (no network)."""
    try:
        from huggingface_hub import snapshot_download  # only for sources on the Hub

        snapshot_download(repo_id=name, allow_patterns=_HUB_FILES, local_files_only=True)
        return True
    except Exception:  # not cached, or not a valid id
        return False


def _rope(cfg: dict, where: str) -> tuple[float, dict]:
    """(rope_theta, scaling) from transformers 5's `rope_parameters` or the older rope_theta + rope_scaling."""
    params = dict(cfg.get("rope_parameters") or {})
    if not params:
        params = dict(cfg.get("rope_scaling") or {})
        params.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    theta = float(params.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
    params.setdefault("rope_type", "default")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise UserError(f"{where}: partial rotary embeddings are not supported")
    params.pop("partial_rotary_factor", None)
    kind = params["rope_type"]
    needed = {"default": (), "linear": ("factor",),
              "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
    if kind not in needed:
        raise UserError(f"{where}: rope_type {kind!r} is not supported (default, linear, llama3 are)")
    missing = [k for k in needed[kind] if k not in params]
    if missing:
        raise UserError(f"{where}: rope_type {kind!r} needs {', '.join(missing)}")
    scaling = {} if kind == "default" else {"rope_type": kind, **{k: params[k] for k in needed[kind]}}
    return theta, scaling


def model_config(cfg: dict, where: str | Path) -> tuple[str, ModelConfig]:
    """(architecture, ModelConfig) of a checkpoint's config.json; a UserError if we cannot run it exactly."""
    archs = cfg.get("architectures") or [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}.get(
        cfg.get("model_type"), str(cfg.get("model_type")))]
    arch = archs[0]
    if arch not in ARCHITECTURES or cfg.get("model_type") != ARCHITECTURES[arch]:
        raise UserError(f"{where}: architecture {arch} (model_type {cfg.get('model_type')!r}) is not supported; "
                        f"supported: {', '.join(ARCHITECTURES)}")
    problems = []
    if cfg.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {cfg['hidden_act']!r}")
    if arch == "LlamaForCausalLM" and cfg.get("attention_bias"):
        problems.append("attention_bias (o_proj bias)")
    if cfg.get("mlp_bias"):
        problems.append("mlp_bias")
    if arch == "Qwen2ForCausalLM" and cfg.get("use_sliding_window"):
        problems.append("use_sliding_window")
    if problems:
        raise UserError(f"{where}: {arch} with {', '.join(problems)} is not supported")
    theta, scaling = _rope(cfg, str(where))
    n_heads = cfg["num_attention_heads"]
    model = ModelConfig(vocab_size=cfg["vocab_size"], n_layers=cfg["num_hidden_layers"], d_model=cfg["hidden_size"],
                        n_heads=n_heads, n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
                        ffn_hidden=cfg["intermediate_size"], context=cfg["max_position_embeddings"],
                        rope_theta=theta, norm_eps=cfg["rms_norm_eps"],
                        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                        init_std=float(cfg.get("initializer_range", 0.02)), zero_init_residual=False,
                        qkv_bias=arch == "Qwen2ForCausalLM", rope_scaling=scaling)
    if (cfg.get("head_dim") or model.head_dim) != model.head_dim:
        raise UserError(f"{where}: head_dim {cfg['head_dim']} != hidden_size / num_attention_heads is not supported")
    model.validate()
    return arch, model


def read_source(source: str | Path) -> Source:
    path = locate(source)
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path / 'config.json'}: {exc}") from None
    arch, model = model_config(cfg, source)
    return Source(str(source), path, arch, model)


def weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        names = ["model.safetensors"]
    files = [folder / n for n in names]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise UserError(f"{folder}: weights missing ({', '.join(missing)}; only safetensors checkpoints are read)")
    return files


def weights_hash(folder: Path) -> str:
    h = hashlib.sha256()
    for path in weight_files(folder):
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()


def trunk_state(folder: Path, model: ModelConfig) -> dict[str, torch.Tensor]:
    """The checkpoint's weights under the trunk's names (Llama's without the `model.` prefix), fp32."""
    state: dict[str, torch.Tensor] = {}
    for path in weight_files(folder):
        state.update(load_file(path))
    renamed = {k.removeprefix("model."): v.float() for k, v in state.items()
               if _layer_index(k) is None or _layer_index(k) < model.n_layers}  # layers past the trunk's: MTP
    if model.tie_embeddings:
        renamed.pop("lm_head.weight", None)
    return renamed


def _layer_index(key: str) -> int | None:
    """N of a `model.layers.N.` key (an MTP layer in DeepSeek-V3's layout when N >= num_hidden_layers)."""
    parts = key.split(".")
    return int(parts[2]) if len(parts) > 2 and parts[:2] == ["model", "layers"] and parts[2].isdigit() else None


def load_into(trunk, folder: Path, where: str | Path) -> None:
    try:
        trunk.load_state_dict(trunk_state(folder, trunk.cfg))
    except RuntimeError as exc:
        raise UserError(f"weights in {where} do not match its config.json: {str(exc).splitlines()[0]}") from None


def load_trunk(source: str | Path):
    """(Trunk in eval mode, fp32, tokenizer, Source) of a checkpoint folder or Hub id."""

    src = read_source(source)
    trunk = Trunk(src.model)
    load_into(trunk, src.path, source)
    return trunk.float().eval(), toklib.load(src.path), src


def resolve_recipe(recipe: Recipe, given: set[str] | None = None) -> Source:
    """Make `recipe.model` the checkpoint's. `given`: the [model] keys the user set (a recipe's or a
    variant's); None = every key is taken as given, i.e. the recipe must already agree. The training
    context is the given one (at most the checkpoint's), else min(INIT_CONTEXT, the checkpoint's). Also
    points data.tokenizer at the source."""
    src = read_source(recipe.train.init_from)
    mine, theirs = recipe.model, src.model
    keys = set(SOURCE_KEYS) | {"context"} if given is None else given
    for key in sorted(keys & set(SOURCE_KEYS)):
        a, b = getattr(mine, key), getattr(theirs, key)
        if key == "n_kv_heads":
            a, b = mine.kv_heads, theirs.kv_heads
        if a != b:
            raise UserError(f"model.{key} = {a!r} contradicts --init-from {src.name} ({key} = {b!r}); "
                            f"drop it from the recipe (the checkpoint decides the architecture)")
    context = min(INIT_CONTEXT, theirs.context)
    if "context" in keys:
        if mine.context > theirs.context:
            raise UserError(f"model.context = {mine.context} is longer than --init-from {src.name} was trained for "
                            f"({theirs.context})")
        context = mine.context
    resolved = ModelConfig(**{f.name: getattr(theirs, f.name) for f in fields(ModelConfig)})
    resolved.context = context
    recipe.model = resolved
    recipe.check_draft_vocab()
    if recipe.data.tokenizer not in ("bpe", src.name, str(src.path)):
        raise UserError(f"data.tokenizer = {recipe.data.tokenizer!r}: with --init-from the tokenizer is the checkpoint's")
    local = Path(src.name).expanduser().is_dir() or gguf.is_gguf(src.name)  # a Hub id stays a name
    recipe.data.tokenizer = str(src.path) if local else src.name
    return src


def given_model_keys(recipe_file: str | Path | None, variant_model: dict | None = None) -> set[str]:
    """The [model] keys a recipe file (with those of the recipes it extends) and a variant's overrides
    set explicitly."""
    keys = set(variant_model or {})
    if recipe_file is not None:
        keys |= set(recipe_data(Path(recipe_file)).get("model", {}))
    return keys


def init_model(model, src: Source) -> None:
    """Load the source into `model.trunk` and start the MTP modules from it (see the module docstring)."""

    trunk = model.trunk
    if trunk.n_layers != src.model.n_layers:
        raise UserError(f"compute-matched parallel heads would drop {src.model.n_layers - trunk.n_layers} layers of "
                        f"--init-from {src.name}; set mtp.compute_matched = false")
    load_into(trunk, src.path, src.name)
    last = trunk.layers[trunk.n_layers - 1].state_dict()
    with torch.no_grad():
        for module in model.mtp:
            if isinstance(module, MTPModule):
                module.block.load_state_dict(last)
                module.shared_head.norm.load_state_dict(trunk.norm.state_dict())
                torch.nn.init.ones_(module.enorm.weight)
                torch.nn.init.ones_(module.hnorm.weight)
                torch.nn.init.normal_(module.eh_proj.weight, mean=0.0, std=src.model.init_std)
            else:
                module.load_state_dict(last)
