"""`Datastore`: a read-only, verified, zero-copy view of a format-v1 datastore directory.

Opening checks, before any array is used: the directory holds an LMDB `data.mdb` at least as long as
the pages LMDB says are in use (reading past the end of a truncated file is a SIGBUS, not an error),
`meta` is present, parseable and of a known format_version, every shard's arrays have the sizes meta
gives, and (default) their sha256 matches meta. The checksum pass reads every page of the file, so it
runs in a child process first: a file damaged in a way LMDB cannot detect kills that child with a
signal, which becomes a DatastoreError here instead of killing the server.

Arrays are `numpy.frombuffer` views of LMDB pages inside one long-lived read transaction; they are
valid until `close()`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import lmdb
import numpy as np

from datastore.format import (
    FORMAT_VERSION, META_KEY, DatastoreError, docs_key, sa_key, separator_for, shard_checksum,
    token_dtype_for, tokens_key,
)
from datastore.index import SuffixIndex, count_in, draft_batch, draft_from
from datastore.tree import DraftTree

DATA_FILE = "data.mdb"
_VERIFY_EXIT = 3  # the child's exit code for a DatastoreError (its message on stderr)
_REQUIRED_META = ("format_version", "tokenizer", "token_dtype", "separator", "shards")


def _fail(path: Path, what: str) -> DatastoreError:
    return DatastoreError(f"{path}: {what}")


def _check_directory(path: Path) -> Path:
    """-> path / data.mdb, or DatastoreError for a missing, non-directory or foreign path."""
    if not path.exists():
        raise _fail(path, "no such datastore directory")
    if not path.is_dir():
        raise _fail(path, "not a directory (a datastore is an LMDB directory)")
    data = path / DATA_FILE
    if not data.is_file():
        raise _fail(path, f"not a datastore: no {DATA_FILE}")
    return data


def _open_env(path: Path, data: Path, readahead: bool) -> lmdb.Environment:
    """Open read-only without locks; refuse a data.mdb shorter than the pages LMDB will map."""
    if os.path.getsize(data) == 0:
        raise _fail(data, "empty file (truncated)")
    try:
        env = lmdb.open(str(path), readonly=True, lock=False, subdir=True, readahead=readahead,
                        max_dbs=0)
    except lmdb.Error as exc:
        raise _fail(path, f"not a readable LMDB environment ({type(exc).__name__}: {exc})") from exc
    need = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    have = os.path.getsize(data)
    if have < need:
        env.close()
        raise _fail(data, f"truncated: {have} bytes, but its LMDB pages need {need}")
    return env


def _parse_meta(path: Path, raw) -> dict:
    if raw is None:
        raise _fail(path, "not a draftstore datastore: no 'meta' key")
    try:
        meta = json.loads(bytes(raw))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(path, f"meta is not valid JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise _fail(path, f"meta is a JSON {type(meta).__name__}, expected an object")
    missing = [k for k in _REQUIRED_META if k not in meta]
    if missing:
        raise _fail(path, f"meta lacks {', '.join(missing)}")
    if meta["format_version"] != FORMAT_VERSION:
        raise _fail(path, f"meta.format_version {meta['format_version']!r} is not supported "
                          f"(this reader knows {FORMAT_VERSION})")
    _check_tokenizer_meta(path, meta)
    if not isinstance(meta["shards"], list):
        raise _fail(path, "meta.shards must be a list")
    for i, shard in enumerate(meta["shards"]):
        _check_shard_meta(path, i, shard)
    ids = [s["id"] for s in meta["shards"]]
    if len(set(ids)) != len(ids):
        raise _fail(path, f"meta.shards has duplicate ids {ids}")
    return meta


def _check_tokenizer_meta(path: Path, meta: dict) -> None:
    tok = meta["tokenizer"]
    if not isinstance(tok, dict) or not all(k in tok for k in ("name", "fingerprint", "vocab_size")):
        raise _fail(path, "meta.tokenizer must be {name, fingerprint, vocab_size}")
    vocab = tok["vocab_size"]
    if not isinstance(vocab, int) or vocab <= 0:
        raise _fail(path, f"meta.tokenizer.vocab_size must be a positive int, got {vocab!r}")
    if meta["token_dtype"] != token_dtype_for(vocab).name:
        raise _fail(path, f"meta.token_dtype {meta['token_dtype']!r} does not hold vocab_size "
                          f"{vocab} (expected {token_dtype_for(vocab).name})")
    if meta["separator"] != separator_for(vocab):
        raise _fail(path, f"meta.separator {meta['separator']!r}, expected {separator_for(vocab)}")


def _check_shard_meta(path: Path, i: int, shard) -> None:
    where = f"meta.shards[{i}]"
    if not isinstance(shard, dict):
        raise _fail(path, f"{where} must be an object")
    for key in ("id", "tokens", "documents"):
        if not isinstance(shard.get(key), int) or shard[key] < 0:
            raise _fail(path, f"{where}.{key} must be a non-negative int, got {shard.get(key)!r}")
    if shard.get("sa_dtype") not in ("int32", "int64"):
        raise _fail(path, f"{where}.sa_dtype must be int32 or int64, got {shard.get('sa_dtype')!r}")
    if shard["sa_dtype"] == "int32" and shard["tokens"] >= 2**31:
        raise _fail(path, f"{where}: {shard['tokens']} tokens cannot be addressed by int32")
    if not isinstance(shard.get("sha256"), str):
        raise _fail(path, f"{where}.sha256 must be a hex string")


def _shard_buffers(path: Path, txn: lmdb.Transaction, meta: dict, shard: dict) -> tuple:
    """(tokens, sa, docs) LMDB buffers with the byte sizes meta implies; DatastoreError otherwise.
    Only lengths are read here, so a damaged value cannot fault before it is checked."""
    i, n = shard["id"], shard["tokens"]
    expected = ((tokens_key(i), n * np.dtype(meta["token_dtype"]).itemsize),
                (sa_key(i), n * np.dtype(shard["sa_dtype"]).itemsize),
                (docs_key(i), shard["documents"] * 8))
    out = []
    for key, size in expected:
        value = txn.get(key)
        if value is None:
            raise _fail(path, f"shard {i}: key {key.decode()!r} is missing")
        if len(value) != size:
            raise _fail(path, f"shard {i}: {key.decode()} has {len(value)} bytes, meta says {size}")
        out.append(value)
    return tuple(out)


def check_store(path: str | Path, checksums: bool = True) -> dict:
    """Every check of `Datastore.open`, in this process; -> meta. Used by the verifying child."""
    path = Path(path)
    env = _open_env(path, _check_directory(path), readahead=True)
    try:
        with env.begin(buffers=True) as txn:
            meta = _parse_meta(path, txn.get(META_KEY))
            for shard in meta["shards"]:
                bufs = _shard_buffers(path, txn, meta, shard)
                if checksums and shard_checksum(*bufs) != shard["sha256"]:
                    raise _fail(path, f"shard {shard['id']}: sha256 mismatch (corrupt data)")
        return meta
    finally:
        env.close()


def verify_in_child(path: Path, timeout: float | None = None) -> None:
    """check_store(path) in a child process, so that a SIGBUS/SIGSEGV cannot reach this one."""
    cmd = [sys.executable, "-m", "datastore.store", "--verify", str(path)]
    env = dict(os.environ)
    root, extra = str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join([root, extra]) if extra else root
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode == 0:
        return
    if proc.returncode == _VERIFY_EXIT:
        raise DatastoreError(proc.stderr.strip() or f"{path}: verification failed")
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        raise _fail(path, f"reading {DATA_FILE} killed the verifier with {name}: "
                          "the file is truncated or corrupt")
    tail = proc.stderr.strip().splitlines()[-1:] or ["no message"]
    raise _fail(path, f"the verifier failed (exit {proc.returncode}): {tail[0]}")


class Datastore:
    """A verified datastore, read-only. Use `Datastore.open(path)`; close() or `with`."""

    def __init__(self, path: Path, env: lmdb.Environment, txn: lmdb.Transaction, meta: dict,
                 indexes: list[SuffixIndex], docs: list[np.ndarray], used_bytes: int) -> None:
        self.path = path
        self._env, self._txn = env, txn
        self._meta = meta
        self._indexes = indexes
        self._docs = docs
        self.used_bytes = used_bytes  # bytes of data.mdb in use (pages up to last_pgno)

    @classmethod
    def open(cls, path: str | Path, verify: bool = True) -> "Datastore":
        """verify=False skips the checksum pass (sizes and meta are always checked)."""
        path = Path(path)
        data = _check_directory(path)
        if verify:
            verify_in_child(path)
        env = _open_env(path, data, readahead=False)  # serving reads are random
        try:
            txn = env.begin(buffers=True)
            meta = _parse_meta(path, txn.get(META_KEY))
            indexes, docs = _load_shards(path, txn, meta)
            used = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        except BaseException:
            env.close()
            raise
        return cls(path, env, txn, meta, indexes, docs, used)

    # ------------------------------------------------------------------ properties
    @property
    def meta(self) -> dict:
        return self._meta

    @property
    def tokenizer(self) -> dict:
        return dict(self._meta["tokenizer"])

    @property
    def vocab_size(self) -> int:
        return int(self._meta["tokenizer"]["vocab_size"])

    @property
    def separator(self) -> int:
        return int(self._meta["separator"])

    @property
    def token_dtype(self) -> np.dtype:
        return np.dtype(self._meta["token_dtype"])

    @property
    def tokens(self) -> int:
        """Tokens stored, separators included."""
        return sum(int(s["tokens"]) for s in self._meta["shards"])

    @property
    def documents(self) -> int:
        return sum(int(s["documents"]) for s in self._meta["shards"])

    @property
    def shards(self) -> list[dict]:
        """meta's shard entries: [{id, tokens, documents, sa_dtype, sha256}]."""
        return list(self._meta["shards"])

    @property
    def sources(self) -> list[dict]:
        return list(self._meta.get("sources", []))

    @property
    def indexes(self) -> list[SuffixIndex]:
        return list(self._live_indexes())

    def docs(self, shard: int) -> np.ndarray:
        """[documents] int64 start offsets of shard `shard`'s documents (position in meta.shards)."""
        self._live_indexes()
        return self._docs[shard]

    # ------------------------------------------------------------------ queries
    def count(self, pattern: Sequence[int]) -> int:
        """Exact occurrences of the token pattern inside documents, over all shards."""
        return count_in(self._live_indexes(), pattern, self.separator)

    def draft(self, context, budget: int = 64, max_depth: int = 16, max_suffix: int = 16,
              min_suffix: int = 1, extra_indexes: Sequence[SuffixIndex] = (), min_count: int = 1
              ) -> DraftTree:
        """The exact weighted trie after `context`; extra_indexes (a live tier) count as more shards.
        min_count > 1: grown from the longest suffix seen that often (`index.backoff_match`)."""
        indexes = self._live_indexes() + list(extra_indexes)
        return draft_from(indexes, context, budget, max_depth, max_suffix, min_suffix,
                          self.separator, min_count)

    def draft_batch(self, contexts: Sequence, budget: int | Sequence[int] = 64,
                    max_depth: int | Sequence[int] = 16, max_suffix: int = 16, min_suffix: int = 1,
                    extra_indexes: Sequence[SuffixIndex] = (), min_count: int = 1,
                    spec_factor: float = 0.0) -> list[DraftTree]:
        """`draft` for every context (one tree each, in order), in one call of the compiled kernel
        with the GIL released; budget and max_depth: an int, or one per context; spec_factor > 0
        caps each tree's depth at that multiple of its match length (`index.draft_batch`)."""
        indexes = self._live_indexes() + list(extra_indexes)
        return draft_batch(indexes, contexts, budget, max_depth, max_suffix, min_suffix,
                           self.separator, min_count, spec_factor=spec_factor)

    # ------------------------------------------------------------------ lifetime
    def _live_indexes(self) -> list[SuffixIndex]:
        if self._indexes is None:
            raise DatastoreError(f"{self.path}: the datastore is closed")
        return self._indexes

    def close(self) -> None:
        """Ends the read transaction: arrays taken from this datastore must not be used after."""
        if self._indexes is None:
            return
        self._indexes, self._docs = None, []
        self._txn.abort()
        self._env.close()

    def __enter__(self) -> "Datastore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._indexes is None else f"{len(self._indexes)} shards"
        return f"Datastore({str(self.path)!r}, {state}, {self.tokens} tokens)"


def _load_shards(path: Path, txn: lmdb.Transaction, meta: dict
                 ) -> tuple[list[SuffixIndex], list[np.ndarray]]:
    token_dtype, sep = np.dtype(meta["token_dtype"]), int(meta["separator"])
    indexes, docs = [], []
    for shard in meta["shards"]:
        tok_buf, sa_buf, docs_buf = _shard_buffers(path, txn, meta, shard)
        tokens = np.frombuffer(tok_buf, dtype=token_dtype)  # [n] zero-copy
        sa = np.frombuffer(sa_buf, dtype=np.dtype(shard["sa_dtype"]))  # [n] zero-copy
        if len(tokens) and int(tokens[-1]) != sep:
            raise _fail(path, f"shard {shard['id']}: does not end with the separator {sep}")
        indexes.append(SuffixIndex(tokens, sa, sep))
        docs.append(np.frombuffer(docs_buf, dtype=np.int64))  # [documents] zero-copy
    return indexes, docs


def _verify_main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "--verify":
        print("usage: python -m datastore.store --verify DIR", file=sys.stderr)
        return 2
    try:
        check_store(argv[1], checksums=True)
    except DatastoreError as exc:
        print(str(exc), file=sys.stderr)
        return _VERIFY_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(_verify_main(sys.argv[1:]))
