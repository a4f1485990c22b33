"""Before a release: run every command in README.md's shell blocks, at tiny scale, in a fresh clone.

Each `mtp …`, `make …` and `torchrun …` line (and `NAME=value` lines, kept as variables) of every
```bash block runs in order, as a new user runs it: in a fresh clone of this repository (its working
tree's changes applied and committed there), with that clone's code, and with the sizes shrunk: recipes
are rewritten to a tiny model with the same name and variants (so run names match the README's),
`--limit`, `--steps`, `--repeats`, `--samples`, `--max-new-tokens`, `--batch-sizes` and
`--nproc_per_node` are made small, and `make` runs in the clone. After every command the clone's
`git status` must be clean: no README command may change a tracked file (the committed results among
them). `make test` and `make check-readme` are skipped (the first is what CI runs, the second is this
script); lines of other programs (pip, source, python scripts) only have their script's `--help` run. A
command that fails stops the check with its output.

    python scripts/check_readme.py            # every command (minutes)
    python scripts/check_readme.py --parse    # only: each mtp command and flag exists (seconds)
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from mtp_cli.config.recipe import toml_text  # noqa: E402 (the repository's package, beside this script)

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SMALL = {"--limit": "1", "--steps": "4", "--repeats": "1", "--samples": "2", "--max-new-tokens": "8",
         "--batch-sizes": "1", "--nproc_per_node": "2", "--nproc-per-node": "2"}
SKIPPED_MAKE = {"test", "test-slow", "check-readme", "install", "bench", "clean"}
TINY_MODEL = {"vocab_size": 512, "n_layers": 4, "d_model": 32, "n_heads": 2, "ffn_hidden": 64, "context": 32}
TINY_TRAIN = {"steps": 4, "batch_size": 4, "warmup": 1, "eval_every": 4, "eval_batches": 1, "ckpt_every": 4,
              "compile": False, "device": "cpu"}


def commands(readme: Path) -> list[str]:
    """The README's shell lines, continuations joined and comments dropped."""
    lines, block = [], None
    for raw in readme.read_text().splitlines():
        if raw.lstrip().startswith("```"):  # fences indented under a list item count too
            block = raw.lstrip()[3:].strip() if block is None else None
            continue
        if block in ("bash", "sh", "shell", "console"):
            lines.append(raw)
    joined = "\n".join(lines).replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(shlex.join(words))
    return out


def tiny_recipe(name: str, folder: Path) -> Path:
    """The shipped recipe `name` with a tiny model, a few stdlib files and tiny eval/specbench settings."""
    source = REPO / "recipes" / f"{name}.toml"
    data = tomllib.loads(source.read_text()) if source.is_file() else {}
    data["name"] = name
    data["model"] = {**data.get("model", {}), **TINY_MODEL}
    data["data"] = {"source": "files", "tokenizer": "bpe",
                    "paths": [str(STDLIB / f) for f in ("textwrap.py", "string.py", "shlex.py", "glob.py")]}
    data["train"] = {**{k: v for k, v in data.get("train", {}).items() if k in ("lr", "schedule", "seed")}, **TINY_TRAIN}
    data["seeds"] = data.get("seeds", [0])[:1] or [0]
    data["eval"] = {**data.get("eval", {}), "limits": {"humaneval": 1, "gsm8k": 1, "heldout": 2}}
    data["specbench"] = {**data.get("specbench", {}), "limit": 1, "max_new_tokens": 4, "batch_sizes": [1],
                         "repeats": 1}
    data["variants"] = [{k: x for k, x in v.items() if k in ("name", "description", "mtp")}  # sizes stay tiny
                        for v in data.get("variants", [])]
    if not data["variants"]:
        del data["variants"]
    path = folder.parent / "recipes" / f"{name}.toml"  # beside the clone: its recipes/ stay as committed
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(toml_text(data))
    return path


def shrink(words: list[str], scratch: Path) -> list[str]:
    """Small sizes, tiny recipes (named like the originals), ablations into the scratch folder."""
    out, i = [], 0
    while i < len(words):
        w = words[i]
        flag, eq, val = w.partition("=")
        if flag in SMALL and (eq or i + 1 < len(words)):
            out += [flag, SMALL[flag]]
            i += 1 if eq else 2
            continue
        if w == "--recipe" and i + 1 < len(words):
            out += ["--recipe", str(tiny_recipe(Path(words[i + 1]).stem, scratch))]
            i += 2
            continue
        out.append(w)
        i += 1
    is_train = "train" in out and "--resume" not in out and "--recipe" not in out
    if is_train:
        out += ["--recipe", str(tiny_recipe("quick", scratch))]
    return out


def run_line(line: str, scratch: Path, env: dict, parse_only: bool) -> str:
    words = shlex.split(line)
    while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):  # NAME=value [command]
        name, _, value = words.pop(0).partition("=")
        env[name] = os.path.expandvars(value)
        if not words:
            return f"set {name}"
    words = [os.path.expandvars(w) if "$" in w else w for w in words]
    program = words[0] if words else ""
    python = sys.executable
    if program == "mtp":
        return _mtp(words[1:], scratch, env, parse_only)
    if program == "torchrun":
        if parse_only:
            return "skipped (parse only)"
        words = shrink(words, scratch)
        cmd = [python, "-m", "torch.distributed.run", *words[1:]]
        return _run(cmd, scratch, env)
    if program == "make":
        target = next((w for w in words[1:] if "=" not in w and not w.startswith("-")), "")
        if target in SKIPPED_MAKE or parse_only:
            return f"skipped (make {target})"
        return _make(words[1:], scratch, env)
    script = next((w for w in words if w.startswith("scripts/") and w.endswith(".py")), None)
    if script:
        if not (REPO / script).is_file():
            raise SystemExit(f"README: {script}: no such script")
        return "exists" if parse_only else _run([python, str(scratch / script), "--help"], scratch, env)
    return "skipped (not an mtp, make or torchrun command)"


def _mtp(args: list[str], scratch: Path, env: dict, parse_only: bool) -> str:
    if parse_only:
        from click.testing import CliRunner
        from typer.main import get_command

        from mtp_cli.cli import app

        command = get_command(app)
        sub = command.commands.get(args[0]) if args else None
        if sub is None:
            raise SystemExit(f"README: `mtp {' '.join(args)}`: no such command")
        known = {o for p in sub.params for o in (*p.opts, *p.secondary_opts)}
        unknown = [a.partition("=")[0] for a in args[1:] if a.startswith("--") and a.partition("=")[0] not in known]
        if unknown:
            raise SystemExit(f"README: `mtp {' '.join(args)}`: unknown option {', '.join(unknown)}")
        parse(args)
        CliRunner().invoke(command, [args[0], "--help"])
        return "parsed"
    args = shrink(args, scratch)
    if args[:1] == ["ablate"] and "--results-root" not in args:
        args += ["--results-root", str(scratch.parent / "ablations")]
    if args[:1] in (["eval"],) and "--limit" not in args:
        args += ["--limit", "1"]
    if args[:1] == ["specbench"]:
        args += [a for pair in (("--limit", "1"), ("--max-new-tokens", "4"), ("--repeats", "1")) if pair[0] not in args
                 for a in pair]
    if args[:1] == ["generate"] and "--max-new-tokens" not in args:
        args += ["--max-new-tokens", "8"]
    return _run([sys.executable, "-m", "mtp_cli", *args], scratch, env)


def parse(args: list[str]) -> None:
    """`mtp ARGS` through the command's own parser (values, counts, extra arguments), running nothing."""
    from typer.main import get_command

    from mtp_cli.cli import app

    command = get_command(app)
    try:
        command.commands[args[0]].make_context(args[0], list(args[1:]))
    except Exception as exc:  # typer's vendored click usage errors (as mtp_cli.cli.main reads them)
        if not hasattr(exc, "format_message"):
            raise
        raise SystemExit(f"README: `mtp {' '.join(args)}`: {exc.format_message()}") from None


def _make(args: list[str], scratch: Path, env: dict) -> str:
    venv = scratch.parent / "venv"
    venv.mkdir(exist_ok=True)
    (venv / ".installed").touch()
    recipe = next((a.partition("=")[2] for a in args if a.startswith("RECIPE=")), "quick")
    args = [a for a in args if not a.startswith("RECIPE=")]
    mtp = f"{sys.executable} -m mtp_cli"
    return _run(["make", "-C", str(scratch), *args, f"VENV={venv}", f"MTP={mtp}", f"PY={sys.executable}",
                 f"RECIPE={tiny_recipe(recipe, scratch)}"], scratch, env)


def _run(cmd: list[str], cwd: Path, env: dict) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"README command failed (exit {proc.returncode}): {shlex.join(cmd)}\n"
                         f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    changed = _git(cwd, "status", "--porcelain")
    if changed.strip():
        raise SystemExit(f"README command changed tracked files of a fresh clone: {shlex.join(cmd)}\n{changed}")
    return "ok"


def _git(where: Path, *args: str, stdin: bytes | None = None) -> str:
    return subprocess.run(["git", "-C", str(where), *args], input=stdin, capture_output=True, check=True).stdout.decode()


def fresh_clone(into: Path) -> Path:
    """A clone of this repository with the working tree's changes (tracked and untracked, not ignored)
    committed in it, so that `git status` there is clean until a command writes a tracked file."""
    _git(into, "clone", "-q", "--no-hardlinks", str(REPO), "clone")
    clone = into / "clone"
    diff = subprocess.run(["git", "-C", str(REPO), "diff", "--binary", "HEAD"], capture_output=True, check=True).stdout
    if diff:
        _git(clone, "apply", "--binary", "-", stdin=diff)
    for name in _git(REPO, "ls-files", "--others", "--exclude-standard").splitlines():
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, clone / name)
    if _git(clone, "status", "--porcelain").strip():
        _git(clone, "add", "-A")
        _git(clone, "-c", "user.name=check_readme", "-c", "user.email=check@readme", "commit", "-qm", "working tree")
    return clone


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readme", type=Path, default=REPO / "README.md")
    ap.add_argument("--parse", action="store_true", help="Only check that each mtp command and flag exists.")
    ap.add_argument("--keep", action="store_true", help="Keep the scratch folder.")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="mtp-readme-"))
    scratch = work if args.parse else fresh_clone(work)
    env = {"PYTHONPATH": str(scratch) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "MTP_CACHE_DIR": str(work / "cache"), "OMP_NUM_THREADS": "1"}
    try:
        for line in commands(args.readme):
            print(f"{run_line(line, scratch, env, args.parse):<12} {line}", flush=True)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
