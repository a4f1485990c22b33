"""The report's PNG plots (matplotlib, Agg backend), drawn from stored results only.

loss_curves          training loss per variant (trunk, and each extra depth/head), validation points
acceptance           measured acceptance per draft position (bs=1), with the validation proxy beside it
speedup_vs_batch     measured MTP speedup over our greedy against batch size, with its interval
quality_differences  variant − NTP for each quality metric, with its 95% interval
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from mtp_cli import results  # noqa: E402


def render_all(r, out_dir: Path) -> list[tuple[str, Path]]:
    """Draw every plot there is data for; returns [(caption, path)]."""
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = []
    for name, fn in (("loss_curves", loss_curves), ("acceptance_per_position", acceptance),
                     ("speedup_vs_batch", speedup_vs_batch), ("quality_differences", quality_differences)):
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
    fig.savefig(path, dpi=110)
    plt.close(fig)


def loss_curves(r, path: Path) -> str | None:
    if not any(run.metrics for run in r.runs):
        return None
    colors = _colors(r.variants)
    max_k = max((int(r.first(v, "n_extra") or 0) for v in r.variants), default=0)
    fig, axes = plt.subplots(1, 2 if max_k else 1, figsize=(12 if max_k else 7, 4.5), squeeze=False)
    main, extra = axes[0][0], (axes[0][1] if max_k else None)
    styles = ["-", "--", ":", "-."]
    labelled: set[str] = set()
    for run in r.runs:
        train = [m for m in run.metrics if m.get("kind") == "train"]
        val = [m for m in run.metrics if m.get("kind") == "val"]
        color, label = colors[run.variant], (run.variant if run.variant not in labelled else None)
        labelled.add(run.variant)
        if train:
            main.plot([m["step"] for m in train], _smooth([m["loss_main"] for m in train]), color=color, label=label,
                      lw=1.2, alpha=0.9)
        if val:
            main.plot([m["step"] for m in val], [m["val_loss"] for m in val], "o", color=color, ms=4)
        if extra is not None and train:
            for k in range(1, max_k + 1):
                key = f"loss_mtp_{k}"
                if key in train[0]:
                    extra.plot([m["step"] for m in train], _smooth([m[key] for m in train]), styles[(k - 1) % 4],
                               color=color, lw=1.1, label=f"{run.variant} k={k}" if run.seed == r.rows(run.variant)["seed"].min() else None)
    main.set(title="trunk (next-token) loss: training, smoothed; dots = validation", xlabel="step",
             ylabel="cross-entropy (nats/token)")
    main.legend(fontsize=8)
    if extra is not None:
        extra.set(title="extra predictions: loss of depth/head k (smoothed)", xlabel="step", ylabel="cross-entropy")
        extra.legend(fontsize=8)
    _save(fig, path)
    return "Training loss per variant: the trunk's next-token loss (left) and each MTP depth/head (right)"


def acceptance(r, path: Path) -> str | None:
    from mtp_cli.report import _spec_by_batch

    bars = {}
    for v in r.variants:
        for bs, methods, _ in _spec_by_batch(r, v):
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


def speedup_vs_batch(r, path: Path) -> str | None:
    from mtp_cli.report import _spec_by_batch

    series = {}
    for v in r.variants:
        pts = []
        for bs, methods, _ in _spec_by_batch(r, v):
            mtp = methods.get(results.MTP_METHOD) or {}
            if mtp.get("speedup") is not None:
                ci = mtp.get("speedup_ci95") or mtp.get("speedup_ci")
                pts.append((bs, mtp["speedup"], ci if isinstance(ci, (list, tuple)) and len(ci) == 2 else None,
                            mtp.get("ideal_speedup")))
        if pts:
            series[v] = pts
    if not series:
        return None
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


def quality_differences(r, path: Path) -> str | None:
    from mtp_cli.report import difference

    base = r.baseline
    if base is None:
        return None
    metrics = r.quality_metrics
    others = [v for v in r.variants if v != base]
    if not others or not metrics:
        return None
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 3.8), squeeze=False)
    colors = _colors(r.variants)
    drawn = False
    for ax, m in zip(axes[0], metrics):
        scale = 100 if m.pct else 1
        for i, v in enumerate(others):
            delta, lo, hi, _ = difference(r.rows(v), r.rows(base), m)
            if delta is None:
                continue
            drawn = True
            yerr = [[(delta - lo) * scale], [(hi - delta) * scale]] if lo is not None else None
            ax.errorbar([i], [delta * scale], yerr=yerr, fmt="o", capsize=4, color=colors[v])
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlim(-0.6, len(others) - 0.4)
        ax.set_xticks(range(len(others)))
        ax.set_xticklabels(others, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"Δ {m.label}" + (" (points)" if m.pct else ""), fontsize=9)
    if not drawn:
        plt.close(fig)
        return None
    _save(fig, path)
    return f"Quality difference to NTP ({base}) per variant, with 95% intervals (trunk only, modules discarded)"
