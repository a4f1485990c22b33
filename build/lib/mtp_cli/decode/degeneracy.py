"""What kind of text a decoder produced: how much of it is a repetition loop, how much is blank.

A speed benchmark is only as meaningful as the text it timed: small trunks decoding greedily often
collapse into one token (or one line) repeated, and drafting a loop is trivially easy (or, for a
module that never saw one in training, trivially hard). These statistics travel with every
`mtp specbench` row so a reader sees what was timed.

Definitions (over generated token ids; the prompt is not looked at):
- A token is *in a loop* when it lies inside a stretch of at least MIN_REPEATS · n consecutive
  tokens in which every token equals the one n positions before it, for some period
  n in 1..MAX_PERIOD; that is, some n-gram (n ≤ 16) occurs at least 3 times in a row there, and the
  whole stretch (all copies, including a trailing partial copy) counts. A single token repeated
  L ≥ 3 times is a loop in full; "a b c a b c a b c" is; "a b c a b c a b" (under three full
  copies) is not.
- `degenerate_share` of several outputs: tokens in a loop ÷ all generated tokens (token-weighted).
- `whitespace_share`: the share of outputs whose decoded text (special tokens dropped) holds no
  character other than whitespace (an empty output counts as whitespace only).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MAX_PERIOD = 16  # a short line of code is about this many tokens
MIN_REPEATS = 3


def loop_mask(ids: Sequence[int], max_period: int = MAX_PERIOD, min_repeats: int = MIN_REPEATS) -> np.ndarray:
    """Boolean mask over `ids`: True where the token lies in a repetition loop (see the module docstring)."""
    seq = np.asarray(list(ids), dtype=np.int64)
    mask = np.zeros(len(seq), dtype=bool)
    for n in range(1, min(max_period, len(seq)) + 1):
        same = np.concatenate([np.zeros(n, dtype=bool), seq[n:] == seq[:-n]])  # same[i]: seq[i] == seq[i - n]
        edges = np.flatnonzero(np.diff(np.concatenate([[0], same.astype(np.int8), [0]])))
        for start, stop in zip(edges[::2], edges[1::2]):  # maximal runs same[start:stop]
            if stop - start >= (min_repeats - 1) * n:  # the stretch start-n .. stop-1 holds >= min_repeats copies
                mask[start - n:stop] = True
    return mask


def degenerate_share(outputs: Sequence[Sequence[int]]) -> float | None:
    """Tokens in a loop ÷ all tokens, over all outputs (None when there are no tokens)."""
    total = sum(len(o) for o in outputs)
    if not total:
        return None
    return float(sum(int(loop_mask(o).sum()) for o in outputs) / total)


def whitespace_share(texts: Sequence[str]) -> float | None:
    """The share of texts that are empty or whitespace only (None when there are none)."""
    if not texts:
        return None
    return sum(not t.strip() for t in texts) / len(texts)


def text_stats(outputs: Sequence[Sequence[int]], tokenizer) -> dict:
    """{degenerate_share, whitespace_share, n_outputs} of generated token ids."""
    texts = [tokenizer.decode(list(o), skip_special_tokens=True) for o in outputs]
    return {"degenerate_share": degenerate_share(outputs), "whitespace_share": whitespace_share(texts),
            "n_outputs": len(outputs)}
