"""The wheel carries what a non-editable install needs: the recipes and the shipped GSM8K copy inside
the package (pyproject.toml: package-dir), found through importlib.resources. A test builds the
wheel, installs it (no dependencies: the test environment's own) into a folder outside the
repository, and plans the quick recipe from there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile

from helpers import REPO


def test_the_package_list_names_every_package_folder():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "mtp_cli").rglob("__init__.py")}
    found |= {"mtp_cli.evals.tasks"}  # YAML only
    assert listed - {"mtp_cli.recipes", "mtp_cli.data.gsm8k"} == found


def test_a_wheel_install_plans_the_quick_recipe_outside_the_repository(tmp_path):
    wheels, target, cwd, src = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere", tmp_path / "src"
    cwd.mkdir()
    # built from a copy: setuptools leaves build/ and *.egg-info beside the sources it builds
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "mtp_cli", "recipes", "data"):
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy2
        copy(REPO / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if copy is shutil.copytree
                                          else {}))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(wheels), str(src)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("mtp-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "mtp_cli/recipes/quick.toml" in names and "mtp_cli/data/gsm8k/test.jsonl" in names
    install = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                              str(wheel)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr
    env = {**os.environ, "PYTHONPATH": str(target)}  # ahead of the editable install of this checkout
    where = subprocess.run([sys.executable, "-c", "import mtp_cli.base.paths as p; print(p.RECIPES_DIR); print(p.GSM8K_DIR)"],
                           cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    recipes, gsm8k = where.stdout.split()
    assert recipes == str(target / "mtp_cli" / "recipes") and gsm8k == str(target / "mtp_cli" / "data" / "gsm8k")
    plan = subprocess.run([sys.executable, "-m", "mtp_cli", "ablate", "--recipe", "quick", "--dry-run",
                           "--results-root", str(tmp_path / "res")], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)
    assert plan.returncode == 0, plan.stderr
    assert "ntp-init-s2" in plan.stdout and "total" in plan.stdout
