"""Guards acceptance read from stored results (results/acceptance.py): a draft position's conditional acceptance
and its interval over prompts from specbench's per-prompt counts, results stored before those counts, and which
variants form a data-scaling curve (only those differing in their distinct training tokens)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mtp_cli.results.acceptance import curve_variants, distinct_tokens, paired_difference, position_acceptance

UNITS = [{"accepted": 9, "drafted": 30, "steps": 10, "accepted_at": [6, 2, 1]},
         {"accepted": 6, "drafted": 30, "steps": 10, "accepted_at": [4, 2, 0]}]


def test_position_acceptance_is_conditional_on_the_drafts_before():
    assert position_acceptance(UNITS, 1)[0] == pytest.approx(10 / 20)
    assert position_acceptance(UNITS, 2)[0] == pytest.approx(4 / 10)
    assert position_acceptance(UNITS, 3)[0] == pytest.approx(1 / 4)
    value, (lo, hi) = position_acceptance(UNITS, 1)
    assert lo <= value <= hi
    assert position_acceptance(UNITS, 4) == (None, [None, None])  # never drafted that far


def test_results_stored_before_the_counts_give_position_one_only_at_one_draft_a_step():
    k1 = [{"accepted": 3, "drafted": 10, "steps": 10}, {"accepted": 5, "drafted": 10, "steps": 10}]
    assert position_acceptance(k1, 1)[0] == pytest.approx(8 / 20)
    k2 = [{"accepted": 3, "drafted": 20, "steps": 10}]
    assert position_acceptance(k2, 1) == (None, [None, None])  # accepted mixes positions: not position 1's


def _result_set(recipes: dict[str, dict]):
    runs = {v: SimpleNamespace(run={"recipe": rec}) for v, rec in recipes.items()}
    return SimpleNamespace(variants=list(recipes), seeds=lambda v: {0: runs[v]},
                           first=lambda v, col: 1 if col == "n_extra" else None)


def recipe(batches: int, lr: float = 1e-3, repeats: int = 3) -> dict:
    return {"model": {"context": 512}, "mtp": {"depth": 1},
            "train": {"steps": 512, "batch_size": 4, "lr": lr, "distinct_batches": batches},
            "specbench": {"repeats": repeats}, "description": str(batches)}


def test_curve_variants_differ_only_in_distinct_tokens():
    r = _result_set({"1m": recipe(512), "fast": recipe(512, lr=3e-3), "64k": recipe(32, repeats=1),
                     "256k": recipe(128, repeats=1)})
    assert curve_variants(r) == ["64k", "256k", "1m"]  # "fast" changes the learning rate: not on the curve
    assert distinct_tokens(recipe(32)) == 32 * 4 * 512
    assert distinct_tokens({**recipe(0), "train": {"steps": 10, "batch_size": 4}}) == 10 * 4 * 512
    assert curve_variants(_result_set({"a": recipe(32), "b": recipe(32, lr=3e-3)})) == []


def test_paired_difference_resamples_the_same_prompts():
    better = [{**u, "accepted_at": [u["accepted_at"][0] + 2, *u["accepted_at"][1:]]} for u in UNITS]
    diff, (lo, hi) = paired_difference(better, UNITS)
    assert diff == pytest.approx(14 / 20 - 10 / 20)
    assert lo == pytest.approx(0.2) and hi == pytest.approx(0.2)  # +2 on every prompt of 10 steps: no spread
    assert paired_difference(better[:1], UNITS) == (None, [None, None])  # not the same prompts
