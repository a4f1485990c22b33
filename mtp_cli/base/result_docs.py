"""eval.json and specbench.json: their typed top level, their versions, the one interval-key convention,
and the one place they are written and read.

Every stored 95% interval is a `[lo, hi]` pair under `<key>_ci95` beside its `<key>`, in both files
(`ci_key`). A file of another version is refused when read, with the command that rewrites it: the
readers in the main path know one schema each. specbench.json version 2 spelled its intervals `_ci`;
`scripts/migrate_specbench_v3.py` rewrites such a file (a key rename, no number changes).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtp_cli.base.errors import UserError
from mtp_cli.base.files import write_json

EVAL_SCHEMA = 1
SPEC_SCHEMA = 3
CI_SUFFIX = "_ci95"


def ci_key(key: str) -> str:
    """Where the 95% interval of `key` is stored: `<key>_ci95`."""
    return key + CI_SUFFIX


@dataclass
class EvalDoc:
    """eval.json: one run (or a Hugging Face checkpoint, `hf`) evaluated with its MTP modules discarded."""

    run: str
    step: int
    objective: str
    export: str | None
    context: int
    tasks: list[str]
    limits: dict[str, int | None]
    seconds: dict[str, float]
    hardware: dict[str, Any]
    git_commit: str
    results: dict[str, dict[str, Any]]  # task -> its metrics, each interval under ci_key(metric)
    hf: dict[str, Any] | None = None  # the checkpoint's record, for `mtp eval --hf`
    harness: str = "mtp"  # who generated and scored: "mtp", or "lm-eval hf" (`mtp eval --harness lm-eval`)
    dtype: str = "fp32"  # the weights' dtype it evaluated with (Runtime.dtype; older files: fp32)
    schema: int = EVAL_SCHEMA


@dataclass
class SpecbenchDoc:
    """specbench.json: one run's decoding benchmark, a `conditions` entry per prompt source × temperature."""

    run: str
    step: int
    objective: str
    depth: int | None
    heads: int | None
    mtp_input: str | None
    draft_len: int | None
    max_new_tokens: int
    batch_sizes: list[int]
    repeats: int
    interval: str
    acceptance_interval: str
    params: dict[str, Any]
    no_mtp_reason: str | None
    peers: dict[str, Any]
    environment: dict[str, Any]
    git_commit: str
    primary: str
    conditions: list[dict[str, Any]] = field(default_factory=list)
    draft_vocab: dict[str, Any] | None = None
    draft_len_selection: dict[str, Any] | None = None  # specbench.draft_lens: every candidate k, timed apart
    draft_width: int | None = None  # candidates verified per step where one row decodes greedily (1: a chain)
    draft_width_selection: dict[str, Any] | None = None  # specbench.draft_widths: every candidate width
    weight_floor: dict[str, Any] | None = None  # a step's weight bytes over the read bandwidth measured in the run
    prompts_interval: str | None = None  # what each method's speedup_prompts_ci95 is (older files have none)
    speedup_interval: str | None = None  # what each method's speedup and its interval are (older files: `interval`)
    schema: int = SPEC_SCHEMA


def write_eval(path: Path, doc: EvalDoc) -> dict:
    data = dataclasses.asdict(doc)
    if data["hf"] is None:
        del data["hf"]  # only `mtp eval --hf` records a checkpoint
    write_json(path, data)
    return data


def write_spec(path: Path, doc: SpecbenchDoc) -> dict:
    data = dataclasses.asdict(doc)
    write_json(path, data)
    return data


def read_eval(path: Path) -> dict:
    """eval.json as a dict checked against `EvalDoc` ({} when there is none); a figure that is not a
    finite number (NaN, infinity) is a one-line error naming it, so that no mean quietly leaves it out."""
    doc = _read(path, EvalDoc, EVAL_SCHEMA, "mtp eval RUN")
    bad = next(_non_finite(doc.get("results") or {}, "results"), None)
    if bad is not None:
        raise UserError(f"{path}: {bad} is not a finite number; re-run that evaluation (mtp eval RUN)")
    return doc


def _non_finite(value, where: str):
    """The keys under `value` whose numbers are NaN or infinite."""
    if isinstance(value, float) and not math.isfinite(value):
        yield where
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _non_finite(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _non_finite(item, f"{where}[{i}]")


def read_spec(path: Path) -> dict:
    """specbench.json as a dict checked against `SpecbenchDoc` ({} when there is none)."""
    return _read(path, SpecbenchDoc, SPEC_SCHEMA, "python scripts/migrate_specbench_v3.py FILE, or mtp specbench RUN")


def _read(path: Path, cls: type, version: int, rewrite: str) -> dict:
    if not Path(path).is_file():
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != version:
        found = data.get("schema") if isinstance(data, dict) else None
        raise UserError(f"{path} is {cls.__name__} schema {found}, this mtp reads schema {version}; rewrite it: {rewrite}")
    names = {f.name for f in dataclasses.fields(cls)}
    required = {f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    unknown, missing = set(data) - names, required - set(data)
    if unknown or missing:
        raise UserError(f"{path} does not match {cls.__name__} schema {version}: "
                        f"{'unknown ' + ', '.join(sorted(unknown)) if unknown else ''}"
                        f"{'; ' if unknown and missing else ''}{'missing ' + ', '.join(sorted(missing)) if missing else ''}")
    return data
