"""The results model: one ablation's stored results loaded once, for the tables (the report package) and the
plots (plots.py) alike. Runs per variant and seed, their summary rows, per-item series (HumanEval
problems, GSM8K questions, held-out windows) and specbench conditions. Anything a run did not
store reads as None, so older results render with "not measured" instead of failing.
"""

from __future__ import annotations

import json
import math
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from mtp_cli.base import stats
from mtp_cli.base.errors import UserError
from mtp_cli.base.result_docs import ci_key
from mtp_cli.config.recipe import recipe_from_dict
from mtp_cli.results import folder as results
from mtp_cli.results import seed_stats
from mtp_cli.results.estimate import training_flops


@dataclass(frozen=True)
class Metric:
    """One quality number: its summary.csv column and, where the eval stores it per item, where."""

    label: str
    col: str
    pct: bool = False  # a rate shown in percent
    digits: int = 3
    ci: bool = True  # the summary has <col>_lo / <col>_hi per run
    items: tuple[str, str] | None = None  # (eval task, per-item field) for the paired per-item comparison
    higher_better: bool = False  # pass rates; losses and bits/byte are better lower


QUALITY = [
    Metric("held-out loss ↓ (nats/token)", "heldout_loss", items=("heldout", "loss")),
    Metric("held-out bits/byte ↓", "heldout_bpb", items=("heldout", "bpb")),
    Metric("HumanEval gold bits/byte ↓", "humaneval_gold_bpb", items=("humaneval", "gold_bpb")),
    Metric("GSM8K gold bits/byte ↓", "gsm8k_gold_bpb", items=("gsm8k", "gold_bpb")),
    Metric("HumanEval pass@1", "humaneval_pass1", pct=True, higher_better=True),
    Metric("GSM8K strict", "gsm8k_strict", pct=True, higher_better=True),
    Metric("GSM8K flexible", "gsm8k_flexible", pct=True, higher_better=True),
]
VAL_LOSS = Metric("val loss ↓ (training-time)", "val_loss", ci=False)
ITEM_PATH_KEY = {"heldout": "windows_path"}  # other tasks store theirs under "items_path"
ITEM_ID_KEYS = ("task_id", "doc_id", "window")
BEFORE = "source (before)"  # the "before" row's label: the source checkpoint as it is, before any training
CONTEXT_CUT_TASKS = {"humaneval": "HumanEval", "gsm8k": "GSM8K"}
RATIO_KEYS = ("speedup", "ideal_speedup")  # pooled over seeds on the log scale


def values(rows: pd.DataFrame, col: str) -> list[float]:
    """The numeric values of a summary column (missing ones left out)."""
    if col not in rows:
        return []
    return [float(v) for v in pd.to_numeric(rows[col], errors="coerce").dropna()]


@dataclass
class ResultSet:
    """Everything the report reads, loaded once."""

    dir: Path
    frame: pd.DataFrame
    runs: list[results.RunFolder]
    lock: dict
    before: pd.DataFrame | None = None  # the source checkpoint evaluated as it is (baseline/eval.json), one summary row
    _items: dict = field(default_factory=dict, repr=False)

    # ---- variants and seeds ----------------------------------------------------------------------
    @property
    def variants(self) -> list[str]:
        return list(dict.fromkeys(self.frame["variant"]))

    def rows(self, variant: str) -> pd.DataFrame:
        return self.frame[self.frame["variant"] == variant]

    def seeds(self, variant: str) -> dict[int, results.RunFolder]:
        return {run.seed: run for run in self.runs if run.variant == variant}

    @property
    def baseline(self) -> str | None:
        ntp = self.frame[self.frame["objective"] == "ntp"]
        return str(ntp["variant"].iloc[0]) if len(ntp) else None

    def first(self, variant: str, col: str):
        vals = self.rows(variant)[col].dropna() if col in self.frame else []
        return vals.iloc[0] if len(vals) else None

    @property
    def quality_metrics(self) -> list[Metric]:
        """Every quality metric (absent ones read "not measured"); the training-time validation loss
        stands in first when no held-out loss was measured at all."""
        return ([] if values(self.frame, "heldout_loss") else [VAL_LOSS]) + QUALITY

    def variant_label(self, variant: str) -> str:
        what = self.describe(variant)
        return variant if what == variant else f"{variant} ({what})"

    def describe(self, variant: str) -> str:
        obj = self.first(variant, "objective")
        if obj == "sequential":
            return f"sequential D={self.first(variant, 'n_extra')} λ={self.lambda_text(variant)} " \
                   f"{self.first(variant, 'mtp_input')}"
        if obj == "parallel":
            return f"parallel n={int(self.first(variant, 'n_extra')) + 1} λ={self.lambda_text(variant)}, " \
                   f"{self.first(variant, 'trunk_layers')}-layer trunk"
        return str(obj)

    def lambda_text(self, variant: str) -> str:
        """λ as it was through training: "0.3", or "0.3→0.1" when it dropped (DeepSeek-V3's schedule)."""
        start, final = self.first(variant, "lambda"), self.first(variant, "lambda_final")
        return f"{start:g}" if final is None or final == start else f"{start:g}→{final:g}"

    # ---- the source checkpoint before training (recipes that start from one) ------------------------
    @property
    def _before_eval(self) -> dict:
        return results.RunFolder(results.baseline_json(self.dir).parent).eval

    @property
    def before_source(self) -> str | None:
        """What the "before" row evaluated: the checkpoint `mtp eval --hf` read."""
        if self.before is None:
            return None
        doc = self._before_eval
        return (doc.get("hf") or {}).get("source") or doc.get("export") or doc.get("run")

    @property
    def before_seconds(self) -> float | None:
        """Wall seconds the "before" row's evaluation took (baseline/eval.json's per-task seconds)."""
        if self.before is None:
            return None
        spent = (self._before_eval.get("seconds") or {}).values()
        spent = [s for s in spent if isinstance(s, (int, float))]
        return sum(spent) if spent else None

    @property
    def frozen_trunk(self) -> bool:
        """Every run trained with train.freeze_trunk: its trunk is the source's, unchanged."""
        return bool(self.runs) and all(results._get(run.run, "recipe", "train", "freeze_trunk") is True for run in self.runs)

    def trunk_differences(self) -> dict[str, list[str]]:
        """{variant: labels of the quality metrics whose value differs from the "before" row's}, over
        the metrics the "before" row measured (every run of the variant compared, exactly)."""
        if self.before is None:
            return {}
        measured = [m for m in QUALITY if values(self.before, m.col)]
        return {v: [m.label for m in measured if values(self.rows(v), m.col) != values(self.before, m.col) * len(self.rows(v))]
                for v in self.variants}

    def frozen_flops_recount(self, run: results.RunFolder) -> float | None:
        """A frozen-trunk run's training FLOPs/token as `train.flops_per_token` counts them now, when its
        stored figure differs (runs stored before the count knew the frozen trunk's no-grad forward, or a
        distilled module's teacher logits);
        None otherwise, or when its stored recipe cannot be read back."""

        stored, recipe = run.run.get("flops_per_token"), run.run.get("recipe")
        if not (results._get(recipe, "train", "freeze_trunk") is True and isinstance(stored, (int, float))):
            return None
        try:
            now = training_flops(recipe_from_dict(recipe))[0]
        except (UserError, TypeError, ValueError, KeyError):
            return None
        return now if now != stored else None

    def run_models(self) -> dict[str, dict]:
        """{run folder name: the [model] it trained} from each run.json (after init_from resolved it);
        runs that stored none are left out."""
        return {run.path.name: model for run in self.runs if isinstance(model := results._get(run.run, "recipe", "model"), dict)}

    # ---- per-item series ---------------------------------------------------------------------------
    def items(self, run: results.RunFolder, task: str, metric: str) -> pd.Series | None:
        """One run's per-item values of `metric` on `task`, indexed by item id (None if not stored).
        Held-out windows are weighted so that their plain mean is eval.json's aggregate (`_window_totals`)."""
        key = (run.path, task, metric)
        if key not in self._items:
            self._items[key] = _read_items(run, task, metric)
        return self._items[key]

    def item_runs(self, variant: str, metric: Metric) -> dict[int, pd.Series] | None:
        """{seed: per-item series} of a variant, or None unless every one of its runs stored the items."""
        if metric.items is None:
            return None
        series = {seed: self.items(run, *metric.items) for seed, run in self.seeds(variant).items()}
        return series if series and all(s is not None and len(s) for s in series.values()) else None

    def context_cuts(self, task: str) -> list[dict]:
        """Distinct context-cut records of `task` over the runs (the prompts are the same for every run)."""
        keys = ("context", "prompts_cut", "prompt_cut_tokens_max", "prompt_cut_tokens_mean", "prompts_over_context", "n")
        found = []
        for run in self.runs:
            result = run.eval_result(task)
            if result:
                record = {k: result.get(k) for k in keys}
                record["context"] = record["context"] or run.eval.get("context")
                if record not in found:
                    found.append(record)
        return found

    # ---- specbench -------------------------------------------------------------------------------------
    @property
    def condition_names(self) -> list[str]:
        """Every specbench condition any run measured, the primary first."""
        names: list[str] = []
        for primary in (True, False):
            for run in self.runs:
                for c in results.spec_conditions(run.spec):
                    is_primary = c.get("name") == results.spec_primary(run.spec).get("name")
                    if is_primary == primary and c.get("name") not in names:
                        names.append(c.get("name"))
        return names

    def condition(self, run: results.RunFolder, name: str | None = None) -> dict:
        """One run's specbench condition by name (the primary when `name` is None); {} if not measured."""
        if name is None:
            return results.spec_primary(run.spec)
        return next((c for c in results.spec_conditions(run.spec) if c.get("name") == name), {})

    def spec_by_batch(self, variant: str, condition: str | None = None) -> list[tuple[int, dict, int]]:
        """[(batch size, {method: metrics}, runs)] of a variant in one condition: one run's numbers, or
        their means over seeds, where every stored interval (`<key>_ci95`) becomes a t-interval over seeds.
        Speed-ups (`RATIO_KEYS`) are pooled on the log scale instead: the geometric mean, its t-interval
        over seeds (never below 0) and the seeds' own values (`<key>_seeds`)."""
        per_bs: dict[int, list[dict]] = {}
        for run in self.seeds(variant).values():
            for bs, methods in (self.condition(run, condition).get("results") or {}).items():
                per_bs.setdefault(int(bs), []).append(methods)
        out = []
        for bs, all_methods in sorted(per_bs.items()):
            if len(all_methods) == 1:
                out.append((bs, all_methods[0], 1))
                continue
            merged = {}
            for name in all_methods[0]:
                ms = [m.get(name) or {} for m in all_methods]
                merged[name] = {key: _seed_mean([m.get(key) for m in ms]) for key in ms[0]}
                for key in ms[0]:
                    vals = [m.get(key) for m in ms]
                    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in vals):
                        continue
                    if key in RATIO_KEYS:
                        centre, lo, hi = seed_stats.log_t_interval([float(x) for x in vals])
                        merged[name].update({key: centre, ci_key(key): [lo, hi], f"{key}_seeds": [float(x) for x in vals]})
                    elif ci_key(key) in ms[0]:
                        _, lo, hi = stats.t_interval([float(x) for x in vals])
                        merged[name][ci_key(key)] = [lo, hi]
            out.append((bs, merged, len(all_methods)))
        return out

    def text_share(self, variant: str, condition: str | None, key: str) -> float | None:
        """Mean over seeds of a condition's text statistic (`degenerate_share`, `whitespace_share`)."""
        vals = [(self.condition(run, condition).get("text") or {}).get(key) for run in self.seeds(variant).values()]
        nums = [float(v) for v in vals if isinstance(v, (int, float))]
        return sum(nums) / len(nums) if nums else None

    # ---- provenance ------------------------------------------------------------------------------------
    @property
    def results_commits(self) -> list[str]:
        """The commits whose code produced these results (`git_commit` of run.json, eval.json, specbench.json)."""
        found = {doc.get("git_commit") for run in self.runs for doc in (run.run, run.eval, run.spec)}
        found -= {None, "", "unknown"}
        return sorted(found)


def load(results_dir: str | Path) -> ResultSet:
    """Load an ablation's results folder (and rewrite its summary.csv from the run folders)."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise UserError(f"results folder not found: {results_dir}")
    runs = results.run_folders(results_dir)
    if not runs:
        raise UserError(f"no runs in {results_dir / results.RUNS}; run `mtp ablate --recipe RECIPE` first")
    results.write_summary(results_dir)
    return ResultSet(results_dir, results.summary_frame(results_dir), runs, results.read_lock(results_dir, required=True),
                     _before_row(results_dir))


def _before_row(results_dir: Path) -> pd.DataFrame | None:
    """The baseline (`[eval] baseline = true`): the source checkpoint's eval.json as one summary row."""
    path = results.baseline_json(results_dir)
    if not path.is_file():
        return None
    row = results.summary_row(results.RunFolder(path.parent))
    row.update(variant=BEFORE, seed=0, objective=None)
    return pd.DataFrame([row])


def code_commit() -> str | None:
    """The last commit that changed this package's code: what renders a report. Uncommitted edits and
    commits that only add results leave it unchanged, so re-rendering unchanged results is byte-stable."""
    package = Path(__file__).resolve().parents[1]  # mtp_cli/
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%H", "--", "."], cwd=package, capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _resolve(run_path: Path, stored: str) -> Path | None:
    """A stored path: relative to the run folder (the contract), or as written; else the same file
    name inside the run folder (results copied or moved elsewhere)."""
    for path in (run_path / stored, Path(stored), run_path / Path(stored).name):
        if path.is_file():
            return path
    return None


def _read_items(run: results.RunFolder, task: str, metric: str) -> pd.Series | None:
    stored = run.eval_result(task).get(ITEM_PATH_KEY.get(task, "items_path"))
    path = _resolve(run.path, stored) if stored else None
    if path is None:
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if task == "heldout":
        rows = _window_totals(rows, metric)
    ids, vals = [], []
    for row in rows:
        item = next((row[k] for k in ITEM_ID_KEYS if k in row), None)
        value = row.get(metric)
        if item is not None and isinstance(value, (int, float)) and math.isfinite(value):
            ids.append(item)
            vals.append(float(value))
    if not ids:
        return None
    series = pd.Series(vals, index=pd.Index(ids, name="item"), name=f"{task}.{metric}")
    return series[~series.index.duplicated(keep="first")]


def _window_totals(rows: list[dict], metric: str) -> list[dict]:
    """Held-out windows as items whose plain mean is the eval's own aggregate: a window's nats (for
    `loss`) or bits (for `bpb`) over the mean tokens or bytes per window, so the mean over windows is
    Σ nats / Σ tokens (token-weighted loss) or Σ bits / Σ bytes (bits per byte), as in eval.json."""
    if metric not in ("loss", "bpb") or not rows or any(not r.get("tokens") for r in rows):
        return rows
    per = "bytes" if metric == "bpb" else "tokens"
    if any(not r.get(per) for r in rows):
        return []
    mean_per = sum(r[per] for r in rows) / len(rows)
    to_unit = math.log(2) if metric == "bpb" else 1.0
    return [{"window": r.get("window"), metric: r["loss"] * r["tokens"] / to_unit / mean_per} for r in rows]


def _seed_mean(vals: list):
    if vals and all(isinstance(v, bool) for v in vals):
        return all(vals)
    nums = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if vals and len(nums) == len(vals):
        return sum(nums) / len(nums)
    if vals and all(isinstance(v, list) for v in vals) and all(not isinstance(x, dict) for v in vals for x in v):
        width = min(len(v) for v in vals)
        return [_seed_mean([v[i] for v in vals]) for i in range(width)]
    if vals and all(isinstance(v, dict) for v in vals) and all(isinstance(x, (int, float)) for v in vals for x in v.values()):
        return {key: _seed_mean([v[key] for v in vals]) for key in vals[0] if all(key in v for v in vals)}  # per k
    return vals[0] if vals else None
