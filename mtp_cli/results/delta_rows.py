"""The rows of the report's Δ tables: which runs each row compares, and exactly what it varies (the
estimate and interval of each row are `compare`'s).

Each row compares one variant with the baseline (the recipe's first NTP variant), run by run at the
same grid seed. What a row varies is read from the runs' own run.json: the settings that differ
(model, mtp, data, train; logging and checkpoint cadence left out), and whether the two runs share
the initialisation seed (train.seed) and the data order (train.data_seed, or train.seed where unset).
A variant whose settings equal the baseline's and only its seeds differ is a noise floor, measured
like a variant: NTP with another initialisation on the same data order ("init only"), or the same
initialisation on another data order ("data order only"). The one-pair row "ntp s1 − s0" (two NTP
seeds, which differ in both) is kept as well.
"""

from __future__ import annotations

from dataclasses import dataclass

from mtp_cli.base.errors import UserError
from mtp_cli.base.stats import Estimate
from mtp_cli.config.recipe import recipe_from_dict
from mtp_cli.results import compare
from mtp_cli.results.resultset import Metric, ResultSet

SECTIONS = ("model", "mtp", "data", "train")
NOT_SETTINGS = {"train": {"seed", "data_seed", "log_every", "eval_every", "ckpt_every", "eval_batches", "compile",
                          "device", "track", "peak_flops"}}
VARIANT, NOISE, PAIR = "variant", "noise floor", "seed pair"


@dataclass(frozen=True)
class Comparison:
    label: str  # the row's name in the tables
    kind: str  # VARIANT, NOISE or PAIR
    variant: str
    base: str
    varies: str  # what differs between the two sides
    shares: str  # what they have in common
    seeds: str  # which seeds are paired


def comparisons(r: ResultSet) -> list[Comparison]:
    """Every Δ-table row of an ablation, the variants first, then the noise floors."""
    base = r.baseline
    if base is None:
        return []
    rows, floors = [], []
    for v in r.variants:
        if v == base:
            continue
        settings, init, data, seeds = _differences(r, v, base)
        if settings:
            varies = "; ".join(x for x in (", ".join(settings), _seed_text(init, data)) if x)
            rows.append(Comparison(f"{v} − {base}", VARIANT, v, base, varies, _shared(init, data), seeds))
            continue
        what = {(True, False): "noise floor (init only)", (False, True): "noise floor (data order only)",
                (True, True): "noise floor (init and data order)"}.get((init is not None, data is not None), "repeat")
        floors.append(Comparison(f"{what}: {v} − {base}", NOISE, v, base,
                                 _seed_text(init, data) or "nothing (identical settings and seeds)",
                                 _shared(init, data, settings=True), seeds))
    pair = compare.noise_floor_seeds(r)
    if pair:
        a, b = pair
        floors.append(Comparison(f"noise floor: {base} s{b} − s{a}", PAIR, base, base,
                                 f"init seed and data order (seed {b} vs {a})", "every setting", "one pair"))
    return rows + floors


def estimate(r: ResultSet, c: Comparison, m: Metric) -> Estimate | str | None:
    """The Δ of one row for one metric."""
    if c.kind == PAIR:
        return compare.noise_floor(r, m)
    return compare.difference(r, c.variant, m, c.base)


def _flat(recipe: dict, objective: str | None = None) -> dict[str, object]:
    """The recipe's settings as `section.key`, keys added to the code since a run was stored taking their
    defaults, as they did then; the objective is the run's own (run.json `objective`) where it has one."""

    try:
        recipe = recipe_from_dict(recipe).to_dict() if recipe else recipe
    except (UserError, TypeError, ValueError):
        pass
    out = {}
    for section in SECTIONS:
        for key, value in (recipe.get(section) or {}).items():
            if key not in NOT_SETTINGS.get(section, ()):
                out[f"{section}.{key}"] = value
    if objective:
        out["mtp.objective"] = objective
    return out


def _seeds_of(recipe: dict) -> tuple[int | None, int | None]:
    train = recipe.get("train") or {}
    return train.get("seed"), train.get("seed") if train.get("data_seed") is None else train.get("data_seed")


def _differences(r: ResultSet, variant: str, base: str):
    """(settings that differ, as `key=value`; the init-seed offset or None when shared; the data-seed
    offset or None when shared; which seeds pair) of a variant's runs against the baseline's."""
    v_runs, b_runs = r.seeds(variant), r.seeds(base)
    common = sorted(set(v_runs) & set(b_runs))
    pairs = [(v_runs[s], b_runs[s]) for s in common] or [(v, b) for v in v_runs.values() for b in b_runs.values()][:1]
    settings: dict[str, object] = {}
    init, data = set(), set()
    for v_run, b_run in pairs:
        mine, theirs = v_run.run.get("recipe") or {}, b_run.run.get("recipe") or {}
        fv, fb = _flat(mine, v_run.run.get("objective")), _flat(theirs, b_run.run.get("objective"))
        settings.update({k: fv.get(k) for k in sorted(set(fv) | set(fb)) if fv.get(k) != fb.get(k)})
        (vi, vd), (bi, bd) = _seeds_of(mine), _seeds_of(theirs)
        init.add(None if vi == bi else (vi - bi if vi is not None and bi is not None else "?"))
        data.add(None if vd == bd else (vd - bd if vd is not None and bd is not None else "?"))
    seeds = f"seeds {', '.join(map(str, common))}" if common else "none in common (unpaired)"
    return ([f"{k}={_value(v)}" for k, v in settings.items()], _one(init), _one(data), seeds)


def _one(offsets: set):
    """The seed offset shared by every pair; None when every pair shares the seed; "differs" when mixed."""
    if offsets == {None}:
        return None
    return next(iter(offsets)) if len(offsets) == 1 else "differs"


def _value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return "none" if value is None else str(value)


def _seed_text(init, data) -> str:
    parts = []
    for name, offset in (("init seed", init), ("data order", data)):
        if offset is None:
            continue
        parts.append(f"{name} ({offset:+d} on the grid seed)" if isinstance(offset, int) else f"{name} (another)")
    return " and ".join(parts)


def _shared(init, data, settings: bool = False) -> str:
    shared = [name for name, offset in (("init seed", init), ("data order", data)) if offset is None]
    return ", ".join((["every setting"] if settings else []) + shared) or "nothing"
