"""On-disk format v1 of a datastore: one LMDB environment directory.

Keys (all values are raw little-endian arrays unless noted):
  b"meta"             JSON (utf-8), see `META_KEYS`
  b"shard/{i}/tokens" [n_i] token_dtype: documents concatenated, each followed by `separator`
  b"shard/{i}/sa"     [n_i] sa_dtype: suffix array of the tokens (pydivsufsort)
  b"shard/{i}/docs"   [documents_i] int64: start offset of each document in the shard

`meta` fields:
  format_version  int, FORMAT_VERSION
  tokenizer       {name, fingerprint (sha256 of the vocab), vocab_size}
  token_dtype     "uint16" | "uint32"
  separator       int, == vocab_size (outside the vocabulary, so no continuation crosses documents)
  shards          [{id, tokens, documents, sa_dtype, sha256}], sha256 over tokens||sa||docs bytes
  sources         [{path, format, files, records, documents, tokens, skipped: {reason: n}}]
  build           {shard_tokens, workers, on_error, format, ...}
  created         ISO-8601 UTC time of the build (of the last append for appended stores)
  lmdb_version    "major.minor.patch" of the LMDB library that wrote it
"""
from __future__ import annotations

import hashlib

import numpy as np

FORMAT_VERSION = 1
META_KEY = b"meta"
META_KEYS = (
    "format_version", "tokenizer", "token_dtype", "separator", "shards", "sources", "build",
    "created", "lmdb_version",
)
# Large enough for the ~100M-token store plus live appends; LMDB only reserves address space.
MAP_SIZE = 1 << 40


def tokens_key(shard: int) -> bytes:
    return f"shard/{shard}/tokens".encode()


def sa_key(shard: int) -> bytes:
    return f"shard/{shard}/sa".encode()


def docs_key(shard: int) -> bytes:
    return f"shard/{shard}/docs".encode()


def token_dtype_for(vocab_size: int) -> np.dtype:
    """uint16 only when every id and the separator (== vocab_size) fit; never truncate ids."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max else np.dtype(np.uint32)


def separator_for(vocab_size: int) -> int:
    return int(vocab_size)


def sa_dtype_for(n_tokens: int) -> np.dtype:
    return np.dtype(np.int32) if n_tokens < 2**31 else np.dtype(np.int64)


def shard_checksum(*buffers: bytes | memoryview | np.ndarray) -> str:
    h = hashlib.sha256()
    for b in buffers:
        view = np.ascontiguousarray(b) if isinstance(b, np.ndarray) else b
        h.update(memoryview(view).cast("B"))
    return h.hexdigest()


class DatastoreError(Exception):
    """A datastore directory that cannot be served: missing, foreign, truncated or corrupt."""
