"""Corpus sources, each an ordered iterable of documents (strings), offline by default.

- stdlib: the Python standard library's own .py sources (tests, site-packages, idlelib left out);
- stdlib-functions: each public standard-library function with a docstring and a body, whole and dedented,
  one document each (HumanEval's shape: signature, docstring, body), the natural text a code drafter targets;
- files:  local files or folders (.py, .txt, .md, .jsonl with a text field);
- gsm8k:  GSM8K-style JSONL (question + answer) as documents in lm-eval's format (`gsm8k_format`);
- hf:     a Hugging Face `datasets` dataset by name (needs the network or a local cache);
- self:   the trunk's own greedy continuations (`corpus.selfdistill`, mixed in by `corpus.token_data`).

Several joined by "+" (e.g. "stdlib-functions+gsm8k") give each one's documents in turn; training windows
are drawn uniformly over the tokens, so each corpus is seen in proportion to its size.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sysconfig
import textwrap
from collections.abc import Iterator
from pathlib import Path

from mtp_cli.base.errors import UserError
from mtp_cli.config.recipe import DataConfig
from mtp_cli.data import gsm8k_format

TEXT_SUFFIXES = {".py", ".txt", ".md", ".rst"}
STDLIB_SKIP = {"test", "tests", "site-packages", "dist-packages", "idlelib", "__pycache__", "lib2to3", "turtledemo"}


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if any(part in STDLIB_SKIP or part.startswith("test_") for part in rel):
            continue
        files.append(path)
    return files


def public_functions(text: str) -> list[tuple[str, str]]:
    """(header, whole) of each public function in a Python source that has a docstring and a body, in
    `ast.walk` order, both dedented: the header runs from the `def` line(s) through the docstring's end and
    ends in a newline, the whole adds the body. Functions whose docstring is indented less than the `def`
    are left out; a file that does not parse gives none."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    lines = text.split("\n")  # as ast numbers lines: form feeds and the like do not end one
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_")
                and ast.get_docstring(node) and len(node.body) > 1):
            head = textwrap.dedent("\n".join(lines[node.lineno - 1:node.body[0].end_lineno])) + "\n"
            whole = textwrap.dedent("\n".join(lines[node.lineno - 1:node.end_lineno])) + "\n"
            if head.startswith(("def ", "async def ")) and whole.startswith(head):
                found.append((head, whole))
    return found


def _expand(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if not path.exists():
            raise UserError(f"data path not found: {raw}")
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.suffix == ".jsonl"))
        elif path.is_file():
            files.append(path)
        else:  # a FIFO or a device such as /dev/zero would be read forever
            raise UserError(f"data path {raw} is not a regular file or a folder")
    if not files:
        raise UserError(f"no .py/.txt/.md/.jsonl files under {', '.join(paths)}")
    unreadable = next((p for p in files if not os.access(p, os.R_OK)), None)
    if unreadable is not None:
        raise UserError(f"data file {unreadable} is not readable (permission denied)")
    return files


def _jsonl(path: Path) -> Iterator[dict]:
    with path.open(encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    raise UserError(f"{path}:{lineno} is not valid JSON") from None


def gsm8k_train_rows(paths: list[str]) -> Iterator[dict]:
    """The question/answer rows of the GSM8K JSONL files under `paths`, never the test split's."""
    for path in _expand(paths):
        if path.suffix != ".jsonl" or path.name.startswith("test"):
            continue
        for row in _jsonl(path):
            if "question" not in row or "answer" not in row:
                raise UserError(f"{path}: GSM8K rows need 'question' and 'answer'")
            yield row


def documents(cfg: DataConfig) -> Iterator[str]:
    """The documents of each corpus `data.source` names, one corpus after the other (the trunk's own
    continuations, `self`, are made above this layer: `corpus.token_data`)."""
    for part in cfg.natural_parts:
        yield from _documents(cfg, part)


def _documents(cfg: DataConfig, source: str) -> Iterator[str]:
    if source == "stdlib":
        for path in stdlib_files():
            yield path.read_text(encoding="utf-8", errors="replace")
    elif source == "stdlib-functions":
        for path in stdlib_files():
            for _, whole in public_functions(path.read_text(encoding="utf-8", errors="replace")):
                yield whole
    elif source == "files":
        for path in _expand(cfg.paths):
            if path.suffix == ".jsonl":
                for row in _jsonl(path):
                    if cfg.text_field not in row:
                        raise UserError(f"{path}: a row has no {cfg.text_field!r} field (set data.text_field)")
                    yield str(row[cfg.text_field])
            else:
                yield path.read_text(encoding="utf-8", errors="replace")
    elif source == "gsm8k":
        for row in gsm8k_train_rows(cfg.paths):
            yield gsm8k_format.document(row["question"], row["answer"])
    else:
        try:
            import datasets  # datasets: seconds of start-up, only for data.source = hf
            ds = datasets.load_dataset(cfg.hf_dataset, split=cfg.hf_split)
        except Exception as exc:  # network, missing dataset, ...
            raise UserError(f"could not load Hugging Face dataset {cfg.hf_dataset!r}: {str(exc).splitlines()[0]}") from None
        for row in ds:
            yield str(row[cfg.text_field])


def corpus(cfg: DataConfig) -> list[str]:
    """All documents, capped at data.max_bytes when set."""
    docs, total = [], 0
    for doc in documents(cfg):
        if not doc.strip():
            continue
        docs.append(doc)
        total += len(doc)
        if cfg.max_bytes and total >= cfg.max_bytes:
            break
    if not docs:
        raise UserError("the corpus is empty")
    return docs


def fingerprint(docs: list[str]) -> str:
    h = hashlib.sha256()
    for doc in docs:
        h.update(hashlib.sha256(doc.encode("utf-8", errors="replace")).digest())
    return h.hexdigest()[:16]
