"""write_datastore: format v1 round trip read back with lmdb itself, against naive references."""
from __future__ import annotations

import hashlib
import os

import lmdb
import numpy as np
import pydivsufsort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builder.errors import BuildError, EmptyCorpusError
from builder.suffix_array import suffix_array
from builder.writer import verify_store, write_datastore
from builder_helpers import (
    expected_stream, fake_tokenizer, naive_suffix_array, read_store, store_stream, temp_dirs_next_to,
)
from datastore.format import (
    FORMAT_VERSION, MAP_SIZE, META_KEYS, DatastoreError, shard_checksum, tokens_key,
)


def check_store(out, docs, tokenizer, shard_tokens):
    """Every property format v1 promises, checked shard by shard against naive references."""
    meta, shards = read_store(out)
    vocab = tokenizer["vocab_size"]
    assert tuple(meta) == META_KEYS
    assert meta["format_version"] == FORMAT_VERSION
    assert meta["tokenizer"] == tokenizer
    assert meta["separator"] == vocab
    assert meta["token_dtype"] == ("uint16" if vocab <= 65535 else "uint32")
    assert meta["lmdb_version"] == ".".join(map(str, lmdb.version()))
    assert meta["build"]["shard_tokens"] == shard_tokens
    for info, shard in zip(meta["shards"], shards, strict=True):
        tokens, sa, offsets = shard["tokens"], shard["sa"], shard["docs"]
        assert info["tokens"] == len(tokens) == len(sa) <= shard_tokens
        assert info["documents"] == len(offsets)
        assert info["sa_dtype"] == "int32" and sa.dtype == np.int32
        assert info["sha256"] == shard_checksum(*shard["raw"])
        assert sa.tolist() == naive_suffix_array(tokens)
        # each document starts at its offset and ends with the only separator in it
        ends = np.flatnonzero(tokens == vocab)
        assert offsets.tolist() == [0] + (ends[:-1] + 1).tolist()
        assert tokens[-1] == vocab
    assert store_stream(shards) == expected_stream(docs, vocab, shard_tokens)
    return meta, shards


def test_round_trip_small(tmp_path):
    tok = fake_tokenizer(50)
    docs = [np.array([1, 2, 3]), np.array([], np.int64), np.array([4, 4, 4, 4, 2]),
            np.array([49, 0], np.uint16), [7, 8, 9, 7, 8, 9, 7]]
    meta = write_datastore(tmp_path / "ds", docs, tok, shard_tokens=8,
                           sources=[{"path": "x", "records": 5}], build={"workers": 3})
    read_meta, shards = check_store(tmp_path / "ds", docs, tok, 8)
    assert read_meta == meta
    assert [s["tokens"] for s in meta["shards"]] == [4, 6, 3, 8]  # [1 2 3 S] [4 4 4 4 2 S] [49 0 S] [7 8 9 7 8 9 7 S]
    assert meta["sources"] == [{"path": "x", "records": 5}]
    assert meta["build"]["workers"] == 3
    assert temp_dirs_next_to(tmp_path / "ds") == []


def test_long_document_is_cut_into_shard_sized_pieces(tmp_path):
    tok = fake_tokenizer(10)
    docs = [np.arange(10) % 3, np.array([5])]
    meta = write_datastore(tmp_path / "ds", docs, tok, shard_tokens=4)
    check_store(tmp_path / "ds", docs, tok, 4)
    assert [s["tokens"] for s in meta["shards"]] == [4, 4, 4, 4]  # 3+1, 3+1, 3+1, (1+1 then [5]+1)
    assert [s["documents"] for s in meta["shards"]] == [1, 1, 1, 2]


@settings(max_examples=40, deadline=None)
@given(docs=st.lists(st.lists(st.integers(0, 5), max_size=12), min_size=1, max_size=8)
       .filter(lambda d: any(d)),
       shard_tokens=st.integers(2, 40))
def test_random_documents_round_trip(tmp_path_factory, docs, shard_tokens):
    out = tmp_path_factory.mktemp("hyp") / "ds"
    tok = fake_tokenizer(6)
    arrays = [np.array(d, np.int64) for d in docs]
    write_datastore(out, arrays, tok, shard_tokens=shard_tokens)
    check_store(out, arrays, tok, shard_tokens)


@pytest.mark.parametrize("vocab, dtype", [(65535, "uint16"), (65536, "uint32"), (70_000, "uint32")])
def test_token_width_never_truncates(tmp_path, vocab, dtype):
    tok = fake_tokenizer(vocab)
    docs = [np.array([vocab - 1, 0, vocab - 1, 65535 % vocab, 300]), np.array([vocab - 1, 0])]
    meta = write_datastore(tmp_path / "ds", docs, tok)
    assert meta["token_dtype"] == dtype
    _, shards = check_store(tmp_path / "ds", docs, tok, meta["build"]["shard_tokens"])
    assert shards[0]["tokens"].max() == vocab  # the separator itself survives


@pytest.mark.parametrize("dtype, high", [(np.uint16, 3), (np.uint16, 200), (np.uint16, 49_152),
                                         (np.uint32, 70_000), (np.uint32, 2)])
def test_suffix_array_matches_divsufsort_and_naive(dtype, high):
    rng = np.random.default_rng(high)
    for n in (1, 2, 3, 17, 300, 5000):
        tokens = rng.integers(0, high, n).astype(dtype)
        sa = suffix_array(tokens)
        assert sa.dtype == np.int32
        assert np.array_equal(sa, pydivsufsort.divsufsort(tokens))
        if n <= 300:
            assert sa.tolist() == naive_suffix_array(tokens)


def test_data_file_is_trimmed_and_store_opens_read_only(tmp_path):
    write_datastore(tmp_path / "ds", [np.arange(1000) % 97], fake_tokenizer(100))
    size = (tmp_path / "ds" / "data.mdb").stat().st_size
    assert size < 1 << 20 < MAP_SIZE  # writemap grew it to MAP_SIZE; trimmed to the pages used
    meta, _ = read_store(tmp_path / "ds")
    assert meta["shards"][0]["tokens"] == 1001


def test_append_equals_building_everything_at_once(tmp_path):
    tok = fake_tokenizer(30)
    rng = np.random.default_rng(1)
    part1 = [rng.integers(0, 30, rng.integers(1, 20)) for _ in range(15)]
    part2 = [rng.integers(0, 30, rng.integers(1, 20)) for _ in range(9)]
    write_datastore(tmp_path / "all", part1 + part2, tok, shard_tokens=64)
    write_datastore(tmp_path / "inc", part1, tok, shard_tokens=64, sources=[{"path": "a"}])
    appended = write_datastore(tmp_path / "inc", part2, tok, shard_tokens=64, append=True,
                               sources=[{"path": "b"}])
    all_meta, all_shards = read_store(tmp_path / "all")
    inc_meta, inc_shards = check_store(tmp_path / "inc", part1 + part2, tok, 64)
    assert inc_meta == appended
    assert store_stream(inc_shards) == store_stream(all_shards)
    for key in ("tokens", "documents"):
        assert sum(s[key] for s in inc_meta["shards"]) == sum(s[key] for s in all_meta["shards"])
    assert [s["id"] for s in inc_meta["shards"]] == list(range(len(inc_meta["shards"])))
    assert [s["path"] for s in inc_meta["sources"]] == ["a", "b"]
    assert inc_meta["build"]["appended_to"] == [{"shard_tokens": 64}]
    assert temp_dirs_next_to(tmp_path / "inc") == []


def digest(out) -> str:
    return hashlib.sha256((out / "data.mdb").read_bytes()).hexdigest()


@pytest.fixture
def old_store(tmp_path):
    out = tmp_path / "ds"
    write_datastore(out, [np.array([1, 2, 3]), np.array([3, 2, 1])], fake_tokenizer(10), shard_tokens=5)
    return out


def test_append_refuses_another_tokenizer(old_store):
    before = digest(old_store)
    with pytest.raises(BuildError, match="fingerprint"):
        write_datastore(old_store, [np.array([1])], fake_tokenizer(10, name="other"), append=True)
    assert digest(old_store) == before
    assert temp_dirs_next_to(old_store) == []


def test_append_needs_an_existing_store(tmp_path):
    with pytest.raises(BuildError, match="not a datastore"):
        write_datastore(tmp_path / "nope", [np.array([1])], fake_tokenizer(10), append=True)
    assert not (tmp_path / "nope").exists()


def failing_docs(exc: BaseException, good: int = 6):
    for _ in range(good):
        yield np.array([1, 2, 3, 4])
    raise exc


@pytest.mark.parametrize("exc", [RuntimeError("reader died"), KeyboardInterrupt()])
def test_failed_build_keeps_the_old_store(old_store, exc):
    before = digest(old_store)
    with pytest.raises(type(exc)):
        # shard_tokens=5: several shards are already written into the temp dir when it fails
        write_datastore(old_store, failing_docs(exc), fake_tokenizer(10), shard_tokens=5)
    assert digest(old_store) == before
    assert read_store(old_store)[0]["shards"][0]["tokens"] == 4
    assert temp_dirs_next_to(old_store) == []


def test_failed_first_build_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        write_datastore(tmp_path / "ds", failing_docs(RuntimeError("x")), fake_tokenizer(10), shard_tokens=5)
    assert list(tmp_path.iterdir()) == []


def test_rebuild_replaces_the_store(old_store):
    meta = write_datastore(old_store, [np.array([9, 9, 9])], fake_tokenizer(10))
    assert read_store(old_store)[0] == meta
    assert meta["shards"][0]["tokens"] == 4
    assert temp_dirs_next_to(old_store) == []


@pytest.mark.parametrize("doc, message", [
    (np.array([1, 10]), "document 1: token id 10 is outside the vocabulary"),
    (np.array([-1, 2]), "document 1: token id -1 is outside the vocabulary"),
    (np.array([1.5]), "document 1: expected a 1-D integer array"),
    (np.zeros((2, 2), np.int64), "document 1: expected a 1-D integer array"),
])
def test_bad_documents_are_refused(old_store, doc, message):
    before = digest(old_store)
    with pytest.raises(BuildError, match=message):
        write_datastore(old_store, [np.array([1]), doc], fake_tokenizer(10))
    assert digest(old_store) == before
    assert temp_dirs_next_to(old_store) == []


def test_nothing_to_write(tmp_path):
    with pytest.raises(EmptyCorpusError, match="no tokens"):
        write_datastore(tmp_path / "ds", [np.array([], np.int64)], fake_tokenizer(10))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("shard_tokens", [0, 1])
def test_bad_shard_tokens(tmp_path, shard_tokens):
    with pytest.raises(BuildError, match="shard_tokens"):
        write_datastore(tmp_path / "ds", [np.array([1])], fake_tokenizer(10), shard_tokens=shard_tokens)


@pytest.mark.parametrize("tok, message", [({"name": "x", "vocab_size": 5}, "lacks"),
                                          ({"name": "x", "fingerprint": "f", "vocab_size": 0}, "positive")])
def test_bad_tokenizer_info(tmp_path, tok, message):
    with pytest.raises(BuildError, match=message):
        write_datastore(tmp_path / "ds", [np.array([1])], tok)


def test_refuses_to_replace_what_is_not_a_datastore(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(BuildError, match="not a directory"):
        write_datastore(tmp_path / "file", [np.array([1])], fake_tokenizer(10))
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "precious.txt").write_text("keep me")
    with pytest.raises(BuildError, match="not a datastore"):
        write_datastore(tmp_path / "dir", [np.array([1])], fake_tokenizer(10))
    assert (tmp_path / "dir" / "precious.txt").read_text() == "keep me"


def test_stale_temp_dirs_of_dead_builds_are_removed(tmp_path):
    dead = tmp_path / ".ds.building-999999999-abcd"  # no such pid
    alive = tmp_path / f".ds.building-{os.getpid()}-abcd"  # a build still running here
    dead.mkdir()
    alive.mkdir()
    write_datastore(tmp_path / "ds", [np.array([1])], fake_tokenizer(10))
    assert not dead.exists() and alive.exists()


def test_verify_detects_a_changed_shard(old_store):
    meta, _ = read_store(old_store)
    env = lmdb.open(str(old_store), map_size=MAP_SIZE)
    with env.begin(write=True) as txn:
        txn.put(tokens_key(0), np.array([1, 2, 4, 10], np.uint16))
    env.close()
    with pytest.raises(DatastoreError, match="shard 0 checksum mismatch"):
        verify_store(old_store, meta)


def test_append_to_a_corrupt_store_fails_cleanly(old_store):
    data = old_store / "data.mdb"
    data.write_bytes(data.read_bytes()[:8192])  # truncated: its pages are gone
    with pytest.raises(BuildError, match="truncated"):
        write_datastore(old_store, [np.array([1])], fake_tokenizer(10), append=True)
    assert temp_dirs_next_to(old_store) == []


def test_publish_without_atomic_exchange(old_store, monkeypatch):
    from builder import lmdb_files

    monkeypatch.setattr(lmdb_files, "_exchange", lambda a, b: False)  # e.g. no renameat2
    meta = write_datastore(old_store, [np.array([5, 6])], fake_tokenizer(10))
    assert read_store(old_store)[0] == meta
    assert temp_dirs_next_to(old_store) == []


def test_stores_a_reader_holds_open_can_be_replaced_and_appended(old_store):
    env = lmdb.open(str(old_store), readonly=True, lock=False)  # e.g. a server in this process
    try:
        with env.begin() as txn:
            before = bytes(txn.get(tokens_key(0)))
        write_datastore(old_store, [np.array([7])], fake_tokenizer(10), append=True)
        with env.begin() as txn:
            assert bytes(txn.get(tokens_key(0))) == before  # the old files live on while mapped
    finally:
        env.close()
    meta, shards = read_store(old_store)
    assert [s["tokens"] for s in meta["shards"]] == [4, 4, 2]
