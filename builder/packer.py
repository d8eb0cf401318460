"""Stream documents into fixed-capacity shard buffers: the shard size bounds build memory.

Each document is followed by the separator. A document that does not fit in what is left of the
current shard starts the next one (so no document is cut while it could fit whole); a document longer
than a whole shard is cut into shard-sized pieces, each indexed as a document of its own (an n-gram
spanning a cut is lost, nothing else).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from builder.errors import BuildError


@dataclass(frozen=True)
class Shard:
    tokens: np.ndarray  # [n] token dtype, every document followed by the separator
    docs: np.ndarray  # [documents] int64 start offsets


def validate_doc(doc, index: int, vocab_size: int) -> np.ndarray:
    """-> doc as a 1-D integer array; BuildError naming the document for anything else."""
    arr = np.asarray(doc)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise BuildError(f"document {index}: expected a 1-D integer array of token ids, "
                         f"got shape {arr.shape} dtype {arr.dtype}")
    if arr.size:
        low, high = int(arr.min()), int(arr.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise BuildError(f"document {index}: token id {bad} is outside the vocabulary "
                             f"[0, {vocab_size})")
    return arr


class _Buffer:
    """One preallocated shard: tokens [capacity] and growing doc offsets."""

    def __init__(self, capacity: int, dtype: np.dtype, separator: int):
        self.tokens = np.empty(capacity, dtype)  # [shard_tokens] token dtype
        self.offsets = np.empty(1024, np.int64)  # [grows] int64
        self.separator = separator
        self.n = 0
        self.docs = 0

    def room(self) -> int:
        return len(self.tokens) - self.n

    def add(self, piece: np.ndarray) -> None:
        assert len(piece) + 1 <= self.room()
        if self.docs == len(self.offsets):
            self.offsets = np.resize(self.offsets, 2 * len(self.offsets))
        self.offsets[self.docs] = self.n
        self.tokens[self.n:self.n + len(piece)] = piece
        self.tokens[self.n + len(piece)] = self.separator
        self.n += len(piece) + 1
        self.docs += 1

    def take(self) -> Shard:
        """Hand the filled buffer over and start a fresh one (np.empty pages cost nothing until written)."""
        shard = Shard(self.tokens[:self.n], self.offsets[:self.docs].copy())
        self.tokens = np.empty_like(self.tokens)
        self.n = self.docs = 0
        return shard


def pack_shards(docs: Iterable, shard_tokens: int, dtype: np.dtype, vocab_size: int,
                separator: int) -> Iterator[Shard]:
    """Yield full shards of at most shard_tokens tokens (separators included); empty docs skipped."""
    if shard_tokens < 2:
        raise BuildError(f"shard_tokens must be at least 2 (a token and its separator), got {shard_tokens}")
    buf = _Buffer(shard_tokens, dtype, separator)
    for index, doc in enumerate(docs):
        arr = validate_doc(doc, index, vocab_size)
        for piece in _pieces(arr, shard_tokens - 1):
            if len(piece) + 1 > buf.room():
                yield buf.take()
            buf.add(piece)
    if buf.n:
        yield buf.take()


def _pieces(arr: np.ndarray, longest: int) -> Iterator[np.ndarray]:
    for start in range(0, len(arr), longest):
        yield arr[start:start + longest]
