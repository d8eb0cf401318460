"""Directories that cannot be served: DatastoreError naming the path and the problem, and
`datastore-info` exits 2 in a child process (never a signal such as SIGBUS)."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import lmdb
import numpy as np
import pytest

import datastore.store as store_mod
from builder.writer import write_datastore
from datastore import Datastore, DatastoreError
from datastore.format import META_KEY, tokens_key

TOKENIZER = {"name": "toy", "fingerprint": "1" * 64, "vocab_size": 70_000}


@pytest.fixture(scope="module")
def good_store(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 70_000, rng.integers(50, 3000)) for _ in range(40)]
    out = tmp_path_factory.mktemp("good") / "store"
    write_datastore(out, docs, TOKENIZER, shard_tokens=15_000)
    return out


@pytest.fixture
def store_copy(good_store, tmp_path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(good_store, dst)
    return dst


def info_exit(path: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "datastore.info_cli", str(path), "--json"],
                          capture_output=True, text=True, timeout=120)
    return proc


def assert_refused(path: Path, *needles: str) -> None:
    """Datastore.open raises a DatastoreError naming path and each needle; the CLI exits 2."""
    with pytest.raises(DatastoreError) as err:
        Datastore.open(path)
    message = str(err.value)
    assert str(path) in message
    for needle in needles:
        assert needle in message, message
    proc = info_exit(path)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)  # negative = killed by a signal
    assert str(path) in proc.stderr and proc.stdout == ""


def rewrite(path: Path, edit) -> None:
    """Open the store writable and apply edit(txn) (a foreign or damaged store, made on purpose)."""
    env = lmdb.open(str(path), map_size=1 << 30, subdir=True)
    with env.begin(write=True) as txn:
        edit(txn)
    env.close()


def test_good_store_opens_and_info_succeeds(good_store):
    with Datastore.open(good_store) as store:
        assert len(store.indexes) > 1
    proc = info_exit(good_store)
    assert proc.returncode == 0 and json.loads(proc.stdout)["shards"] > 1


@pytest.mark.parametrize("keep", [0, 100, 4096, 0.5, 0.99, -1])
def test_truncated_data_file(store_copy, keep):
    data = store_copy / "data.mdb"
    size = data.stat().st_size
    new_size = int(size * keep) if isinstance(keep, float) else (size + keep if keep < 0 else keep)
    os.truncate(data, new_size)
    assert_refused(store_copy)


@pytest.mark.parametrize("which", ["tokens", "sa"])
def test_flipped_bytes_in_a_shard(store_copy, good_store, which):
    with Datastore.open(good_store) as store:
        ix = store.indexes[1]
        needle = (ix.tokens if which == "tokens" else ix.sa)[1000:1064].tobytes()
    raw = bytearray((store_copy / "data.mdb").read_bytes())
    at = raw.find(needle)
    assert at > 0
    raw[at + 7] ^= 0x5A
    (store_copy / "data.mdb").write_bytes(bytes(raw))
    assert_refused(store_copy, "shard 1", "sha256")


def test_missing_meta(store_copy):
    rewrite(store_copy, lambda txn: txn.delete(META_KEY))
    assert_refused(store_copy, "no 'meta'")


@pytest.mark.parametrize("change, needle", [
    (lambda m: b"{not json", "not valid JSON"),
    (lambda m: json.dumps([1, 2]).encode(), "expected an object"),
    (lambda m: json.dumps({**m, "format_version": 99}).encode(), "format_version 99"),
    (lambda m: json.dumps({k: v for k, v in m.items() if k != "shards"}).encode(), "lacks shards"),
    (lambda m: json.dumps({**m, "token_dtype": "uint16"}).encode(), "token_dtype"),
    (lambda m: json.dumps({**m, "shards": [{**m["shards"][0], "tokens": m["shards"][0]["tokens"] + 1}]
                           + m["shards"][1:]}).encode(), "meta says"),
])
def test_bad_meta(store_copy, change, needle):
    def edit(txn):
        meta = json.loads(bytes(txn.get(META_KEY)))
        txn.put(META_KEY, change(meta))
    rewrite(store_copy, edit)
    assert_refused(store_copy, needle)


def test_missing_shard_array(store_copy):
    rewrite(store_copy, lambda txn: txn.delete(tokens_key(2)))
    assert_refused(store_copy, "shard 2", "missing")


def test_foreign_lmdb_environment(tmp_path):
    env = lmdb.open(str(tmp_path / "other"), map_size=1 << 24)
    with env.begin(write=True) as txn:
        txn.put(b"hello", b"world")
    env.close()
    assert_refused(tmp_path / "other", "not a draftstore datastore")


def test_random_foreign_directory(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not a datastore")
    assert_refused(foreign, "no data.mdb")
    (foreign / "data.mdb").write_bytes(np.random.default_rng(0).bytes(3 * 4096))
    assert_refused(foreign, "not a readable LMDB")


def test_empty_missing_and_file_paths(tmp_path):
    (tmp_path / "empty").mkdir()
    assert_refused(tmp_path / "empty", "no data.mdb")
    assert_refused(tmp_path / "absent", "no such")
    (tmp_path / "plain").write_text("x")
    assert_refused(tmp_path / "plain", "not a directory")


def test_a_verifier_killed_by_a_signal_is_an_error(store_copy, tmp_path, monkeypatch):
    """What a SIGBUS inside LMDB would do to the verifying child becomes a DatastoreError here."""
    fake = tmp_path / "crashing-python"
    fake.write_text("#!/bin/sh\nkill -BUS $$\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(store_mod.sys, "executable", str(fake))
    with pytest.raises(DatastoreError, match="SIGBUS"):
        Datastore.open(store_copy)
