"""`data.source = "self"`: a corpus of the trunk's own greedy continuations, for training MTP modules.

Drafters accept more of the target's tokens when they learn the target's own outputs rather than
the corpus it was trained on: Medusa-2's self-distillation, FastMTP's self-distilled data and
SpecForge's regenerated training sets all report it. Each document is a prompt followed by the
trunk's greedy continuation of it (up to `self_new_tokens`, fewer at end of text). Prompts come from
`data.self_prompts`: windows of `self_prompt_tokens` tokens cut evenly from a corpus (stdlib, or
files in data.paths), standard-library functions cut after their docstring (HumanEval's shape, not
its items), GSM8K training questions (the train split in data.paths, never the test split) — all from
their corpus's training documents only, so that no held-out figure (loss on the validation split,
specbench's heldout prompts) is measured on text whose prompts the modules saw —, or the HumanEval
prompts (then a HumanEval specbench measures drafting on prompts the modules saw); several
joined by "+" share the samples evenly. Generation is Hugging Face `generate` on the source checkpoint itself.

The documents are cached under `<cache>/self/<key>.jsonl`, the key hashing the trunk's weights
(`weights_sha256`, also stamped in the file's meta) with every setting, so a changed trunk or
setting never reuses them; the token shards built from them are cached like any others.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from mtp_cli.base import ui
from mtp_cli.base.errors import UserError
from mtp_cli.base.files import atomic_write_text
from mtp_cli.config.recipe import DataConfig
from mtp_cli.data import gsm8k_format, shards, sources
from mtp_cli.data import tokenizer as toklib
from mtp_cli.data.prompts import load_prompts
from mtp_cli.model import pretrained

BATCH = 64
MAX_FUNCTION_PROMPT_CHARS = 1500  # about 400 tokens; HumanEval's longest prompt is ~1,300 characters


def _share(cfg: DataConfig, prompt_set: str) -> int:
    """How many of `self_samples` go to `prompt_set`: an even split, the first sets taking the remainder."""
    sets = cfg.self_prompt_sets
    quotient, remainder = divmod(cfg.self_samples, len(sets))
    return quotient + (sets.index(prompt_set) < remainder)


def _corpus_prompts(cfg: DataConfig, prompt_set: str, tokenizer) -> list[list[int]]:
    corpus_cfg = DataConfig(source=prompt_set, paths=cfg.paths, text_field=cfg.text_field, max_bytes=cfg.max_bytes)
    train_docs = shards.split_documents(sources.corpus(corpus_cfg), cfg.val_fraction)[0]
    ids = [t for e in tokenizer.backend_tokenizer.encode_batch(train_docs, add_special_tokens=False) for t in e.ids]
    n_windows = len(ids) // cfg.self_prompt_tokens
    if n_windows < 1:
        raise UserError(f"the prompt corpus has {len(ids)} tokens, fewer than data.self_prompt_tokens")
    take = min(_share(cfg, prompt_set), n_windows)
    starts = [(i * n_windows // take) * cfg.self_prompt_tokens for i in range(take)]
    return [ids[s:s + cfg.self_prompt_tokens] for s in starts]


@functools.cache
def function_prompts(val_fraction: float) -> tuple[str, ...]:
    """A HumanEval-shaped prompt for each public standard-library function with a docstring and a body:
    its `def` line(s) through the docstring's end, dedented, ending in a newline (the body is the trunk's
    to write). File by file, training files only (the stdlib corpus's split at `val_fraction`), each
    file's functions in `ast.walk` order; very long headers (over MAX_FUNCTION_PROMPT_CHARS), and those
    whose docstring is indented less than the `def`, are left out."""
    prompts = []
    for text in shards.split_documents(sources.corpus(DataConfig(source="stdlib")), val_fraction)[0]:
        prompts += [head for head, _ in sources.public_functions(text) if len(head) <= MAX_FUNCTION_PROMPT_CHARS]
    return tuple(prompts)


def _text_prompts(cfg: DataConfig, prompt_set: str) -> list[str]:
    take = _share(cfg, prompt_set)
    if prompt_set == "humaneval":
        return load_prompts("humaneval", take)
    if prompt_set == "stdlib-functions":
        every = function_prompts(cfg.val_fraction)
        if not every:
            raise UserError("no standard-library function with a docstring and a body was found for "
                            "data.self_prompts = 'stdlib-functions'")
        take = min(take, len(every))
        return [every[i * len(every) // take] for i in range(take)]
    rows = list(sources.gsm8k_train_rows(cfg.paths))  # their training documents only, as the gsm8k corpus splits them
    docs = [gsm8k_format.document(r["question"], r["answer"]) for r in rows]
    kept = set(shards.split_documents(docs, cfg.val_fraction)[0])
    questions = [gsm8k_format.prompt(r["question"]) for r, doc in zip(rows, docs) if doc in kept]
    if not questions:
        raise UserError(f"no GSM8K training questions (train*.jsonl) under {', '.join(cfg.paths)}")
    return questions[:take]


def prompt_ids(cfg: DataConfig, tokenizer) -> list[list[int]]:
    """The prompts to continue: each of `self_prompt_sets` in turn, with its share of `self_samples`."""
    ids = []
    for prompt_set in cfg.self_prompt_sets:
        if prompt_set in ("stdlib", "files"):
            got = _corpus_prompts(cfg, prompt_set, tokenizer)
        else:
            got = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in _text_prompts(cfg, prompt_set)]
        if len(got) < _share(cfg, prompt_set):
            ui.console.print(f"warning: self-distillation prompt set {prompt_set!r} holds {len(got)} prompts, "
                             f"fewer than its share of data.self_samples ({_share(cfg, prompt_set)})", markup=False)
        ids += got
    return ids


def cache_key(cfg: DataConfig, weights_sha256: str, prompts: list[list[int]]) -> str:
    h = hashlib.sha256(weights_sha256.encode())
    h.update(json.dumps([cfg.self_prompts, cfg.self_new_tokens, prompts]).encode())
    return h.hexdigest()[:16]


def continue_greedily(model, prompts: list[list[int]], new_tokens: int, pad_id: int, eos_id: int,
                      show_progress: bool = True) -> list[list[int]]:
    """Each prompt's greedy continuation (token ids, cut after the first end-of-text), left-padded batches."""
    out: list[list[int]] = []
    with ui.progress(disable=not show_progress) as bar, torch.no_grad():
        task = bar.add_task("self-distill", total=len(prompts), info=f"{new_tokens} tokens each")
        for b in range(0, len(prompts), BATCH):
            batch = prompts[b:b + BATCH]
            width = max(map(len, batch))
            ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
            gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=pad_id, eos_token_id=eos_id)[:, width:]
            for row in gen.tolist():
                out.append(row[:row.index(eos_id) + 1] if eos_id in row else row)
            bar.update(task, advance=len(batch))
    return out


@dataclass
class SelfText:
    """Where the self-distilled corpus of one checkpoint and data config lives, and what making it takes."""
    path: Path  # `<cache>/self/<key>.jsonl`
    prompts: list[list[int]]
    weights_sha256: str
    source: pretrained.Source
    tokenizer: object

    def tokens_to_run(self, new_tokens: int) -> int:
        """Tokens the trunk runs over to make it: every prompt, and at most `new_tokens` after each."""
        return sum(len(p) for p in self.prompts) + len(self.prompts) * new_tokens


def locate(cfg: DataConfig, source: str | Path, cache_root: Path) -> SelfText:
    """The cache file (made or not) and prompts of checkpoint `source`'s self-distilled corpus."""
    src = pretrained.read_source(source)
    tokenizer = toklib.load(src.path)
    prompts = prompt_ids(cfg, tokenizer)
    sha = pretrained.weights_hash(src.path)
    return SelfText(cache_root / "self" / f"{cache_key(cfg, sha, prompts)}.jsonl", prompts, sha, src, tokenizer)


def documents(cfg: DataConfig, source: str | Path, cache_root: Path, show_progress: bool = True) -> list[str]:
    """The self-distilled corpus of checkpoint `source` (built once, then read from the cache)."""
    from transformers import AutoModelForCausalLM  # transformers: seconds of start-up, only on this path
    from transformers.utils import logging as hf_logging  # transformers: seconds of start-up, only on this path

    where = locate(cfg, source, cache_root)
    path, prompts, sha, src, tokenizer = where.path, where.prompts, where.weights_sha256, where.source, where.tokenizer
    if not path.is_file():
        hf_logging.disable_progress_bar()
        model = AutoModelForCausalLM.from_pretrained(src.path, dtype=torch.float32).eval()
        continuations = continue_greedily(model, prompts, cfg.self_new_tokens, tokenizer.pad_token_id,
                                          tokenizer.eos_token_id, show_progress)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"meta": {"trunk": src.name, "weights_sha256": sha, "prompts": cfg.self_prompts,
                         "new_tokens": cfg.self_new_tokens, "samples": len(prompts)}}
        rows = [json.dumps(meta)] + [json.dumps({"text": tokenizer.decode(p + c, skip_special_tokens=True)})
                                     for p, c in zip(prompts, continuations)]
        atomic_write_text(path, "\n".join(rows) + "\n", tag=str(os.getpid()))  # ranks may write it at once
    lines = path.read_text().splitlines()
    if json.loads(lines[0])["meta"]["weights_sha256"] != sha:
        raise UserError(f"{path} was made from other weights; delete it")
    return [json.loads(line)["text"] for line in lines[1:]]
