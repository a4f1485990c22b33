"""Choosing the draft length before the benchmark, on prompts it does not time.

A sequential module drafts any number of tokens (reused recursively beyond its depth), and the best
number depends on the model, the text and the machine. Picking the fastest k from the same timings
that are then reported would report the luckiest of several noisy figures. So specbench chooses k on
`TUNING_PROMPTS` other prompts of the primary condition's source (ones the timed set does not hold),
at batch size 1 and the primary temperature: our plain decoder and MTP at each candidate k, one timed
pass each after a warm-up. One pass over a few prompts is noisy (the same candidates have swapped places
between two runs 4% apart), so a longer draft replaces a shorter one only where it is faster beyond
that noise: the shortest k is the first choice, and each longer k in turn replaces the current choice
when the 95% paired bootstrap interval over the prompts of its speed over the choice's lies above 1.
The chosen k is then timed on the measured prompts in every condition, and every candidate's figures
are recorded in specbench.json's `draft_len_selection`.
"""

from __future__ import annotations

from mtp_cli.bench.measure import measure
from mtp_cli.bench.runners import Tally, ours_mtp, ours_plain
from mtp_cli.stats import rate_ratio_ci

TUNING_PROMPTS = 8


def tuning_prompts(all_ids: list[list[int]], measured: list[list[int]], n: int = TUNING_PROMPTS) -> list[list[int]]:
    """`n` prompts spread evenly over those of `all_ids` that are not in the measured set."""
    timed = {tuple(p) for p in measured}
    rest = [p for p in all_ids if tuple(p) not in timed]
    return [rest[i * len(rest) // n] for i in range(min(n, len(rest)))]


def choose_draft_len(model, lens: list[int], prompts: list[list[int]], source: str, temperature: float,
                     max_new_tokens: int, eos: int, compile: bool, vocab, device: str, tick=lambda name: None) -> dict:
    """Time every candidate k on `prompts`; the record with the fastest as `chosen`."""
    runners = {"plain": ours_plain(model, max_new_tokens, eos, compile, temperature)}
    runners |= {f"k{k}": ours_mtp(model, max_new_tokens, eos, k, compile, temperature, vocab) for k in lens}
    tallies = measure(runners, prompts, 1, 1, device, tick)
    base = tallies["plain"][0]
    by_k = {}
    for k in lens:
        t = tallies[f"k{k}"][0]
        by_k[str(k)] = {"tokens_per_s": t.tokens_per_s, "speedup": t.tokens_per_s / base.tokens_per_s,
                        "acceptance_rate": t.stats.acceptance_rate,
                        "mean_acceptance_length": t.stats.mean_acceptance_length,
                        "acceptance_at": [a / t.stats.steps if t.stats.steps else None for a in t.stats.accepted_at]}
    chosen, over = pick_draft_len(lens, {k: tallies[f"k{k}"][0] for k in lens})
    for k, ci in over.items():
        by_k[str(k)]["over_shorter_ci95"] = ci
    return {"chosen": chosen, "candidates": list(lens), "source": source, "temperature": temperature,
            "prompts": len(prompts), "plain_tokens_per_s": base.tokens_per_s, "by_k": by_k,
            "rule": (f"over {len(prompts)} {source} prompts that are not among the timed ones, one pass after a "
                     "warm-up, at batch size 1: the shortest k, replaced by each longer k in turn whose tokens/s "
                     "over the current choice's has a 95% paired bootstrap interval above 1")}


def pick_draft_len(lens: list[int], runs: dict[int, Tally]) -> tuple[int, dict[int, list[float | None]]]:
    """The draft length chosen from one pass at batch size 1 at each k (see the module docstring), and each
    longer k's 95% interval of its speed over the choice it was compared with."""
    order = sorted(lens)
    chosen, over = order[0], {}
    for k in order[1:]:
        a, b = runs[k], runs[chosen]
        over[k] = rate_ratio_ci([len(o) for o in a.outputs], a.walls, [len(o) for o in b.outputs], b.walls)
        if over[k][0] is not None and over[k][0] > 1:
            chosen = k
    return chosen, over
