"""Token shards on disk and the batches drawn from them.

`prepare` turns a DataConfig into a tokenizer plus two memory-mapped token files (train, val),
cached under a key hashed from the corpus content and the tokenizer, so a second run with the
same data costs nothing. Documents are split into train/validation deterministically by a hash
of their content; each document ends with the end-of-text token.

Batches depend only on (seed, step): a resumed run draws exactly the batches an uninterrupted
run would have, and under DDP every rank takes its slice of the same global batch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedTokenizerFast

from mtp_cli.base import outputs, ui
from mtp_cli.base.errors import UserError
from mtp_cli.base.files import atomic_write_text, replacing
from mtp_cli.config.recipe import DataConfig
from mtp_cli.data import sources
from mtp_cli.data import tokenizer as toklib


def cache_root(cfg: DataConfig) -> Path:
    """The cache folder: $MTP_CACHE_DIR, else data.cache_dir; refused in one line where it cannot be a
    writable folder (a file, under /proc)."""
    flag = "MTP_CACHE_DIR" if os.environ.get("MTP_CACHE_DIR") else "data.cache_dir"
    return outputs.folder(Path(os.environ.get("MTP_CACHE_DIR") or cfg.cache_dir).expanduser(), flag)


@dataclass
class TokenData:
    tokenizer: PreTrainedTokenizerFast
    train: np.ndarray  # memmap of token ids
    val: np.ndarray
    key: str
    n_docs: int
    n_bytes_val: int  # UTF-8 bytes of the validation text (for bits-per-byte)

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)


def is_validation(doc: str, val_fraction: float) -> bool:
    """Whether a document belongs to the validation split: by a hash of its text, the same on every machine."""
    h = int.from_bytes(hashlib.sha256(doc.encode("utf-8", errors="replace")).digest()[:8], "little")
    return (h % 1_000_000) < val_fraction * 1_000_000


def split_documents(docs: list[str], val_fraction: float) -> tuple[list[str], list[str]]:
    """(training, validation) documents: by `is_validation`; a tiny corpus with none in validation holds
    out its last document."""
    train_docs = [d for d in docs if not is_validation(d, val_fraction)]
    val_docs = [d for d in docs if is_validation(d, val_fraction)]
    if not val_docs:
        train_docs, val_docs = docs[:-1] or docs, docs[-1:]
    return train_docs, val_docs


def _write_tokens(path: Path, ids: list[list[int]], eos: int, dtype: np.dtype) -> None:
    total = sum(len(x) + 1 for x in ids)
    with replacing(path) as tmp:
        arr = np.memmap(tmp, dtype=dtype, mode="w+", shape=(max(total, 1),))
        pos = 0
        for doc in ids:
            arr[pos:pos + len(doc)] = doc
            arr[pos + len(doc)] = eos
            pos += len(doc) + 1
        arr.flush()
        del arr


def _file_record(path: Path) -> dict:
    """What a cached shard must still be when it is read again: its size and SHA-256."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def _damaged_shards(shard_dir: Path, meta_path: Path) -> str | None:
    """Why the cache entry cannot be used (a shard missing, truncated or changed, or an entry written
    before shards were recorded), or None when every shard is as it was written."""
    try:
        files = json.loads(meta_path.read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return "meta.json unreadable"
    if not isinstance(files, dict) or set(files) != {"train", "val"}:
        return "no record of its files"
    for name, record in files.items():
        path = shard_dir / f"{name}.bin"
        if not path.is_file():
            return f"{path.name} missing"
        if path.stat().st_size != record.get("bytes"):
            return f"{path.name}: {path.stat().st_size} bytes, {record.get('bytes')} when written"
        if _file_record(path)["sha256"] != record.get("sha256"):
            return f"{path.name}: its contents changed"
    return None


def get_tokenizer(cfg: DataConfig, vocab_size: int, docs: list[str], corpus_key: str) -> PreTrainedTokenizerFast:
    if cfg.tokenizer != "bpe":
        return toklib.load(cfg.tokenizer)
    tok_dir = cache_root(cfg) / "tokenizers" / f"bpe-{vocab_size}-{corpus_key}"
    if (tok_dir / "tokenizer.json").is_file():
        return toklib.load(tok_dir)
    ui.console.print(f"data: training a {vocab_size:,}-token byte-level BPE on {len(docs):,} documents", markup=False)
    tok = toklib.train_bpe(docs, vocab_size)
    tmp = tok_dir.with_name(tok_dir.name + f".tmp{os.getpid()}")
    tok.save_pretrained(tmp)
    try:
        tmp.replace(tok_dir)
    except OSError:  # another process won the race; its tokenizer is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return toklib.load(tok_dir)


def prepare(cfg: DataConfig, vocab_size: int, docs: list[str] | None = None) -> TokenData:
    """`docs`: the corpus when the caller built it (data.source with "self": `corpus.token_data`); else read
    from `cfg`."""
    if docs is None and cfg.uses_self:
        raise ValueError("data.source includes the trunk's continuations: build its documents with corpus.token_data")
    docs = sources.corpus(cfg) if docs is None else docs
    corpus_key = sources.fingerprint(docs)
    tok = get_tokenizer(cfg, vocab_size, docs, corpus_key)
    key = f"{corpus_key}-{toklib.fingerprint(tok)}-{cfg.val_fraction}"
    shard_dir = cache_root(cfg) / "shards" / key
    meta_path = shard_dir / "meta.json"
    dtype = np.uint16 if len(tok) <= 65536 else np.uint32
    damaged = _damaged_shards(shard_dir, meta_path) if meta_path.is_file() else None
    if damaged:
        ui.console.print(f"data: the cached token shards in {shard_dir} do not match their record ({damaged}); "
                         "rebuilding them", markup=False)
        meta_path.unlink()
    if not meta_path.is_file():
        ui.console.print(f"data: tokenizing {len(docs):,} documents into token shards", markup=False)
        shard_dir.mkdir(parents=True, exist_ok=True)
        train_docs, val_docs = split_documents(docs, cfg.val_fraction)
        encode = tok.backend_tokenizer.encode_batch
        eos = tok.eos_token_id
        for name, split in (("train", train_docs), ("val", val_docs)):
            ids = [e.ids for e in encode(split, add_special_tokens=False)]
            _write_tokens(shard_dir / f"{name}.bin", ids, eos, dtype)
        meta = {"n_docs": len(docs), "n_train_docs": len(train_docs), "n_val_docs": len(val_docs),
                "n_bytes_val": sum(len(d.encode("utf-8", errors="replace")) for d in val_docs),
                "dtype": np.dtype(dtype).name,
                "files": {name: _file_record(shard_dir / f"{name}.bin") for name in ("train", "val")}}
        atomic_write_text(meta_path, json.dumps(meta))
    meta = json.loads(meta_path.read_text())
    load = lambda name: np.memmap(shard_dir / f"{name}.bin", dtype=meta["dtype"], mode="r")  # noqa: E731
    return TokenData(tok, load("train"), load("val"), key, meta["n_docs"], meta["n_bytes_val"])


def comparison_config(cfg):
    """The data a run is compared on (held-out loss, heldout specbench prompts): its own, except for a
    self-distilled run, whose text is its trunk's output: then the corpus its (first) prompts came from,
    as every other variant of the comparison is measured on."""
    if not cfg.uses_self:
        return cfg
    if cfg.natural_parts:  # continuations mixed into corpora: compared on those corpora's validation split
        return dataclasses.replace(cfg, source="+".join(cfg.natural_parts), self_share=0.0)
    corpora = [{"stdlib-functions": "stdlib"}.get(p, p) for p in cfg.self_prompt_sets if p != "humaneval"]
    if not corpora:
        raise UserError("this run was self-distilled from HumanEval prompts, which have no validation split "
                        "to compare on: use --text FILE for held-out loss and --prompts humaneval for specbench")
    return dataclasses.replace(cfg, source=corpora[0])


def train_batch(tokens: np.ndarray, step: int, seed: int, batch: int, context: int,
                rank: int = 0, world: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of the global batch for `step`: `batch` windows of context+1 tokens."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    n_windows = len(tokens) - context - 1
    if n_windows < 1:
        raise ValueError(f"training split has {len(tokens)} tokens, fewer than context + 1 = {context + 1}")
    starts = torch.randint(0, n_windows, (batch,), generator=g)
    per_rank = batch // world
    starts = starts[rank * per_rank:(rank + 1) * per_rank]
    chunk = torch.from_numpy(np.stack([tokens[s:s + context + 1].astype(np.int64) for s in starts.tolist()]))
    return chunk[:, :-1], chunk[:, 1:]


def val_batches(tokens: np.ndarray, n_batches: int, batch: int, context: int):
    """Fixed, non-overlapping validation windows, in order (identical for every run on the data)."""
    n_chunks = min(n_batches * batch, (len(tokens) - 1) // context)
    for b in range(0, n_chunks, batch):
        starts = [i * context for i in range(b, min(b + batch, n_chunks))]
        chunk = torch.from_numpy(np.stack([tokens[s:s + context + 1].astype(np.int64) for s in starts]))
        yield chunk[:, :-1], chunk[:, 1:]
