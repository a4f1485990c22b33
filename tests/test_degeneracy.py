"""`degenerate_share` / `whitespace_share`: exact values on hand-made sequences, and the fast mask against
a brute-force reading of the definition (every window, every period) on random short sequences."""

from __future__ import annotations

import random

import pytest

from mtp_cli.decode.degeneracy import MAX_PERIOD, MIN_REPEATS, degenerate_share, loop_mask, text_stats, whitespace_share


def test_a_repeated_token_is_all_loop():
    assert degenerate_share([[7] * 40]) == 1.0
    assert degenerate_share([[7] * MIN_REPEATS]) == 1.0  # three copies of a 1-gram: a loop in full
    assert degenerate_share([[7, 7]]) == 0.0  # two copies are not yet a loop


def test_text_without_repeats_is_no_loop():
    assert degenerate_share([list(range(50)), list(range(100, 130))]) == 0.0
    assert degenerate_share([[1, 2, 1, 3, 1, 4, 2, 2, 5]]) == 0.0  # repeats, but never 3 copies in a row


def test_period_three_loop():
    assert loop_mask([1, 2, 3] * 3).tolist() == [True] * 9
    assert not loop_mask([1, 2, 3] * 2 + [1, 2]).any()  # two full copies and a partial one
    assert loop_mask([9, 8] + [1, 2, 3] * 4 + [1]).tolist() == [False, False] + [True] * 13  # trailing partial copy counts


def test_a_share_in_between_by_hand():
    # 5 distinct tokens, then (4, 6) three times (6 tokens in a loop), then 4 distinct: 6 of 15
    seq = [1, 2, 3, 4, 5, 4, 6, 4, 6, 4, 6, 10, 11, 12, 13]
    assert loop_mask(seq).tolist() == [False] * 5 + [True] * 6 + [False] * 4
    assert degenerate_share([seq]) == pytest.approx(6 / 15)
    # token-weighted over outputs: 10 looping tokens of 10 + 6 of 15
    assert degenerate_share([[0] * 10, seq]) == pytest.approx(16 / 25)
    assert degenerate_share([]) is None and degenerate_share([[]]) is None


def _brute_force(seq: list[int]) -> list[bool]:
    """The docstring's definition read literally: token i is in a loop if some window seq[a:b] holding i,
    of length >= MIN_REPEATS * n, has seq[j] == seq[j - n] for every j in a+n..b-1, for some n <= MAX_PERIOD."""
    inside = [False] * len(seq)
    for n in range(1, MAX_PERIOD + 1):
        for a in range(len(seq)):
            for b in range(a + MIN_REPEATS * n, len(seq) + 1):
                if all(seq[j] == seq[j - n] for j in range(a + n, b)):
                    for i in range(a, b):
                        inside[i] = True
    return inside


def test_mask_matches_the_definition_on_random_sequences():
    rng = random.Random(0)
    for trial in range(150):
        alphabet = rng.choice([2, 3, 5])
        seq = [rng.randrange(alphabet) for _ in range(rng.randrange(0, 30))]
        if trial % 3 == 0:  # plant a loop of a random period
            period = [rng.randrange(9) for _ in range(rng.randrange(1, 6))]
            seq = seq[:10] + period * rng.randrange(2, 5) + seq[10:]
        assert loop_mask(seq).tolist() == _brute_force(seq), seq


class _Tokenizer:
    """Decodes id i to the character TEXT[i]; id 0 is a special token (dropped)."""
    TEXT = "\x00 \na"

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.TEXT[i] for i in ids if not (skip_special_tokens and i == 0))


def test_whitespace_share_and_text_stats():
    assert whitespace_share(["  \n", "", "x", "a b"]) == 0.5
    assert whitespace_share([]) is None
    stats = text_stats([[2, 2, 2, 2], [1, 3, 0], [0], [3, 1, 3]], _Tokenizer())
    assert stats == {"degenerate_share": pytest.approx(4 / 11), "whitespace_share": 0.5, "n_outputs": 4}
