"""REPORT.md's settings table, its environment section and the provenance line: what ran, where, at which commits."""

from __future__ import annotations

from mtp_cli.base.tables import Table
from mtp_cli.results.report.section import Section
from mtp_cli.results.resultset import ResultSet, values

RENDERED_BY = "REPORT.rendered.json"  # the report code's commit (not committed with the results: see .gitignore)



def provenance(r: ResultSet) -> str:
    """Which code produced the results. The code that rendered them goes to the sidecar (`RENDERED_BY`), so a
    code change that does not change what the report says changes no byte of REPORT.md."""
    produced = r.results_commits
    return (f"Results produced at commit {', '.join(f'`{c[:12]}`' for c in produced)}." if produced
            else "The commit that produced these results was not recorded.")



def environment_section(r: ResultSet) -> Section:
    envs = [run.run.get("env") or {} for run in r.runs]
    env = envs[0] if envs else {}
    started = sorted(run.run.get("started") for run in r.runs if run.run.get("started"))
    finished = sorted(run.run.get("finished") for run in r.runs if run.run.get("finished"))
    rows = [
        ["CPU", str(env.get("cpu", "?"))],
        ["cores / torch threads", f"{env.get('cpu_count', '?')} / {env.get('torch_threads', '?')}"],
        ["GPU", str(env.get("gpu", "none"))],
        ["torch / python", f"{env.get('torch', '?')} / {env.get('python', '?')}"],
        ["platform", str(env.get("platform", "?"))],
        ["device", ", ".join(sorted({str(run.run.get('device', '?')) for run in r.runs}))],
        ["git commit (results)", ", ".join(c[:12] for c in r.results_commits) or "unknown"],
        ["runs", f"{len(r.runs)} ({', '.join(r.variants)}), started {started[0] if started else '?'}, "
                 f"finished {finished[-1] if finished else '?'}"],
        ["recipe", f"{r.lock.get('recipe_name', r.dir.name)} ({r.lock.get('source', '?')}, "
                   f"fingerprint {r.lock.get('fingerprint', '?')})"],
    ]
    if len({(e.get("cpu"), e.get("gpu"), e.get("torch")) for e in envs}) > 1:
        rows.append(["warning", "runs come from different machines or torch versions"])
    return Section("Environment", "", [Table("Where these numbers come from", ["", ""], rows)])



def settings_table(r: ResultSet) -> Table:
    recipe = r.lock.get("recipe") or {}
    model, train, ev, sb = (recipe.get(k) or {} for k in ("model", "train", "eval", "specbench"))
    rows = [
        ["model", _trained_models(r, model)],
        ["data", f"{(recipe.get('data') or {}).get('source')}"],
        ["training", f"{train.get('steps')} steps × {train.get('batch_size')} sequences, peak lr {train.get('lr')}, "
                     f"{train.get('schedule', 'cosine')} schedule, {_seeds_text(recipe)}"],
        ["eval", _eval_text(r, ev) if ev.get("enabled", True) else "disabled"],
        ["specbench", _specbench_text(sb) if sb.get("enabled", True) else "disabled"],
    ]
    variants = recipe.get("variants") or []
    for v in variants:
        overrides = "; ".join(f"{sec}: " + ", ".join(f"{k}={_plain(val)}" for k, val in v[sec].items())
                              for sec in ("model", "mtp", "data", "train", "eval", "specbench") if v.get(sec))
        offsets = ", ".join(f"{k} {v[k]}" for k in ("init_seed_offset", "data_seed_offset") if v.get(k))
        what = (f"{v['description']} ({overrides})" if v.get("description") and overrides
                else v.get("description") or overrides or "the recipe as is")
        ran = "" if v["name"] in r.variants else " — no runs yet"
        rows.append([f"variant {v['name']}", what + (f" ({offsets})" if offsets else "") + ran])
    return Table("Settings", ["", ""], rows)



def _plain(value) -> str:
    """A recipe value as a reader writes it: lists joined by commas, no quotes or brackets."""
    if isinstance(value, (list, tuple)):
        return ", ".join(_plain(x) for x in value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {_plain(v)}" for k, v in value.items())
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)



def _seeds_text(recipe: dict) -> str:
    seeds = recipe.get("seeds") or []
    data_seed = (recipe.get("train") or {}).get("data_seed")
    text = f"seed{'s' if len(seeds) != 1 else ''} {_plain(seeds)}" if seeds else "seeds ?"
    return text + (f" (initialisation; data order fixed at data seed {data_seed})" if data_seed is not None else "")



def _eval_text(r: ResultSet, ev: dict) -> str:
    limits = ev.get("limits") or {}
    shots = sorted({int(v) for v in values(r.frame, "gsm8k_fewshot")}) if "gsm8k_fewshot" in r.frame else []
    parts = []
    for task in ev.get("tasks", []):
        what = [f"first {limits[task]}" if limits.get(task) else "all"]
        if task == "gsm8k":
            what.append(f"{'/'.join(map(str, shots))}-shot" if shots else f"{ev.get('gsm8k_fewshot', 5)}-shot (recipe)")
        parts.append(f"{task} ({', '.join(what)})")
    return ", ".join(parts)



def _specbench_text(sb: dict) -> str:
    temps = sb.get("temperatures")
    return (f"{sb.get('limit')} prompts each from {_plain(sb.get('prompts'))}"
            + (f" at temperature {_plain(temps)}" if temps else "")
            + f", {sb.get('max_new_tokens')} new tokens, batch size{'s' if len(sb.get('batch_sizes') or []) != 1 else ''} "
            f"{_plain(sb.get('batch_sizes'))}, {sb.get('repeats')} timed repeat{'s' if sb.get('repeats') != 1 else ''}")



def _describe_model(model: dict) -> str:
    return (f"{model.get('n_layers')} layers, d={model.get('d_model')}, {model.get('n_heads')} heads, "
            f"SwiGLU {model.get('ffn_hidden')}, context {model.get('context')}, vocab {model.get('vocab_size')}")



def _trained_models(r: ResultSet, recipe_model: dict) -> str:
    """The model the runs trained (their run.json, after init_from resolved it), not the recipe's [model];
    when runs differ, each description with its runs. The recipe's only when no run stored one."""
    by_text: dict[str, list[str]] = {}
    for run, model in r.run_models().items():
        by_text.setdefault(_describe_model(model), []).append(run)
    if not by_text:
        return f"{_describe_model(recipe_model)} (the recipe's; no run stored its own)"
    if len(by_text) == 1:
        return next(iter(by_text))
    return "runs differ: " + "; ".join(f"{text} ({', '.join(runs)})" for text, runs in by_text.items())
