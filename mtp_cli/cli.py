"""The `mtp` command line: each command parses its flags, calls one function, prints the result."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import typer

from mtp_cli.base import ui
from mtp_cli.base.errors import Stop, Terminated, UserError, raise_terminated
from mtp_cli.base.paths import RESULTS_ROOT

# Decoding one sequence is many small ops: a second OpenMP thread gains little on idle cores and, when another
# process holds a core, makes every op wait at a barrier (measured: README, "Threads").
DECODE_THREADS = 1

DECODE_COMPILE_HELP = ("torch.compile the decoder (default: on CUDA only; on CPU its step is faster, but compiling "
                       "takes about a minute, more than a short run saves).")
SPECBENCH_COMPILE_HELP = ("torch.compile our decoders (default: on CUDA; on CPU when the benchmark plans enough decoded "
                          "tokens that the minute of compiling pays; the JSON's environment says which and why).")
DEVICE_HELP = "auto (CUDA when present) | cpu | cuda."
DTYPE_HELP = ("fp32 | bf16 | int8: the weights' dtype (bf16 and int8 weight-only decode faster on CPUs with "
              "AVX512-BF16 / VNNI, compiled, and change some greedy tokens: docs/decoding.md).")

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Train NTP vs multi-token-prediction models, evaluate the trunk, benchmark MTP drafting.")


@app.callback()
def _root() -> None:
    """Train NTP vs multi-token-prediction models, evaluate the trunk, benchmark MTP drafting."""


@app.command()
def train(
    recipe: str | None = typer.Option(
        None, help="Recipe name (recipes/*.toml) or path to a TOML file [default: quick; with --resume: the run's own]."
    ),
    objective: str | None = typer.Option(
        None, help="ntp | sequential | parallel (default: sequential if --depth/--lambda given)."
    ),
    depth: int | None = typer.Option(None, help="Sequential MTP depth D (DeepSeek-V3 modules)."),
    heads: int | None = typer.Option(None, help="Parallel heads n, including the next-token head (Meta)."),
    lam: float | None = typer.Option(None, "--lambda", help="MTP loss weight λ: L = L_main + λ/D Σ L_k."),
    lambda_final: float | None = typer.Option(
        None, help="λ drops to this value after --lambda-switch of training (DeepSeek: 0.1)."
    ),
    lambda_switch: float | None = typer.Option(None, help="Fraction of steps after which λ becomes --lambda-final."),
    mtp_input: str | None = typer.Option(None, help="Trunk state feeding depth 1: post-norm | pre-norm."),
    steps: int | None = typer.Option(None, help="Optimizer steps."),
    batch_size: int | None = typer.Option(None, help="Global batch size in sequences."),
    lr: float | None = typer.Option(None, help="Peak learning rate."),
    seed: int | None = typer.Option(None, help="Initialisation seed (and the batch order, unless --data-seed)."),
    data_seed: int | None = typer.Option(None, help="Batch-order seed (default: --seed)."),
    data: list[str] | None = typer.Option(None, help="Train on these files/folders instead of the recipe's corpus."),
    device: str | None = typer.Option(None, help="auto | cpu | cuda."),
    compile: bool | None = typer.Option(None, "--compile/--no-compile", help="torch.compile the model."),
    out: Path | None = typer.Option(None, help="Run folder (default: runs/<recipe>-<objective>-...-s<seed>)."),
    resume: bool = typer.Option(False, help="Continue the run in --out from its last checkpoint, with its own recipe."),
    force: bool = typer.Option(False, help="Overwrite the run in --out."),
    threads: int | None = typer.Option(None, help="torch CPU threads (default: torch's, one per core)."),
    init_from: str | None = typer.Option(
        None,
        help="Start the trunk from this Hugging Face checkpoint (a folder, "
        "a Hub id, a .gguf file or smollm2-135m-instruct; Llama or Qwen2): its "
        "architecture and tokenizer.",
    ),
    freeze_trunk: bool | None = typer.Option(
        None, "--freeze-trunk/--no-freeze-trunk", help="Train only the MTP modules (with --init-from)."
    ),
    track: str | None = typer.Option(None, help="Also log to tensorboard | wandb | none (recipe: train.track)."),
    fsdp: bool | None = typer.Option(
        None,
        "--fsdp/--ddp",
        help="Under torchrun, shard the model, gradients and "
        "optimizer state over the processes (FSDP2, sharded checkpoints) instead of "
        "replicating them (DDP, the default; recipe: train.parallel).",
    ),
) -> None:
    """Train one model (NTP, sequential MTP or parallel heads) into a run folder."""
    from mtp_cli.base import outputs
    from mtp_cli.model import checkpoint as ckpt
    from mtp_cli.train import loop as trainer
    from mtp_cli.train.flags import recipe_from_flags

    r = recipe_from_flags(recipe, out, resume, init_from, objective=objective, depth=depth, heads=heads, lam=lam,
                          lambda_final=lambda_final, lambda_switch=lambda_switch, mtp_input=mtp_input, data=data,
                          fsdp=fsdp, steps=steps, batch_size=batch_size, lr=lr, seed=seed, data_seed=data_seed,
                          device=device, compile=compile, freeze_trunk=freeze_trunk, track=track)
    out = outputs.folder(out or Path("runs") / trainer.default_run_name(r), "--out")
    if resume and not (out / ckpt.RUN_JSON).is_file():
        raise UserError(f"--resume: {out} holds no run to continue")
    summary = trainer.train(r, out, resume=resume, force=force, rt=r.runtime("train", threads))
    if summary.get("final"):
        ui.out.print(_train_table(summary))
    ui.out.print(f"run saved to {out}", markup=False)


def _train_table(summary: dict):
    from mtp_cli.base.tables import Table

    rows = [[key, f"{value:.4f}"] for key, value in summary["final"].items() if key not in ("kind", "step")]
    thr = summary["throughput"]
    rows.append(["tokens/s (median)", f"{thr['tokens_per_s_median']:,.0f}" if thr["tokens_per_s_median"] else "-"])
    rows.append(["MFU (median)", f"{thr['mfu_median']:.1%}" if thr["mfu_median"] else
                 ("- (" + summary["peak_note"] + ")" if summary.get("peak_note") else "-")])
    rows.append(["params trunk / MTP", f"{summary['params']['trunk']:,} / {summary['params']['mtp']:,}"])
    return Table(f"{summary['run']} — {summary['note']}", ["metric", "value"], rows)


@app.command()
def export(
    run: Path = typer.Argument(..., help="A run folder (from `mtp train`)."),
    out: Path | None = typer.Option(None, help="Folder for the Hugging Face checkpoint [default: RUN/export]: a new "
                                       "or empty folder, or an earlier export (replaced)."),
    force: bool = typer.Option(False, help="Replace a folder holding other files (never one holding a run)."),
    with_mtp: bool = typer.Option(False, help="Keep the sequential MTP module, in DeepSeek-V3's layout, for "
                                             "transformers' generate(use_mtp=True) (docs/pretrained.md)."),
) -> None:
    """Write the trunk as a Hugging Face LlamaForCausalLM checkpoint (MTP modules discarded, or kept with --with-mtp)."""
    import json

    from mtp_cli.base.run_files import EXPORT, EXPORT_INFO
    from mtp_cli.model.hf import export_run

    path = export_run(run, out or run / EXPORT, force=force, with_mtp=with_mtp)
    ui.out.print(f"exported {run} -> {path} (load with transformers.AutoModelForCausalLM.from_pretrained)", markup=False)
    for difference in json.loads((path / EXPORT_INFO).read_text())["mtp_differences"]:
        ui.out.print(f"note: the MTP module was {difference}", markup=False)


@app.command("eval")
def eval_(
    run: Path | None = typer.Argument(None, help="A run folder (from `mtp train`); or give --hf."),
    tasks: str | None = typer.Option(None, help="Comma-separated: humaneval, gsm8k, heldout [default: all three; "
                                                 "humaneval,gsm8k with --harness lm-eval]."),
    limit: str | None = typer.Option(None, help="First N problems / documents / validation windows of each task, or "
                                                "per task: humaneval=0,gsm8k=200 (0 = all)."),
    gsm8k_data: Path | None = typer.Option(None, help="Folder with GSM8K train.jsonl + test.jsonl, or `hub` for the "
                                              "stock online task [default: $MTP_GSM8K_DATA, else the repository's data/gsm8k]."),
    samples: int = typer.Option(1, help="HumanEval completions per problem (pass@k for k <= n)."),
    temperature: float = typer.Option(0.0, help="HumanEval sampling temperature (0 = greedy; > 0 needs it for --samples > 1)."),
    text: Path | None = typer.Option(None, help="Also report held-out loss and bits per byte on this text file."),
    json_path: Path | None = typer.Option(None, "--json", help="Where to write the results (default: RUN/eval.json)."),
    threads: int = typer.Option(DECODE_THREADS, help="torch CPU threads (1: fastest on busy cores, see the README)."),
    truncate: bool = typer.Option(True, "--truncate/--no-truncate",
                                  help="Cut prompts longer than the trained context from the left (lm-eval's rule; "
                                       "counts reported), or refuse to run such an eval."),
    gsm8k_fewshot: int | None = typer.Option(None, help="GSM8K few-shot examples (lm-eval's num_fewshot) [default: "
                                                "the recipe's eval.gsm8k_fewshot, fewer where its prompts would not "
                                                "fit the trained context]."),
    hf: str | None = typer.Option(None, "--hf", help="Evaluate a Hugging Face checkpoint (folder, Hub id, .gguf file "
                                     "or smollm2-135m-instruct) instead of a run: the 'before' row of continued "
                                     "pretraining."),
    recipe: str | None = typer.Option(None, help="With --hf: the recipe whose data gives the held-out split "
                                         "(default: quick)."),
    compile: bool | None = typer.Option(None, "--compile/--no-compile", help=DECODE_COMPILE_HELP),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    dtype: str = typer.Option("fp32", help=DTYPE_HELP),
    humaneval_prompt: str = typer.Option("raw", help="raw HumanEval prompt | instruct: lm-eval's humaneval_instruct "
                                                     "text under the model's chat template (for chat-tuned models)."),
    generate: bool = typer.Option(True, "--generate/--gold-only", help="--gold-only: HumanEval and GSM8K score the "
                                                                      "reference answers only (bits/byte; no pass rates)."),
    harness: str = typer.Option("mtp", help="mtp (ours) | lm-eval: with --hf, HumanEval and GSM8K through lm-eval's "
                                         "own Hugging Face backend instead (default --json: eval_lm_eval.json)."),
) -> None:
    """HumanEval, GSM8K and held-out loss of the trunk, MTP modules discarded."""
    from mtp_cli.base import paths
    from mtp_cli.config.recipe import EvalConfig, Runtime
    from mtp_cli.evals.runner import parse_limits, parse_tasks, results_table, run_eval

    if recipe is not None and hf is None:
        raise UserError("--recipe is for --hf (a run evaluates on its own recipe's data)")
    if harness not in ("mtp", "lm-eval"):
        raise UserError(f"--harness must be mtp or lm-eval, got {harness!r}")
    if harness == "lm-eval" and (hf is None or run is not None or text is not None):
        raise UserError("--harness lm-eval evaluates a Hugging Face checkpoint: give --hf SOURCE (no run folder, no --text)")
    if harness == "lm-eval" and not generate:
        raise UserError("--gold-only is for our harness (--harness mtp): lm-eval's backend scores pass rates")
    names = parse_tasks(("humaneval,gsm8k" if harness == "lm-eval" else "humaneval,gsm8k,heldout") if tasks is None else tasks)
    cfg = EvalConfig(tasks=names, limits=parse_limits(limit, names),
                     gsm8k_data=str(paths.gsm8k_data(gsm8k_data) or paths.HUB), gsm8k_fewshot=gsm8k_fewshot,
                     truncate=truncate, samples=samples, temperature=temperature, humaneval_prompt=humaneval_prompt,
                     generate=generate)
    rt = Runtime(device=device, threads=threads, compile=compile, dtype=dtype)
    if harness == "lm-eval":
        from mtp_cli.evals.harness_agreement import agreement
        from mtp_cli.evals.lm_eval_hf import run_lm_eval

        doc = run_lm_eval(hf, cfg, rt, recipe=recipe, json_path=json_path)
        beside = agreement(Path(doc["json_path"]))  # when `mtp eval --hf` wrote eval.json in the same folder
    else:
        doc, beside = run_eval(run, cfg, rt, hf=hf, recipe=recipe, text=text, json_path=json_path), None
    ui.out.print(results_table(doc))
    if beside is not None:
        ui.out.print(beside)
    ui.out.print(f"results written to {doc['json_path']}", markup=False)


@app.command()
def generate(
    run: Path = typer.Argument(..., help="A run folder (from `mtp train`)."),
    prompt: str = typer.Option(..., help="Text to continue."),
    max_new_tokens: int = typer.Option(128, help="Most tokens to generate."),
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass (with --temperature > 0)."),
    seed: int = typer.Option(0, help="Sampling seed."),
    speculative: bool = typer.Option(False, "--speculative", help="Let the run's MTP modules draft and the trunk verify "
                                                                   "(greedy: the same text; sampling: the same distribution)."),
    draft_len: int | None = typer.Option(None, help="Drafts per step with --speculative (default: one per module/head)."),
    draft_vocab: int | None = typer.Option(None, help="With --speculative: draft from this many of the most frequent "
                                                         "training tokens (default: a quarter of the vocabulary; 0: all)."),
    threads: int = typer.Option(DECODE_THREADS, help="torch CPU threads (1: fastest on busy cores, see the README)."),
    compile: bool | None = typer.Option(None, "--compile/--no-compile", help=DECODE_COMPILE_HELP),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    dtype: str = typer.Option("fp32", help=DTYPE_HELP),
) -> None:
    """Continue a prompt with the run's trunk (the KV-cache decoder the evals use)."""
    from mtp_cli.config.recipe import Runtime
    from mtp_cli.decode.batching import complete

    result = complete(run, prompt, max_new_tokens, temperature, top_p, seed, speculative=speculative,
                      draft_len=draft_len, draft_vocab=draft_vocab,
                      rt=Runtime(device=device, threads=threads, compile=compile, dtype=dtype))
    if result["max_new_tokens"] != max_new_tokens:
        ui.console.print(f"note: --max-new-tokens {max_new_tokens} does not fit the trained context {result['context']}; "
                         f"at most {result['max_new_tokens']} new tokens", markup=False, soft_wrap=True)
    if result["prompt_cut"]:
        ui.console.print(f"note: the prompt's first {result['prompt_cut']} of {result['prompt_tokens']} tokens were cut, "
                         f"so that it and {result['max_new_tokens']} new tokens fit the trained context "
                         f"{result['context']}", markup=False, soft_wrap=True)
    ui.out.print(prompt + result["text"], markup=False, highlight=False)
    ui.console.print(f"{result['tokens']} tokens in {result['seconds']:.2f} s", highlight=False)
    if speculative:
        s = result["speculative"]
        ui.console.print(f"drafts: {s['accepted']}/{s['drafted']} accepted ({s['acceptance_rate']:.1%}), "
                         f"mean acceptance length {s['mean_acceptance_length']:.2f} over {s['steps']} steps",
                         highlight=False)


@app.command()
def specbench(
    run: Path = typer.Argument(..., help="A run folder (from `mtp train`)."),
    prompts: str = typer.Option(
        "humaneval",
        help="Comma-separated prompt sources: humaneval | gsm8k | heldout (the run's "
        'validation split) | a file (one prompt per line, or JSONL with "prompt").',
    ),
    temperatures: str = typer.Option(
        "0", help="Comma-separated temperatures, e.g. 0,0.8 (> 0: speculative sampling); every prompt source is measured at each."
    ),
    primary: str | None = typer.Option(
        None, help="The condition the headline comes from, e.g. heldout-greedy (default: the first)."
    ),
    peers: str = typer.Option(
        "all",
        help="all | primary | none: time the Hugging Face peers in every condition, in the primary one only, or nowhere "
        "(they cost the most, and do not depend on the modules).",
    ),
    limit: int = typer.Option(20, help="First N prompts (0 = all)."),
    max_new_tokens: int = typer.Option(128, help="Tokens to generate per prompt (fewer at EOS)."),
    batch_sizes: str = typer.Option("1", help="Comma-separated batch sizes, e.g. 1,4,16."),
    repeats: int = typer.Option(5, help="Timed repeats after the warm-up (medians and 95% intervals over them)."),
    draft_len: int | None = typer.Option(
        None,
        help="Drafts per step (default: one per MTP module/head; sequential modules can draft further by reusing the last one).",
    ),
    draft_lens: str | None = typer.Option(
        None, help="Comma-separated candidate draft lengths, e.g. 1,2,3,4: the fastest on 8 prompts that are not timed "
        "is then timed (every candidate's figures go to the JSON).",
    ),
    draft_width: int = typer.Option(
        1, help="With one draft per step, at batch size 1, greedy: verify the module's top W candidates for the next "
        "token in one forward (a token tree) instead of its top one.",
    ),
    draft_widths: str | None = typer.Option(
        None, help="Comma-separated candidate widths, e.g. 1,2,3,4: chosen like --draft-lens, after it.",
    ),
    draft_vocab: int | None = typer.Option(
        None,
        help="The MTP modules draft from this many of the most frequent "
        "training tokens; the trunk verifies over all, so the output "
        "is unchanged (default: a quarter of the vocabulary; 0: all).",
    ),
    draft: Path | None = typer.Option(
        None, help="A smaller NTP run with the same tokenizer: adds HF assisted generation with it as the draft model."
    ),
    gsm8k_data: Path | None = typer.Option(
        None,
        help="Folder with GSM8K test.jsonl for --prompts gsm8k [default: $MTP_GSM8K_DATA, else the repository's data/gsm8k].",
    ),
    threads: int = typer.Option(DECODE_THREADS, help="torch CPU threads during the benchmark (1: fastest on busy cores)."),
    json_path: Path | None = typer.Option(None, "--json", help="Where to write the results (default: RUN/specbench.json)."),
    compile: bool | None = typer.Option(None, "--compile/--no-compile", help=SPECBENCH_COMPILE_HELP),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    dtype: str = typer.Option("fp32", help=DTYPE_HELP),
    recheck: bool = typer.Option(False, help="Time nothing: recompute RUN's stored speed-ups and lossless verdicts "
                                            "(or --json's) from the raw data beside them; exit 1 on any mismatch."),
) -> None:
    """End-to-end latency: plain decoding vs MTP self-speculative decoding (lossless, checked) vs Hugging Face peers,
    with the share of the timed text that is a repetition loop."""
    from mtp_cli.bench.render import render_table
    from mtp_cli.bench.run import JSON_NAME, run_specbench
    from mtp_cli.config.recipe import Runtime, SpecbenchConfig

    if recheck:
        from mtp_cli.bench.raw import recheck as recheck_spec

        path = json_path or run / JSON_NAME
        if not path.is_file():
            raise UserError(f"--recheck: no {path}")
        problems = recheck_spec(path)
        for line in problems:
            ui.out.print(f"mismatch: {line}", markup=False)
        verdict = f"{len(problems)} mismatches" if problems else "every stored speed-up and lossless verdict recomputed"
        ui.out.print(f"{path}: {verdict}", markup=False)
        raise typer.Exit(1 if problems else 0)

    cfg = SpecbenchConfig(prompts=prompts, temperatures=_float_list(temperatures, "--temperatures"), primary=primary,
                          limit=limit, max_new_tokens=max_new_tokens, batch_sizes=_int_list(batch_sizes, "--batch-sizes"),
                          repeats=repeats, draft_len=draft_len, draft_vocab=draft_vocab, peers=peers,
                          draft_lens=_int_list(draft_lens, "--draft-lens") if draft_lens else None,
                          draft_width=draft_width,
                          draft_widths=_int_list(draft_widths, "--draft-widths") if draft_widths else None)
    # --gsm8k-data is resolved where the prompts are read (mtp_cli/data/prompts.py)
    report = run_specbench(run, cfg, Runtime(device=device, threads=threads, compile=compile, dtype=dtype), draft_run=draft,
                           gsm8k_data=gsm8k_data, json_path=json_path)
    ui.out.print(render_table(report))
    if report["no_mtp_reason"]:
        ui.out.print(f"no MTP row: {report['no_mtp_reason']}", markup=False)
    ui.out.print(f"results written to {json_path or run / JSON_NAME}", markup=False)


@app.command()
def ablate(
    recipe: str | None = typer.Option(None, help="Recipe name (recipes/*.toml) or path to a TOML file with variants."),
    only: str | None = typer.Option(None, help="Run only these variants (comma-separated names)."),
    seeds: str | None = typer.Option(None, help="Run only these seeds, e.g. 0,1 (default: the recipe's)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and its estimated cost; run nothing."),
    force: bool = typer.Option(False, help="Discard results in the folder that come from another recipe version."),
    results_root: Path = typer.Option(
        RESULTS_ROOT, help="Results go to RESULTS_ROOT/<recipe>/ (the committed copies are under results/)."
    ),
    gsm8k_data: Path | None = typer.Option(
        None,
        help="GSM8K folder for the eval stage, or `hub` [default: "
        "$MTP_GSM8K_DATA, else the recipe's eval.gsm8k_data, else data/gsm8k].",
    ),
    threads: int | None = typer.Option(None, help="torch CPU threads for every stage (default: torch's, one per core)."),
    status: str | None = typer.Option(
        None,
        "--status",
        metavar="RECIPE",
        help="List every run and stage of RECIPE with its state (done, queued, running, failed); run nothing.",
    ),
    launcher: str | None = typer.Option(
        None,
        help="local (run the stages here, one after another) | slurm "
        "(submit them as jobs with submitit); default: the recipe's launcher.kind, local.",
    ),
    wait: bool = typer.Option(False, "--wait", help="With --launcher slurm: follow the jobs until they finish."),
    track: str | None = typer.Option(None, help="Also log every run to tensorboard | wandb | none (recipe: train.track)."),
    partition: str | None = typer.Option(None, rich_help_panel="Slurm", help="Slurm partition."),
    account: str | None = typer.Option(None, rich_help_panel="Slurm", help="Slurm account."),
    qos: str | None = typer.Option(None, rich_help_panel="Slurm", help="Slurm QOS."),
    time_limit: str | None = typer.Option(
        None, "--time", rich_help_panel="Slurm", help="Time limit per job, Slurm syntax (e.g. 4:00:00)."
    ),
    nodes: int | None = typer.Option(None, rich_help_panel="Slurm", help="Nodes of each training job."),
    gpus_per_node: int | None = typer.Option(None, rich_help_panel="Slurm", help="GPUs per node (torchrun processes per node)."),
    cpus_per_task: int | None = typer.Option(None, rich_help_panel="Slurm", help="CPUs per task (one task per node)."),
    mem: str | None = typer.Option(None, rich_help_panel="Slurm", help="Memory per node, e.g. 64G."),
    sbatch: list[str] | None = typer.Option(
        None, rich_help_panel="Slurm", help="Extra sbatch option KEY=VALUE (repeatable), e.g. constraint=a100."
    ),
    job_folder: Path | None = typer.Option(
        None,
        rich_help_panel="Slurm",
        help="submitit's job folder (logs) on a shared filesystem; default: RESULTS_ROOT/<recipe>/slurm.",
    ),
) -> None:
    """Run a recipe's variants × seeds through train → export → eval → specbench (resumable)."""
    from mtp_cli import ablate as ablation
    from mtp_cli.base import outputs
    from mtp_cli.config.recipe import Runtime
    from mtp_cli.grid.plan import plan_table

    Runtime(threads=threads).validate()  # each stage gets its Runtime from the recipe, with these threads
    if job_folder is not None:
        outputs.folder(job_folder, "--job-folder")
    seed_list = _int_list(seeds, "--seeds") if seeds is not None else None
    if status is not None:
        from mtp_cli.launch.status import ablation_status, status_table

        ab, rows = ablation_status(status, only=only, seeds=seed_list, results_root=results_root)
        ui.out.print(status_table(ab, rows))
        return
    if recipe is None:
        raise UserError("mtp ablate needs --recipe RECIPE (or --status RECIPE)")
    settings = {"kind": launcher, "partition": partition, "account": account, "qos": qos, "time": time_limit,
                "nodes": nodes, "gpus_per_node": gpus_per_node, "cpus_per_task": cpus_per_task, "mem": mem,
                "sbatch": _key_values(sbatch, "--sbatch") if sbatch else None,
                "folder": str(job_folder) if job_folder else None}
    ab = ablation.run_ablation(recipe, only=only, seeds=seed_list, dry_run=dry_run, force=force,
                               results_root=results_root, gsm8k_data=gsm8k_data, launcher=settings, track=track,
                               wait=wait, threads=threads)
    if dry_run:
        ui.out.print(plan_table(ab))
        return
    for failure in ab.failures:
        ui.console.print(f"[red]failed:[/red] {failure}", highlight=False, soft_wrap=True)
    if ab.summary:  # under torchrun only rank 0 writes it
        ui.out.print(f"summary written to {ab.summary}; render the report with `mtp report {ab.results_dir}`")
    if ab.failures:
        raise typer.Exit(1)


@app.command()
def report(results_dir: Path = typer.Argument(..., help="An ablation's results folder, e.g. results/quick.")) -> None:
    """Render REPORT.md, plots and terminal tables from stored results (trains nothing)."""
    from mtp_cli.results import report as reporting

    path = reporting.render_report(results_dir, console=ui.out)
    ui.out.print(f"report written to {path}")


def _float_list(text: str, flag: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{flag} expects comma-separated numbers, got {text!r}") from None
    if not values:
        raise UserError(f"{flag} is empty")
    return values


def _key_values(items: list[str], flag: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"{flag} expects KEY=VALUE, got {item!r}")
        pairs[key.strip()] = value.strip()
    return pairs


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{flag} expects comma-separated integers, got {text!r}") from None
    if not values:
        raise UserError(f"{flag} is empty")
    return values


def main() -> None:
    from rich.markup import escape  # messages carry user paths: "[...]" in them is text, not markup

    signal.signal(signal.SIGTERM, raise_terminated)  # SIGTERM as Ctrl-C: the same clean-up, exit 143
    Stop.said = False  # this command's own: nothing has said why it stopped yet
    try:
        code = app(standalone_mode=False)
        if isinstance(code, int) and code:  # without standalone mode typer *returns* typer.Exit(n)'s code (Ctrl-C: 130)
            if code == 130 and not Stop.said:
                ui.console.print("interrupted")
            sys.exit(code)
    except UserError as exc:
        ui.console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        if not Stop.said:
            ui.console.print("interrupted")
        sys.exit(130)
    except Terminated:
        if not Stop.said:
            ui.console.print("terminated (SIGTERM)")
        sys.exit(143)
    except Exception as exc:
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):  # typer's (vendored click) usage errors
            ctx = getattr(exc, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            ui.console.print(f"[red]error:[/red] {escape(exc.format_message())}{escape(hint)}", highlight=False,
                             soft_wrap=True)
            sys.exit(exc.exit_code)
        raise


if __name__ == "__main__":
    main()
