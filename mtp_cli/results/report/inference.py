"""REPORT.md's inference evidence: the MTP modules kept as drafters, timed against our plain decoder and the peers."""

from __future__ import annotations

from mtp_cli.base.tables import Table
from mtp_cli.results import compare
from mtp_cli.results import folder as results
from mtp_cli.results.report.format import fmt, fmt_estimate, interval, seed_values, speed
from mtp_cli.results.report.helpers import num, pct, ratio, share, yes_no
from mtp_cli.results.report.section import Section
from mtp_cli.results.resultset import Metric, ResultSet, values

DEGENERATE_THRESHOLD = 0.5  # above this share of degenerate outputs, acceptance measures repetition



PEERS = {"hf_generate": "HF generate", "hf_prompt_lookup": "HF prompt lookup", "hf_assisted": "HF assisted",
         "hf_mtp": "HF MTP (our module)", "llamacpp_greedy": "llama.cpp greedy (GGUF weights)",
         "llamacpp_prompt_lookup": "llama.cpp prompt lookup (GGUF weights)"}
SHOWN_WHERE_MEASURED = {"hf_mtp", "llamacpp_greedy", "llamacpp_prompt_lookup"}  # older results render as they did



PCT = Metric("", "", pct=True)



def inference_section(r: ResultSet) -> Section:
    conditions = r.condition_names
    primary = conditions[0] if conditions else None
    mtp_rows, speed_rows, aa_rows, notes = [], [], [], set()
    peer_names = [name for name in PEERS if name not in SHOWN_WHERE_MEASURED or any(
        name in methods for v in r.variants for _, methods, _ in r.spec_by_batch(v, primary))]
    for v in r.variants:
        for name in conditions:
            for bs, methods, n in r.spec_by_batch(v, name):
                mtp = methods.get(results.MTP_METHOD)
                if not mtp:
                    notes.add(f"{v}: {_no_mtp_reason(r, v)}")
                    continue
                over_prompts, over_seeds = compare.acceptance(r, v, name, bs)
                mtp_rows.append([
                    v, _condition_label(r, v, name, primary), str(bs), str(n), yes_no(mtp.get("lossless")),
                    _with_interval(over_prompts) if over_prompts else pct(mtp.get("acceptance_rate")),
                    _with_interval(over_seeds, seeds=True) if over_seeds else ("n/a (one seed)" if n < 2 else "–"),
                    num(mtp.get("mean_acceptance_length"), 2),
                    " / ".join(pct(x) for x in mtp.get("per_position_acceptance") or []) or "–",
                    share(r.text_share(v, name, "degenerate_share")), share(r.text_share(v, name, "whitespace_share")),
                    speed(mtp, "speedup"), speed(mtp, "tpot_speedup"), speed(mtp, "ideal_speedup")])
                if mtp.get("exceeds_ideal"):
                    notes.add(f"{v} {name} bs {bs}: flagged, {mtp['exceeds_ideal']}")
                aa = methods.get(results.AA_METHOD)
                if aa:
                    lo, hi = aa.get("speedup_ci95") or (None, None)
                    aa_rows.append([v, _condition_label(r, v, name, primary), str(bs), speed(aa, "speedup"),
                                    "–" if lo is None else yes_no(lo <= 1 <= hi)])
        for bs, methods, _n in r.spec_by_batch(v, primary):
            mtp, greedy = methods.get(results.MTP_METHOD), methods.get(results.GREEDY_METHOD) or {}
            if not mtp:
                notes.add(f"{v}: {_no_mtp_reason(r, v)}")
            peers = [methods.get(name) or {} for name in peer_names]
            best_peer = max((p.get("tokens_per_s") or 0 for p in peers), default=0)
            speed_rows.append([v, str(bs), num(greedy.get("tokens_per_s"), 0),
                               num((mtp or {}).get("tokens_per_s"), 0),
                               *[num(p.get("tokens_per_s"), 0) for p in peers],
                               ratio(greedy.get("tokens_per_s"), (methods.get("hf_generate") or {}).get("tokens_per_s")),
                               ratio((mtp or {}).get("tokens_per_s"), best_peer)])
    seeds_note = ("seeds = runs measured; with several, acceptance and MAL are means over seeds, speed-ups geometric "
                  "means with a 95% t-interval over seeds on the log scale (so never below 0) and, with 2-3 seeds, "
                  "each seed's value in brackets" if any(len(r.rows(v)) > 1 for v in r.variants) else
                  _one_seed_speed_note(r))
    mtp_notes = ["acceptance = accepted / drafted tokens. Evaluation-set noise only: 95% bootstrap over prompts with "
                 "the seeds held fixed. 95% over seeds: a t over the seeds' rates (n − 1 degrees of freedom) with the "
                 "prompt variance the seeds share added (the same prompts for every seed); with 2-3 seeds, each "
                 "seed's rate in brackets",
                 "degenerate: share of our plain decoder's generated tokens inside a repetition loop (an n-gram, "
                 "n ≤ 16, repeated at least 3 times in a row); whitespace: share of its outputs that are whitespace "
                 "only — high acceptance on such text says little about real text",
                 "speedup = MTP speculative tokens/s ÷ our plain greedy tokens/s on the same prompts, end to end "
                 "(the headline: prefill included); decode only = greedy's time per output token after the first ÷ "
                 "MTP's; each the geometric mean over prompts × interleaved repeats with a 95% interval over both "
                 "(crossed random effects; results timed before that protocol: over repeats or prompts alone); "
                 "ideal = MAL · T_step / (T_verify + T_draft) from the forward parts timed side by side (the cost "
                 "table below; T_draft from the decoding loop where drafting is a call of its own: sampling, "
                 "batches): the gap is the decoding loops' own time, greedy's and ours",
                 "lossless: the speculative output equals plain greedy on every prompt",
                 "acceptance per draft position i counts i only when every earlier position was accepted (vLLM)",
                 seeds_note, *sorted(notes)]
    speed_notes = [f"condition {primary}; all on the exported trunk's weights and the same prompts; peers: Hugging "
                   "Face transformers (prompt lookup and assisted decoding run at batch size 1 only)",
                   *(["HF MTP: transformers' generate(use_mtp=True) with the run's own module (`mtp export "
                      "--with-mtp`), batch size 1 only: ours MTP ÷ HF MTP is the engine's cost, the drafter held fixed"]
                     if "hf_mtp" in peer_names else []),
                   *(["llama.cpp: llama-cpp-python on the run's GGUF source with the file's own quantized weights "
                      "(not the same computation as ours: its greedy text can differ where rounding flips an argmax), "
                      "batch size 1, in the same interleaved repeats"] if "llamacpp_greedy" in peer_names else []),
                   "MTP ÷ best peer: MTP speculative tokens/s over the fastest peer at that batch size",
                   *_compile_notes(r)]
    tables = [
        Table("Self-speculative decoding with the run's own MTP modules",
              ["variant", "prompts × temperature", "batch", "seeds", "lossless", "acceptance, evaluation-set noise only",
               "acceptance, 95% over seeds", "MAL", "per position", "degenerate", "whitespace",
               "speedup vs our greedy", "decode-only speedup", "ideal speedup"], mtp_rows, mtp_notes,
              empty="no specbench result with MTP drafting stored (stage disabled, not run yet, or NTP only)."),
        Table("Decoding speed against the peers (tokens/s, median of repeats)",
              ["variant", "batch", "ours greedy", "ours MTP", *(PEERS[p] for p in peer_names), "ours greedy ÷ HF generate",
               "MTP ÷ best peer"], speed_rows, speed_notes, empty="no specbench results stored."),
    ]
    if aa_rows:
        tables.append(Table("A/A control: our plain decoder timed against itself",
                            ["variant", "prompts × temperature", "batch", "speedup [95%]", "interval holds 1"], aa_rows,
                            ["the baseline's decoder run a second time as if another method, in the same interleaved "
                             "repeats: its true speed-up is 1, so an interval that misses 1 is narrower than the "
                             "machine's noise (about 1 in 20 would by chance)"]))
    parts = parts_table(r, primary)
    if parts:
        tables.append(parts)
    chosen = draft_len_table(r)
    if chosen:
        tables.append(chosen)
    proxy_rows, source = [], set()
    for v in r.variants:
        for k in range(1, int(r.first(v, "n_extra") or 0) + 1):
            prefix = "heldout" if values(r.rows(v), f"heldout_agree_{k}") else "val"
            source.add(prefix)
            cells = [fmt_estimate(m, compare.summarize(r.rows(v), m))
                     for m in (Metric("", f"{prefix}_{what}_{k}", pct=True, ci=False) for what in ("top1", "agree"))]
            proxy_rows.append([v, str(k), *cells])
    if proxy_rows:
        where = {"heldout": "the whole validation split (eval)", "val": "the end-of-training validation batches"}
        tables.append(Table("Acceptance proxy on validation text (teacher-forced, modules kept)",
                            ["variant", "extra prediction k", "top-1 vs the true token", "agrees with trunk's greedy"],
                            proxy_rows, [f"on {' and '.join(where[s] for s in sorted(source))}; a proxy only — the "
                                         "tables above are the measured acceptance and speed"]))
    intro = ("What keeping the MTP modules buys as drafters for the trunk's own greedy decoding (lossless: the output "
             "must equal plain greedy). Only measured speeds appear here.")
    warning = _degenerate_warning(r, primary)
    return Section("Inference evidence", f"{intro}\n\n{warning}" if warning else intro, tables)



def _with_interval(e, seeds: bool = False) -> str:
    """A rate with its interval and, when asked and there are 2-3 seeds, each seed's rate."""
    text = " ".join(x for x in (fmt(PCT, e.value), interval(PCT, e.lo, e.hi)) if x)
    return f"{text} {seed_values(PCT, e)}".strip() if seeds else text



def _condition_label(r: ResultSet, variant: str, name: str, primary: str | None) -> str:
    run = next(iter(r.seeds(variant).values()))
    cond = r.condition(run, name)
    source = (cond.get("prompts") or {}).get("source")
    temp = cond.get("temperature")
    label = f"{source} × T={temp:g}" if source and isinstance(temp, (int, float)) else str(name)
    return label + (" (primary)" if name == primary and len(r.condition_names) > 1 else "")



def _compile_notes(r: ResultSet) -> list[str]:
    compiled = sorted({v for v in r.variants for run in r.seeds(v).values()
                       if (run.spec.get("environment") or {}).get("compile")})
    if not compiled:
        return []
    return [f"{', '.join(compiled)}: our decoders (greedy and MTP) ran under torch.compile "
            "(compile time not counted in tokens/s); the Hugging Face peers ran eager, as `generate` does by default"]


def _one_seed_speed_note(r: ResultSet) -> str:
    over_prompts = any(run.spec.get("prompts_interval") for v in r.variants for run in r.seeds(v).values())
    repeats = sorted({run.spec.get("repeats") for v in r.variants for run in r.seeds(v).values()} - {None})
    if over_prompts:
        return ("one seed: the speed-up intervals are 95% paired bootstrap intervals over prompts (each prompt's "
                "time the median over timed repeats): how much the figure depends on which prompts were timed")
    if repeats == [1]:
        return "one seed and one timed repeat: the speed-up intervals have no width and say nothing about noise"
    return "one seed: the speed intervals are 95% bootstrap intervals of the median over timed repeats"


def parts_table(r: ResultSet, primary: str | None) -> Table | None:
    """Where the time of one speculative step goes (primary condition, smallest batch): the parts
    relative to a plain step, the plain step against the weight-streaming floor, and the break-even
    MAL at which drafting starts to pay."""
    rows, vocab_notes = [], set()
    for v in r.variants:
        by_batch = r.spec_by_batch(v, primary)
        mtp = by_batch[0][1].get(results.MTP_METHOD) if by_batch else None
        if not mtp:
            continue
        greedy = by_batch[0][1].get(results.GREEDY_METHOD) or {}
        spec = next(iter(r.seeds(v).values())).spec
        k = int(spec.get("draft_len") or r.first(v, "n_extra") or 1)
        width = int(mtp.get("draft_width") or 1)  # a tree verifies its width's candidates
        step, draft = mtp.get("t_forward_step_s"), mtp.get("t_draft_s")
        verify = (mtp.get("t_verify_by_k_s") or {}).get(str(max(k, width)))
        ok = all(isinstance(x, (int, float)) and x > 0 for x in (step, verify)) and isinstance(draft, (int, float))
        by_k = " / ".join(num(x, 2) for x in (mtp.get("verify_over_step_by_k") or {}).values()) or "–"
        fused = mtp.get("t_forward_verify_draft_s")  # one call verifies and drafts: its own time is the cost
        cost = (fused if fused else verify + max(draft, 0.0)) if ok else None
        draft_share = max(draft, 0.0) / step if ok else None
        rows.append([v, str(by_batch[0][0]), str(k) if width == 1 else f"1, tree of {width}", num(step * 1e3 if ok else None, 2),
                     num(greedy.get("step_over_floor"), 2), by_k, num(verify / step if ok else None, 2),
                     "≈0" if draft_share is not None and draft_share < 0.005 else num(draft_share, 2),
                     num(cost / step if ok else None, 2), num(mtp.get("mean_acceptance_length"), 2)])
        for run in r.seeds(v).values():
            dv = run.spec.get("draft_vocab") or {}
            if dv.get("size") and dv.get("vocab_size") and dv["size"] < dv["vocab_size"]:
                vocab_notes.add(f"the modules draft from the {dv['size']} most frequent training tokens of "
                                f"{dv['vocab_size']} (the trunk verifies over all of them, so output is unchanged)")
            floor = run.spec.get("weight_floor")
            if floor:
                vocab_notes.add(f"{v}: weight-streaming floor {floor['weight_bytes'] / 1e6:.0f} MB at "
                                f"{floor['read_bytes_per_s'] / 1e9:.1f} GB/s = {floor['floor_s'] * 1e3:.1f} ms a step "
                                "(read rate measured in the same run)")
    if not rows:
        return None
    notes = ["per step: T_step is one plain decoding step (the trunk's forward and unembedding), T_verify(k) the "
             "same over the pending token and k drafts, T_draft the modules' drafting at the draft length k used (one "
             "row greedy: the fused verify-and-draft call beyond verifying alone; ≈0: within timing noise; a tree of "
             "w candidates verifies w tokens, so T_verify(w)); "
             "break-even MAL = (T_verify + T_draft) / T_step, the fused call's own time where there is one: "
             "drafting pays only above it",
             "T_step ÷ floor: the plain decoding loop's step over the bytes of weights it must read divided by the "
             "memory read rate", *sorted(vocab_notes)]
    return Table("Where a speculative step's time goes (primary condition, medians)",
                 ["variant", "batch", "k", "T_step ms", "T_step ÷ floor", "T_verify ÷ T_step, k = 1..4",
                  "T_verify(k) ÷ T_step", "T_draft ÷ T_step", "break-even MAL", "measured MAL"], rows, notes)


def draft_len_table(r: ResultSet) -> Table | None:
    """Each candidate draft length (specbench.draft_lens) and tree width (draft_widths) as timed apart, and
    the ones chosen."""
    rows = []
    rules: dict[str, list[str]] = {}  # each rule as worded, with the runs it chose for
    for v in r.variants:
        for seed, run in r.seeds(v).items():
            for key, table, label in [("draft_len_selection", "by_k", "{}"),
                                      ("draft_width_selection", "by_width", "1, tree of {}")]:
                sel = run.spec.get(key)
                if not sel or table not in sel:  # no selection, or widths skipped (k > 1 chosen)
                    continue
                for c, e in sel[table].items():
                    rows.append([v, str(seed), label.format(c) if c != "1" or table == "by_k" else "1, chain",
                                 num(e.get("speedup"), 2), num(e.get("mean_acceptance_length"), 2),
                                 " / ".join(pct(a) for a in e.get("acceptance_at") or []) or "–",
                                 "yes" if int(c) == sel["chosen"] else ""])
                rules.setdefault(f"{sel['rule']} (T={sel['temperature']:g})", []).append(f"{v} s{seed}")
    if not rows:
        return None
    notes = [f"rule: {rule}" + (f" ({', '.join(runs)})" if len(rules) > 1 else "") for rule, runs in rules.items()]
    notes.append("the chosen k (and tree width) is then timed on the measured prompts in every condition above, so "
                 "its reported speed-up is not the best of several noisy figures")
    return Table("Draft length, chosen on prompts the benchmark does not time",
                 ["variant", "seed", "k", "speedup vs our greedy", "MAL", "acceptance per position", "chosen"], rows,
                 notes)



def _degenerate_warning(r: ResultSet, primary: str | None) -> str:
    """One sentence, with the figures, when the primary condition's decoded text is degenerate."""
    shares = {v: r.text_share(v, primary, "degenerate_share") for v in r.variants} if primary else {}
    bad = {v: s for v, s in shares.items() if s is not None and s > DEGENERATE_THRESHOLD}
    if not bad:
        return ""
    figures = ", ".join(f"{pct(s)} ({v})" for v, s in bad.items())
    return (f"**The trunks' decoded text is degenerate in the primary condition ({primary}): degenerate share "
            f"{figures}, so acceptance there measures agreement on degenerate text, not the drafting of real text.**")



def _no_mtp_reason(r: ResultSet, variant: str) -> str:
    obj = r.first(variant, "objective")
    if obj == "ntp":
        return "NTP has no MTP modules, so no speculative row (its greedy and peer speeds are the baseline)"
    return "no specbench result stored for this run"
