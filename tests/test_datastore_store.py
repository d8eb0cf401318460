"""`Datastore` over real LMDB stores written by the builder: counts and drafts against brute force,
real text with the SmolLM2 tokenizer, shards, the uint32 path, append, live-tier indexes."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

from builder.tokenizer import tokenizer_info
from builder.writer import write_datastore
from datastore import Datastore, DatastoreError
from datastore_naive import count, longest_match, make_index, reference_draft

TOY = {"name": "toy", "fingerprint": "0" * 64}


def toy_tokenizer(vocab: int) -> dict:
    return {**TOY, "vocab_size": vocab}


def random_docs(rng, n_docs: int, vocab: int, max_len: int = 200) -> list[np.ndarray]:
    return [rng.integers(0, vocab, rng.integers(1, max_len)) for _ in range(n_docs)]


def contexts_from(rng, docs, n: int, length: int = 20) -> list[np.ndarray]:
    """Real contexts: a document's prefix up to a random cut point."""
    out = []
    for _ in range(n):
        doc = docs[rng.integers(len(docs))]
        cut = int(rng.integers(1, len(doc) + 1))
        out.append(np.asarray(doc[max(0, cut - length):cut], dtype=np.int64))
    return out


@pytest.fixture(scope="module")
def python_text_docs():
    """Real Python source from the standard library, in pieces of ~40 lines (one document each)."""
    import fnmatch, glob, heapq, shlex  # noqa: E401 - real text, any stable modules will do

    pieces = []
    for module in (shlex, heapq, fnmatch, glob):
        lines = inspect.getsource(module).splitlines(keepends=True)
        pieces += ["".join(lines[i:i + 40]) for i in range(0, len(lines), 40)]
    return pieces


@pytest.fixture(scope="module")
def real_store(tmp_path_factory, smollm2_tokenizer, python_text_docs):
    tok = smollm2_tokenizer
    docs = [np.asarray(tok.encode(text, add_special_tokens=False), dtype=np.int64)
            for text in python_text_docs]
    docs = [d for d in docs if len(d)]
    out = tmp_path_factory.mktemp("real") / "store"
    write_datastore(out, docs, tokenizer_info(tok, "smollm2"))
    with Datastore.open(out) as store:
        yield store, docs


def test_real_text_counts_equal_brute_force(real_store):
    store, docs = real_store
    rng = np.random.default_rng(0)
    assert store.token_dtype == np.uint16 and store.vocab_size == 49152
    assert store.tokens == sum(len(d) + 1 for d in docs) and store.documents == len(docs)
    patterns = [list(c[-rng.integers(1, 7):]) for c in contexts_from(rng, docs, 150)]
    patterns += [list(rng.integers(0, 49152, rng.integers(1, 3))) for _ in range(30)]
    seen = 0
    for pattern in patterns:
        want = count(docs, pattern)
        assert store.count(pattern) == want, pattern
        seen += want > 1
    assert seen > 50  # many patterns repeat: the test exercises real ranges


def test_real_text_drafts_are_exact(real_store):
    store, docs = real_store
    rng = np.random.default_rng(1)
    nodes = 0
    for context in contexts_from(rng, docs, 40):
        tree = store.draft(context, budget=32, max_depth=8, max_suffix=8)
        assert tree.same_as(reference_draft(docs, context, 32, 8, 8))
        assert tree.match_len == longest_match(docs, context, 8, 1)
        suffix = tuple(context[len(context) - tree.match_len:].tolist())
        for path, c in tree.paths().items():
            assert c == count(docs, suffix + path)
        assert store.separator not in tree.tokens.tolist()
        nodes += len(tree)
    assert nodes > 300


def test_arrays_are_zero_copy_views(real_store):
    store, _ = real_store
    for ix in store.indexes:
        assert not ix.tokens.flags.owndata and not ix.tokens.flags.writeable
        assert not ix.sa.flags.owndata and ix.sa.dtype == np.int32
    assert store.docs(0)[0] == 0 and store.docs(0).dtype == np.int64


def test_sharded_build_drafts_identically(tmp_path):
    rng = np.random.default_rng(2)
    docs = random_docs(rng, 120, 6, max_len=150)
    write_datastore(tmp_path / "one", docs, toy_tokenizer(6))
    write_datastore(tmp_path / "many", docs, toy_tokenizer(6), shard_tokens=400)
    with Datastore.open(tmp_path / "one") as one, Datastore.open(tmp_path / "many") as many:
        assert len(one.indexes) == 1 and len(many.indexes) > 10
        for context in contexts_from(rng, docs, 60) + [np.array([5, 5, 5, 5])]:
            for budget, depth in ((64, 16), (8, 3), (1, 1)):
                a = one.draft(context, budget=budget, max_depth=depth)
                assert a.same_as(many.draft(context, budget=budget, max_depth=depth))
            assert one.count(context[-3:]) == many.count(context[-3:]) == count(docs, context[-3:])


def test_uint32_vocabulary(tmp_path):
    vocab = 70_000
    rng = np.random.default_rng(3)
    docs = [np.concatenate([rng.integers(65_530, vocab, rng.integers(1, 40)), [69_999, 3]])
            for _ in range(60)]
    write_datastore(tmp_path / "wide", docs, toy_tokenizer(vocab), shard_tokens=700)
    with Datastore.open(tmp_path / "wide") as store:
        assert store.token_dtype == np.uint32 and store.separator == vocab
        assert store.count([69_999, 3]) == 60
        assert store.count([69_999 - 65_536, 3]) == count(docs, [69_999 - 65_536, 3])
        for context in contexts_from(rng, docs, 30):
            assert store.draft(context, budget=24).same_as(reference_draft(docs, context, 24))


def test_append_drafts_like_one_build(tmp_path):
    rng = np.random.default_rng(4)
    docs = random_docs(rng, 80, 5)
    write_datastore(tmp_path / "all", docs, toy_tokenizer(5), shard_tokens=3000)
    write_datastore(tmp_path / "grown", docs[:30], toy_tokenizer(5), shard_tokens=3000)
    write_datastore(tmp_path / "grown", docs[30:], toy_tokenizer(5), shard_tokens=3000, append=True)
    with Datastore.open(tmp_path / "all") as a, Datastore.open(tmp_path / "grown") as g:
        assert (a.tokens, a.documents) == (g.tokens, g.documents)
        for context in contexts_from(rng, docs, 50):
            assert a.draft(context).same_as(g.draft(context))


def test_extra_indexes_count_as_more_shards(tmp_path):
    rng = np.random.default_rng(5)
    docs = random_docs(rng, 60, 4)
    write_datastore(tmp_path / "static", docs[:40], toy_tokenizer(4))
    write_datastore(tmp_path / "both", docs, toy_tokenizer(4))
    live = make_index(docs[40:], 4)  # an in-memory live tier
    with Datastore.open(tmp_path / "static") as static, Datastore.open(tmp_path / "both") as both:
        for context in contexts_from(rng, docs[40:], 30):
            assert static.draft(context, extra_indexes=[live]).same_as(both.draft(context))


def test_properties_and_lifetime(tmp_path):
    docs = [np.array([0, 1, 2]), np.array([2, 1])]
    sources = [{"path": "a.jsonl", "format": "jsonl", "records": 3, "skipped": {"empty": 1}}]
    write_datastore(tmp_path / "s", docs, toy_tokenizer(3), sources=sources)
    store = Datastore.open(tmp_path / "s")
    assert store.tokenizer == toy_tokenizer(3) and store.vocab_size == 3 and store.separator == 3
    assert (store.tokens, store.documents, len(store.shards)) == (7, 2, 1)
    assert store.meta["format_version"] == 1 and store.sources[0]["records"] == 3
    assert store.draft([1]).paths() == {(2,): 1}
    with store:
        pass
    with pytest.raises(DatastoreError, match="closed"):
        store.draft([1])
    with pytest.raises(DatastoreError, match="closed"):
        store.count([1])
    store.close()  # twice is fine


def test_unverified_open_still_checks_sizes_and_meta(tmp_path):
    write_datastore(tmp_path / "s", [np.array([0, 1])], toy_tokenizer(2))
    with Datastore.open(tmp_path / "s", verify=False) as store:
        assert store.count([0, 1]) == 1


def test_draft_batch_equals_draft_per_context(tmp_path):
    """Datastore.draft_batch: one kernel call, the same trees as draft one context at a time, with
    per-context budgets and depths, extra indexes (a live tier) and min_count; shards summed."""
    rng = np.random.default_rng(6)
    docs = random_docs(rng, 90, 5, max_len=180)
    write_datastore(tmp_path / "s", docs[:70], toy_tokenizer(5), shard_tokens=2000)
    live = make_index(docs[70:], 5)
    with Datastore.open(tmp_path / "s") as store:
        assert len(store.indexes) > 2
        contexts = contexts_from(rng, docs, 40) + [np.array([], np.int64), [1, 2, 5, 1], (3, 3)]
        budgets = rng.choice([0, 1, 8, 64], len(contexts)).tolist()
        depths = rng.integers(1, 9, len(contexts)).tolist()
        for extra, k in (((), 1), ((live,), 1), ((live,), 6)):
            got = store.draft_batch(contexts, budgets, depths, 8, 1, extra_indexes=extra, min_count=k)
            want = [store.draft(c, b, d, 8, 1, extra_indexes=extra, min_count=k)
                    for c, b, d in zip(contexts, budgets, depths)]
            assert all(g.same_as(w) for g, w in zip(got, want))
            assert sum(len(t) for t in got) > 100
        plain = store.draft_batch(contexts[:10], budget=24, max_depth=5)
        assert all(t.same_as(reference_draft(docs[:70], c, 24, 5)) for t, c in zip(plain, contexts[:10]))
        assert store.draft_batch([]) == []
    with pytest.raises(DatastoreError, match="closed"):
        store.draft_batch([[1]])
