"""The repository stands on its own: no tracked file points outside it, GSM8K ships inside it and is
found from any current directory (with --gsm8k-data and MTP_GSM8K_DATA overriding it), a dry run checks
what the real run checks, every computing command takes --threads, and tables fit 80 columns or are
plain Markdown when not printed to a terminal."""

from __future__ import annotations

import io
import os
import re
import subprocess

import pytest
from helpers import REPO, ablation_toml, cli_in_process
from rich.console import Console

from mtp_cli.base import paths
from mtp_cli.base.tables import Table

mtp = cli_in_process
COMPUTING_COMMANDS = ("train", "eval", "generate", "specbench", "ablate")
UP = "../"  # spelled in pieces below, so this file does not match its own check
WORKSPACE = re.compile("/" + r"work/\w*")  # the folder these repositories were developed in
GENERATED = re.compile(r"results/[^/]+/runs/[^/]+/(tokenizer/|.*_samples\.jsonl)")  # model output, vocabularies


def tracked_text_files():
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for name in names:
        path = REPO / name
        if GENERATED.match(name) or not path.is_file():
            continue
        try:
            yield name, path.read_text()
        except UnicodeDecodeError:
            continue  # images


def test_no_tracked_file_refers_to_a_path_outside_the_repository():
    offenders = []
    for name, text in tracked_text_files():
        depth = name.count("/")
        for match in re.finditer(r"(?:\.\./)+", text):
            ups = match.group().count(UP)
            if ups > depth or text.startswith("shared", match.end()):  # above the root, or the old workspace
                offenders.append(f"{name}: ...{text[max(match.start() - 20, 0):match.end() + 20]!r}")
        offenders += [f"{name}: mentions {m.group()!r}" for m in WORKSPACE.finditer(text)]
    assert not offenders, "\n".join(offenders)


def test_the_check_catches_a_planted_reference(tmp_path, monkeypatch):
    planted = REPO / "recipes" / "planted-outside.toml"
    planted.write_text(f'gsm8k_data = "{UP}shared/data/gsm8k"\n')
    try:
        subprocess.run(["git", "add", "-N", str(planted)], cwd=REPO, check=True)
        with pytest.raises(AssertionError, match="planted-outside"):
            test_no_tracked_file_refers_to_a_path_outside_the_repository()
    finally:
        subprocess.run(["git", "rm", "-q", "--cached", "-f", str(planted)], cwd=REPO, check=False)
        planted.unlink(missing_ok=True)


def test_gsm8k_ships_with_its_licence_and_is_found_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(paths.GSM8K_ENV, raising=False)
    data = paths.gsm8k_data()
    assert data == REPO / "data" / "gsm8k"
    assert "MIT License" in (data / "LICENSE").read_text()
    assert sum(1 for _ in (data / "test.jsonl").open()) == 1319 and sum(1 for _ in (data / "train.jsonl").open()) == 7473
    assert paths.gsm8k_data(None, "data/gsm8k") == data  # a recipe's relative path is the repository's
    monkeypatch.setenv(paths.GSM8K_ENV, str(tmp_path / "mine"))
    assert paths.gsm8k_data(None, "data/gsm8k") == tmp_path / "mine"  # the variable beats the recipe
    assert paths.gsm8k_data(tmp_path / "flag", "data/gsm8k") == tmp_path / "flag"  # the flag beats both
    assert paths.gsm8k_data("hub") is None


def test_ablate_dry_run_exits_2_without_gsm8k_data(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(paths.GSM8K_ENV, raising=False)
    recipe = tmp_path / "r.toml"
    recipe.write_text(ablation_toml("r").replace(str(REPO / "tests" / "data" / "gsm8k"), str(tmp_path / "nowhere")))
    code, out, err = mtp("ablate", "--recipe", recipe, "--dry-run", "--results-root", tmp_path / "res", capsys=capsys)
    assert code == 2 and "nowhere does not exist" in err and len(err.strip().splitlines()) == 1, (out, err)
    assert not (tmp_path / "res").exists()
    # --gsm8k-data repairs it; MTP_GSM8K_DATA breaks the shipped recipe the same way
    code, out, err = mtp("ablate", "--recipe", recipe, "--dry-run", "--results-root", tmp_path / "res",
                         "--gsm8k-data", REPO / "tests" / "data" / "gsm8k", capsys=capsys)
    assert code == 0, err
    monkeypatch.setenv(paths.GSM8K_ENV, str(tmp_path / "elsewhere"))
    code, out, err = mtp("ablate", "--recipe", "quick", "--dry-run", "--results-root", tmp_path / "res", capsys=capsys)
    assert code == 2 and "elsewhere does not exist" in err


@pytest.mark.parametrize("recipe", ["quick", "cpu-posthoc", "depth", "cpu-small"])
def test_shipped_offline_recipes_plan(recipe, tmp_path, capsys, monkeypatch):
    """Each offline recipe passes the checks a real run makes first (several prompt sources, heldout among them)."""
    monkeypatch.delenv(paths.GSM8K_ENV, raising=False)
    code, out, err = mtp("ablate", "--recipe", recipe, "--dry-run", "--results-root", tmp_path / "res", capsys=capsys)
    assert code == 0, err
    assert "total" in out


def test_the_fsdp_recipe_plans_offline(tmp_path, capsys, monkeypatch):
    """gpu-1b (online, CUDA, untested on GPU) passes --dry-run here: its source is only noted as not cached."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, out, err = mtp("ablate", "--recipe", "gpu-1b", "--dry-run", "--results-root", tmp_path / "res",
                         "--gsm8k-data", REPO / "tests" / "data" / "gsm8k", capsys=capsys)
    assert code == 0, err
    assert "parallel n=4" in out and "total" in out


def test_ablate_dry_run_checks_the_output_folder(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    code, _, err = mtp("ablate", "--recipe", "quick", "--dry-run", "--results-root", tmp_path / "file", capsys=capsys)
    assert code == 2 and "is not a folder" in err


def test_the_data_path_is_not_part_of_the_recipe_fingerprint(tmp_path):
    from mtp_cli.grid.cells import fingerprint

    text = (REPO / "recipes" / "quick.toml").read_text()
    moved = tmp_path / "quick.toml"
    moved.write_text(text.replace('gsm8k_data = "data/gsm8k"', 'gsm8k_data = "/somewhere/else"'))
    assert moved.read_text() != text
    assert fingerprint(moved) == fingerprint(REPO / "recipes" / "quick.toml")
    moved.write_text(text.replace("steps = 64", "steps = 65"))
    assert fingerprint(moved) != fingerprint(REPO / "recipes" / "quick.toml")


@pytest.mark.parametrize("command", COMPUTING_COMMANDS)
def test_every_computing_command_takes_threads(command, tmp_path, capsys):
    code, out, _ = mtp(command, "--help", capsys=capsys)
    assert code == 0 and "--threads" in out
    args = {"train": [], "ablate": ["--recipe", "quick"], "generate": [tmp_path / "no-run", "--prompt", "x"]}.get(
        command, [tmp_path / "no-run"])
    code, _, err = mtp(command, *args, "--threads", "0", capsys=capsys)
    assert code == 2 and err.strip() == "error: --threads must be >= 1, got 0", err


def test_usage_errors_read_like_every_other_error(capsys):
    code, _, err = mtp("export", "--no-such-flag", capsys=capsys)
    assert code == 2 and err.startswith("error: No such option: --no-such-flag"), err


WIDE = Table("Decoding speed", ["variant", "batch size", "tokens per second", "speedup over our greedy decoder",
                                "acceptance rate", "mean acceptance length", "identical to greedy"],
             [["parallel-n4", "1", "1,555", "0.39× [0.37, 0.42]", "66.9%", "3.01", "yes"],
              ["seq-d1", "4", "886", "0.60× [0.58, 0.70]", "10.5%", "1.11", "20/20"]],
             ["a note"], short={"tokens per second": "tok/s"})


def test_tables_fit_80_columns_in_a_terminal_with_a_legend():
    buf = io.StringIO()
    Console(file=buf, width=80, force_terminal=True, color_system=None).print(WIDE)
    text = buf.getvalue()
    assert max(map(len, text.splitlines())) <= 80 and "…" not in text, text
    for cell in ("parallel-n4", "1,555", "66.9%", "20/20"):  # no cell broken over lines
        assert cell in text, text
    buf = io.StringIO()
    Console(file=buf, width=60, force_terminal=True, color_system=None).print(WIDE)
    text = buf.getvalue()
    assert max(map(len, text.splitlines())) <= 60 and "…" not in text, text
    assert "tok/s = tokens per second" in text and "parallel-n4" in text, text  # too narrow to fold: short forms
    buf = io.StringIO()
    Console(file=buf, width=200, force_terminal=True, color_system=None).print(WIDE)
    assert "tokens per second" in buf.getvalue() and "tok/s" not in buf.getvalue()  # room: full headers


def test_tables_are_markdown_when_not_printed_to_a_terminal():
    buf = io.StringIO()
    Console(file=buf, width=40, soft_wrap=True).print(WIDE)
    assert buf.getvalue().strip() == WIDE.markdown().strip()
    assert "| variant | batch size | tokens per second |" in buf.getvalue()


def _check_readme():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_readme", REPO / "scripts" / "check_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_starts_with_the_two_commands_and_every_mtp_command_in_it_parses(tmp_path, capsys):
    check = _check_readme()
    lines = check.commands(REPO / "README.md")
    assert lines[:2] == ["make report", "make test"]
    assert "make test" in (REPO / ".ci" / "run").read_text()
    assert check.main(["--parse"]) == 0
    assert check.main(["--parse", "--readme", str(REPO / "docs" / "results.md")]) == 0  # the figures' own commands
    bad = tmp_path / "README.md"
    bad.write_text("```bash\nmtp train --no-such-flag 3\n```\n")
    with pytest.raises(SystemExit, match="unknown option --no-such-flag"):
        check.main(["--parse", "--readme", str(bad)])


def test_the_readmes_own_data_line_parses_as_written():
    """The inline `mtp train --data ...` of the README, parsed by the command itself (it once passed two paths
    to one --data: "Got unexpected extra argument"). Control: that form is refused."""
    import re
    import shlex

    check = _check_readme()
    lines = re.findall(r"`(mtp train --data [^`]+)`", (REPO / "README.md").read_text())
    assert lines
    for line in lines:
        check.parse(shlex.split(line)[1:])
    with pytest.raises(SystemExit, match="unexpected extra argument"):
        check.parse(["train", "--data", "my_code/", "notes.md"])


@pytest.mark.slow
def test_every_readme_command_runs_at_tiny_scale():
    assert _check_readme().main([]) == 0


def test_committed_tokenizers_are_stored_once():
    """Each distinct tokenizer is tracked once, under results/tokenizers/, and every committed run's
    tokenizer is a relative link to it that loads. Control: the 15 copies it replaced were byte-identical."""
    import hashlib

    from mtp_cli.data import tokenizer as toklib

    names = subprocess.run(["git", "ls-files", "results"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    stored = [n for n in names if n.endswith("/tokenizer.json")]
    digests = [hashlib.sha256((REPO / n).read_bytes()).hexdigest() for n in stored]
    assert len(set(digests)) == len(digests) and all(n.startswith("results/tokenizers/") for n in stored), stored
    links = [REPO / n for n in names if n.endswith("/tokenizer") and (REPO / n).is_symlink()]
    assert links
    for link in links:
        target = link.resolve()
        assert target.parent == (REPO / "results" / "tokenizers").resolve() and not os.path.isabs(os.readlink(link))
        assert target.name.endswith(toklib.fingerprint(toklib.load(link)))


def test_every_committed_recipe_survives_a_round_trip_through_toml_text():
    """`toml_text` (the TOML writer of check_readme, the GPU check and the tests) gives back the tables it was given."""
    import tomllib

    from mtp_cli.config.recipe import load_recipe, recipe_data, toml_text

    for path in sorted((REPO / "recipes").glob("*.toml")):
        data = recipe_data(path)
        assert tomllib.loads(toml_text(data)) == data, path.name
        recipe = load_recipe(path)
        assert tomllib.loads(recipe.to_toml())["train"] == {k: v for k, v in recipe.to_dict()["train"].items()
                                                           if v is not None}
