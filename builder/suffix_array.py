"""Suffix array of a token array with pydivsufsort, in less memory than `divsufsort(typed_array)`.

pydivsufsort sorts integer arrays as big-endian byte strings and keeps the suffixes that start on a
token boundary; its own filter (`out[out % itemsize == 0]`) allocates two more arrays as large as the
byte-level SA. Here the same byte-level sort is compacted in place, chunk by chunk, so a shard of n
uint16 tokens peaks at ~12n bytes (tokens 2n + big-endian copy 2n + byte SA 8n) instead of ~20n.
Comparing big-endian bytes from an even offset orders suffixes exactly as comparing token values, and a
shorter suffix sorts first in both, so the result equals `divsufsort(tokens)` (tests check this).
"""
from __future__ import annotations

import numpy as np
import pydivsufsort

from datastore.format import sa_dtype_for

_CHUNK = 1 << 22  # entries per compaction step: bounds the temporaries to ~20 MB


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """tokens: [n] uint16|uint32 -> [n] sa_dtype_for(n): suffix start offsets in sorted order."""
    assert tokens.ndim == 1 and tokens.dtype in (np.uint16, np.uint32), (tokens.shape, tokens.dtype)
    n = len(tokens)
    out_dtype = sa_dtype_for(n)
    if n == 0:
        return np.empty(0, out_dtype)
    width = _byte_width(tokens)
    if width == 1:
        return _as_dtype(pydivsufsort.divsufsort(tokens.astype(np.uint8)), out_dtype)
    big_endian = tokens.astype(f">u{width}")  # [n] big-endian copy, ordered like the tokens
    byte_sa = pydivsufsort.divsufsort(big_endian.view(np.uint8))  # [n * width] int32|int64
    del big_endian
    kept = _compact_in_place(byte_sa, width)
    assert kept == n, (kept, n)
    return _as_dtype(byte_sa[:n], out_dtype)


def _byte_width(tokens: np.ndarray) -> int:
    """Bytes per token needed for the largest id (1, 2 or 4): a smaller sort when ids are small."""
    top = int(tokens.max())
    return 1 if top < 1 << 8 else 2 if top < 1 << 16 else 4


def _compact_in_place(byte_sa: np.ndarray, width: int) -> int:
    """Keep the offsets divisible by width, divided by it, at the front of byte_sa; -> how many."""
    shift = width.bit_length() - 1
    write = 0
    for start in range(0, len(byte_sa), _CHUNK):
        chunk = byte_sa[start:start + _CHUNK]
        keep = chunk[(chunk & (width - 1)) == 0] >> shift  # a copy, so overlapping writes are safe
        byte_sa[write:write + len(keep)] = keep
        write += len(keep)
    return write


def _as_dtype(sa: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return sa if sa.dtype == dtype else sa.astype(dtype)
