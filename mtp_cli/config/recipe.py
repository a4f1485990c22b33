"""Typed configuration: model, MTP objective, data, training, and the recipe that bundles them.

Recipes are TOML; every section maps onto one dataclass here, unknown keys are errors, and
CLI flags override recipe values through `Recipe.override`. Validation lives here so that
every entry point (train, ablate, tests) rejects the same bad input the same way.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtp_cli.base.errors import UserError
from mtp_cli.base.paths import RECIPES_DIR
from mtp_cli.config.conditions import plan_conditions

OBJECTIVES = ("ntp", "sequential", "parallel")
MTP_INPUTS = ("post-norm", "pre-norm")
DRAFT_TARGETS = ("token", "trunk")
SCHEDULES = ("cosine", "wsd")
EVAL_TASKS = ("humaneval", "gsm8k", "heldout")
SPEC_PROMPTS = ("humaneval", "gsm8k")
TRACKERS = ("none", "tensorboard", "wandb")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("fp32", "bf16", "int8")  # the weights a model decodes and evaluates with (Runtime.dtype)
PEER_SCOPES = ("all", "primary", "none")  # specbench.peers
PARALLEL = ("ddp", "fsdp")  # train.parallel: how torchrun's processes share the model (mtp_cli/model/parallel.py)
LAUNCHERS = ("local", "slurm")
VARIANT_SECTIONS = ("model", "mtp", "data", "train", "eval", "specbench")
ROPE_TYPES = ("default", "linear", "llama3")
ROPE_KEYS = {"default": (), "linear": ("factor",),  # the numbers each rope_type reads (model/trunk.py)
             "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
SELF_PROMPTS = ("stdlib", "files", "gsm8k", "humaneval", "stdlib-functions")  # data.self_prompts, "+" mixes them
FEATURES = ("last", "fused")  # mtp.features
TRUNK_DTYPES = ("float32", "bfloat16")  # train.trunk_dtype
SOURCES = ("stdlib", "stdlib-functions", "files", "gsm8k", "hf", "self")  # data.source, "+" mixes them
_VARIANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+=-]*$")


@dataclass
class ModelConfig:
    vocab_size: int = 4096
    n_layers: int = 4
    d_model: int = 256
    n_heads: int = 4
    n_kv_heads: int | None = None  # None = n_heads (no GQA)
    ffn_hidden: int = 688
    context: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    init_std: float = 0.02
    zero_init_residual: bool = True  # blocks start as the identity (o_proj, down_proj = 0)
    qkv_bias: bool = False  # q/k/v projections with biases (Qwen2)
    rope_scaling: dict[str, Any] = field(default_factory=dict)  # HF rope_parameters beyond rope_theta; {} = plain RoPE

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def validate(self) -> None:
        for name in ("vocab_size", "n_layers", "d_model", "n_heads", "ffn_hidden", "context"):
            if getattr(self, name) < 1:
                raise UserError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("rope_theta", "norm_eps", "init_std"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise UserError(f"model.{name} must be a finite number > 0, got {value}")
        if self.d_model % self.n_heads:
            raise UserError(f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})")
        if self.head_dim % 2:
            raise UserError(f"head dimension {self.head_dim} must be even for RoPE")
        if self.n_heads % self.kv_heads:
            raise UserError(f"model.n_heads ({self.n_heads}) must be divisible by model.n_kv_heads ({self.kv_heads})")
        rope_type = self.rope_scaling.get("rope_type", "default")
        if rope_type not in ROPE_TYPES:
            raise UserError(
                f"model.rope_scaling: rope_type {rope_type!r} is not supported; choose one of {', '.join(ROPE_TYPES)}"
            )
        missing = [k for k in ROPE_KEYS[rope_type] if k not in self.rope_scaling]
        if missing:
            raise UserError(f"model.rope_scaling: rope_type {rope_type!r} needs {', '.join(missing)}")
        for key in ROPE_KEYS[rope_type]:
            value = self.rope_scaling[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
                raise UserError(f"model.rope_scaling.{key} must be a finite number > 0, got {value!r}")
        if rope_type == "llama3" and not self.rope_scaling["high_freq_factor"] > self.rope_scaling["low_freq_factor"]:
            raise UserError("model.rope_scaling: llama3's high_freq_factor must be above its low_freq_factor")


@dataclass
class MTPConfig:
    objective: str = "ntp"
    depth: int = 1  # sequential: number of modules D
    heads: int = 4  # parallel: number of heads n, head 1 = next token
    lambda_: float | None = None  # None: 0.3 for sequential, n-1 for parallel (Meta's plain sum)
    lambda_final: float | None = None  # DeepSeek-V3 schedule: lambda drops to this value ...
    lambda_switch: float = 1.0  # ... after this fraction of training steps
    mtp_input: str = "post-norm"  # which trunk state feeds depth 1
    compute_matched: bool = True  # parallel: take n-1 layers out of the trunk
    memory_efficient: bool = True  # parallel: Meta's one-head-at-a-time backward
    draft_vocab: int = 0  # train the extra predictions over this many most frequent training tokens (0: all)
    draft_target: str = "token"  # what extra prediction k learns: the text's token (the papers), or "trunk": the
                                 # frozen trunk's own distribution for that token, which is what verification accepts
    features: str = "last"  # what depth 1 reads (sequential): the trunk's last state, or "fused": a learned
                            # projection of a low, a middle and the last layer's states (EAGLE-3), starting as "last"
    unroll: int = 1  # training-time test (sequential, depth 1): train the module on its own states over this many
                     # recursive steps, a loss at each, as it drafts beyond depth 1 (mtp_cli/model/unroll.py)

    @property
    def n_extra(self) -> int:
        """Number of extra predictions beyond the next token (D, or n-1)."""
        return {"ntp": 0, "sequential": self.depth, "parallel": self.heads - 1}[self.objective]

    def lambda_at(self, step: int | None = None, total_steps: int | None = None) -> float:
        """λ in L = L_main + (λ/D) Σ_k L_k: the one place its default and its schedule are worked out. Unset,
        0.3 for sequential modules (DeepSeek-V3) and n − 1 for parallel heads (Meta's plain sum, each head
        weighted 1); 0 for NTP. At training step `step` of `total_steps`, lambda_final from
        lambda_switch × total_steps on (DeepSeek-V3's drop); without a step, the run's λ before any drop."""
        if step is not None and self.lambda_final is not None and step >= self.lambda_switch * total_steps:
            return self.lambda_final
        if self.objective == "ntp":
            return 0.0
        if self.lambda_ is not None:
            return self.lambda_
        return 0.3 if self.objective == "sequential" else float(self.heads - 1)

    def validate(self) -> None:
        if self.objective not in OBJECTIVES:
            raise UserError(f"unknown objective {self.objective!r}; choose one of {', '.join(OBJECTIVES)}")
        if self.objective == "sequential" and self.depth < 1:
            raise UserError(f"--depth must be >= 1 for the sequential objective, got {self.depth}")
        if self.objective == "parallel" and self.heads < 2:
            raise UserError(f"--heads must be >= 2 for the parallel objective, got {self.heads}")
        for name in ("lambda_", "lambda_final"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise UserError(f"{name.rstrip('_')} must be a finite number >= 0, got {value}")
        if not 0.0 <= self.lambda_switch <= 1.0:
            raise UserError(f"mtp.lambda_switch must be in [0, 1], got {self.lambda_switch}")
        if self.mtp_input not in MTP_INPUTS:
            raise UserError(f"unknown mtp_input {self.mtp_input!r}; choose one of {', '.join(MTP_INPUTS)}")
        if self.draft_vocab < 0:
            raise UserError(f"mtp.draft_vocab must be >= 0 (0: the whole vocabulary), got {self.draft_vocab}")
        if self.features not in FEATURES:
            raise UserError(f"unknown mtp.features {self.features!r}; choose {' or '.join(FEATURES)}")
        if self.features == "fused" and self.objective != "sequential":
            raise UserError("mtp.features = 'fused' feeds a sequential module's depth 1: it needs the sequential objective")
        if self.unroll < 1:
            raise UserError(f"mtp.unroll must be >= 1 (1: no training-time test), got {self.unroll}")
        if self.unroll > 1 and not (self.objective == "sequential" and self.depth == 1):
            raise UserError("mtp.unroll > 1 trains a depth-1 module on its own recursive states: it needs the "
                            "sequential objective with depth 1")
        if self.draft_target not in DRAFT_TARGETS:
            raise UserError(f"unknown mtp.draft_target {self.draft_target!r}; choose one of {', '.join(DRAFT_TARGETS)}")


def objective_from_flags(recipe_objective: str, objective: str | None, depth: int | None, heads: int | None,
                         lam: float | None) -> str:
    """The objective a command line asks for: given, or implied by --depth/--lambda (sequential) or
    --heads (parallel) over an NTP recipe. Flags that the objective would ignore are errors."""
    if objective is None and depth is not None and heads is not None:
        raise UserError("--depth (sequential MTP) and --heads (parallel heads) cannot be used together")
    if objective is None and recipe_objective == "ntp":
        if heads is not None and depth is None:
            objective = "parallel"
        elif heads is None and (depth is not None or lam is not None):
            objective = "sequential"
    chosen = objective or recipe_objective
    ignored = {"ntp": [("--depth", depth), ("--heads", heads), ("--lambda", lam)],
               "sequential": [("--heads", heads)], "parallel": [("--depth", depth)]}.get(chosen, [])
    given = [flag for flag, value in ignored if value is not None]
    if given:
        raise UserError(f"{' and '.join(given)} cannot be used with the {chosen} objective "
                        "(--depth and --lambda are for sequential, --heads and --lambda for parallel)")
    return chosen


@dataclass
class DataConfig:
    source: str = "stdlib"  # stdlib | stdlib-functions | files | gsm8k | hf | self, or several joined by "+"
    paths: list[str] = field(default_factory=list)  # files/folders for files|gsm8k
    hf_dataset: str = ""  # name for source = "hf"
    hf_split: str = "train"
    text_field: str = "text"
    tokenizer: str = "bpe"  # "bpe": train a byte-level BPE on the corpus; else an HF tokenizer name/path
    val_fraction: float = 0.05
    max_bytes: int = 0  # 0 = whole corpus
    cache_dir: str = ".cache/mtp"
    # source = "self": the init_from trunk's own greedy continuations of prompts from `self_prompts`
    self_prompts: str = "stdlib"  # stdlib | files | gsm8k (both read data.paths) | humaneval | stdlib-functions,
                                  # or several joined by "+" (e.g. "stdlib-functions+gsm8k"), sharing the samples
    self_samples: int = 256  # prompts continued
    self_prompt_tokens: int = 32  # corpus prompts: windows of this many tokens
    self_new_tokens: int = 128  # greedy tokens generated per prompt (fewer at end of text)
    self_share: float = 0.0  # source "<corpora>+self": the continuations' share of the text (by bytes), reached by
                             # repeating them (windows are drawn uniformly over the tokens); 0: each once

    def validate(self) -> None:
        parts = self.source_parts
        if any(p not in SOURCES for p in parts) or len(set(parts)) < len(parts):
            raise UserError(f"unknown or repeated data.source {self.source!r}; choose {', '.join(SOURCES)} (several "
                            "joined by '+' mix their documents)")
        if not 0.0 <= self.self_share < 1.0:
            raise UserError(f"data.self_share must be in [0, 1), got {self.self_share}")
        if self.self_share and not (self.uses_self and self.natural_parts):
            raise UserError("data.self_share weighs the trunk's continuations against other corpora: it needs a "
                            "data.source such as 'stdlib-functions+self'")
        if self.uses_self:
            unknown = [p for p in self.self_prompt_sets if p not in SELF_PROMPTS]
            if unknown or len(set(self.self_prompt_sets)) < len(self.self_prompt_sets):
                raise UserError(f"unknown or repeated data.self_prompts {self.self_prompts!r}; choose one of "
                                f"{', '.join(SELF_PROMPTS)}, or several joined by '+'")
            for name in ("self_samples", "self_prompt_tokens", "self_new_tokens"):
                if getattr(self, name) < 1:
                    raise UserError(f"data.{name} must be >= 1, got {getattr(self, name)}")
            if self.self_samples < len(self.self_prompt_sets):
                raise UserError(f"data.self_samples ({self.self_samples}) must give each prompt set in "
                                f"{self.self_prompts!r} at least one prompt")
        if {"files", "gsm8k"} & set(parts) or (self.uses_self and {"files", "gsm8k"} & set(self.self_prompt_sets)):
            if not self.paths:
                raise UserError(f"data.source = {self.source!r} needs data.paths (or --data PATH)")
            for p in self.paths:
                if not Path(p).expanduser().exists():
                    raise UserError(f"data path not found: {p}")
        if "hf" in parts and not self.hf_dataset:
            raise UserError("data.source = 'hf' needs data.hf_dataset")
        if not 0.0 < self.val_fraction < 0.5:
            raise UserError(f"data.val_fraction must be in (0, 0.5), got {self.val_fraction}")

    @property
    def source_parts(self) -> list[str]:
        """The corpora `source` names, in order ("stdlib-functions+gsm8k": both, their documents one after the other)."""
        return self.source.split("+")

    @property
    def uses_self(self) -> bool:
        """Whether the text includes the trunk's own continuations (`self`, alone or mixed in)."""
        return "self" in self.source_parts

    @property
    def natural_parts(self) -> list[str]:
        """The corpora other than the trunk's continuations, in order."""
        return [p for p in self.source_parts if p != "self"]

    @property
    def self_prompt_sets(self) -> list[str]:
        """The prompt sets `self_prompts` names, in order."""
        return self.self_prompts.split("+")


@dataclass
class TrainConfig:
    steps: int = 220
    batch_size: int = 16
    grad_accum: int = 1
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 50
    schedule: str = "cosine"  # cosine | wsd (warmup-stable-decay)
    decay_fraction: float = 0.2  # wsd: final fraction of steps spent decaying
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # the largest gradient norm kept (0: no clipping)
    seed: int = 0  # the initialisation (torch.manual_seed before the model is built)
    data_seed: int | None = None  # the order of training batches; None = `seed` (runs before it existed)
    log_every: int = 1
    eval_every: int = 50
    eval_batches: int = 8
    ckpt_every: int = 50
    compile: bool = False
    device: str = "auto"  # auto | cpu | cuda
    peak_flops: float = 0.0  # FLOP/s used for MFU; 0 = measure the fp32/bf16 matmul peak once
    init_from: str = ""  # a checkpoint the trunk starts from: folder, Hub id, .gguf file or short name; "" = random init
    freeze_trunk: bool = False  # train only the MTP modules (needs init_from)
    trunk_cache: bool = True  # a frozen trunk's states per batch are stored and reused (mtp_cli/model/trunk_cache.py)
    trunk_dtype: str = "float32"  # what a frozen trunk's cached pass runs in: float32, or bfloat16 (autocast; the
                                  # states stored in bf16, the last layer and the teacher still in fp32 each step)
    distinct_batches: int = 0  # step s trains on batch s mod this (0: a new batch every step): passes over one sample
    track: str = "none"  # none | tensorboard | wandb: also log the metrics there (rank 0)
    parallel: str = "ddp"  # ddp (every rank holds the whole model) | fsdp (sharded: FSDP2 + DCP checkpoints)

    def batch_index(self, step: int) -> int:
        """Which training batch step `step` (0-based) draws: itself, or its place in the cycle of `distinct_batches`."""
        return step % self.distinct_batches if self.distinct_batches else step

    @property
    def order_seed(self) -> int:
        """The seed the batches are drawn from: `data_seed`, or `seed` when it is not set."""
        return self.seed if self.data_seed is None else self.data_seed

    def validate(self) -> None:
        if self.data_seed is not None and self.data_seed < 0:
            raise UserError(f"train.data_seed must be >= 0, got {self.data_seed}")
        if self.trunk_dtype not in TRUNK_DTYPES:
            raise UserError(f"unknown train.trunk_dtype {self.trunk_dtype!r}; choose {' or '.join(TRUNK_DTYPES)}")
        if self.trunk_dtype != "float32" and not (self.freeze_trunk and self.trunk_cache):
            raise UserError(f"train.trunk_dtype = {self.trunk_dtype!r} is the cached pass of a frozen trunk: it needs "
                            "train.freeze_trunk and train.trunk_cache")
        if self.distinct_batches < 0:
            raise UserError(f"train.distinct_batches must be >= 0 (0: a new batch every step), got {self.distinct_batches}")
        for name in ("steps", "batch_size", "grad_accum", "log_every", "eval_every", "eval_batches", "ckpt_every"):
            if getattr(self, name) < 1:
                raise UserError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise UserError(f"train.lr must be a finite number > 0, got {self.lr}")
        if not (math.isfinite(self.grad_clip) and self.grad_clip >= 0):
            raise UserError(f"train.grad_clip must be a finite number >= 0 (0: no clipping), got {self.grad_clip}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise UserError(f"train.{name} must be in [0, 1), got {getattr(self, name)}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise UserError(f"train.weight_decay must be a finite number >= 0, got {self.weight_decay}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise UserError(f"train.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if not 0.0 <= self.decay_fraction <= 1.0:
            raise UserError(f"train.decay_fraction must be in [0, 1], got {self.decay_fraction}")
        for name, flag in (("seed", "--seed"), ("data_seed", "--data-seed")):
            value = getattr(self, name)
            if value is not None and not 0 <= value < 2**63:
                raise UserError(f"train.{name} ({flag}) must be in [0, 2**63), got {value}")
        if self.steps > 10**9:
            raise UserError(f"train.steps must be at most 10**9, got {self.steps}")
        if self.warmup < 0:
            raise UserError(f"train.warmup must be >= 0, got {self.warmup}")
        if self.schedule not in SCHEDULES:
            raise UserError(f"unknown train.schedule {self.schedule!r}; choose one of {', '.join(SCHEDULES)}")
        if self.device not in DEVICES:
            raise UserError(f"unknown train.device {self.device!r}; choose one of {', '.join(DEVICES)}")
        if self.track not in TRACKERS:
            raise UserError(f"unknown tracker {self.track!r} (--track / train.track); choose one of {', '.join(TRACKERS)}")
        if self.parallel not in PARALLEL:
            raise UserError(f"unknown train.parallel {self.parallel!r}; choose one of {', '.join(PARALLEL)}")


@dataclass
class EvalConfig:
    """What `mtp eval` and `mtp ablate`'s eval stage measure, on the exported trunk (MTP modules discarded)."""

    enabled: bool = True
    tasks: list[str] = field(default_factory=lambda: list(EVAL_TASKS))
    limits: dict[str, int] = field(default_factory=dict)  # task -> first N items; absent or 0 = all
    gsm8k_data: str = "data/gsm8k"  # relative to the repository (`mtp_cli.base.paths`); "" or "hub" = the online stock task
    gsm8k_fewshot: int | None = 5  # lm-eval's num_fewshot; None (`mtp eval` without the flag): the run recipe's,
    #                                lowered to the largest count whose prompts fit the trained context
    truncate: bool = True  # cut prompts to the trained context (lm-eval's rule); false = refuse to eval instead
    baseline: bool = False  # also evaluate train.init_from itself (`mtp eval --hf`): the "before" row
    samples: int = 1  # HumanEval completions per problem (pass@k for k <= samples)
    temperature: float = 0.0  # HumanEval sampling temperature (0: greedy)
    humaneval_prompt: str = "raw"  # raw HumanEval prompt | instruct: lm-eval's humaneval_instruct under the chat template
    generate: bool = True  # false: HumanEval and GSM8K score the gold answers only (no pass rates, no generation)

    def limit(self, task: str) -> int | None:
        return self.limits.get(task) or None

    def validate(self) -> None:
        for task in self.tasks:
            if task not in EVAL_TASKS:
                raise UserError(f"unknown eval task {task!r} (eval.tasks / --tasks); choose from {', '.join(EVAL_TASKS)}")
        if len(set(self.tasks)) != len(self.tasks):
            raise UserError(f"eval.tasks lists a task twice: {self.tasks}")
        for task, n in self.limits.items():
            if task not in EVAL_TASKS:
                raise UserError(f"eval.limits names unknown task {task!r}; choose from {', '.join(EVAL_TASKS)}")
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise UserError(f"eval.limits.{task} (--limit) must be a whole number >= 0 (0 = all), got {n!r}")
        fewshot = self.gsm8k_fewshot
        if fewshot is not None and (isinstance(fewshot, bool) or not isinstance(fewshot, int) or fewshot < 0):
            raise UserError(f"eval.gsm8k_fewshot (--gsm8k-fewshot) must be a whole number >= 0, got {fewshot!r}")
        if not isinstance(self.truncate, bool):
            raise UserError(f"eval.truncate must be true or false, got {self.truncate!r}")
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or not 1 <= self.samples <= MAX_SAMPLES:
            raise UserError(f"--samples must be in [1, {MAX_SAMPLES}] (pass@k papers use up to 200), got {self.samples}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise UserError(f"--temperature must be >= 0, got {self.temperature}")
        if self.humaneval_prompt not in ("raw", "instruct"):
            raise UserError(f"eval.humaneval_prompt (--humaneval-prompt) must be raw or instruct, got {self.humaneval_prompt!r}")
        if not isinstance(self.generate, bool):
            raise UserError(f"eval.generate must be true or false, got {self.generate!r}")
        if self.samples > 1 and self.temperature <= 0:
            raise UserError("--samples > 1 needs --temperature > 0 (greedy decoding gives the same completion every time)")


MAX_SAMPLES = 1000  # HumanEval completions per problem: 164,000 generations at the most

MAX_DRAFT_CANDIDATES = 6  # draft lengths + tree widths one specbench times: each may compile a fused graph,
# and dynamo allows 8 per code object (bench/run.py fails rather than time eager code past it)


@dataclass
class SpecbenchConfig:
    """What `mtp specbench` and `mtp ablate`'s specbench stage measure: MTP self-speculative decoding
    against plain greedy and peers."""

    enabled: bool = True
    prompts: str | list[str] = "humaneval"  # one or more of humaneval | gsm8k | heldout | a prompt file
    temperatures: list[float] = field(default_factory=lambda: [0.0])  # each source is measured at each
    primary: str | None = None  # the headline condition, e.g. "heldout-greedy" (default: the first)
    limit: int = 20  # the first N prompts of each source; 0 = all
    max_new_tokens: int = 128
    batch_sizes: list[int] = field(default_factory=lambda: [1])
    repeats: int = 5
    draft_len: int | None = None  # None: the run's own number of modules/heads
    draft_lens: list[int] | None = None  # or the fastest of these, chosen on untimed prompts (bench/draft_select.py)
    draft_width: int = 1  # k = 1, one row, greedy: verify the module's top w candidates for the next token
    draft_widths: list[int] | None = None  # or the fastest of these at k = 1, chosen as draft_lens
    draft_vocab: int | None = None  # the modules draft from this many most frequent training tokens
    # (None: the run's mtp.draft_vocab, else V/4; 0: all)
    peers: str = "all"  # all | primary | none: where the Hugging Face peers are timed (they cost the most)
    compile: bool | None = None  # torch.compile our decoders in `mtp ablate`'s specbench (None: the device's default)
    dtype: str = "fp32"  # fp32 | bf16 | int8: the weights every method decodes with (Runtime.dtype)
    seeds: list[int] | None = None  # `mtp ablate`: time only the runs of these grid seeds (None: every seed's)

    def validate(self) -> None:
        if self.seeds is not None and (not isinstance(self.seeds, list)
                                       or any(isinstance(s, bool) or not isinstance(s, int) for s in self.seeds)):
            raise UserError(f"specbench.seeds must be a list of grid seeds, got {self.seeds!r}")
        if self.peers not in PEER_SCOPES:
            raise UserError(f"specbench.peers (--peers) must be one of {', '.join(PEER_SCOPES)}, got {self.peers!r}")
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 0:
            raise UserError(f"specbench.limit (--limit) must be a whole number >= 0 (0 = all), got {self.limit!r}")
        for name in ("max_new_tokens", "repeats"):
            if getattr(self, name) < 1:
                raise UserError(f"specbench.{name} (--{name.replace('_', '-')}) must be >= 1, got {getattr(self, name)}")
        if not self.batch_sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.batch_sizes):
            raise UserError(f"specbench.batch_sizes (--batch-sizes) must be integers >= 1, got {self.batch_sizes}")
        if self.draft_len is not None and self.draft_len < 1:
            raise UserError(f"specbench.draft_len (--draft-len) must be >= 1, got {self.draft_len}")
        if self.draft_lens is not None:
            if self.draft_len is not None:
                raise UserError("set specbench.draft_len or specbench.draft_lens (--draft-len or --draft-lens), not both")
            if not self.draft_lens or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in self.draft_lens):
                raise UserError(f"specbench.draft_lens (--draft-lens) must be integers >= 1, got {self.draft_lens}")
            if not self.limit:
                raise UserError("specbench.draft_lens chooses k on prompts beyond the timed ones: "
                                "it needs specbench.limit (--limit) > 0")
        if isinstance(self.draft_width, bool) or not isinstance(self.draft_width, int) or self.draft_width < 1:
            raise UserError(f"specbench.draft_width (--draft-width) must be an integer >= 1, got {self.draft_width!r}")
        if self.draft_widths is not None:
            if self.draft_width != 1:
                raise UserError("set specbench.draft_width or specbench.draft_widths (--draft-width or --draft-widths), "
                                "not both")
            if not self.draft_widths or any(isinstance(w, bool) or not isinstance(w, int) or w < 1
                                            for w in self.draft_widths):
                raise UserError(f"specbench.draft_widths (--draft-widths) must be integers >= 1, got {self.draft_widths}")
            if not self.limit:
                raise UserError("specbench.draft_widths chooses the width on prompts beyond the timed ones: "
                                "it needs specbench.limit (--limit) > 0")
        if (self.draft_width > 1 or self.draft_widths) and (self.draft_len or 1) > 1:
            raise UserError("specbench.draft_width(s) > 1 verifies candidates for one draft: it needs "
                            "specbench.draft_len 1 (--draft-len 1)")
        if self.draft_width > 1 and self.draft_lens and max(self.draft_lens) > 1:
            raise UserError("specbench.draft_width > 1 needs one draft per step, but draft_lens may choose more: "
                            "use draft_widths (chosen after k, skipped when k > 1) or draft_len 1")
        if len(self.draft_lens or []) + len(self.draft_widths or []) > MAX_DRAFT_CANDIDATES:
            raise UserError(f"specbench.draft_lens and draft_widths: at most {MAX_DRAFT_CANDIDATES} candidates in all "
                            "(each compiles its own decoding graph)")
        if self.draft_vocab is not None and self.draft_vocab < 0:
            raise UserError(f"specbench.draft_vocab (--draft-vocab) must be >= 0 (0: the whole vocabulary), "
                            f"got {self.draft_vocab}")
        plan_conditions(self.prompts, self.temperatures, self.primary)


@dataclass
class Runtime:
    """Where and how a command runs a model, the same settings for every command that runs one (`mtp eval`,
    `generate`, `specbench`, and each stage of `mtp ablate`). device, threads and compile change how fast a
    number comes, not the number; dtype (the weights' precision for decoding and evaluation, never for
    training) changes it a little, so every result file that depends on it records it."""

    device: str = "auto"  # auto (CUDA when present) | cpu | cuda
    threads: int | None = None  # torch's intra-op CPU threads (None: as they are, one per core by default)
    compile: bool | None = None  # the decoders' torch.compile switch (None: the device's default)
    dtype: str = "fp32"  # fp32 | bf16 | int8 (weight-only, bf16 activations): model/weight_format.py

    def validate(self) -> None:
        if self.device not in DEVICES:
            raise UserError(f"unknown device {self.device!r} (--device); choose one of {', '.join(DEVICES)}")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or self.threads < 1):
            raise UserError(f"--threads must be >= 1, got {self.threads}")
        if self.dtype not in DTYPES:
            raise UserError(f"unknown dtype {self.dtype!r} (--dtype); choose one of {', '.join(DTYPES)}")


@dataclass
class SourceConfig:
    """How `mtp ablate` produces train.init_from when a clone does not have it (exports are not
    committed): train and export variant `variant`, seed `seed`, of recipe `recipe` into
    <results>/<this recipe>/source/<variant>-s<seed>/; its export/ is then every run's init_from."""

    recipe: str = ""
    variant: str = ""
    seed: int = 0


@dataclass
class LauncherConfig:
    """Where `mtp ablate` runs its stages: here, one after another (local), or as Slurm jobs (submitit)."""

    kind: str = "local"  # local | slurm
    partition: str = ""
    account: str = ""
    qos: str = ""
    time: str = "4:00:00"  # Slurm's time-limit syntax, per job
    nodes: int = 1  # of the training job; export/eval/specbench jobs use one node
    gpus_per_node: int = 1
    cpus_per_task: int = 8
    mem: str = ""  # e.g. "64G"; "" = the partition's default
    sbatch: dict[str, Any] = field(default_factory=dict)  # extra sbatch options, e.g. { constraint = "a100" }
    setup: list[str] = field(default_factory=list)  # shell lines run before each job, e.g. "module load cuda"
    folder: str = ""  # submitit's job folder (logs, pickles); "" = <results>/<recipe>/slurm

    def validate(self) -> None:
        if self.kind not in LAUNCHERS:
            raise UserError(f"unknown launcher {self.kind!r} (--launcher / launcher.kind); choose one of {', '.join(LAUNCHERS)}")
        for name in ("nodes", "cpus_per_task"):
            if getattr(self, name) < 1:
                raise UserError(f"launcher.{name} must be >= 1, got {getattr(self, name)}")
        if self.gpus_per_node < 0:
            raise UserError(f"launcher.gpus_per_node must be >= 0, got {self.gpus_per_node}")
        time_minutes(self.time)


_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def time_minutes(text: str) -> int:
    """Slurm's time-limit syntax (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S) in whole minutes, rounded up."""
    match = _SLURM_TIME.match(str(text).strip())
    if not match:
        raise UserError(f"launcher time {text!r} is not a Slurm time limit (e.g. 90, 4:00:00, 1-12:00:00)")
    days, a, b, c = match.groups()
    a, b, c = int(a), int(b or 0), int(c or 0)
    if days is not None:  # D-H, D-H:M, D-H:M:S
        seconds = ((int(days) * 24 + a) * 60 + b) * 60 + c
    elif c or match.group(4) is not None:  # H:M:S
        seconds = (a * 60 + b) * 60 + c
    else:  # M or M:S
        seconds = a * 60 + b
    if seconds < 60:
        raise UserError(f"launcher time {text!r} is under a minute")
    return -(-seconds // 60)


@dataclass
class Variant:
    """One column of an ablation: a name plus overrides of the recipe's sections, e.g.
    `{name = "seq-d1", mtp = {objective = "sequential", depth = 1, lambda = 0.3}}`.

    At grid seed s a run initialises from seed s + `init_seed_offset` and draws its batches from data
    seed s + `data_seed_offset` (or the recipe's train.data_seed + the offset). Both 0 (the default):
    the grid seed sets both, so every variant at seed s shares initialisation and data order with NTP
    at seed s. A noise-floor cell is NTP with `init_seed_offset` > 0 (another initialisation, the same
    data order) or `data_seed_offset` > 0 (the same initialisation, another data order), paired with
    NTP at the same grid seed like any variant. `eval` and `specbench` override those sections for
    this variant's runs (a noise floor has no drafters to time: `specbench = { enabled = false }`)."""

    name: str = ""
    description: str = ""
    init_seed_offset: int = 0
    data_seed_offset: int = 0
    model: dict[str, Any] = field(default_factory=dict)
    mtp: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    eval: dict[str, Any] = field(default_factory=dict)
    specbench: dict[str, Any] = field(default_factory=dict)  # e.g. {enabled = false} for a noise floor: no drafters


@dataclass
class Recipe:
    name: str = "custom"
    model: ModelConfig = field(default_factory=ModelConfig)
    mtp: MTPConfig = field(default_factory=MTPConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    # Sections used by `mtp ablate`; `mtp train` carries them along untouched.
    seeds: list[int] = field(default_factory=lambda: [0])
    eval: EvalConfig = field(default_factory=EvalConfig)
    specbench: SpecbenchConfig = field(default_factory=SpecbenchConfig)
    variants: list[Variant] = field(default_factory=list)
    description: str = ""
    source: SourceConfig = field(default_factory=SourceConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)

    def check_draft_vocab(self) -> None:
        if self.mtp.draft_vocab > self.model.vocab_size:
            raise UserError(f"mtp.draft_vocab {self.mtp.draft_vocab} is above the vocabulary of {self.model.vocab_size} "
                            f"tokens (0: all of them)")

    def validate(self) -> Recipe:
        self.model.validate()
        self.mtp.validate()
        if self.mtp.n_extra >= self.model.context:
            raise UserError(f"{self.mtp.n_extra} extra predictions per position need model.context > "
                            f"{self.mtp.n_extra}, got {self.model.context}")
        self.data.validate()
        self.train.validate()
        if self.train.freeze_trunk and self.mtp.objective == "ntp":
            raise UserError("--freeze-trunk with the ntp objective leaves nothing to train; choose sequential or parallel")
        has_init = bool(self.train.init_from or self.source.recipe)  # [source]: `mtp ablate` sets init_from
        if self.train.freeze_trunk and not has_init:
            raise UserError("--freeze-trunk needs --init-from (a trained trunk to freeze)")
        if self.mtp.draft_target == "trunk" and not self.train.freeze_trunk:
            raise UserError("mtp.draft_target = 'trunk' distils the modules from a frozen trunk: it needs train.freeze_trunk")
        if not has_init:  # with init_from the vocabulary is the checkpoint's (pretrained.resolve_recipe checks it)
            self.check_draft_vocab()
        if self.data.uses_self and not has_init:
            raise UserError("data.source = 'self' needs train.init_from (the trunk whose continuations are the data)")
        return self

    def runtime(self, stage: str = "train", threads: int | None = None) -> Runtime:
        """The `Runtime` a stage of this recipe runs on (train, eval, specbench): train.device, the stage's
        compile switch (train.compile, specbench.compile; eval: the device's default), the weights' dtype
        (specbench.dtype; fp32 elsewhere) and `threads`, the command line's (None: torch's default)."""
        compile = {"train": self.train.compile, "specbench": self.specbench.compile}.get(stage)
        dtype = self.specbench.dtype if stage == "specbench" else "fp32"
        rt = Runtime(device=self.train.device, threads=threads, compile=compile, dtype=dtype)
        rt.validate()
        return rt

    def check_grid(self) -> Recipe:
        """Validate what `mtp ablate` adds: seeds, eval/specbench settings, variant names and overrides."""
        if not self.seeds:
            raise UserError("recipe.seeds must list at least one seed")
        if len(set(self.seeds)) != len(self.seeds):
            raise UserError(f"recipe.seeds lists a seed twice: {self.seeds}")
        big = [s for s in self.seeds if not 0 <= s < 2**63]
        if big:
            raise UserError(f"recipe.seeds (--seeds) must be in [0, 2**63), got {big[0]}")
        self.eval.validate()
        self.specbench.validate()
        self.launcher.validate()
        seen: set[str] = set()
        for v in self.variants:
            if not v.name:
                raise UserError("every variant needs a name")
            if not _VARIANT_NAME.match(v.name):
                raise UserError(f"variant name {v.name!r} must be letters, digits and . _ + = - (it names a folder)")
            if v.name in seen:
                raise UserError(f"variant name {v.name!r} is used twice")
            seen.add(v.name)
            for key in ("init_seed_offset", "data_seed_offset"):
                if getattr(v, key) < 0:
                    raise UserError(f"variant {v.name!r}: {key} must be >= 0, got {getattr(v, key)}")
            if "seed" in v.train or "data_seed" in v.train:
                raise UserError(f"variant {v.name!r}: the grid sets train.seed and train.data_seed; "
                                "use init_seed_offset / data_seed_offset")
            run = self.for_run(v, self.seeds[0], validate=False)
            run.model.validate()
            run.mtp.validate()
            run.train.validate()
        return self

    def grid_variants(self) -> list[Variant]:
        """The recipe's variants; a recipe without any is one variant named after its objective."""
        return self.variants or [Variant(name=self.mtp.objective)]

    def for_run(self, variant: Variant, seed: int, validate: bool = True) -> Recipe:
        """The plain single-run recipe of one grid cell: the variant's overrides applied, the seeds set
        (init: seed + init_seed_offset; data order: data seed + data_seed_offset, the data seed being
        the recipe's train.data_seed or else the grid seed; both left as they were without offsets)."""
        base = self.to_dict()
        sections = {}
        for section in VARIANT_SECTIONS:
            cls = type(getattr(self, section))
            merged = {**base[section], **getattr(variant, section)}
            sections[section] = from_dict(cls, merged, f"variant {variant.name!r}: {section}")
        train = sections["train"]
        if variant.init_seed_offset or variant.data_seed_offset:
            train.data_seed = (seed if train.data_seed is None else train.data_seed) + variant.data_seed_offset
        train.seed = seed + variant.init_seed_offset
        if sections["specbench"].seeds is not None and seed not in sections["specbench"].seeds:
            sections["specbench"].enabled = False
        run = dataclasses.replace(self, **sections, seeds=[seed], variants=[],
                                  description=variant.description or self.description)
        return run.validate() if validate else run

    def to_dict(self) -> dict[str, Any]:
        return _to_toml_dict(self)

    def to_toml(self, sections: tuple[str, ...] = ("model", "mtp", "data", "train")) -> str:
        """The recipe's name and these tables as TOML text, which `load_recipe` reads back."""
        d = self.to_dict()
        return toml_text({"name": d["name"], **{s: d[s] for s in sections}})

    def override(self, section: str, **values: Any) -> None:
        """Apply CLI flags (None = not given) onto one section."""
        target = getattr(self, section)
        for key, value in values.items():
            if value is not None:
                setattr(target, key, value)


def toml_text(data: dict[str, Any]) -> str:
    """A recipe's tables as TOML text: top-level values, then [tables], then [[variants]]; None left out."""
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)  # a JSON string is a TOML basic string
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items() if x is not None) + " }"
        raise TypeError(f"no TOML for {v!r}")

    def pairs(table: dict) -> str:
        return "\n".join(f"{k} = {value(v)}" for k, v in table.items() if v is not None)

    top = [f"{k} = {value(v)}" for k, v in data.items() if not isinstance(v, dict) and k != "variants" and v is not None]
    tables = [f"\n[{k}]\n{pairs(v)}" for k, v in data.items() if isinstance(v, dict)]
    variants = [f"\n[[variants]]\n{pairs(v)}" for v in data.get("variants", [])]
    return "\n".join(top + tables + variants) + "\n"


def _field_key(name: str) -> str:
    return "lambda" if name == "lambda_" else name


def _to_toml_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {_field_key(f.name): _to_toml_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list):
        return [_to_toml_dict(v) for v in obj]
    return obj


def _check_type(value: Any, annotation: Any, where: str) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return _check_type(value, option, where)
            except UserError:
                pass
        raise UserError(f"{where}: {value!r} has the wrong type")
    if origin is list:
        if not isinstance(value, list):
            raise UserError(f"{where}: expected a list, got {value!r}")
        (item,) = typing.get_args(annotation)
        return [_check_type(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{where}: expected a table, got {value!r}")
        return value
    if annotation is Any:
        return value
    if dataclasses.is_dataclass(annotation):
        return from_dict(annotation, value, where)
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation is int and isinstance(value, bool):
        raise UserError(f"{where}: expected an integer, got {value!r}")
    if isinstance(annotation, type) and not isinstance(value, annotation):
        raise UserError(f"{where}: expected {annotation.__name__}, got {value!r}")
    return value


def from_dict(cls: type, data: dict[str, Any], where: str = "recipe") -> Any:
    """Build dataclass `cls` from a TOML table; unknown keys and wrong types are UserErrors."""
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a table, got {data!r}")
    hints = typing.get_type_hints(cls)
    by_key = {_field_key(f.name): f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(by_key))
    if unknown:
        raise UserError(f"unknown key{'s' if len(unknown) > 1 else ''} in {where}: {', '.join(unknown)}")
    kwargs = {}
    for key, value in data.items():
        f = by_key[key]
        annotation = hints[f.name]
        if dataclasses.is_dataclass(annotation):
            kwargs[f.name] = from_dict(annotation, value, f"{where}.{key}" if where != "recipe" else key)
        else:
            kwargs[f.name] = _check_type(value, annotation, f"{where}.{key}" if where != "recipe" else key)
    return cls(**kwargs)


def resolve_recipe_path(name_or_path: str | Path) -> Path:
    """A recipe is a TOML path, or the bare name of one shipped in recipes/ (e.g. 'quick')."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    shipped = RECIPES_DIR / f"{name_or_path}.toml"
    if shipped.is_file():
        return shipped
    raise UserError(f"recipe not found: {name_or_path} (a .toml path or one of: {', '.join(shipped_recipes())})")


def shipped_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.toml"))


def load_recipe(name_or_path: str | Path = "quick") -> Recipe:
    path = resolve_recipe_path(name_or_path)
    data = recipe_data(path)
    train = data.get("train") if isinstance(data.get("train"), dict) else {}
    if "model" not in data and not train.get("init_from") and "source" not in data:
        raise UserError(f"recipe {path} has no [model] table, and neither train.init_from nor a [source] gives one: "
                        "write [model], or start the file with `extends = \"quick\"` to take the quick recipe's tables")
    return from_dict(Recipe, data).check_grid()


def recipe_data(path: Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A recipe file's tables. `extends = "other"` starts from that recipe's tables: each table this file
    gives replaces the same keys of the other's (`seeds`, `variants` and other top-level values are
    replaced whole); `name` and `description` are this file's own."""
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"recipe {path} is not valid TOML: {exc}") from None
    base_name = data.pop("extends", None)
    if base_name is not None:
        base_path = resolve_recipe_path(base_name)
        if base_path.resolve() in _seen:
            raise UserError(f"recipe {path}: extends {base_name}, which extends it back")
        base = recipe_data(base_path, (*_seen, path.resolve()))
        base.pop("description", None)
        for key, value in data.items():
            base[key] = {**base[key], **value} if isinstance(value, dict) and isinstance(base.get(key), dict) else value
        data = base | {"name": data.get("name", path.stem)}
    data.setdefault("name", path.stem)
    return data


def recipe_from_dict(data: dict[str, Any]) -> Recipe:
    return from_dict(Recipe, data)
