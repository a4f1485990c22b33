"""What an ablation will cost before it runs, for `mtp ablate --dry-run` (what it did cost is the report's
cost section, `report/costs`; what a decoding step costs, `bench/costs`).

Measured first: a stage that already ran for the same variant (another seed) in this results folder
costs what it took there; a partly trained run costs its remaining steps at its own median step time.
Otherwise training is estimated from FLOPs: training FLOPs per token × tokens / (matmul peak measured
on this machine × an assumed utilisation), or over the FLOP/s that runs in this folder reached. Eval and
specbench have no FLOP model worth the name (decoding small models is overhead-bound), so without a
measurement they borrow another variant's time in this folder, or say they are unknown. A self-distilled
corpus that is not cached yet adds its generation to the first cell that makes it.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

import torch

from mtp_cli.base import env
from mtp_cli.base.errors import UserError
from mtp_cli.config.recipe import Recipe
from mtp_cli.corpus import selfdistill
from mtp_cli.data import shards
from mtp_cli.model import MTPModel, pretrained, trunk_cache
from mtp_cli.model.flops import flops_per_token, forward_flops_per_token, trunk_forward_flops_per_token
from mtp_cli.results import folder as results

ASSUMED_MFU = {"cpu": 0.5, "cuda": 0.35}  # fp32 on CPU reaches ~0.55 at the quick scale; bf16 on CUDA varies
GENERATION_UTILISATION = 0.3  # HF generate, fp32 on the CPU in batches of 64: SmolLM2-135M ran at ~31% of the peak


@dataclass
class Estimate:
    seconds: float | None
    basis: str


def _meta_model(recipe: Recipe) -> MTPModel:
    """The recipe's model without memory (shapes only), its trunk frozen as training will freeze it."""
    with torch.device("meta"):
        model = MTPModel(recipe.model, recipe.mtp)
    if recipe.train.freeze_trunk:
        model.freeze_trunk()
    return model


def training_flops(recipe: Recipe) -> tuple[float, float, int]:
    """(training FLOPs per token, forward FLOPs per token, tokens per step) of a single-run recipe,
    without allocating the model; a frozen trunk (train.freeze_trunk) counts as it trains."""
    model = _meta_model(recipe)
    context = recipe.model.context
    return (flops_per_token(model, context), forward_flops_per_token(model, context),
            recipe.train.batch_size * context)


class Estimator:
    """Estimates for every (cell, stage) of one ablation, from what its results folder measured."""

    def __init__(self, results_dir, recipe: Recipe, cells=()):
        self.stage_times: dict[tuple[str, str], list[float]] = defaultdict(list)  # (variant, stage) -> seconds
        self.achieved: list[float] = []  # FLOP/s the runs in this folder reached (no peak needed)
        for run in results.run_folders(results_dir):
            for stage, info in (run.log.get("stages") or {}).items():
                if stage != "train":
                    self.stage_times[(run.variant, stage)].append(float(info["seconds"]))
            tokens_per_s = (run.run.get("throughput") or {}).get("tokens_per_s_median")
            if tokens_per_s and run.run.get("flops_per_token"):
                self.achieved.append(float(tokens_per_s) * float(run.run["flops_per_token"]))
        self._peak: dict[str, float | None] = {}
        self._self_texts: set = set()  # self-distilled corpora an earlier cell of this plan makes
        self._stored_states: dict[tuple, dict[str, int]] = defaultdict(dict)  # batch key -> {run: batches it stores}
        self._located: dict[tuple, selfdistill.SelfText] = {}
        for cell in cells:  # the whole plan in order, done or not: a finished run's states are on disk
            self._stores_states(cell)

    def peak(self, recipe: Recipe) -> tuple[float | None, str]:
        device = recipe.train.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda" and not torch.cuda.is_available():
            return (recipe.train.peak_flops or None), "cuda"
        if device not in self._peak:

            dtype = env.autocast_dtype(torch.device(device)) or torch.float32
            self._peak[device] = recipe.train.peak_flops or env.matmul_peak(torch.device(device), dtype,
                                                                             shards.cache_root(recipe.data))
        return self._peak[device], device

    def stage(self, cell, stage: str) -> Estimate:
        return getattr(self, f"_{stage}")(cell)

    def _train(self, cell) -> Estimate:
        """The training steps left, plus making the self-distilled corpus first where no earlier cell or
        cache has it."""
        steps, text = self._train_steps(cell), self._self_text(cell)
        if text is None:
            return steps
        seconds = None if steps.seconds is None or text.seconds is None else steps.seconds + text.seconds
        return Estimate(seconds, f"{steps.basis}; + {text.basis}")

    def _self_text(self, cell) -> Estimate | None:
        """Hugging Face `generate` over the self-distillation prompts (`selfdistill`), on the CPU, from the
        forward FLOPs of every prompt token and new token over the CPU's measured matmul peak at an assumed
        utilisation; None when the text is cached or an earlier cell of this plan makes it."""
        recipe = cell.recipe
        if not recipe.data.uses_self or not recipe.train.init_from:
            return None
        data, source = recipe.data, recipe.train.init_from
        try:
            pretrained.read_source(source)
        except UserError:  # an earlier stage's export, not made yet: nothing of it can be cached
            key, n = ("source", source, repr(data)), data.self_samples
            tokens = n * (data.self_prompt_tokens + data.self_new_tokens)
            what = f"{n} prompts of ~{data.self_prompt_tokens} tokens"
        else:
            memo = (source, repr(data))
            if memo not in self._located:  # hashing the weights and cutting the prompts: once per setting
                self._located[memo] = selfdistill.locate(data, source, shards.cache_root(data))
            where = self._located[memo]
            key, n = where.path, len(where.prompts)
            tokens, what = where.tokens_to_run(data.self_new_tokens), f"{n} prompts"
            if where.path.is_file():
                return None
        if key in self._self_texts:
            return None
        self._self_texts.add(key)
        flops = trunk_forward_flops_per_token(_meta_model(recipe), recipe.model.context) * tokens
        peak = env.matmul_peak(torch.device("cpu"), torch.float32, shards.cache_root(data))
        basis = (f"self-distilled text, not cached: {what}, {tokens:,} tokens at most, "
                 f"{flops / 1e12:.3g} TFLOP / {peak / 1e9:.0f} GFLOP/s / {GENERATION_UTILISATION:.0%} (assumed)")
        return Estimate(flops / (peak * GENERATION_UTILISATION), basis)

    def _train_steps(self, cell) -> Estimate:
        recipe = cell.recipe
        run = results.RunFolder(cell.run_dir)
        done = int(run.run.get("step") or 0) if run.run else 0
        remaining = max(recipe.train.steps - done, 0)
        step_times = [m["step_time_s"] for m in run.metrics if m.get("kind") == "train"][1:]
        if len(step_times) >= 5:
            t = statistics.median(step_times)
            return Estimate(remaining * t, f"measured: {remaining} steps left × {t:.2f} s")
        fpt, forward_fpt, tokens = training_flops(recipe)
        val_tokens = (recipe.train.steps // recipe.train.eval_every + 1) * recipe.train.eval_batches * tokens
        flops = fpt * tokens * remaining + forward_fpt * val_tokens * remaining / max(recipe.train.steps, 1)
        reused, shared = self._reused_trunk_steps(cell, done)
        if reused:
            flops -= trunk_forward_flops_per_token(_meta_model(recipe), recipe.model.context) * tokens * reused
        how = (f"; the trunk's forward on {remaining - reused} of {remaining} steps (stored states"
               f"{', some stored by an earlier run of this plan' if shared else ''})") if reused else ""
        if self.achieved:
            rate = statistics.median(self.achieved)
            return Estimate(flops / rate, f"{flops / 1e12:.3g} TFLOP / {rate / 1e9:.0f} GFLOP/s "
                                          f"(reached by {len(self.achieved)} run(s) here){how}")
        peak, device = self.peak(recipe)
        mfu = ASSUMED_MFU.get(device, 0.35)
        if not peak:
            return Estimate(None, f"{flops / 1e15:.3g} PFLOP; no {device} here to measure its peak{how}")
        return Estimate(flops / (peak * mfu),
                        f"{flops / 1e12:.3g} TFLOP / {peak / 1e9:.0f} GFLOP/s / MFU {mfu:.0%} (assumed){how}")

    def _reused_trunk_steps(self, cell, done: int) -> tuple[int, bool]:
        """(steps left that read stored trunk states, whether an earlier run of this plan stored some): the
        run's own passes after the first over train.distinct_batches, and the batches an earlier cell with the
        same frozen trunk and batches stores first (`trunk_cache`'s key: the data, context, batch size, data
        order). The cell's own batches are noted for the cells after it."""
        key = self._stores_states(cell)
        if key is None:
            return 0, False
        runs = list(self._stored_states[key].items())  # in plan order
        mine = [run for run, _ in runs].index(str(cell.run_dir))
        first_pass = runs[mine][1]
        earlier = max((n for _, n in runs[:mine]), default=0)
        fresh = max(first_pass - max(done, earlier), 0)
        return max(cell.recipe.train.steps - done, 0) - fresh, fresh < max(first_pass - done, 0)

    def _stores_states(self, cell) -> tuple | None:
        """Note (once, in plan order) how many batches a frozen, cached trunk's run stores states for; its
        batch key, or None for a run that stores none."""
        recipe = cell.recipe
        t = recipe.train
        if not (t.freeze_trunk and t.trunk_cache):
            return None
        key = (t.init_from, repr(recipe.data), t.device, *trunk_cache.batch_settings(recipe).values())
        self._stored_states[key].setdefault(str(cell.run_dir), min(t.steps, t.distinct_batches or t.steps))
        return key

    def _borrowed(self, cell, stage: str) -> Estimate:
        mine = self.stage_times.get((cell.variant.name, stage))
        if mine:
            return Estimate(statistics.median(mine), f"measured on {len(mine)} run(s) of this variant")
        others = [t for (variant, s), ts in self.stage_times.items() if s == stage for t in ts]
        if others:
            return Estimate(statistics.median(others), f"measured on {len(others)} run(s) of other variants")
        return Estimate(None, "unknown until one run has done it")

    def _export(self, cell) -> Estimate:
        est = self._borrowed(cell, "export")
        return est if est.seconds is not None else Estimate(5.0, "assumed (writes the trunk's weights)")

    def _eval(self, cell) -> Estimate:
        return self._borrowed(cell, "eval")

    def _specbench(self, cell) -> Estimate:
        return self._borrowed(cell, "specbench")
