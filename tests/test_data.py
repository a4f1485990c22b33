"""Guards the data path: corpus sources (stdlib without tests/site-packages, local files and .jsonl with a
text field, GSM8K train only), the deterministic by-document train/validation split, the token-shard
cache (reused, keyed by content, uint16), and batches that depend only on (seed, step) with DDP rank
slices that concatenate to the one-process batch.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

from mtp_cli.base.errors import UserError
from mtp_cli.config.recipe import DataConfig
from mtp_cli.data import shards, sources
from mtp_cli.data import tokenizer as toklib

pytestmark = pytest.mark.usefixtures("single_thread")

GSM8K = Path(__file__).resolve().parent / "data" / "gsm8k"  # a bundled slice of GSM8K


# ---- sources -------------------------------------------------------------------------------------

def test_stdlib_source_leaves_out_tests_and_site_packages():
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sources.stdlib_files()
    assert len(files) > 300
    assert {"textwrap.py", "string.py"} <= {f.name for f in files}
    assert any((root / d).is_dir() for d in ("test", "site-packages")), "nothing to leave out on this Python"
    for f in files:
        rel = f.relative_to(root).parts
        assert not {"test", "tests", "site-packages", "dist-packages", "__pycache__", "idlelib"} & set(rel), f
        assert not f.name.startswith("test_"), f


def test_stdlib_corpus_respects_max_bytes():
    docs = sources.corpus(DataConfig(source="stdlib", max_bytes=200_000))
    total = sum(len(d) for d in docs)
    assert 200_000 <= total < 200_000 + max(len(d) for d in docs) + 1
    assert all(d.strip() for d in docs)


def test_files_source_reads_folders_and_jsonl_text_field(tmp_path):
    (tmp_path / "a.py").write_text("def a():\n    return 1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("plain text\n")
    (tmp_path / "skip.bin").write_bytes(b"\x00\x01")
    rows = [{"text": "first row", "id": 1}, {"text": "second row", "id": 2}]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    docs = sources.corpus(DataConfig(source="files", paths=[str(tmp_path)]))
    assert sorted(docs) == sorted(["def a():\n    return 1\n", "plain text\n", "first row", "second row"])


def test_jsonl_other_text_field_and_bad_rows(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"content": "x = 1"}) + "\n")
    assert sources.corpus(DataConfig(source="files", paths=[str(path)], text_field="content")) == ["x = 1"]
    with pytest.raises(UserError, match="no 'text' field"):
        sources.corpus(DataConfig(source="files", paths=[str(path)]))
    path.write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(UserError, match=r"d\.jsonl:2"):
        sources.corpus(DataConfig(source="files", paths=[str(path)]))


def test_missing_data_path_is_a_user_error(tmp_path):
    cfg = DataConfig(source="files", paths=[str(tmp_path / "nope")])
    with pytest.raises(UserError, match="data path not found"):
        cfg.validate()
    with pytest.raises(UserError, match="data path not found"):
        sources.corpus(cfg)


@pytest.mark.skipif(not GSM8K.is_dir(), reason="needs tests/data/gsm8k")
def test_gsm8k_source_trains_on_train_split_only():
    docs = sources.corpus(DataConfig(source="gsm8k", paths=[str(GSM8K)]))
    train_rows = [json.loads(line) for line in (GSM8K / "train.jsonl").read_text().splitlines() if line.strip()]
    assert docs == [f"Question: {r['question']}\nAnswer: {r['answer']}" for r in train_rows]  # lm-eval's format
    assert docs[0].startswith("Question: ") and "\nAnswer: " in docs[0]
    test_questions = {json.loads(line)["question"] for line in (GSM8K / "test.jsonl").read_text().splitlines()
                      if line.strip()}
    joined = "\n".join(docs)
    assert not any(q in joined for q in list(test_questions)[:200])
    # naming the test split explicitly still never trains on it
    with pytest.raises(UserError):
        sources.corpus(DataConfig(source="gsm8k", paths=[str(GSM8K / "test.jsonl")]))


def test_stdlib_functions_source_gives_whole_public_functions_with_docstrings():
    text = ('def public(x):\n    """Doc."""\n    return x\n\n\ndef _private(x):\n    """Doc."""\n    return x\n\n\n'
            'def bare(x):\n    return x\n\n\nclass C:\n    def method(self):\n        """Doc."""\n        return 1\n\n\n'
            'def only_doc():\n    """Doc."""\n')
    found = sources.public_functions(text)
    assert [whole for _, whole in found] == ['def public(x):\n    """Doc."""\n    return x\n',
                                             'def method(self):\n    """Doc."""\n    return 1\n']
    assert [head for head, _ in found] == ['def public(x):\n    """Doc."""\n', 'def method(self):\n    """Doc."""\n']
    assert sources.public_functions("def broken(:\n") == []
    docs = sources.corpus(DataConfig(source="stdlib-functions", max_bytes=200_000))
    assert len(docs) > 50 and all(d.startswith(("def ", "async def ")) for d in docs)


def test_sources_joined_by_plus_give_each_corpus_in_turn():
    functions = sources.corpus(DataConfig(source="stdlib-functions"))
    gsm8k = sources.corpus(DataConfig(source="gsm8k", paths=[str(GSM8K)]))
    assert sources.corpus(DataConfig(source="stdlib-functions+gsm8k", paths=[str(GSM8K)])) == functions + gsm8k
    for bad in ("stdlib+stdlib", "self+stdlib+self", "stdlib+nope"):  # "stdlib+self" mixes (corpus.token_data)
        with pytest.raises(UserError, match="data.source"):
            DataConfig(source=bad).validate()
    with pytest.raises(UserError, match="needs data.paths"):
        DataConfig(source="stdlib-functions+gsm8k").validate()


# ---- shards: split, cache, dtype -----------------------------------------------------------------

def make_corpus(folder: Path, n: int = 40) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    docs = []
    for i in range(n):
        text = f"def f{i}(x):\n    return x * {i} + {i * i}  # document {i}\n"
        (folder / f"doc{i:03d}.py").write_text(text)
        docs.append(text)
    return docs


def split_documents(data: shards.TokenData, name: str) -> list[str]:
    ids = np.asarray(getattr(data, name)).tolist()
    eos = data.tokenizer.eos_token_id
    docs, cur = [], []
    for t in ids:
        if t == eos:
            docs.append(data.tokenizer.decode(cur))
            cur = []
        else:
            cur.append(t)
    assert cur == [], "every document ends with the end-of-text token"
    return docs


def test_split_is_by_whole_document_and_deterministic(tmp_path, monkeypatch):
    docs = make_corpus(tmp_path / "corpus")
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache1"))
    cfg = DataConfig(source="files", paths=[str(tmp_path / "corpus")], val_fraction=0.25)
    data = shards.prepare(cfg, 300)
    train_docs, val_docs = split_documents(data, "train"), split_documents(data, "val")
    assert sorted(train_docs + val_docs) == sorted(docs)  # every document whole, in exactly one split
    assert 0 < len(val_docs) < len(docs) // 2
    assert data.n_docs == len(docs)
    assert data.n_bytes_val == sum(len(d.encode()) for d in val_docs)
    # the split depends on the document, not on the order or on a cache: a fresh cache, files listed
    # in reverse, gives the same validation documents
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache2"))
    paths = sorted((tmp_path / "corpus").iterdir(), reverse=True)
    again = shards.prepare(DataConfig(source="files", paths=[str(p) for p in paths], val_fraction=0.25), 300)
    assert sorted(split_documents(again, "val")) == sorted(val_docs)


def test_shard_cache_is_reused_and_keyed_by_content(tmp_path, monkeypatch):
    make_corpus(tmp_path / "corpus", 12)
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    cfg = DataConfig(source="files", paths=[str(tmp_path / "corpus")])
    first = shards.prepare(cfg, 300)

    def no_work(*a, **k):
        raise AssertionError("a second prepare of the same data must not tokenize again")

    with monkeypatch.context() as m:
        m.setattr(shards, "_write_tokens", no_work)
        m.setattr(toklib, "train_bpe", no_work)
        second = shards.prepare(cfg, 300)
    assert second.key == first.key
    assert np.array_equal(second.train, first.train) and np.array_equal(second.val, first.val)
    # changed content -> a new key and fresh shards
    (tmp_path / "corpus" / "doc000.py").write_text("print('changed')\n")
    third = shards.prepare(cfg, 300)
    assert third.key != first.key


def test_tokens_stored_as_uint16(tmp_path, monkeypatch):
    make_corpus(tmp_path / "corpus", 12)
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    data = shards.prepare(DataConfig(source="files", paths=[str(tmp_path / "corpus")]), 300)
    assert data.train.dtype == np.uint16 and data.val.dtype == np.uint16
    shard_files = list((tmp_path / "cache" / "shards" / data.key).glob("*.bin"))
    assert sorted(f.name for f in shard_files) == ["train.bin", "val.bin"]
    assert (tmp_path / "cache" / "shards" / data.key / "train.bin").stat().st_size == 2 * len(data.train)
    assert int(np.asarray(data.train).max()) < len(data.tokenizer) <= 300


# ---- batches -------------------------------------------------------------------------------------

TOKENS = np.arange(5000, dtype=np.uint16) % 300


def test_batches_depend_only_on_seed_and_step():
    a = shards.train_batch(TOKENS, step=7, seed=3, batch=8, context=16)
    shards.train_batch(TOKENS, step=2, seed=3, batch=8, context=16)  # other calls in between change nothing
    b = shards.train_batch(TOKENS, step=7, seed=3, batch=8, context=16)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], shards.train_batch(TOKENS, step=8, seed=3, batch=8, context=16)[0])
    assert not torch.equal(a[0], shards.train_batch(TOKENS, step=7, seed=4, batch=8, context=16)[0])
    torch.manual_seed(123)  # the global RNG plays no part
    c = shards.train_batch(TOKENS, step=7, seed=3, batch=8, context=16)
    assert torch.equal(a[0], c[0])


def test_batch_targets_are_inputs_shifted_by_one():
    x, y = shards.train_batch(TOKENS, step=0, seed=0, batch=4, context=16)
    assert x.shape == y.shape == (4, 16) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal((x + 1) % 300, y)  # TOKENS is a running count: each target is the next token


@pytest.mark.parametrize("world", [2, 4])
def test_rank_slices_concatenate_to_the_global_batch(world):
    full_x, full_y = shards.train_batch(TOKENS, step=5, seed=1, batch=8, context=16)
    parts = [shards.train_batch(TOKENS, step=5, seed=1, batch=8, context=16, rank=r, world=world) for r in range(world)]
    assert all(p[0].shape == (8 // world, 16) for p in parts)
    assert torch.equal(torch.cat([p[0] for p in parts]), full_x)
    assert torch.equal(torch.cat([p[1] for p in parts]), full_y)


def test_validation_batches_are_fixed_consecutive_windows():
    batches = list(shards.val_batches(TOKENS, n_batches=2, batch=3, context=16))
    assert len(batches) == 2
    x = torch.cat([b[0] for b in batches])
    assert x[:, 0].tolist() == [(16 * i) % 300 for i in range(6)]
    assert batches[0][0].tolist() == list(shards.val_batches(TOKENS, 2, 3, 16))[0][0].tolist()
