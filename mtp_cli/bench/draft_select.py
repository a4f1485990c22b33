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
are recorded in specbench.json's `draft_len_selection`. At k = 1 the tree width (how many of the module's
top candidates for the next token one step verifies) is chosen the same way, after k, on the same prompts
(`draft_width_selection`).
"""

from __future__ import annotations

from mtp_cli.base.stats import rate_ratio_ci
from mtp_cli.bench.measure import measure
from mtp_cli.bench.runners import Tally, ours_mtp, ours_plain
from mtp_cli.decode.speculative import make_drafter

TUNING_PROMPTS = 8


def tuning_prompts(all_ids: list[list[int]], measured: list[list[int]], n: int = TUNING_PROMPTS) -> list[list[int]]:
    """`n` prompts spread evenly over those of `all_ids` that are not in the measured set."""
    timed = {tuple(p) for p in measured}
    rest = [p for p in all_ids if tuple(p) not in timed]
    return [rest[i * len(rest) // n] for i in range(min(n, len(rest)))]


def choose_draft_len(model, lens: list[int], prompts: list[list[int]], source: str, temperature: float,
                     max_new_tokens: int, eos: int, compile: bool, vocab, device: str, tick=lambda name: None) -> dict:
    """Time every candidate k on `prompts`; the record with the fastest as `chosen`."""
    return _choose(model, {k: (k, 1) for k in lens}, "by_k", "k", prompts, source, temperature, max_new_tokens, eos,
                   compile, vocab, device, tick)


def choose_draft_width(model, widths: list[int], prompts: list[list[int]], source: str, max_new_tokens: int,
                       eos: int, compile: bool, vocab, device: str, tick=lambda name: None) -> dict:
    """As `choose_draft_len`, over tree widths at k = 1 (the module's top w candidates for the next token,
    verified together: `speculative.FusedGreedyStep._tree`), greedy; width 1 is the chain."""
    return _choose(model, {w: (1, w) for w in widths}, "by_width", "width", prompts, source, 0.0, max_new_tokens,
                   eos, compile, vocab, device, tick)


def _choose(model, shapes: dict[int, tuple[int, int]], table: str, what: str, prompts, source, temperature,
            max_new_tokens, eos, compile, vocab, device, tick) -> dict:
    """Time our plain decoder and MTP at every candidate (k, width) = shapes[c] on `prompts`, one pass after a
    warm-up, and pick a candidate with `pick_draft_len`'s rule (candidates in increasing order)."""
    runners = {"plain": ours_plain(model, max_new_tokens, eos, compile, temperature)}
    runners |= {f"c{c}": ours_mtp(make_drafter(model, k, compile=compile, draft_vocab=vocab, width=width),
                                  max_new_tokens, eos, temperature)
                for c, (k, width) in shapes.items()}
    tallies = measure(runners, prompts, 1, 1, device, tick)
    base = tallies["plain"][0]
    by = {}
    for c in shapes:
        t = tallies[f"c{c}"][0]
        by[str(c)] = {"tokens_per_s": t.tokens_per_s, "speedup": t.tokens_per_s / base.tokens_per_s,
                      "acceptance_rate": t.stats.acceptance_rate,
                      "mean_acceptance_length": t.stats.mean_acceptance_length,
                      "acceptance_at": [a / t.stats.steps if t.stats.steps else None for a in t.stats.accepted_at]}
    chosen, over = pick_draft_len(list(shapes), {c: tallies[f"c{c}"][0] for c in shapes})
    for c, ci in over.items():
        by[str(c)]["over_shorter_ci95"] = ci
    return {"chosen": chosen, "candidates": list(shapes), "source": source, "temperature": temperature,
            "prompts": len(prompts), "plain_tokens_per_s": base.tokens_per_s, table: by,
            "rule": (f"over {len(prompts)} {source} prompts that are not among the timed ones, one pass after a "
                     f"warm-up, at batch size 1: the smallest {what}, replaced by each larger {what} in turn whose "
                     "tokens/s over the current choice's has a 95% paired bootstrap interval above 1")}


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
