"""Where the data that ships with the repository lives, and how a user points elsewhere.

GSM8K (MIT, `data/gsm8k/`) is read by `mtp eval`, `mtp ablate` and `mtp specbench --prompts gsm8k`.
One rule for all three, so a clone works from any current directory: `--gsm8k-data DIR`, else the
environment variable MTP_GSM8K_DATA (both relative to the current folder), else the recipe's
`eval.gsm8k_data` (relative to the repository), else the shipped copy. The word `hub` (or an empty
recipe value) asks for lm-eval's stock online task.
"""

from __future__ import annotations

import importlib.resources
import os
import sysconfig
from pathlib import Path

from mtp_cli.base.env import REPO

# Where `mtp ablate` (and `make report`, its Makefile's OUT) put an ablation: not `results/`, the committed copy.
RESULTS_ROOT = Path("runs/results")
GSM8K_ENV = "MTP_GSM8K_DATA"
GSM8K_BUNDLED = "data/gsm8k"
HUB = "hub"


def shipped(folder: str) -> Path:
    """A folder the repository keeps at its top level (`recipes`, `data/gsm8k`) and the wheel ships at the
    same place inside the package (pyproject.toml: package-dir): a source checkout's own, else the
    installed copy."""
    if (REPO / folder).is_dir():
        return REPO / folder
    return Path(str(importlib.resources.files("mtp_cli").joinpath(*folder.split("/"))))


RECIPES_DIR = shipped("recipes")
GSM8K_DIR = shipped(GSM8K_BUNDLED)


def gsm8k_data(flag: str | Path | None = None, recipe_value: str | None = None) -> Path | None:
    """The GSM8K folder to use (absolute), or None for the stock task on the Hugging Face hub."""
    for value, base in ((flag, Path.cwd()), (os.environ.get(GSM8K_ENV) or None, Path.cwd()), (recipe_value, REPO)):
        if value is not None:
            return _gsm8k_folder(value, base)
    return GSM8K_DIR


def gsm8k_folder(value: str | Path) -> Path | None:
    """An eval config's `gsm8k_data` as it stands (no flag or environment above it): a folder, relative to
    the repository, or None for "hub" / ""."""
    return _gsm8k_folder(value, REPO)


def _gsm8k_folder(value: str | Path, base: Path) -> Path | None:
    text = str(value).strip()
    if text in ("", HUB):
        return None
    if base == REPO and text == GSM8K_BUNDLED:
        return GSM8K_DIR  # the recipes' "data/gsm8k": the shipped copy, in a checkout or a wheel
    path = Path(text).expanduser()
    return path if path.is_absolute() else (base / path).resolve()


def shown(path: str | Path) -> str:
    """A path as results record it: relative to the repository when inside it, so no stored file names
    the folder the repository happens to be cloned into."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def portable(path: str | Path) -> str:
    """`shown`, and a file inside an installed package as `package/...`: results name neither the clone's
    folder nor the environment's."""
    resolved = Path(path).resolve()
    for root in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        try:
            return str(resolved.relative_to(Path(root).resolve()))
        except ValueError:
            continue
    return shown(resolved)


def gsm8k_source_hint() -> str:
    return f"--gsm8k-data DIR or {GSM8K_ENV} (default: the repository's {GSM8K_BUNDLED})"
