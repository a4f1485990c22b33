"""The sequential MTP module in DeepSeek-V3's release layout, so that transformers itself decodes with it.

transformers (5.x) carries `MtpModel` (modeling_layers.py) and `generate(use_mtp=True)`
(`MTPCandidateGenerator`): layer k reads [enorm(Emb(next token)); hnorm(h)] through `eh_proj`, runs a
decoder layer of the main model's own class (`mtp_block`), then `post_norm`, and the main model's
`lm_head`. `MtpModel.from_pretrained(main)` reads the layers from the main checkpoint as
`model.layers.{L + k}.*` (L = num_hidden_layers, DeepSeek-V3's `model.layers.61.*`), selected by the main
class's `_keys_to_ignore_on_load_unexpected` patterns, with `shared_head.norm` renamed `post_norm`;
`num_mtp_layers` in config.json says how many. Our `MTPModule` has those names and that order already
(embedding first; `block` is a Llama decoder layer under Llama's names; `shared_head.norm` its final norm).

What transformers' layer cannot express, and what we do about it:
- parallel heads (no `eh_proj`, no chain): refused;
- depth 1 fed the trunk state before its final norm (`mtp.mtp_input = "pre-norm"`): refused, since
  `generate(use_mtp=True)` passes the main model's last hidden state, after the final norm;
- fused features (`mtp.features = "fused"`, several layers' states): refused, the layer reads the last one only;
- D >= 2: refused, since transformers feeds depth k+1 the state after depth k's `post_norm`, where ours
  reads it before its final norm (depth 2 would draft from a state it never trained on);
- a module trained over a draft sub-vocabulary (`mtp.draft_vocab`): exported, the difference stated,
  since transformers drafts over the whole vocabulary (greedy decoding stays lossless; acceptance moves).
Llama and Qwen2 register no MTP key pattern, so a user sets one before `generate(use_mtp=True)`
(`enable_mtp`, three lines in docs/pretrained.md).
"""

from __future__ import annotations

from mtp_cli.base.errors import UserError

NUM_MTP_LAYERS = "num_mtp_layers"  # the config.json key transformers reads


def mtp_layer_pattern(n_layers: int, depth: int) -> str:
    """The checkpoint-key pattern of MTP layer `depth` (1-based) after `n_layers` trunk layers."""
    return rf"model\.layers\.{n_layers + depth - 1}\..*"


def check_exportable(model) -> list[str]:
    """The differences an export in transformers' layout keeps from `model` (an `MTPModel`), or a one-line
    UserError where transformers' `MtpLayer` cannot express its modules."""
    cfg = model.mtp_cfg
    if model.objective != "sequential":
        raise UserError(f"--with-mtp exports DeepSeek-style sequential modules; this run's objective is "
                        f"{model.objective!r} (transformers' MtpLayer has no parallel heads)")
    if cfg.mtp_input != "post-norm":
        raise UserError("--with-mtp: this module reads the trunk state before its final norm (mtp.mtp_input = "
                        "'pre-norm'); transformers' generate(use_mtp=True) feeds it the state after it")
    if cfg.features != "last":
        raise UserError("--with-mtp: this module reads fused trunk features (mtp.features = 'fused'); "
                        "transformers' MtpLayer reads the last hidden state only")
    if model.n_extra > 1:
        raise UserError(f"--with-mtp exports one module; this run has {model.n_extra} (transformers feeds depth k+1 "
                        "the state after depth k's final norm, ours the state before it)")
    differences = []
    if cfg.draft_vocab:
        differences.append(f"trained over the {cfg.draft_vocab:,} most frequent tokens (mtp.draft_vocab); "
                           "transformers drafts over the whole vocabulary")
    return differences


def mtp_state_dict(model) -> dict:
    """The modules' weights under DeepSeek-V3's release names, numbered after the trunk's layers."""
    out = {}
    n_layers = model.trunk.n_layers
    for depth, module in enumerate(model.mtp, 1):
        prefix = f"model.layers.{n_layers + depth - 1}."
        for name, tensor in module.state_dict().items():
            name = name.removeprefix("block.")  # the decoder layer's own names sit directly under the layer
            out[prefix + name] = tensor.detach().contiguous()
    return out


def enable_mtp(hf_model) -> None:
    """Let transformers find the MTP layers of an export in `hf_model`'s checkpoint (a Llama or Qwen2 model
    registers no MTP key pattern of its own): what `generate(use_mtp=True)` needs first."""
    n_layers = hf_model.config.num_hidden_layers
    depth = getattr(hf_model.config, NUM_MTP_LAYERS, None)
    if not depth:
        raise UserError(f"{hf_model.config.name_or_path} has no {NUM_MTP_LAYERS} in its config: export it with "
                        "`mtp export --with-mtp`")
    hf_model._keys_to_ignore_on_load_unexpected = {mtp_layer_pattern(n_layers, d) for d in range(1, depth + 1)}
