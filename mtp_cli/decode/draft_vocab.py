"""The drafters' vocabulary: the tokens most frequent in the run's training data.

A draft is only a proposal; the trunk verifies it over the full vocabulary, so drafting from a
subset changes how often drafts are accepted, never what is generated (greedy: the same tokens;
sampling: speculative sampling's rule holds for any draft distribution, here one that is zero off
the subset). What it buys is the drafter's unembedding: at a 4,096-token vocabulary and d = 256 the
full one is as many bytes as the draft module's block, fusing projection and norms together. Picking
the subset by training-data frequency is FR-Spec's rule (Zhao et al., 2025); EAGLE-3 drafts from
32k of Llama 3's 128k tokens. The default here is a quarter of the vocabulary, the same share.

The counts are taken once at training (from up to `COUNT_TOKENS` training tokens) and stored in
the checkpoint; runs trained before that are counted from their data when it is at hand.
"""

from __future__ import annotations

import numpy as np
import torch

from mtp_cli.base.errors import UserError
from mtp_cli.corpus import token_data as corpus

COUNT_TOKENS = 50_000_000  # a frequency ranking needs a sample, not a pass over a GPU-scale corpus
DEFAULT_SHARE = 4  # default draft vocabulary: vocab_size // DEFAULT_SHARE


def count_tokens(train_tokens: np.ndarray, vocab_size: int) -> torch.Tensor:
    """Occurrences of each token id in (a prefix of) the training tokens."""
    sample = np.asarray(train_tokens[:COUNT_TOKENS], dtype=np.int64)
    return torch.from_numpy(np.bincount(sample, minlength=vocab_size)[:vocab_size].astype(np.int64))


def default_size(vocab_size: int) -> int:
    return max(1, vocab_size // DEFAULT_SHARE)


def run_counts(run) -> torch.Tensor:
    """The run's training-token counts: stored in its checkpoint, else counted from its data."""
    if run.token_counts is not None:
        return run.token_counts

    return count_tokens(corpus.prepare_for(run.recipe).train, run.recipe.model.vocab_size)


def top_tokens(counts: torch.Tensor, size: int) -> torch.Tensor | None:
    """The `size` most frequent token ids (ties: lower id first), ascending; None for the whole vocabulary."""
    if size <= 0 or size >= len(counts):
        return None
    order = sorted(range(len(counts)), key=lambda i: (-int(counts[i]), i))
    return torch.tensor(sorted(order[:size]), dtype=torch.long)


def draft_vocabulary(run, size: int | None) -> tuple[torch.Tensor | None, dict]:
    """A run's draft vocabulary for `--draft-vocab size` (None: the one its modules were trained over,
    mtp.draft_vocab, else the default; 0: all) and what a report says of it: (ids or None for the whole
    vocabulary, {size, vocab_size, training_share})."""
    V = run.recipe.model.vocab_size
    if size is None:
        size = run.recipe.mtp.draft_vocab or default_size(V)
    if size < 0:
        raise UserError(f"--draft-vocab must be >= 0 (0: the whole vocabulary), got {size}")
    if size > V:
        raise UserError(f"--draft-vocab {size} is above the run's vocabulary of {V} tokens (0: all of them)")
    if size == 0 or size == V:
        return None, {"size": V, "vocab_size": V, "training_share": 1.0}
    counts = run_counts(run)
    ids = top_tokens(counts, size)
    return ids, {"size": size, "vocab_size": V, "training_share": coverage(counts, ids)}


def coverage(counts: torch.Tensor, ids: torch.Tensor | None) -> float:
    """The share of training tokens whose id is in the draft vocabulary."""
    total = int(counts.sum())
    return 1.0 if ids is None or total == 0 else int(counts[ids].sum()) / total
