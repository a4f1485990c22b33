"""`mtp train`'s flags as one recipe, worked out in one place: the recipe named (or, resuming without one,
the run's own), the checkpoint it starts from resolved into its [model], each flag given laid over it, and
the whole validated once. The grid's cells come from their recipe file (grid/plan.py) and start from a
checkpoint through the same `resolve_init`."""

from __future__ import annotations

from pathlib import Path

from mtp_cli.base import ui
from mtp_cli.base.errors import UserError
from mtp_cli.config.recipe import Recipe, load_recipe, objective_from_flags, resolve_recipe_path
from mtp_cli.model import checkpoint as ckpt
from mtp_cli.model import pretrained


def resolve_init(recipe: Recipe, given_model_keys: set[str]) -> None:
    """With train.init_from, make the recipe's [model] the checkpoint's (`given_model_keys`: the [model] keys
    the user set, which must agree with it); without, nothing."""
    if recipe.train.init_from:
        pretrained.resolve_recipe(recipe, given_model_keys)


def recipe_from_flags(recipe: str | None, out: Path | None, resume: bool, init_from: str | None, *,
                      objective: str | None = None, depth: int | None = None, heads: int | None = None,
                      lam: float | None = None, lambda_final: float | None = None, lambda_switch: float | None = None,
                      mtp_input: str | None = None, data: list[str] | None = None, fsdp: bool | None = None,
                      **train: object) -> Recipe:
    """The recipe `mtp train` trains. `train`: the [train] flags (steps, batch_size, lr, seed, data_seed,
    device, compile, freeze_trunk, track), None where not given."""
    if resume and out is not None and recipe is None:
        r = ckpt.recipe_of_run(out)
        if init_from is not None and init_from != r.train.init_from:
            raise UserError(f"--init-from {init_from}: the run in {out} started from "
                            f"{r.train.init_from or 'a random init'}; resume it without --init-from")
    else:
        r = load_recipe(recipe or "quick")
        r.override("train", init_from=init_from)
        # the checkpoint decides [model]; the default recipe's never applies
        resolve_init(r, pretrained.given_model_keys(resolve_recipe_path(recipe)) if recipe else set())
        if r.train.init_from and not recipe and train.get("lr") is None:
            ui.console.print(f"warning: --init-from without --recipe trains at the quick recipe's lr {r.train.lr:g}, "
                             "set for a random init; pass --lr or a recipe (e.g. gpu-smollm2-135m)",
                             markup=False, soft_wrap=True)
    objective = objective_from_flags(r.mtp.objective, objective, depth, heads, lam)
    r.override("mtp", objective=objective, depth=depth, heads=heads, lambda_=lam, lambda_final=lambda_final,
               lambda_switch=lambda_switch, mtp_input=mtp_input)
    r.override("train", **train)
    if data:
        r.override("data", source="files", paths=list(data))
    if fsdp is not None:
        r.override("train", parallel="fsdp" if fsdp else "ddp")
    r.validate()
    return r
