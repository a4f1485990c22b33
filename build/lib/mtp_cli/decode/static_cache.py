"""The decode engine's KV cache: preallocated K/V buffers of a fixed capacity, one length per row.

Nothing grows while decoding: keys and values are written in place at explicit positions, a query
at position p attends to the keys at positions <= p (a mask hides the rest), so slots beyond a
row's length are stale but harmless. Rolling back rejected drafts is setting a row's length; rows
of a batch may hold different lengths (ragged prompts, ragged acceptance). Storage is
(B, H_kv, S, D) so attention reads each head's keys contiguously.
"""

from __future__ import annotations

import torch


class CacheFull(RuntimeError):
    """A write past the cache's fixed capacity."""


def check_capacity(last_position: int, capacity: int) -> None:
    if last_position >= capacity:
        raise CacheFull(f"KV cache full: need position {last_position}, capacity {capacity} "
                        f"(prompt plus new tokens must fit the cache)")


class StaticKVCache:
    def __init__(self, n_layers: int, batch: int, capacity: int, kv_heads: int, head_dim: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        shape = (batch, kv_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.capacity = capacity

    @property
    def batch(self) -> int:
        return self.lengths.shape[0]

    def check(self, last_position: int) -> None:
        check_capacity(last_position, self.capacity)

    def positions(self, n_new: int) -> torch.Tensor:
        """(B, n_new) absolute positions of the next n_new tokens of every row."""
        return self.lengths[:, None] + torch.arange(n_new, device=self.lengths.device)[None, :]

    def advance(self, n_new: int | torch.Tensor) -> None:
        self.lengths = self.lengths + n_new

    def rollback(self, lengths: torch.Tensor) -> None:
        self.lengths = lengths.clone()

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the given batch rows (e.g. drop finished sequences)."""
        self.k = [k[rows] for k in self.k]
        self.v = [v[rows] for v in self.v]
        self.lengths = self.lengths[rows]
