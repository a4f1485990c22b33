"""specbench.json as terminal tables: one per condition, a row per batch size and method."""

from __future__ import annotations

from rich.console import Group

from mtp_cli.base.result_docs import ci_key
from mtp_cli.base.tables import Table


def render_table(report: dict):
    """The report as tables, one per condition: a row per batch size and method. "degen" is the share of
    the method's generated tokens inside a repetition loop, "exact" whether its output equals plain
    greedy's on every prompt (else how many; "-" when sampling). Latency and the other intervals are in
    the JSON."""
    params = report["params"]
    notes = [f"MTP modules: {params['mtp_bytes'] / 1e6:.2f} MB of extra weights"] if params["mtp"] else []
    dv = report.get("draft_vocab")
    if dv and dv["size"] < dv["vocab_size"]:
        notes.append(f"drafts from the {dv['size']} most frequent training tokens of {dv['vocab_size']} "
                     f"({dv['training_share']:.0%} of training tokens; the trunk verifies over all)")
    floor = report.get("weight_floor")
    if floor:
        notes.append(f"weight-streaming floor of a step: {floor['weight_bytes'] / 1e6:.0f} MB of weights at "
                     f"{floor['read_bytes_per_s'] / 1e9:.1f} GB/s = {floor['floor_s'] * 1e3:.1f} ms")
    sel = report.get("draft_len_selection")
    if sel:
        tried = ", ".join(f"k={k} {v['speedup']:.2f}x (MAL {v['mean_acceptance_length']:.2f})" for k, v in sel["by_k"].items())
        notes.append(f"draft length {sel['chosen']} chosen on {sel['prompts']} untimed {sel['source']} prompts: {tried}")
    sel = report.get("draft_width_selection")
    if sel and "by_width" in sel:
        tried = ", ".join(f"width {w} {v['speedup']:.2f}x (MAL {v['mean_acceptance_length']:.2f})"
                          for w, v in sel["by_width"].items())
        notes.append(f"tree width {sel['chosen']} chosen on {sel['prompts']} untimed {sel['source']} prompts: {tried}")
    elif (report.get("draft_width") or 1) > 1:
        notes.append(f"one row, greedy: the module's top {report['draft_width']} candidates verified each step")
    if "draft_bytes" in params:
        notes.append(f"draft model ({params['draft_run']}): {params['draft_bytes'] / 1e6:.2f} MB")
    tables = [_condition_table(report, c) for c in report["conditions"]]
    tables[-1].notes += notes
    return Group(*tables)


def _condition_table(report: dict, condition: dict):

    p, text = condition["prompts"], condition["text"]
    primary = " (primary)" if condition["name"] == report["primary"] else ""
    rows = []
    for bs, methods in condition["results"].items():
        for name, e in methods.items():
            speedup = _with_ci(e, "speedup")
            tpot_speedup = _with_ci(e, "tpot_speedup") if "tpot_speedup" in e else ""
            acc = _fmt(e.get("acceptance_rate"), "{:.0%}")
            if acc and e[ci_key("acceptance_rate")][0] is not None:
                acc += " [{:.0%}-{:.0%}]".format(*e[ci_key("acceptance_rate")])
            exact = "-" if e["lossless"] is None else "yes" if e["lossless"] else \
                f"{e['identical_prompts']}/{e['identical_prompts'] + len(e['mismatches'])}"
            rows.append([
                str(bs), name, f"{e['tokens_per_s']:.0f}", speedup, tpot_speedup,
                _fmt(e.get("ideal_speedup"), "{:.2f}"), acc, _fmt(e.get("degenerate_share"), "{:.0%}"),
                _fmt(e.get("mean_acceptance_length"), "{:.2f}"), f"{e['ttft_s'] * 1e3:.1f}", f"{e['tpot_s'] * 1e3:.2f}",
                exact])
    parts = _parts_notes(condition)
    parts += [f"bs {bs} {name}: {e['exceeds_ideal']}" for bs, methods in condition["results"].items()
              for name, e in methods.items() if e.get("exceeds_ideal")]
    caption = (f"text timed ({condition['baseline']}, batch size {report['batch_sizes'][0]}): "
               f"{_fmt(text.get('degenerate_share'), '{:.0%}')} of tokens in repetition loops, "
               f"{_fmt(text.get('whitespace_share'), '{:.0%}')} of outputs blank")
    return Table(f"specbench {report['run']} {condition['name']}{primary}: {p['source']} x{p['count']}, "
                 f"T={condition['temperature']:g}, {report['max_new_tokens']} new tokens, {report['repeats']} repeats",
                 ["batch size", "method", "tokens/s", "speedup [95%]", "decode-only speedup", "ideal speedup", "acceptance [95%]",
                  "degenerate", "MAL", "TTFT ms", "TPOT ms", "identical to greedy"], rows, [caption, *parts],
                 short={"batch size": "bs", "tokens/s": "tok/s", "decode-only speedup": "decode", "ideal speedup": "ideal",
                        "acceptance [95%]": "acc",
                        "degenerate": "degen", "identical to greedy": "exact"})


def _parts_notes(condition: dict) -> list[str]:
    """The measured parts of our decoders per batch size, in ms (compile in s)."""
    notes = []
    for bs, methods in condition["results"].items():
        g, m = methods.get(condition["baseline"], {}), methods.get("mtp")
        parts = [f"step {_fmt(g.get('t_step_s'), '{:.2f}', 1e3)} ({_fmt(g.get('step_over_floor'), '{:.2f}')}x the floor)",
                 f"prefill {_fmt(g.get('t_prefill_s'), '{:.1f}', 1e3)}"]
        if g.get("loop_over_forward"):
            parts.append(f"greedy loop {g['loop_over_forward']:.2f}x its forward")
        if m:
            verify = "/".join(_fmt(v, "{:.2f}", 1e3) for v in m.get("t_verify_by_k_s", {}).values())
            parts += [f"verify k=1..{len(m.get('t_verify_by_k_s', {}))} {verify}",
                      f"draft {_fmt(m.get('t_draft_s'), '{:.2f}', 1e3)}"]
            if m.get("fused"):
                parts.append(f"verify+draft in one call {_fmt(m.get('t_forward_verify_draft_s'), '{:.2f}', 1e3)}")
            if m.get("loop_over_parts"):
                parts.append(f"MTP loop {m['loop_over_parts']:.2f}x its parts")
        compiled = sum(e.get("compile_s") or 0.0 for e in methods.values())
        parts.append(f"compile {compiled:.1f} s")
        notes.append(f"bs {bs} ms: " + ", ".join(parts))
    return notes


def _with_ci(e: dict, key: str) -> str:
    lo, hi = e[ci_key(key)]
    return f"{e[key]:.2f}" + ("" if lo is None else f" [{lo:.2f}-{hi:.2f}]")


def _fmt(value, fmt: str, scale: float = 1.0) -> str:
    return "" if value is None else fmt.format(value * scale)
