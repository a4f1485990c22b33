"""The forward costs that explain an end-to-end speed-up: compile time, and the trunk forward at fixed
widths (the plain step, verifying k drafts, the fused verify-and-draft call), beside the measured phases."""

from __future__ import annotations

import torch

from mtp_cli.base.result_docs import ci_key
from mtp_cli.bench.forward_cost import forward_costs
from mtp_cli.decode.engine import engine_for
from mtp_cli.decode.speculative import make_drafter

VERIFY_WIDTHS_UP_TO = 4  # t_verify is measured for k = 1..max(4, the draft length)


def add_forward_costs(results: dict, model, prompts: list[list[int]], k: int | None, compile: bool,
                       baseline: str = "greedy", draft_vocab: torch.Tensor | None = None) -> None:
    """Beside the end-to-end phase means: the one-time compile cost of our decoders (`compile_s`, in
    their warm-up), and the trunk forward at fixed widths on these prompts (`t_forward_by_width_s`:
    width 1 is the plain step, width k+1 verifies k drafts; `t_verify_by_k_s` and its ratio to the
    step for k = 1..max(4, k)); one row, greedy, also the fused verify-and-draft call
    (`t_forward_verify_draft_s`) and the draft's share of it, beyond verifying (`t_draft_s`). From
    these parts, timed side by side, the ideal speed-up: MAL · T_step / (T_verify(k) + T_draft). A tree of
    w candidates (where the loop ran one: the MTP row's `draft_width`) verifies w tokens."""
    greedy_engine = engine_for(model.trunk, compile=compile)
    results[baseline]["compile_s"] = greedy_engine.compile_s
    if "mtp" not in results:
        return
    engine = engine_for(model.trunk, model, compile=compile)
    results["mtp"]["compile_s"] = engine.compile_s
    width = results["mtp"].get("draft_width", 1)
    verified = max(k, width)  # tokens verified after the pending one: the drafts, or a tree's candidates
    ks = range(1, max(VERIFY_WIDTHS_UP_TO, verified) + 1)
    fused = None
    if results["mtp"].get("fused"):  # one row, greedy: the verify-and-draft call the loop ran, timed alike
        drafter = make_drafter(model, k, compile=compile, draft_vocab=draft_vocab, width=width)
        fused = lambda capacity: drafter.reserve(1, capacity + 2 * verified + 2)  # noqa: E731
    costs = forward_costs(engine, prompts, [1, *(j + 1 for j in ks)], fused=fused)
    results["mtp"]["t_forward_step_s"] = costs[1]
    if fused is not None:  # the draft's share of the fused call: beyond verifying at its width
        results["mtp"]["t_forward_verify_draft_s"] = costs["fused"]
        results["mtp"]["t_draft_s"] = costs["fused"] - costs[verified + 1]
    results["mtp"]["t_verify_by_k_s"] = {str(j): costs[j + 1] for j in ks}
    results["mtp"]["verify_over_step_by_k"] = {str(j): costs[j + 1] / costs[1] for j in ks}
    parts_s = costs["fused"] if fused is not None else costs[verified + 1] + results["mtp"]["t_draft_s"]
    _add_ideal(results["mtp"], costs[1], parts_s, results[baseline].get("t_step_s"))
    _add_loop_overheads(results[baseline], results["mtp"], costs[1], parts_s)


def _add_loop_overheads(greedy: dict, mtp: dict, step_s: float, parts_s: float) -> None:
    """What each decoding loop costs beyond its forwards: greedy's decode time per token over one plain step
    timed alone (`loop_over_forward`), and MTP's decode time per speculative step (its forwards in the loop
    plus everything else) over its verify + draft parts timed alone (`loop_over_parts`); 1.0 is a loop
    that adds nothing (Python per token, sampling, syncs, cache bookkeeping)."""
    greedy["loop_over_forward"] = greedy["tpot_s"] / step_s if greedy.get("tpot_s") else None
    loop_step = (mtp.get("t_verify_draft_s") or 0.0) + (mtp.get("t_other_s") or 0.0)
    mtp["loop_over_parts"] = loop_step / parts_s if loop_step and parts_s > 0 else None


def _add_ideal(mtp: dict, step_s: float, verify_draft_s: float, step_loop_s: float | None) -> None:
    """The speed-up if a speculative step cost only its forward parts: MAL · T_step / (T_verify + T_draft),
    and the measured speed-up's share of it (its interval scaled alike: the parts are one measurement)."""
    ideal = mtp["mean_acceptance_length"] * step_s / verify_draft_s
    mtp["ideal_speedup"], mtp[ci_key("ideal_speedup")] = ideal, [ideal, ideal]
    mtp["speedup_over_ideal"] = mtp["speedup"] / ideal
    mtp[ci_key("speedup_over_ideal")] = [x / ideal if x is not None else None for x in mtp[ci_key("speedup")]]
    lo = mtp[ci_key("speedup")][0]
    mtp["exceeds_ideal"] = None
    if lo is not None and lo > ideal:
        reason = f"measured {mtp['speedup']:.2f}x, its whole interval above the ideal {ideal:.2f}x"
        if step_loop_s:
            reason += (f": the bound prices a plain step at its forward timed alone ({step_s * 1e3:.2f} ms), the plain "
                       f"loop's step took {step_loop_s * 1e3:.2f} ms; the loop's own cost per step, which fewer steps "
                       "save, or a different machine state while the parts were timed")
        mtp["exceeds_ideal"] = reason
