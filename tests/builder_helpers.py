"""Helpers for the builder tests: read a datastore back with lmdb directly, naive references."""
from __future__ import annotations

import json
from pathlib import Path

import lmdb
import numpy as np

from datastore.format import META_KEY, docs_key, sa_key, tokens_key


def fake_tokenizer(vocab_size: int, name: str = "fake") -> dict:
    return {"name": name, "fingerprint": f"{name}-{vocab_size}".ljust(64, "0"), "vocab_size": vocab_size}


def read_store(path: Path) -> tuple[dict, list[dict]]:
    """-> (meta, [{tokens, sa, docs, raw: (tokens bytes, sa bytes, docs bytes)}]) read with lmdb itself."""
    env = lmdb.open(str(path), readonly=True, lock=False, subdir=True)
    try:
        with env.begin() as txn:
            meta = json.loads(txn.get(META_KEY))
            dtype = np.dtype(meta["token_dtype"])
            shards = []
            for shard in meta["shards"]:
                i = shard["id"]
                raw = (txn.get(tokens_key(i)), txn.get(sa_key(i)), txn.get(docs_key(i)))
                shards.append({"tokens": np.frombuffer(raw[0], dtype),
                               "sa": np.frombuffer(raw[1], np.dtype(shard["sa_dtype"])),
                               "docs": np.frombuffer(raw[2], np.int64), "raw": raw})
    finally:
        env.close()
    return meta, shards


def naive_suffix_array(tokens) -> list[int]:
    seq = [int(t) for t in tokens]
    return sorted(range(len(seq)), key=lambda i: seq[i:])


def expected_stream(docs, separator: int, shard_tokens: int | None = None) -> list[int]:
    """Every non-empty doc followed by the separator; a doc longer than a shard (shard_tokens - 1
    tokens) is cut into pieces, each followed by the separator."""
    out: list[int] = []
    longest = (shard_tokens - 1) if shard_tokens else None
    for doc in docs:
        doc = [int(t) for t in doc]
        step = longest or max(len(doc), 1)
        for start in range(0, len(doc), step):
            out.extend(doc[start:start + step])
            out.append(separator)
    return out


def store_stream(shards: list[dict]) -> list[int]:
    return [int(t) for s in shards for t in s["tokens"]]


def temp_dirs_next_to(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if ".building-" in p.name)
