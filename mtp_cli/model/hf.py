"""The trunk as a Hugging Face `LlamaForCausalLM` (`Qwen2ForCausalLM` when it has q/k/v biases, as a
trunk started from a Qwen2 checkpoint does): the export that tools we did not write can load.

The trunk mirrors Llama's parameter names and rotate-half RoPE, so conversion is a renaming
(`x` -> `model.x`, `lm_head` kept as is) in both directions. MTP modules are discarded, unless
`with_mtp` adds the sequential module in DeepSeek-V3's layout for transformers' own MTP decoding
(`hf_mtp.py`).
`load_export` reads such a folder back into our `Trunk` (through `pretrained`, which also reads
checkpoints we did not write), so evaluation scores the export itself. With tied embeddings
the checkpoint carries no `lm_head.weight` and the config says `tie_word_embeddings`.
transformers 5 reads `rope_theta` from `rope_parameters`; older versions read the top-level key,
so the config carries both.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.utils import logging as hf_logging

from mtp_cli.base import outputs
from mtp_cli.base.errors import UserError
from mtp_cli.base.run_files import EXPORT, EXPORT_INFO
from mtp_cli.config.recipe import ModelConfig
from mtp_cli.model import hf_mtp, pretrained
from mtp_cli.model.checkpoint import checkpoint_stamp, load_run
from mtp_cli.model.trunk import Trunk


def hf_config(model_cfg: ModelConfig, tokenizer, n_layers: int | None = None) -> LlamaConfig | Qwen2Config:
    """A LlamaConfig (Qwen2Config with q/k/v biases) describing the trunk (`n_layers` overrides the
    recipe's, e.g. compute-matched heads)."""
    rope = {"rope_type": "default", "rope_theta": float(model_cfg.rope_theta), **model_cfg.rope_scaling}
    if model_cfg.qkv_bias:
        cfg = Qwen2Config(
            vocab_size=model_cfg.vocab_size, hidden_size=model_cfg.d_model, intermediate_size=model_cfg.ffn_hidden,
            num_hidden_layers=n_layers or model_cfg.n_layers, num_attention_heads=model_cfg.n_heads,
            num_key_value_heads=model_cfg.kv_heads, hidden_act="silu", max_position_embeddings=model_cfg.context,
            rms_norm_eps=model_cfg.norm_eps, rope_parameters=rope, tie_word_embeddings=model_cfg.tie_embeddings,
            use_sliding_window=False, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id, architectures=["Qwen2ForCausalLM"])
        cfg.rope_theta = float(model_cfg.rope_theta)
        cfg.dtype = torch.float32
        return cfg
    cfg = LlamaConfig(
        vocab_size=model_cfg.vocab_size,
        hidden_size=model_cfg.d_model,
        intermediate_size=model_cfg.ffn_hidden,
        num_hidden_layers=n_layers or model_cfg.n_layers,
        num_attention_heads=model_cfg.n_heads,
        num_key_value_heads=model_cfg.kv_heads,
        head_dim=model_cfg.head_dim,
        hidden_act="silu",
        max_position_embeddings=model_cfg.context,
        rms_norm_eps=model_cfg.norm_eps,
        rope_parameters=rope,
        tie_word_embeddings=model_cfg.tie_embeddings,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        architectures=["LlamaForCausalLM"],
    )
    cfg.rope_theta = float(model_cfg.rope_theta)
    cfg.dtype = torch.float32
    return cfg


def hf_state_dict(trunk: Trunk) -> dict[str, torch.Tensor]:
    """The trunk's weights under Llama's names (no lm_head when tied)."""
    out = {}
    for name, tensor in trunk.state_dict().items():
        out[name if name.startswith("lm_head.") else f"model.{name}"] = tensor
    return out


def trunk_to_hf(trunk: Trunk, tokenizer) -> LlamaForCausalLM | Qwen2ForCausalLM:
    cfg = hf_config(trunk.cfg, tokenizer, trunk.n_layers)
    model = (Qwen2ForCausalLM if trunk.cfg.qkv_bias else LlamaForCausalLM)(cfg)
    missing, unexpected = model.load_state_dict(hf_state_dict(trunk), strict=False)
    missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"trunk -> Llama renaming is incomplete: missing {missing}, unexpected {unexpected}")
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model.to(torch.float32).eval()


def to_hf_model(run) -> LlamaForCausalLM:
    """The trunk of a `LoadedRun` as an in-memory LlamaForCausalLM (fp32, eval mode)."""
    return trunk_to_hf(run.model.trunk, run.tokenizer)


def generation_config(tokenizer) -> GenerationConfig:
    return GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id, do_sample=False)


def _source_stamp(run_dir: str | Path) -> dict:

    return checkpoint_stamp(Path(run_dir))


def ensure_export(run_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """The run's export (default `<run>/export`), re-exported only if the checkpoint changed since."""
    out_dir = Path(out_dir) if out_dir else Path(run_dir) / EXPORT
    try:
        info = json.loads((out_dir / EXPORT_INFO).read_text())
        if info.get("source") == _source_stamp(run_dir) and (out_dir / "config.json").is_file():
            return out_dir
    except (OSError, ValueError):
        pass
    return export_run(run_dir, out_dir)


def export_run(run_dir: str | Path, out_dir: str | Path, force: bool = False, with_mtp: bool = False) -> Path:
    """Write the run's trunk as a Hugging Face checkpoint folder; return it. The MTP modules are discarded,
    or with `with_mtp` kept as layers L.. in DeepSeek-V3's layout with `num_mtp_layers` in config.json
    (`hf_mtp`; refused in one line where transformers cannot express them, differences in export_info.json).
    Only a new or empty folder or an earlier export is replaced (`outputs.replaceable_export`), and
    atomically: the export is written beside it and swapped in whole."""

    out_dir = outputs.replaceable_export(out_dir, run_dir, force)
    run = load_run(run_dir)
    differences = hf_mtp.check_exportable(run.model) if with_mtp else []
    out_dir = Path(os.path.abspath(out_dir))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        hf_logging.disable_progress_bar()
        model = to_hf_model(run)
        model.generation_config = generation_config(run.tokenizer)
        if with_mtp:
            setattr(model.config, hf_mtp.NUM_MTP_LAYERS, run.model.n_extra)
        model.save_pretrained(tmp, safe_serialization=True)
        if with_mtp:
            _add_tensors(tmp, hf_mtp.mtp_state_dict(run.model))
        run.tokenizer.save_pretrained(tmp)
        counts = run.model.param_counts()
        (tmp / EXPORT_INFO).write_text(json.dumps({
            "run": str(Path(run_dir).resolve()), "step": run.step, "objective": run.model.objective,
            "trunk_params": counts["trunk"], "mtp_params_discarded": 0 if with_mtp else counts["mtp"],
            "mtp_layers": run.model.n_extra if with_mtp else 0, "mtp_differences": differences,
            "source": _source_stamp(run_dir),
        }, indent=2) + "\n")
        _with_default_modes(tmp)
        _swap_in(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _add_tensors(folder: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Add tensors to a saved checkpoint: into model.safetensors, or as one more shard of a sharded one."""
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        save_file({**load_file(folder / "model.safetensors"), **tensors}, folder / "model.safetensors",
                  metadata={"format": "pt"})
        return
    doc = json.loads(index.read_text())
    save_file(tensors, folder / "model-mtp.safetensors", metadata={"format": "pt"})
    doc["weight_map"].update({k: "model-mtp.safetensors" for k in tensors})
    doc.setdefault("metadata", {})["total_size"] = doc.get("metadata", {}).get("total_size", 0) + sum(
        t.numel() * t.element_size() for t in tensors.values())
    index.write_text(json.dumps(doc, indent=2) + "\n")


def _with_default_modes(folder: Path) -> None:
    """The modes a plain `mkdir` and `open` would give under the user's umask (mkdtemp makes 0700, and
    safetensors may write 0600): an export is shared like every other output."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [folder, *folder.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _swap_in(new: Path, target: Path) -> None:
    """Put the folder `new` at `target`; whatever was at `target` is removed only once `new` is in place."""
    if not target.exists():
        new.rename(target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
    target.replace(old)
    try:
        new.rename(target)
    except OSError:
        old.replace(target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def load_export(export_dir: str | Path) -> tuple[Trunk, object]:
    """(Trunk in eval mode, tokenizer) from a checkpoint folder such as `export_run` writes."""
    export_dir = Path(export_dir)
    if not (export_dir / "config.json").is_file():
        raise UserError(f"no Hugging Face checkpoint in {export_dir} (config.json missing)")
    trunk, tokenizer, _ = pretrained.load_trunk(export_dir)
    return trunk, tokenizer
