"""specbench.json: its header, one entry per condition, and each condition's headline numbers."""

from __future__ import annotations

import torch

from mtp_cli.base import env
from mtp_cli.base.result_docs import SPEC_SCHEMA, ci_key
from mtp_cli.base.run_files import SPEC_JSON
from mtp_cli.base.stats import CROSSED_INTERVAL
from mtp_cli.bench.runners import AA_METHOD, PROMPT_LOOKUP_TOKENS, weight_bytes
from mtp_cli.config.conditions import Condition
from mtp_cli.model.weight_format import quantized

JSON_NAME = SPEC_JSON


INTERVAL = "95% percentile-bootstrap interval of the median over repeats (speed-ups: speedup_interval)"


SPEEDUP = ("speedup: end to end (tokens/s, prefill included; the headline); tpot_speedup: decode only (the baseline's "
           "time per output token after the first over the method's); each ")


ACCEPTANCE_INTERVAL = ("95% percentile bootstrap of accepted/drafted (ratio of sums) over prompts (batch size 1) "
                       "or batches (larger batch sizes), first timed repeat")


def header(run, max_new_tokens, batch_sizes, repeats, k, draft, primary: str) -> dict:
    import transformers  # transformers: seconds of start-up, only on this path

    model = run.model
    params = {"trunk": model.param_counts()["trunk"], "mtp": model.param_counts()["mtp"],
              "mtp_bytes": weight_bytes(model.mtp)}
    if draft is not None:
        params.update({"draft_run": str(draft.run_dir), "draft_params": draft.model.param_counts()["trunk"],
                       "draft_bytes": weight_bytes(draft.model.trunk)})
    no_mtp = None
    if not k:
        no_mtp = (f"objective {model.objective!r} trains no MTP modules, so there is nothing to draft with: "
                  "only the baseline and any Hugging Face peers are measured")
    return {
        "schema": SPEC_SCHEMA, "run": str(run.run_dir), "step": run.step, "objective": model.objective,
        "depth": model.mtp_cfg.depth if model.objective == "sequential" else None,
        "heads": model.mtp_cfg.heads if model.objective == "parallel" else None,
        "mtp_input": model.mtp_cfg.mtp_input if model.objective == "sequential" else None,
        "draft_len": k, "max_new_tokens": max_new_tokens,
        "batch_sizes": batch_sizes, "repeats": repeats, "interval": INTERVAL,
        "acceptance_interval": ACCEPTANCE_INTERVAL, "speedup_interval": SPEEDUP + CROSSED_INTERVAL, "params": params,
        "no_mtp_reason": no_mtp,
        "peers": {"hf_prompt_lookup": {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS},
                  "hf_assisted": {"draft_run": str(draft.run_dir)} if draft is not None else None},
        "environment": {"device": str(model.trunk.embed_tokens.weight.device), "threads": torch.get_num_threads(),
                        "torch": torch.__version__, "transformers": transformers.__version__,
                        "dtype": "int8" if quantized(model) else  # else torch's name: float32, bfloat16
                                 str(model.trunk.embed_tokens.weight.dtype).removeprefix("torch.")},
        "git_commit": env.git_commit(), "primary": primary, "conditions": [],
    }


def condition_entry(condition: Condition, prompt_info: dict) -> dict:
    return {"name": condition.name, "prompts": prompt_info, "temperature": condition.temperature,
            "baseline": condition.baseline, "results": {}, "summary": {}, "skipped": {}, "text": {}}


def headline(results: dict, baseline: str = "greedy") -> dict:
    """Speedups are over `baseline` (our plain decoder); the keys keep their schema-1 names in every condition."""
    out = {}
    if "hf_generate" in results:  # the reciprocal of hf_generate's speedup: paired per repeat, median and interval
        hf = results["hf_generate"]
        out["greedy_over_hf_generate"] = 1 / hf["speedup"]
        lo, hi = hf[ci_key("speedup")]
        out[ci_key("greedy_over_hf_generate")] = [1 / hi, 1 / lo] if lo is not None else [None, None]
    if "mtp" in results:
        m = results["mtp"]
        out.update({"mtp_speedup": m["speedup"], ci_key("mtp_speedup"): m[ci_key("speedup")],
                    "mtp_tpot_speedup": m["tpot_speedup"], ci_key("mtp_tpot_speedup"): m[ci_key("tpot_speedup")],
                    "mtp_exceeds_ideal": m.get("exceeds_ideal"),
                    "mtp_ideal_speedup": m["ideal_speedup"], "mtp_speedup_over_ideal": m["speedup_over_ideal"],
                    "mtp_lossless": m["lossless"], "mtp_acceptance_rate": m["acceptance_rate"],
                    ci_key("mtp_acceptance_rate"): m[ci_key("acceptance_rate")]})
    if AA_METHOD in results:
        aa = results[AA_METHOD]
        out.update({"aa_speedup": aa["speedup"], ci_key("aa_speedup"): aa[ci_key("speedup")]})
    out["baseline_degenerate_share"] = results[baseline]["degenerate_share"]
    out["step_over_floor"] = results[baseline].get("step_over_floor")
    out["loop_over_forward"] = results[baseline].get("loop_over_forward")
    out["mtp_loop_over_parts"] = results["mtp"].get("loop_over_parts") if "mtp" in results else None
    return out
