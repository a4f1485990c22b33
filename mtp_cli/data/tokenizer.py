"""Tokenizers: train a byte-level BPE with Hugging Face `tokenizers`, or load any HF tokenizer.

Either way the result is a `transformers.PreTrainedTokenizerFast`, saved with every run and with
every export, so `AutoTokenizer.from_pretrained` reads it back without our code.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from mtp_cli.base.errors import UserError

EOS = "<|endoftext|>"


def train_bpe(docs: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    return wrap(tok)


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS)
    fast.model_max_length = 1_000_000
    return fast


def load(name_or_path: str | Path) -> PreTrainedTokenizerFast:
    try:
        tok = AutoTokenizer.from_pretrained(str(name_or_path))
    except Exception as exc:
        raise UserError(f"could not load tokenizer {name_or_path!r}: {str(exc).splitlines()[0]}") from None
    if tok.eos_token is None:
        raise UserError(f"tokenizer {name_or_path!r} has no end-of-text token")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def fingerprint(tok: PreTrainedTokenizerFast) -> str:
    return hashlib.sha256(tok.backend_tokenizer.to_str().encode()).hexdigest()[:16]
