"""Write a format-v1 datastore (see datastore/format.py) from token-id documents.

The store is built in a temporary sibling directory, verified (re-opened, sizes and checksums checked
against meta) and only then renamed into place, so a reader never sees a half-written store and a
failed or interrupted build leaves the previous one at `out` untouched.
"""
from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import lmdb
import numpy as np
from tqdm import tqdm

from builder.errors import BuildError, EmptyCorpusError
from builder.lmdb_files import (
    open_for_write, open_read_only, publish, read_meta, remove_stale_temps, temp_dir_for,
    trim_data_file, used_bytes,
)
from builder.packer import Shard, pack_shards
from builder.suffix_array import suffix_array
from datastore.format import (
    FORMAT_VERSION, META_KEY, META_KEYS, DatastoreError, docs_key, sa_key, separator_for,
    shard_checksum, token_dtype_for, tokens_key,
)

DEFAULT_SHARD_TOKENS = 32_000_000


def write_datastore(out: str | Path, docs: Iterable[np.ndarray], tokenizer: dict, *,
                    shard_tokens: int = DEFAULT_SHARD_TOKENS, sources: Sequence[dict] = (),
                    build: dict | None = None, append: bool = False, progress: bool = False) -> dict:
    """Build (or with append=True extend) the datastore at `out` from docs; -> its meta.

    docs: 1-D integer arrays of token ids, one per document (empty ones skipped), streamed: only
      one shard of shard_tokens tokens (separators included) is held at a time; a document longer
      than a shard is cut into shard-sized documents.
    tokenizer: builder.tokenizer.tokenizer_info(...)'s {name, fingerprint, vocab_size}.
    sources: per-source counts for meta, read after docs are exhausted (so counts that grow while
      docs stream, like builder.sources.SourceStats, are recorded final); with append, added to
      the existing store's.
    Raises BuildError for bad input (ids outside the vocabulary, nothing to write (EmptyCorpusError),
    a different tokenizer or a corrupt store on append, out not a datastore) and DatastoreError if
    the new store fails verification. On any error `out` is left as it was and no temp dir remains.
    """
    out = Path(out)
    if not isinstance(shard_tokens, int) or shard_tokens < 2:
        raise BuildError(f"shard_tokens must be an integer >= 2 (a token and its separator), "
                         f"got {shard_tokens!r}")
    _check_tokenizer(tokenizer)
    _check_target(out, append)
    remove_stale_temps(out)
    tmp = temp_dir_for(out)
    try:
        old_meta = _copy_existing(out, tmp, tokenizer) if append else None
        meta = _write_into(tmp, docs, tokenizer, old_meta, shard_tokens, sources, build, progress)
        try:
            verify_store(tmp, meta)
        except DatastoreError as exc:
            raise DatastoreError(f"the datastore built for {out} failed verification: {exc}") from exc
        publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def _check_tokenizer(tokenizer: dict) -> None:
    missing = [k for k in ("name", "fingerprint", "vocab_size") if k not in tokenizer]
    if missing:
        raise BuildError(f"tokenizer info lacks {missing}; use builder.tokenizer.tokenizer_info()")
    vocab = tokenizer["vocab_size"]
    if not isinstance(vocab, int) or vocab <= 0:
        raise BuildError(f"tokenizer vocab_size must be a positive int, got {vocab!r}")


def _check_target(out: Path, append: bool) -> None:
    """Refuse what cannot be (re)placed: a file, a foreign directory, a missing store to extend."""
    if out.exists() and not out.is_dir():
        raise BuildError(f"{out} exists and is not a directory")
    if append and not (out / "data.mdb").is_file():
        raise BuildError(f"--append: {out} is not a datastore (build it first, without --append)")
    if out.exists() and any(out.iterdir()) and not (out / "data.mdb").is_file():
        raise BuildError(f"{out} is a non-empty directory that is not a datastore; "
                         "refusing to replace it (choose another --out)")


def _copy_existing(out: Path, tmp: Path, tokenizer: dict) -> dict:
    """Copy out's data file into tmp (a plain copy: published stores are immutable, and LMDB would
    refuse a second open of out if this process already serves it); -> out's meta."""
    shutil.copyfile(out / "data.mdb", tmp / "data.mdb")
    try:
        env = open_read_only(tmp)
        try:
            meta = read_meta(env, out)
        finally:
            env.close()
    except DatastoreError as exc:
        raise BuildError(f"--append: cannot extend {out}: {exc}") from exc
    theirs = meta.get("tokenizer", {})
    if theirs.get("fingerprint") != tokenizer["fingerprint"]:
        raise BuildError(
            f"--append: {out} was built with tokenizer {theirs.get('name')!r} "
            f"(fingerprint {str(theirs.get('fingerprint'))[:12]}…), not {tokenizer['name']!r} "
            f"(fingerprint {tokenizer['fingerprint'][:12]}…); build a new datastore instead")
    return meta


def _write_into(tmp: Path, docs, tokenizer: dict, old_meta: dict | None, shard_tokens: int,
                sources: Sequence[dict], build: dict | None, progress: bool) -> dict:
    vocab = int(tokenizer["vocab_size"])
    dtype, separator = token_dtype_for(vocab), separator_for(vocab)
    shards = list(old_meta["shards"]) if old_meta else []
    first_new = len(shards)
    with tqdm(desc="building", unit="tok", unit_scale=True, disable=not progress,
              file=sys.stderr) as bar:
        for shard in pack_shards(_with_progress(docs, bar), shard_tokens, dtype, vocab, separator):
            bar.set_postfix_str(f"sorting shard {len(shards)}", refresh=True)
            # one environment per shard: closing unmaps the shard's pages, which would otherwise
            # stay in this process's RSS and make build memory grow with the whole store
            with open_for_write(tmp) as env:
                shards.append(_put_shard(env, len(shards), shard))
            bar.set_postfix_str("")
    if len(shards) == first_new:
        raise EmptyCorpusError("no tokens to write: every document was empty")
    meta = _meta(tokenizer, dtype, separator, shards, old_meta, sources, build, shard_tokens)
    meta = json.loads(json.dumps(meta))  # what a reader will see (tuples become lists)
    with open_for_write(tmp) as env:
        with env.begin(write=True) as txn:
            txn.put(META_KEY, json.dumps(meta).encode())
        env.sync(True)  # the one sync: every page of every shard, then the meta page
        size = used_bytes(env)
    trim_data_file(tmp, size)
    return meta


def _with_progress(docs: Iterable, bar: tqdm) -> Iterator:
    for doc in docs:
        bar.update(np.size(doc) if isinstance(doc, np.ndarray) else 0)
        yield doc


def _put_shard(env: lmdb.Environment, shard_id: int, shard: Shard) -> dict:
    tokens, docs = shard.tokens, shard.docs  # [n] token dtype, [documents] int64
    sa = suffix_array(tokens)  # [n] int32 (int64 from 2^31 tokens)
    checksum = shard_checksum(tokens, sa, docs)
    with env.begin(write=True) as txn:
        txn.put(tokens_key(shard_id), np.ascontiguousarray(tokens))
        txn.put(sa_key(shard_id), np.ascontiguousarray(sa))
        txn.put(docs_key(shard_id), np.ascontiguousarray(docs))
    return {"id": shard_id, "tokens": int(len(tokens)), "documents": int(len(docs)),
            "sa_dtype": sa.dtype.name, "sha256": checksum}


def _meta(tokenizer: dict, dtype: np.dtype, separator: int, shards: list, old_meta: dict | None,
          sources: Sequence[dict], build: dict | None, shard_tokens: int) -> dict:
    this_build = {**(build or {}), "shard_tokens": int(shard_tokens)}
    if old_meta:
        previous = old_meta["build"]
        this_build["appended_to"] = previous.get("appended_to", []) + [
            {k: v for k, v in previous.items() if k != "appended_to"}]
    meta = {
        "format_version": FORMAT_VERSION,
        "tokenizer": {k: tokenizer[k] for k in ("name", "fingerprint", "vocab_size")},
        "token_dtype": dtype.name,
        "separator": separator,
        "shards": shards,
        "sources": (list(old_meta["sources"]) if old_meta else []) + [dict(s) for s in sources],
        "build": this_build,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "lmdb_version": ".".join(map(str, lmdb.version())),
    }
    assert tuple(meta) == META_KEYS, tuple(meta)
    return meta


def verify_store(path: Path, meta: dict) -> None:
    """Re-open path read-only; every shard's sizes and sha256 must match meta (else DatastoreError).
    One environment per shard, so at most one shard's pages are mapped at a time."""
    dtype = np.dtype(meta["token_dtype"])
    with _read_only(path) as env:
        if read_meta(env, path) != meta:
            raise DatastoreError(f"{path}: the stored meta differs from the one written")
    for shard in meta["shards"]:
        with _read_only(path) as env, env.begin(buffers=True) as txn:
            _verify_shard(txn, path, shard, dtype)


@contextmanager
def _read_only(path: Path):
    env = open_read_only(path)
    try:
        yield env
    finally:
        env.close()


def _verify_shard(txn, path: Path, shard: dict, dtype: np.dtype) -> None:
    i = shard["id"]
    expected = {tokens_key(i): shard["tokens"] * dtype.itemsize,
                sa_key(i): shard["tokens"] * np.dtype(shard["sa_dtype"]).itemsize,
                docs_key(i): shard["documents"] * 8}
    values = []
    for key, size in expected.items():
        value = txn.get(key)
        if value is None or len(value) != size:
            found = None if value is None else len(value)
            raise DatastoreError(f"{path}: {key.decode()} has {found} bytes, meta says {size}")
        values.append(value)
    if shard_checksum(*values) != shard["sha256"]:
        raise DatastoreError(f"{path}: shard {i} checksum mismatch")
