"""Acceptance read from stored specbench results: each draft position's, with its interval over prompts, and the
variants that form a data-scaling curve (the same drafter on more or fewer distinct training tokens).

Position j's acceptance is conditional (the share of steps whose draft j was accepted among those whose drafts
1..j-1 were), from the per-prompt counts specbench keeps (`per_prompt[].accepted_at`); its interval is the
bootstrap over prompts (`stats.ratio_ci`). Results stored before those counts were kept give None.
"""

from __future__ import annotations

import copy

import numpy as np

from mtp_cli.base.stats import ratio_ci
from mtp_cli.results import folder as results


def position_acceptance(units: list[dict], position: int) -> tuple[float | None, list[float | None]]:
    """Draft `position`'s (1-based) acceptance given drafts 1..position-1 were accepted, over prompts (`units`:
    specbench's per_prompt rows), and its 95% bootstrap interval; (None, [None, None]) where not counted."""
    if units and all("accepted_at" not in u and u.get("drafted") == u.get("steps") for u in units):
        units = [{**u, "accepted_at": [u["accepted"]]} for u in units]  # one draft a step: stored before accepted_at
    if not units or any(len(u.get("accepted_at") or []) < position for u in units):
        return None, [None, None]
    num_ = [u["accepted_at"][position - 1] for u in units]
    den = [u["steps"] if position == 1 else u["accepted_at"][position - 2] for u in units]
    return (sum(num_) / sum(den) if sum(den) else None), ratio_ci(num_, den)


def paired_difference(units: list[dict], reference: list[dict], seed: int = 0,
                      n_boot: int = 2000) -> tuple[float | None, list[float | None]]:
    """First-draft acceptance of `units` minus that of `reference` on the same prompts (one row each, in order),
    and its 95% bootstrap interval, the same prompts resampled for both; (None, [None, None]) if not comparable."""
    if len(units) != len(reference) or not units:
        return None, [None, None]
    rows = []
    for u in (units, reference):
        if position_acceptance(u, 1)[0] is None:
            return None, [None, None]
        rows.append(np.array([[(x.get("accepted_at") or [x["accepted"]])[0], x["steps"]] for x in u], dtype=float))
    a, b = rows
    pick = np.random.default_rng(seed).integers(0, len(a), size=(n_boot, len(a)))
    sa, sb = a[pick].sum(1), b[pick].sum(1)
    ok = (sa[:, 1] > 0) & (sb[:, 1] > 0)
    diffs = sa[ok, 0] / sa[ok, 1] - sb[ok, 0] / sb[ok, 1]
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return float(a[:, 0].sum() / a[:, 1].sum() - b[:, 0].sum() / b[:, 1].sum()), [float(lo), float(hi)]


def distinct_tokens(recipe: dict) -> int:
    """The distinct training tokens a run drew: train.distinct_batches (or every step's own batch) × batch × context."""
    t = recipe.get("train") or {}
    batches = t.get("distinct_batches") or t.get("steps") or 0
    return int(batches) * int(t.get("batch_size") or 0) * int((recipe.get("model") or {}).get("context") or 0)


def _without_data_size(recipe: dict) -> dict:
    """A run's recipe without what the curve varies (the distinct batches) or what does not train it."""
    r = copy.deepcopy(recipe)
    r.get("train", {}).pop("distinct_batches", None)
    for key in ("name", "description", "specbench", "eval"):
        r.pop(key, None)
    return r


def run_recipe(r, variant: str) -> dict | None:
    """The recipe a variant's first seed was trained with (its run.json), None when it has no run."""
    runs = list(r.seeds(variant).values())
    return runs[0].run.get("recipe") if runs else None


def curve_variants(r) -> list[str]:
    """The largest group of MTP variants (two or more) whose recipes differ only in their distinct training
    tokens, in order of tokens; [] when there is none."""
    groups: dict[str, list[str]] = {}
    for v in r.variants:
        recipe = run_recipe(r, v)
        if not recipe or not int(r.first(v, "n_extra") or 0):
            continue
        groups.setdefault(repr(sorted(_without_data_size(recipe).items())), []).append(v)
    best = max(groups.values(), key=len, default=[])
    tokens = {v: distinct_tokens(run_recipe(r, v)) for v in best}
    return sorted(best, key=tokens.get) if len(best) > 1 and len(set(tokens.values())) > 1 else []


def mtp_entry(r, variant: str, condition: str) -> dict:
    """The MTP method's entry at batch size 1 in one condition of a variant's first seed ({} if not measured)."""
    run = next(iter(r.seeds(variant).values()))
    return ((r.condition(run, condition).get("results") or {}).get("1") or {}).get(results.MTP_METHOD) or {}
