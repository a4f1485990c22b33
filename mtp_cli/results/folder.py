"""An ablation's results folder: its layout, when a stage's output is complete, and summary.csv's schema.

    results/<recipe>/
        recipe.lock.json        the recipe this folder belongs to (its fingerprint and full settings)
        summary.csv             one row per run, columns = `COLUMNS` (+ per-depth/per-position columns)
        REPORT.md, plots/       written by `mtp report`
        runs/<variant>-s<seed>/ a run folder (run.json, metrics.jsonl, checkpoint.pt, tokenizer/) plus
            export/             the trunk as a Hugging Face checkpoint (not committed)
            eval.json           `mtp eval` on the exported trunk
            specbench.json      `mtp specbench` of the run's MTP drafting
            ablate.json         which variant/seed this is, and how long each stage took

Everything here reads stored files only; nothing trains or evaluates.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from mtp_cli.base.errors import UserError
from mtp_cli.base.files import read_json_lines, read_json_object, replacing
from mtp_cli.base.result_docs import ci_key, read_eval, read_spec

# the run-folder names (their one home is mtp_cli/base/run_files.py), also read through here by the grid and the launcher
from mtp_cli.base.run_files import (  # noqa: F401
    ABLATE_JSON,
    ABLATE_LOG,
    EVAL_JSON,
    EXPORT,
    EXPORT_INFO,
    METRICS,
    RUN_JSON,
    SPEC_JSON,
)
from mtp_cli.config.recipe import Recipe, recipe_from_dict

STAGES = ("train", "export", "eval", "specbench")
LOCK = "recipe.lock.json"
SUMMARY = "summary.csv"
REPORT = "REPORT.md"
PLOTS = "plots"
RUNS = "runs"
GSM8K_STRICT = "exact_match,strict-match"
GSM8K_FLEX = "exact_match,flexible-extract"
MTP_METHOD = "mtp"
GREEDY_METHOD = "greedy"
AA_METHOD = "aa_control"  # bench/runners.py: the results layer reads files, it does not import the benchmark


SOURCE = "source"  # results/<recipe>/source/<run>: the run a recipe's [source] table trains first
BASELINE = "baseline"  # results/<recipe>/baseline/eval.json: `mtp eval --hf` of the runs' init_from


def _lambda_final(run: dict) -> float | None:
    mtp = (run.get("recipe") or {}).get("mtp") or {}
    final = run.get("lambda_final", mtp.get("lambda_final"))
    return None if run.get("objective") == "ntp" or final is None else final


def run_name(variant: str, seed: int) -> str:
    return f"{variant}-s{seed}"


def source_run_dir(results_dir: Path, recipe) -> Path | None:
    """Where the recipe's [source] table trains its source (None without one)."""
    s = recipe.source
    if not s.recipe:
        return None
    return results_dir / SOURCE / run_name(s.variant, s.seed)


def source_export(results_dir: Path, recipe) -> Path:
    """The [source] run's export: the init_from of every run of a recipe that leaves it out."""
    return source_run_dir(results_dir, recipe) / EXPORT


def baseline_json(results_dir: Path) -> Path:
    return results_dir / BASELINE / EVAL_JSON


def missing_runs(results_dir: str | Path) -> list[tuple[str, list[str]]]:
    """[(run name, stages it lacks)] for every run of the grid in `results_dir`'s recipe.lock.json that
    is not complete (a run without any results lacks every stage); [] when there is no lock."""
    lock = read_lock(Path(results_dir))
    if not isinstance(lock.get("recipe"), dict):
        return []
    recipe = recipe_from_dict(lock["recipe"])
    missing = []
    for variant in recipe.grid_variants():
        for seed in recipe.seeds:
            name = run_name(variant.name, seed)
            run_recipe = recipe.for_run(variant, seed, validate=False)
            pending = pending_stages(RunFolder(Path(results_dir) / RUNS / name), run_recipe)
            if pending:
                missing.append((name, pending))
    return missing


def _read(path: Path) -> dict | None:
    """A JSON object the folder keeps, or None where there is none; a file that is there but damaged (torn,
    not JSON, not an object) is a one-line error naming it, never a silent empty record."""
    return read_json_object(path) if path.is_file() else None


@dataclass
class RunFolder:
    """One run's stored results, read lazily."""

    path: Path

    @cached_property
    def run(self) -> dict:
        return _read(self.path / RUN_JSON) or {}

    @cached_property
    def eval(self) -> dict:
        return read_eval(self.path / EVAL_JSON)

    @cached_property
    def spec(self) -> dict:
        return read_spec(self.path / SPEC_JSON)

    @cached_property
    def log(self) -> dict:
        return _read(self.path / ABLATE_JSON) or {}

    @cached_property
    def metrics(self) -> list[dict]:
        """metrics.jsonl's rows; a last line without its newline is a row being written and is left out, any
        other line that is not a JSON object is a one-line error naming it."""
        path = self.path / METRICS
        return read_json_lines(path, partial_last=True) if path.is_file() else []

    @property
    def variant(self) -> str:
        return self.log.get("variant") or self.path.name.rsplit("-s", 1)[0]

    @property
    def seed(self) -> int:
        if "seed" in self.log:
            return int(self.log["seed"])
        tail = self.path.name.rsplit("-s", 1)[-1]
        return int(tail) if tail.isdigit() else int(self.run.get("recipe", {}).get("train", {}).get("seed", 0))

    # ---- pieces of the stored JSON the summary and the report use --------------------------
    def eval_result(self, task: str) -> dict:
        return (self.eval.get("results") or {}).get(task) or {}

    def spec_batch(self, batch_size: int) -> dict:
        """{method: metrics} at one batch size (empty when not measured)."""
        return spec_batches(self.spec).get(batch_size, {})


def spec_conditions(spec: dict) -> list[dict]:
    """specbench.json's measured conditions."""
    return list(spec.get("conditions") or [])


def spec_primary(spec: dict) -> dict:
    """The condition the headline specbench numbers come from (`primary`), else the first one."""
    conditions = spec_conditions(spec)
    return next((c for c in conditions if c.get("name") == spec.get("primary")), conditions[0] if conditions else {})


def spec_batches(spec: dict) -> dict[int, dict]:
    """specbench.json's per-batch-size results as {batch size: {method: metrics}}: the primary condition's."""
    return {int(bs): methods for bs, methods in (spec_condition(spec).get("results") or {}).items()}


def spec_condition(spec: dict, name: str | None = None) -> dict:
    """One condition of specbench.json (default: the primary; empty when absent)."""
    wanted = name or spec.get("primary")
    return next((c for c in spec_conditions(spec) if c.get("name") == wanted), {})


# ---- when a stage's output is complete -----------------------------------------------------------
def train_done(run: RunFolder, recipe: Recipe) -> bool:
    return run.run.get("status") == "done" and int(run.run.get("step", 0)) >= recipe.train.steps


def export_done(run: RunFolder, recipe: Recipe) -> bool:
    info = _read(run.path / EXPORT / EXPORT_INFO)
    return bool(info) and info.get("step") == run.run.get("step") and train_done(run, recipe)


def eval_done(run: RunFolder, recipe: Recipe) -> bool:
    return all(run.eval_result(task) for task in recipe.eval.tasks)


def specbench_done(run: RunFolder, recipe: Recipe) -> bool:
    measured = spec_batches(run.spec)
    return all(bs in measured for bs in recipe.specbench.batch_sizes)


DONE: dict[str, Callable[[RunFolder, Recipe], bool]] = {
    "train": train_done, "export": export_done, "eval": eval_done, "specbench": specbench_done}


def enabled_stages(recipe: Recipe) -> list[str]:
    return [s for s in STAGES if s in ("train", "export") or (s == "eval" and recipe.eval.enabled and recipe.eval.tasks)
            or (s == "specbench" and recipe.specbench.enabled)]


def pending_stages(run: RunFolder, recipe: Recipe) -> list[str]:
    """Stages still to run, in order. The export is only redone when a later stage needs it (it is
    not committed with the results, so a clone with finished evals must not have to rebuild it)."""
    stages = enabled_stages(recipe)
    pending = [s for s in stages if not DONE[s](run, recipe)]
    later = [s for s in stages if s in ("eval", "specbench")]
    if "export" in pending and later and not set(later) & set(pending):
        pending.remove("export")
    return pending


# ---- summary.csv: one schema ---------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    name: str
    doc: str
    get: Callable[[RunFolder], Any]


def _valid_mfu(value):
    """A stored MFU above 100% (a peak measured on a busy machine, before the peak was re-measured) is no figure."""
    return value if isinstance(value, (int, float)) and 0 < value <= 1 else None


def _get(d: dict, *keys: str) -> Any:
    for key in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d


def _ci(result: dict, key: str, side: int) -> Any:
    """Lower (side 0) or upper (side 1) end of a result's 95% interval for `key`, if stored."""
    ci = result.get(ci_key(key))
    return ci[side] if isinstance(ci, (list, tuple)) and len(ci) == 2 else None


ITEMS_LO = "95% interval over this run's items (evaluation-set noise only, not seed to seed), lower end"
ITEMS_HI = "the same interval, upper end"
PROMPTS_LO = "95% interval over this run's prompts (evaluation-set noise only), lower end"
PROMPTS_HI = "the same interval, upper end"


def spec_value(bs: int, method: str, key: str) -> Callable[[RunFolder], Any]:
    return lambda r: _get(r.spec_batch(bs), method, key)


COLUMNS: list[Column] = [
    Column("run", "run folder name, `<variant>-s<seed>`", lambda r: r.path.name),
    Column("variant", "variant name from the recipe", lambda r: r.variant),
    Column("seed", "grid seed: the ablation's seed, which pairs the runs of every variant", lambda r: r.seed),
    Column(
        "init_seed",
        "initialisation seed (train.seed: the grid seed + the variant's init_seed_offset)",
        lambda r: _get(r.run, "recipe", "train", "seed"),
    ),
    Column("data_seed", "batch-order seed (train.data_seed; where unset, the initialisation seed)", lambda r: _data_seed(r.run)),
    Column("objective", "ntp | sequential | parallel", lambda r: r.run.get("objective")),
    Column("n_extra", "extra predictions: sequential depth D or parallel heads n-1", lambda r: _n_extra(r.run)),
    Column(
        "lambda",
        "MTP loss weight λ at the start of training",
        lambda r: r.run.get("lambda") if r.run.get("objective") != "ntp" else None,
    ),
    Column(
        "lambda_final",
        "λ from lambda_switch of training on (DeepSeek-V3's schedule; empty: λ constant)",
        lambda r: _lambda_final(r.run),
    ),
    Column("mtp_input", "trunk state feeding sequential depth 1", lambda r: _mtp_input(r.run)),
    Column("trunk_layers", "trunk layers (compute-matched parallel heads remove n-1)", lambda r: r.run.get("trunk_layers")),
    Column("params_trunk", "trunk parameters (what is exported)", lambda r: _get(r.run, "params", "trunk")),
    Column("params_mtp", "parameters of the MTP modules/heads (discarded at export)", lambda r: _get(r.run, "params", "mtp")),
    Column("params_total", "all trained parameters", lambda r: _get(r.run, "params", "total")),
    Column("steps", "optimizer steps trained", lambda r: r.run.get("step")),
    Column("train_tokens_seen", "tokens processed in training", lambda r: _tokens_seen(r.run)),
    Column("step_time_s", "median training step time (s)", lambda r: _get(r.run, "throughput", "step_time_s_median")),
    Column("tokens_per_s", "median training tokens/s", lambda r: _get(r.run, "throughput", "tokens_per_s_median")),
    Column(
        "mfu",
        "median model FLOPs utilisation against the measured matmul peak (empty where that peak read below the achieved FLOP/s)",
        lambda r: _valid_mfu(_get(r.run, "throughput", "mfu_median")),
    ),
    Column(
        "peak_memory_mb",
        "peak memory during training (CPU: process peak RSS; CUDA: max allocated)",
        lambda r: _get(r.run, "throughput", "peak_memory_mb"),
    ),
    Column(
        "val_loss",
        "trunk validation cross-entropy at the end of training (nats/token)",
        lambda r: _get(r.run, "final", "val_loss"),
    ),
    Column("val_top1", "trunk validation top-1 accuracy at the end of training", lambda r: _get(r.run, "final", "val_top1")),
    Column(
        "heldout_loss",
        "held-out cross-entropy of the exported trunk (nats/token)",
        lambda r: r.eval_result("heldout").get("loss"),
    ),
    Column("heldout_loss_lo", ITEMS_LO, lambda r: _ci(r.eval_result("heldout"), "loss", 0)),
    Column("heldout_loss_hi", ITEMS_HI, lambda r: _ci(r.eval_result("heldout"), "loss", 1)),
    Column("heldout_bpb", "held-out bits per byte", lambda r: r.eval_result("heldout").get("bpb")),
    Column("heldout_bpb_lo", ITEMS_LO, lambda r: _ci(r.eval_result("heldout"), "bpb", 0)),
    Column("heldout_bpb_hi", ITEMS_HI, lambda r: _ci(r.eval_result("heldout"), "bpb", 1)),
    Column("heldout_n", "held-out tokens scored", lambda r: r.eval_result("heldout").get("n")),
    Column("humaneval_pass1", "HumanEval pass@1 (greedy)", lambda r: r.eval_result("humaneval").get("pass@1")),
    Column("humaneval_pass1_lo", ITEMS_LO, lambda r: _ci(r.eval_result("humaneval"), "pass@1", 0)),
    Column("humaneval_pass1_hi", ITEMS_HI, lambda r: _ci(r.eval_result("humaneval"), "pass@1", 1)),
    Column("humaneval_n", "HumanEval problems scored", lambda r: r.eval_result("humaneval").get("n")),
    Column(
        "humaneval_gold_bpb",
        "bits/byte of HumanEval's canonical solutions given the prompt (trunk)",
        lambda r: r.eval_result("humaneval").get("gold_bpb"),
    ),
    Column("humaneval_gold_bpb_lo", ITEMS_LO, lambda r: _ci(r.eval_result("humaneval"), "gold_bpb", 0)),
    Column("humaneval_gold_bpb_hi", ITEMS_HI, lambda r: _ci(r.eval_result("humaneval"), "gold_bpb", 1)),
    Column("gsm8k_strict", "GSM8K exact match, strict-match", lambda r: r.eval_result("gsm8k").get(GSM8K_STRICT)),
    Column("gsm8k_strict_lo", ITEMS_LO, lambda r: _ci(r.eval_result("gsm8k"), GSM8K_STRICT, 0)),
    Column("gsm8k_strict_hi", ITEMS_HI, lambda r: _ci(r.eval_result("gsm8k"), GSM8K_STRICT, 1)),
    Column("gsm8k_flexible", "GSM8K exact match, flexible-extract", lambda r: r.eval_result("gsm8k").get(GSM8K_FLEX)),
    Column("gsm8k_flexible_lo", ITEMS_LO, lambda r: _ci(r.eval_result("gsm8k"), GSM8K_FLEX, 0)),
    Column("gsm8k_flexible_hi", ITEMS_HI, lambda r: _ci(r.eval_result("gsm8k"), GSM8K_FLEX, 1)),
    Column("gsm8k_n", "GSM8K questions scored", lambda r: r.eval_result("gsm8k").get("n")),
    Column(
        "gsm8k_fewshot",
        "GSM8K few-shot examples per prompt (lm-eval's num_fewshot)",
        lambda r: r.eval_result("gsm8k").get("num_fewshot"),
    ),
    Column(
        "gsm8k_gold_bpb",
        "bits/byte of GSM8K's reference answers given the prompt (trunk)",
        lambda r: r.eval_result("gsm8k").get("gold_bpb"),
    ),
    Column("gsm8k_gold_bpb_lo", ITEMS_LO, lambda r: _ci(r.eval_result("gsm8k"), "gold_bpb", 0)),
    Column("gsm8k_gold_bpb_hi", ITEMS_HI, lambda r: _ci(r.eval_result("gsm8k"), "gold_bpb", 1)),
    Column(
        "spec_lossless",
        "MTP speculative output identical to plain greedy on every prompt (bs=1)",
        spec_value(1, MTP_METHOD, "lossless"),
    ),
    Column("spec_acceptance_rate", "accepted / drafted tokens (bs=1)", spec_value(1, MTP_METHOD, "acceptance_rate")),
    Column("spec_acceptance_rate_lo", PROMPTS_LO, lambda r: _ci(r.spec_batch(1).get(MTP_METHOD) or {}, "acceptance_rate", 0)),
    Column("spec_acceptance_rate_hi", PROMPTS_HI, lambda r: _ci(r.spec_batch(1).get(MTP_METHOD) or {}, "acceptance_rate", 1)),
    Column(
        "spec_degenerate_share",
        "share of generated tokens inside a repetition loop (primary condition)",
        lambda r: _get(spec_primary(r.spec), "text", "degenerate_share"),
    ),
    Column(
        "spec_whitespace_share",
        "share of outputs whose decoded text is only whitespace (primary condition)",
        lambda r: _get(spec_primary(r.spec), "text", "whitespace_share"),
    ),
    Column("spec_mal", "mean acceptance length, 1 + accepted / steps (bs=1)",
           spec_value(1, MTP_METHOD, "mean_acceptance_length")),
    Column("spec_draft_len", "tokens drafted per step", lambda r: r.spec.get("draft_len")),
    Column("spec_speedup", "measured end-to-end speedup over our plain greedy (bs=1; geometric mean over prompts × "
           "repeats, results before the interleaved protocol: median of repeats)", spec_value(1, MTP_METHOD, "speedup")),
    Column(
        "spec_speedup_lo",
        "95% interval over prompts and repeats (crossed; older results: of the median over repeats), lower end",
        lambda r: _ci(r.spec_batch(1).get(MTP_METHOD) or {}, "speedup", 0),
    ),
    Column("spec_speedup_hi", "the same interval, upper end", lambda r: _ci(r.spec_batch(1).get(MTP_METHOD) or {}, "speedup", 1)),
    Column("spec_tpot_speedup", "decode-only speedup: our greedy's time per output token over MTP's (bs=1)",
           spec_value(1, MTP_METHOD, "tpot_speedup")),
    Column("spec_aa_speedup", "A/A control: our greedy timed against itself as a second method (bs=1); 1 is inside "
           "its interval when the interval is honest", spec_value(1, AA_METHOD, "speedup")),
    Column("spec_aa_speedup_lo", "its 95% interval, lower end",
           lambda r: _ci(r.spec_batch(1).get(AA_METHOD) or {}, "speedup", 0)),
    Column("spec_aa_speedup_hi", "the same interval, upper end",
           lambda r: _ci(r.spec_batch(1).get(AA_METHOD) or {}, "speedup", 1)),
    Column(
        "spec_ideal_speedup",
        "MAL · T_step / (T_verify + Σ T_draft) from forward parts timed side by side (bs=1)",
        spec_value(1, MTP_METHOD, "ideal_speedup"),
    ),
    Column("spec_tokens_per_s", "MTP speculative decoding tokens/s (bs=1)", spec_value(1, MTP_METHOD, "tokens_per_s")),
    Column("greedy_tokens_per_s", "our plain greedy decoding tokens/s (bs=1)", spec_value(1, GREEDY_METHOD, "tokens_per_s")),
    Column(
        "hf_generate_tokens_per_s",
        "Hugging Face generate, greedy, same weights: tokens/s (bs=1)",
        spec_value(1, "hf_generate", "tokens_per_s"),
    ),
    Column(
        "hf_prompt_lookup_tokens_per_s",
        "Hugging Face prompt-lookup decoding: tokens/s (bs=1)",
        spec_value(1, "hf_prompt_lookup", "tokens_per_s"),
    ),
    Column("eval_s", "wall time of the eval stage (s)", lambda r: _get(r.log, "stages", "eval", "seconds")),
    Column("specbench_s", "wall time of the specbench stage (s)", lambda r: _get(r.log, "stages", "specbench", "seconds")),
]
# Columns repeated per extra depth/head k (1-based) and per draft position i; see `summary_frame`.
DEPTH_COLUMNS = {"val_loss_{k}": "end-of-training validation loss of extra prediction k", "val_top1_{k}": "its top-1 accuracy",
                 "val_agree_{k}": "how often its argmax equals the trunk's greedy token (acceptance proxy)",
                 "heldout_top1_{k}": "extra prediction k's top-1 on the whole validation split (eval)",
                 "heldout_agree_{k}": "its agreement with the trunk's greedy token there (acceptance proxy)"}
POSITION_COLUMN = ("spec_accept_pos{i}", "measured acceptance at draft position i, bs=1 (vLLM's definition)")
# Per quality metric: the run's value minus that of the baseline's run at the same grid seed.
DELTA_COLUMN = ("delta_{col}", "this run's {col} minus that of the baseline (the recipe's first NTP variant) at the "
                "same grid seed: the per-seed paired Δ the report's interval over seeds is built from (empty for "
                "the baseline itself)")
DELTA_OF = ("heldout_loss", "heldout_bpb", "humaneval_gold_bpb", "gsm8k_gold_bpb", "humaneval_pass1", "gsm8k_strict",
            "gsm8k_flexible")


def _data_seed(run: dict) -> int | None:
    train = _get(run, "recipe", "train") or {}
    return train.get("seed") if train.get("data_seed") is None else train.get("data_seed")


def _n_extra(run: dict) -> int | None:
    mtp = _get(run, "recipe", "mtp") or {}
    obj = run.get("objective")
    if obj is None:
        return None
    return {"ntp": 0, "sequential": mtp.get("depth"), "parallel": (mtp.get("heads") or 1) - 1}.get(obj)


def _mtp_input(run: dict) -> str | None:
    return _get(run, "recipe", "mtp", "mtp_input") if run.get("objective") == "sequential" else None


def _tokens_seen(run: dict) -> int | None:
    train, model = _get(run, "recipe", "train") or {}, _get(run, "recipe", "model") or {}
    if run.get("step") is None or not train:
        return None
    return int(run["step"]) * int(train.get("batch_size", 0)) * int(model.get("context", 0))


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def summary_row(run: RunFolder) -> dict[str, Any]:
    row = {c.name: _clean(c.get(run)) for c in COLUMNS}
    final = run.run.get("final") or {}
    extra = {e.get("k"): e for e in run.eval_result("heldout").get("extra") or []}
    for k in range(1, (_n_extra(run.run) or 0) + 1):
        for pattern in DEPTH_COLUMNS:
            name = pattern.format(k=k)
            row[name] = (extra.get(k) or {}).get(name.split("_")[1]) if name.startswith("heldout") else final.get(name)
    per_pos = _get(run.spec_batch(1), MTP_METHOD, "per_position_acceptance") or []
    for i, value in enumerate(per_pos, 1):
        row[POSITION_COLUMN[0].format(i=i)] = value
    return row


def run_folders(results_dir: Path) -> list[RunFolder]:
    """Run folders that hold a run.json, in recipe order when the lock says it, else by name."""
    runs_dir = Path(results_dir) / RUNS
    found = sorted(p for p in runs_dir.glob("*") if (p / RUN_JSON).is_file()) if runs_dir.is_dir() else []
    order = variant_order(results_dir)
    folders = [RunFolder(p) for p in found]
    return sorted(folders, key=lambda r: (order.get(r.variant, len(order)), r.variant, r.seed))


def read_lock(results_dir: Path, required: bool = False) -> dict:
    """recipe.lock.json ({} where there is none); `required`: a report needs its recipe, so a missing or
    recipe-less lock is a one-line error."""
    lock = _read(Path(results_dir) / LOCK) or {}
    if required and not isinstance(lock.get("recipe"), dict):
        raise UserError(f"{Path(results_dir) / LOCK} is missing or holds no recipe: the report cannot say how the runs "
                        "were made; restore it (it is written by `mtp ablate`)")
    return lock


def variant_order(results_dir: Path) -> dict[str, int]:
    variants = _get(read_lock(results_dir), "recipe", "variants") or []
    return {v["name"]: i for i, v in enumerate(variants)}


def summary_frame(results_dir: Path) -> pd.DataFrame:
    rows = [summary_row(r) for r in run_folders(results_dir)]
    base = [c.name for c in COLUMNS]
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=base)
    extra = [c for c in frame.columns if c not in base]
    frame = frame[base + extra]
    return pd.concat([frame, _deltas(frame)], axis=1)


def _deltas(frame: pd.DataFrame) -> pd.DataFrame:
    """`delta_<col>` per run: its value minus the baseline run's at the same grid seed (`DELTA_COLUMN`)."""
    ntp = frame[frame["objective"] == "ntp"]
    if not len(ntp):
        return pd.DataFrame(index=frame.index)
    base = ntp[ntp["variant"] == ntp["variant"].iloc[0]].set_index("seed")
    out = {}
    for col in DELTA_OF:
        if col not in frame:
            continue
        values = pd.to_numeric(frame[col], errors="coerce")
        reference = pd.to_numeric(base[col], errors="coerce")
        delta = values - frame["seed"].map(reference)
        delta[frame["variant"] == base["variant"].iloc[0]] = float("nan")
        out[DELTA_COLUMN[0].format(col=col)] = delta
    return pd.DataFrame(out, index=frame.index)


def write_summary(results_dir: Path) -> Path:
    path = Path(results_dir) / SUMMARY
    with replacing(path) as tmp:
        summary_frame(results_dir).to_csv(tmp, index=False)
    return path
