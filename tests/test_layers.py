"""The package imports in one direction: every module sits in a layer, and imports only from its own
layer or lower ones; no import cycle, counting imports inside functions. A planted cycle and a
planted upward import must fail the same checks (the negative controls)."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import REPO

PACKAGE = REPO / "mtp_cli"

# Lowest first: each layer is one or more folders of mtp_cli/ (the run layer: training and specbench, which
# never import each other); a module's layer is its folder's. At the top, beside them, only the package's
# own __init__ (base) and the application modules that wire the layers together.
LAYERS: list[tuple[str, list[str]]] = [
    ("base", ["base"]), ("config", ["config"]), ("data", ["data"]), ("model", ["model"]), ("corpus", ["corpus"]),
    ("decode", ["decode"]), ("evals", ["evals"]), ("run", ["train", "bench"]), ("results", ["results"]),
    ("grid", ["grid"]), ("launch", ["launch"]), ("app", ["ablate", "cli", "__main__"]),
]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_imports(root: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports, at module level or inside functions (imports under
    `if TYPE_CHECKING:` do not run, so they do not count)."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _running_nodes(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                names = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for target in names:
                if target.split(".")[0] == root.name and (found := resolve(target)) and found != name:
                    # `from pkg import module` names the module; `from pkg import thing` names the package
                    targets.add(found)
        graph[name] = targets
    return graph


def _running_nodes(tree: ast.AST):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        yield node
        yield from _running_nodes(node)


def missing_modules(root: Path) -> list[str]:
    """`from mtp_cli.x import y` where mtp_cli.x is no module of the package (a module moved away, its
    importer not updated: with the import inside a function, only a run of that function would tell)."""
    files = {module_name(p, root) for p in root.rglob("*.py")}
    missing = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == root.name:
                if node.module not in files:
                    missing.append(f"{module_name(path, root)}: from {node.module} import ...")
            elif isinstance(node, ast.Import):
                missing += [f"{module_name(path, root)}: import {a.name}" for a in node.names
                            if a.name.split(".")[0] == root.name and a.name not in files]
    return sorted(missing)


def layer_of(module: str) -> int:
    """The rank of the layer whose folder (or application module) holds `module`; the package itself is base."""
    parts = module.split(".")
    if len(parts) == 1:
        return 0
    found = [i for i, (_, folders) in enumerate(LAYERS) if parts[1] in folders]
    assert found, f"{module} is in no layer: put it in a layer's folder (LAYERS in {__file__})"
    return found[0]


def test_every_folder_and_top_level_module_is_a_layer(tmp_path):
    """The tree shows the layers: each folder of mtp_cli/ is one, and the only modules at its top are the
    application's. Control: a planted top-level module or unknown folder is named."""
    def strays(root: Path) -> list[str]:
        known = {f for _, folders in LAYERS for f in folders}
        entries = [p for p in root.iterdir() if p.name != "__pycache__" and (p.is_dir() or p.suffix == ".py")]
        return sorted(p.name for p in entries if p.name != "__init__.py" and p.name.removesuffix(".py") not in known)

    assert strays(PACKAGE) == []
    planted = plant(tmp_path, {"__init__.py": "", "stray.py": "", "newroom/__init__.py": "", "model/__init__.py": ""})
    assert strays(planted) == ["newroom", "stray.py"]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    # The package's __init__ files may import their own submodules (a package is its modules' layer).
    return sorted(f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
                  for a, targets in graph.items() for b in targets
                  if layer_of(b) > layer_of(a) and not b.startswith(a + "."))


def test_no_import_cycles():
    assert cycles(package_imports(PACKAGE)) == []


def test_every_import_names_a_module():
    assert missing_modules(PACKAGE) == []


def test_a_planted_import_of_a_moved_module_is_found(tmp_path):
    root = plant(tmp_path, {"__init__.py": "", "stats.py": "def f():\n    from mtp_cli.decode.gone import x\n",
                            "decode/__init__.py": ""})
    assert missing_modules(root) == ["mtp_cli.stats: from mtp_cli.decode.gone import ..."]


def test_imports_go_down_the_layers():
    assert upward_imports(package_imports(PACKAGE)) == []


def plant(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "mtp_cli"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_planted_cycle_inside_a_function_is_found(tmp_path):
    root = plant(tmp_path, {"__init__.py": "", "stats.py": "def f():\n    from mtp_cli import config\n",
                            "config.py": "from mtp_cli.stats import f\n"})
    assert cycles(package_imports(root)) == [["mtp_cli.config", "mtp_cli.stats"]]


def test_a_planted_upward_import_is_found(tmp_path):
    root = plant(tmp_path, {"__init__.py": "", "data/__init__.py": "", "data/shards.py": "import mtp_cli.train\n",
                            "train.py": "from .data import shards\n"})
    graph = package_imports(root)
    assert graph["mtp_cli.train"] == {"mtp_cli.data.shards"}
    assert upward_imports(graph) == ["mtp_cli.data.shards (data) imports mtp_cli.train (run)"]


def test_type_checking_imports_do_not_count(tmp_path):
    root = plant(tmp_path, {"__init__.py": "", "stats.py": "from typing import TYPE_CHECKING\n"
                            "if TYPE_CHECKING:\n    from mtp_cli import train\n", "train.py": ""})
    assert package_imports(root)["mtp_cli.stats"] == set()


def uncommented_function_imports(root: Path) -> list[str]:
    """Imports inside functions (outside cli.py, whose commands import lazily by design, and the fence's
    programs, which run alone) without a comment saying why: on their line, or above their block."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "cli.py" or "fence" in path.parts:
            continue
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, (ast.Import, ast.ImportFrom)) or "#" in lines[node.end_lineno - 1]:
                    continue
                above = node.lineno - 2
                while above >= 0 and (not lines[above].strip() or lines[above].strip().startswith(("from ", "import "))):
                    above -= 1
                if above < 0 or not lines[above].strip().startswith("#"):
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def test_every_import_inside_a_function_says_why():
    assert uncommented_function_imports(PACKAGE) == []


def test_a_planted_silent_function_import_is_found(tmp_path):
    root = plant(tmp_path, {"__init__.py": "", "a.py": "def f():\n    import json\n    return json\n",
                            "b.py": "def g():\n    # why: optional\n    import json\n    import os\n    return json, os\n"})
    assert uncommented_function_imports(root) == ["mtp_cli/a.py:2"]
