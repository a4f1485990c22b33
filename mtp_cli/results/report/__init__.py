"""`mtp report`: REPORT.md, PNG plots and the same tables in the terminal, from an ablation's stored
results only (run folders, eval.json, specbench.json, recipe.lock.json); nothing is trained or run.

Training evidence (the trunk with the MTP modules discarded) and inference evidence (the modules kept
as drafters) are separate sections and separate tables. The numbers come from the results model
(`resultset`) and their intervals from `compare`/`stats`, which the plots read too.

One module per section (`training`, `inference`, `drafting`, `costs`, `claims`, `environment`); `deltas` renders the
differences to NTP, `format` and `helpers` the numbers.

REPORT.md holds no render time: re-rendering unchanged results with unchanged code gives the same bytes.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from mtp_cli.base.files import atomic_write_text, write_json
from mtp_cli.results import folder as results
from mtp_cli.results import plots
from mtp_cli.results.report.claims import claims_section
from mtp_cli.results.report.costs import cost_section
from mtp_cli.results.report.drafting import drafting_section
from mtp_cli.results.report.environment import RENDERED_BY, environment_section, provenance, settings_table
from mtp_cli.results.report.inference import inference_section
from mtp_cli.results.report.section import Section
from mtp_cli.results.report.training import training_section
from mtp_cli.results.resultset import code_commit, load

__all__ = ["RENDERED_BY", "incomplete_note", "render_report"]


def incomplete_note(results_dir: Path) -> str:
    """One sentence naming the runs of the recipe's grid that lack a stage ("" when none do)."""
    missing = results.missing_runs(results_dir)
    if not missing:
        return ""
    runs = "; ".join(f"{name} ({', '.join(stages)})" for name, stages in missing)
    return f"Incomplete: {len(missing)} run(s) of the grid lack stages, so the tables show only what is stored: {runs}."



def render_report(results_dir: str | Path, console: Console | None = None) -> Path:
    """Write REPORT.md and plots/*.png into `results_dir` from its stored results; print the tables."""
    r = load(results_dir)
    description = (r.lock.get("recipe") or {}).get("description", "")
    plot_dir = r.dir / results.PLOTS
    images = plots.render_all(r, plot_dir)
    sections = [training_section(r), inference_section(r), drafting_section(r), cost_section(r), claims_section(r),
                Section("Plots", "", [], [(caption, f"{results.PLOTS}/{path.name}") for caption, path in images]),
                environment_section(r)]
    head = [f"# MTP ablation: {r.lock.get('recipe_name', r.dir.name)}", ""]
    if description:
        head += [description, ""]
    head += [f"Rendered by `mtp report {_shown_path(r.dir)}` from stored results (`summary.csv` has one row per run). "
             "Training evidence and inference evidence answer different questions and are never mixed. "
             f"{provenance(r)}", ""]
    missing = incomplete_note(r.dir)
    if missing:
        head += [f"**{missing}**", ""]
    head += [settings_table(r).markdown()]
    body = []
    for s in sections:
        body += [f"## {s.title}", ""]
        if s.intro:
            body += [s.intro, ""]
        body += [t.markdown() for t in s.tables]
        body += [f"![{caption}]({path})\n\n*{caption}*\n" for caption, path in s.images]
        if s.title == "Plots" and not s.images:
            body.append("No plots: no stored metrics to draw.\n")
    path = r.dir / results.REPORT
    atomic_write_text(path, "\n".join(head + body).rstrip() + "\n")
    write_json(r.dir / RENDERED_BY, {"report_code_commit": code_commit(), "results_commits": r.results_commits})
    if console is not None:
        if missing:
            console.print(missing, style="bold yellow", markup=False)
        console.print(settings_table(r).rich())
        for s in sections:
            if s.tables:
                console.rule(s.title)
                if s.intro and "**" in s.intro:  # the degenerate-text warning
                    console.print(s.intro.split("\n\n")[-1].replace("**", ""), style="bold yellow")
                for t in s.tables:
                    console.print(t.rich())
        console.print(f"plots: {', '.join(str(p) for _, p in images) or 'none'}")
    return path



def _shown_path(folder: Path) -> str:
    """The results folder as a user would type it: relative to the working directory when inside it."""
    resolved, cwd = folder.resolve(), Path.cwd().resolve()
    return resolved.relative_to(cwd).as_posix() if resolved.is_relative_to(cwd) else str(folder)
