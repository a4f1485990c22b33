"""The report's PNG plots (matplotlib, Agg backend), drawn from stored results only.

loss_curves          training loss per run (trunk, and each extra depth/head): colour = variant, line style = seed
acceptance           measured acceptance per draft position (bs=1), with the validation proxy beside it
data_curve           first-draft acceptance against the distinct tokens the drafter was trained on, with its
                     interval over prompts; drawn only for variants that differ in nothing else (acceptance.py)
speedup_vs_batch     measured MTP speedup over our greedy against batch size (log-scale intervals, never below 0);
                     drawn only when more than one batch size was measured
quality_differences  variant − NTP for each quality metric, with its 95% interval over seeds, and the noise floors
paired_differences   per-item Δ (gold bits/byte, held-out windows) per variant vs NTP, with the noise floors

Every number comes from the results model (`resultset`) and `compare`/`delta_rows`, as in the report's tables.
Where no interval over seeds exists (one seed, one pair of seeds) the evaluation-set interval is drawn
instead, thin and dashed, and the caption says so.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from mtp_cli.base import stats  # noqa: E402
from mtp_cli.base.result_docs import ci_key
from mtp_cli.results import compare, delta_rows
from mtp_cli.results import folder as results
from mtp_cli.results.acceptance import curve_variants, distinct_tokens, mtp_entry, position_acceptance, run_recipe


def render_all(r, out_dir: Path) -> list[tuple[str, Path]]:
    """Draw every plot there is data for; returns [(caption, path)]."""
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = []
    for name, fn in (("loss_curves", loss_curves), ("acceptance_per_position", acceptance), ("data_curve", data_curve),
                     ("speedup_vs_batch", speedup_vs_batch), ("quality_differences", quality_differences),
                     ("paired_differences", paired_differences)):
        path = out_dir / f"{name}.png"
        caption = fn(r, path)
        if caption:
            drawn.append((caption, path))
        else:
            path.unlink(missing_ok=True)
    return drawn


def _colors(variants: list[str]) -> dict[str, str]:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {v: cycle[i % len(cycle)] for i, v in enumerate(variants)}


def _smooth(values: list[float], alpha: float = 0.1) -> list[float]:
    """Exponential moving average, bias-corrected so the first steps are not pulled toward zero."""
    out, acc = [], 0.0
    for t, v in enumerate(values, 1):
        acc = (1 - alpha) * acc + alpha * v
        out.append(acc / (1 - (1 - alpha) ** t))
    return out


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})  # no version stamp: same data, same bytes
    plt.close(fig)


SEED_STYLES = ["-", "--", ":", "-."]
K_MARKERS = ["o", "s", "^", "v", "D"]


def loss_curves(r, path: Path) -> str | None:
    if not any(run.metrics for run in r.runs):
        return None
    colors = _colors(r.variants)
    max_k = max((int(r.first(v, "n_extra") or 0) for v in r.variants), default=0)
    fig, axes = plt.subplots(1, 2 if max_k else 1, figsize=(12 if max_k else 7, 4.5), squeeze=False)
    main, extra = axes[0][0], (axes[0][1] if max_k else None)
    seeds = sorted({run.seed for run in r.runs})
    for run in r.runs:
        train = [m for m in run.metrics if m.get("kind") == "train"]
        val = [m for m in run.metrics if m.get("kind") == "val"]
        color, style = colors[run.variant], SEED_STYLES[seeds.index(run.seed) % len(SEED_STYLES)]
        label = f"{run.variant} s{run.seed}"
        if train:
            main.plot([m["step"] for m in train], _smooth([m["loss_main"] for m in train]), style, color=color,
                      label=label, lw=1.2, alpha=0.9)
        if val:
            main.plot([m["step"] for m in val], [m["val_loss"] for m in val], "o", color=color, ms=4,
                      mfc=color if seeds.index(run.seed) == 0 else "white")
        if extra is not None and train:
            for k in range(1, max_k + 1):
                key = f"loss_mtp_{k}"
                if key in train[0]:
                    extra.plot([m["step"] for m in train], _smooth([m[key] for m in train]), style, color=color,
                               marker=K_MARKERS[(k - 1) % len(K_MARKERS)], markevery=max(len(train) // 8, 1), ms=4,
                               lw=1.1, label=f"{label} k={k}")
    main.set(title="trunk (next-token) loss: training, smoothed; dots = validation", xlabel="step",
             ylabel="cross-entropy (nats/token)")
    main.legend(fontsize=7, ncol=2 if len(r.runs) > 6 else 1)
    if extra is not None:
        extra.set(title="extra predictions: loss of depth/head k (smoothed; marker = k)", xlabel="step",
                  ylabel="cross-entropy")
        extra.legend(fontsize=7)
    _save(fig, path)
    return ("Training loss per run: the trunk's next-token loss (left) and each MTP depth/head (right); colour = "
            "variant, line style = seed")


def acceptance(r, path: Path) -> str | None:
    bars = {}
    for v in r.variants:
        for bs, methods, _ in r.spec_by_batch(v):
            per_pos = (methods.get(results.MTP_METHOD) or {}).get("per_position_acceptance")
            if bs == 1 and per_pos:
                bars[v] = per_pos
    proxy = {v: [r.first(v, f"heldout_agree_{k}") if r.first(v, f"heldout_agree_{k}") is not None
                 else r.first(v, f"val_agree_{k}") for k in range(1, int(r.first(v, "n_extra") or 0) + 1)]
             for v in r.variants if int(r.first(v, "n_extra") or 0)}
    if not bars and not any(any(x is not None for x in p) for p in proxy.values()):
        return None
    colors = _colors(r.variants)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    names = [v for v in r.variants if v in bars or v in proxy]
    width = 0.8 / max(len(names), 1)
    for i, v in enumerate(names):
        if v in bars:
            xs = [p + 1 + (i - (len(names) - 1) / 2) * width for p in range(len(bars[v]))]
            ax.bar(xs, [x if x is not None else 0 for x in bars[v]], width, color=colors[v], label=f"{v} measured (bs=1)")
        if v in proxy:
            xs = [p + 1 + (i - (len(names) - 1) / 2) * width for p in range(len(proxy[v]))]
            ax.plot(xs, proxy[v], marker="D", mfc=colors[v], mec="black", mew=1.5, ms=8, ls="none",
                    label=f"{v} validation proxy")
    ax.set(xlabel="draft position", ylabel="acceptance", ylim=(0, 1.05),
           title="acceptance per draft position\nbars: measured in decoding · ◇: agreement on validation text")
    ax.set_xticks(range(1, 1 + max([len(b) for b in bars.values()] + [len(p) for p in proxy.values()])))
    ax.legend(fontsize=8)
    _save(fig, path)
    return "Acceptance per draft position: measured in self-speculative decoding at batch size 1, and the validation proxy"


def data_curve(r, path: Path) -> str | None:
    variants = curve_variants(r)
    if not variants:
        return None
    tokens = [distinct_tokens(run_recipe(r, v)) for v in variants]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = False
    for i, name in enumerate(r.condition_names):
        points = [position_acceptance(mtp_entry(r, v, name).get("per_prompt") or [], 1) for v in variants]
        xs = [t for t, (value, _) in zip(tokens, points) if value is not None]
        if not xs:
            continue
        ys = [value for value, _ in points if value is not None]
        lo = [value - ci[0] for value, ci in points if value is not None]
        hi = [ci[1] - value for value, ci in points if value is not None]
        ax.errorbar(xs, ys, yerr=[lo, hi], marker=K_MARKERS[i % len(K_MARKERS)], capsize=4, label=name)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xscale("log")
    ax.set(xlabel="distinct training tokens (log scale)", ylabel="first-draft acceptance", ylim=(0, 1),
           title="first-draft acceptance against distillation text\n95% bootstrap intervals over prompts")
    ax.set_xticks(tokens, [f"{t / 1e3:,.0f}k" if t < 1e6 else f"{t / 1e6:.2f}M" for t in tokens])
    ax.minorticks_off()
    ax.legend(fontsize=8)
    _save(fig, path)
    return ("First-draft acceptance against the distinct tokens the drafter was trained on (" + ", ".join(variants) +
            "; the same steps each), with 95% bootstrap intervals over prompts")


def speedup_vs_batch(r, path: Path) -> str | None:
    series = {}
    for v in r.variants:
        pts = []
        for bs, methods, _ in r.spec_by_batch(v):
            mtp = methods.get(results.MTP_METHOD) or {}
            if mtp.get("speedup") is not None:
                ci = mtp.get(ci_key("speedup"))
                pts.append((bs, mtp["speedup"], ci if isinstance(ci, (list, tuple)) and len(ci) == 2 else None,
                            mtp.get("ideal_speedup")))
        if pts:
            series[v] = pts
    if len({p[0] for pts in series.values() for p in pts}) < 2:
        return None  # one batch size: no curve to draw (the tables give its speed-up)
    colors = _colors(r.variants)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for v, pts in series.items():
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        err = [[y - (p[2][0] if p[2] else y) for y, p in zip(ys, pts)], [(p[2][1] if p[2] else y) - y for y, p in zip(ys, pts)]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, color=colors[v], label=f"{v} measured")
        ideal = [(p[0], p[3]) for p in pts if p[3] is not None]
        if ideal:
            ax.plot([x for x, _ in ideal], [y for _, y in ideal], "x:", color=colors[v], label=f"{v} ideal")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    sizes = sorted({p[0] for pts in series.values() for p in pts})
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.minorticks_off()
    ax.set(xlabel="batch size", ylabel="speedup over our plain greedy",
           title="MTP self-speculative decoding: speedup vs batch size")
    ax.legend(fontsize=8)
    _save(fig, path)
    return "Measured speedup over our plain greedy decoding against batch size (95% intervals), with the ideal speedup"


def _whisker(ax, x, e, scale: float, color, marker: str = "o") -> bool:
    """The point and its interval over seeds, or where none exists the evaluation-set interval, thin and
    dashed. True when the dashed one was drawn."""
    lo, hi, dashed = e.lo, e.hi, False
    if lo is None or hi is None:
        lo, hi, dashed = e.items_lo, e.items_hi, True
    yerr = [[(e.value - lo) * scale], [(hi - e.value) * scale]] if lo is not None and hi is not None else None
    bars = ax.errorbar([x], [e.value * scale], yerr=yerr, fmt=marker, capsize=4, color=color, mec="black",
                       lw=0.8 if dashed else 1.5, ms=6)
    if dashed and yerr is not None:
        bars[-1][0].set_linestyle("--")
    return dashed and yerr is not None


def _rows(r):
    """The Δ-table rows with a colour each: variants in their colour, noise floors in grey."""
    colors = _colors(r.variants)
    return [(c, colors[c.variant] if c.kind == delta_rows.VARIANT else "grey") for c in delta_rows.comparisons(r)]


def quality_differences(r, path: Path) -> str | None:
    base = r.baseline
    if base is None:
        return None
    rows = _rows(r)
    deltas = {m: {c.label: delta_rows.estimate(r, c, m) for c, _ in rows} for m in r.quality_metrics}
    metrics = [m for m in deltas if any(isinstance(e, stats.Estimate) and not e.all_zero for e in deltas[m].values())]
    if not any(c.kind == delta_rows.VARIANT for c, _ in rows) or not metrics:
        return None
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 4.2), squeeze=False)
    dashed = False
    for ax, m in zip(axes[0], metrics):
        scale = 100 if m.pct else 1
        for i, (c, color) in enumerate(rows):
            e = deltas[m][c.label]
            if isinstance(e, stats.Estimate):
                dashed |= _whisker(ax, i, e, scale, color, "s" if c.kind != delta_rows.VARIANT else "o")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlim(-0.6, len(rows) - 0.4)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([_short_label(c) for c, _ in rows], rotation=30, ha="right", fontsize=7)
        ax.set_title(f"Δ {m.label}" + (" (points)" if m.pct else ""), fontsize=9)
    _save(fig, path)
    return (f"Quality difference to NTP ({base}) per variant with its 95% interval over seeds, and the noise floors "
            "in grey (trunk only, modules discarded)"
            + ("; dashed: no interval over seeds exists (one seed or one pair), the evaluation-set interval instead"
               if dashed else ""))


def _short_label(c) -> str:
    return c.label.replace("noise floor", "floor").replace(" − ", "−")


def paired_differences(r, path: Path) -> str | None:
    """Per item: one side − NTP (seed means over the items every run scored), its mean with its 95%
    interval over seeds (or, where none exists, the evaluation-set interval, dashed); noise floors in grey."""
    base = r.baseline
    if base is None:
        return None
    rows, panels = _rows(r), []
    for m in r.quality_metrics:
        base_items = r.item_runs(base, m)
        if not base_items:
            continue
        columns = []
        for c, color in rows:
            e = delta_rows.estimate(r, c, m)
            if not isinstance(e, stats.Estimate):
                continue
            if c.kind == delta_rows.PAIR:
                pair = compare.noise_floor_seeds(r)
                per_item = _per_item_delta({0: base_items[pair[1]]}, {0: base_items[pair[0]]})
            else:
                v_items = r.item_runs(c.variant, m)
                if not v_items:
                    continue
                per_item = _per_item_delta(v_items, base_items)
            columns.append((_short_label(c), per_item, e, color, c.kind))
        if any(kind == delta_rows.VARIANT for *_, kind in columns):
            panels.append((m, columns))
    if not panels:
        return None
    jitter = np.random.default_rng(0)
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 4.4), squeeze=False)
    dashed = False
    for ax, (m, columns) in zip(axes[0], panels):
        for i, (_name, per_item, e, color, _kind) in enumerate(columns):
            ax.scatter(i + jitter.uniform(-0.18, 0.18, len(per_item)), per_item, s=6, alpha=0.3, color=color, lw=0)
            dashed |= _whisker(ax, i, e, 1, color, "D")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xticks(range(len(columns)))
        ax.set_xticklabels([name for name, *_ in columns], rotation=30, ha="right", fontsize=7)
        ax.set_title(f"Δ {m.label} per item vs {base}", fontsize=9)
    _save(fig, path)
    return (f"Per-item difference to NTP ({base}): dots are items (problems, questions, held-out windows), ◆ the mean "
            "with its 95% interval over seeds; grey: the noise floors (only seeds differ)"
            + ("; dashed: no interval over seeds exists (one seed or one pair), the evaluation-set interval instead"
               if dashed else ""))


def _per_item_delta(variant: dict, base: dict) -> np.ndarray:
    """Per common item: mean over the variant's seeds − mean over the baseline's seeds."""
    items = stats.common_items(variant, base)
    v = np.mean([variant[s].reindex(items).to_numpy() for s in variant], axis=0)
    b = np.mean([base[s].reindex(items).to_numpy() for s in base], axis=0)
    return v - b
