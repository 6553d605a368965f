"""64-bit rolling fingerprints of token histories.

`H(t_0 .. t_{k-1}) = sum_i (t_i + 1) * P^i  (mod 2^64)`. Appending a token costs one multiply-add, so
the drafter keeps a row's hash up to date step by step; the engine recomputes the same values for a
whole request at once with `prefix_hashes` and attributes a draft record to its request by
`(position, prefix_hash)`: `prefix_hashes(ids)[position - 1] == record.prefix_hash`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PRIME = 0x100000001B3  # FNV-64 prime: odd, so every power is invertible mod 2^64
_MASK = (1 << 64) - 1


def prefix_hashes(token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """uint64 array h with h[i] = H(token_ids[: i + 1])."""
    ids = np.asarray(token_ids, dtype=np.uint64)
    if ids.size == 0:
        return np.zeros(0, dtype=np.uint64)
    powers = np.empty(ids.size, dtype=np.uint64)
    powers[0] = 1
    if ids.size > 1:
        powers[1:] = np.uint64(PRIME)
        with np.errstate(over="ignore"):
            powers = np.cumprod(powers, dtype=np.uint64)  # wraps mod 2^64
    with np.errstate(over="ignore"):
        return np.cumsum((ids + np.uint64(1)) * powers, dtype=np.uint64)


def prefix_hash(token_ids: Sequence[int] | np.ndarray, n: int | None = None) -> int:
    """H(token_ids[:n]) (0 for the empty history)."""
    ids = np.asarray(token_ids)[: len(token_ids) if n is None else n]
    return int(prefix_hashes(ids)[-1]) if len(ids) else 0


class RollingHash:
    """H of a growing history, extended token by token."""

    __slots__ = ("value", "length", "_power")

    def __init__(self) -> None:
        self.value = 0
        self.length = 0
        self._power = 1

    @classmethod
    def of(cls, token_ids: Sequence[int] | np.ndarray) -> RollingHash:
        """The hash of a whole history at once (vectorised)."""
        h = cls()
        if len(token_ids):
            h.value = int(prefix_hashes(token_ids)[-1])
            h.length = len(token_ids)
            h._power = pow(PRIME, h.length, 1 << 64)
        return h

    @classmethod
    def at(cls, value: int, length: int) -> RollingHash:
        """The hash of a history of `length` tokens whose H is `value` (from `prefix_hashes`)."""
        h = cls()
        h.value, h.length, h._power = value, length, pow(PRIME, length, 1 << 64)
        return h

    def extend(self, token_ids: Sequence[int] | np.ndarray) -> int:
        value, power = self.value, self._power
        for t in token_ids:
            value = (value + (int(t) + 1) * power) & _MASK
            power = (power * PRIME) & _MASK
        self.value, self._power = value, power
        self.length += len(token_ids)
        return value
