"""The whole draft in the C kernel (`datastore.index.draft_batch`, and `draft_from` through it)
against the Python implementation it replaced, kept here as the reference: the longest match and
the min_count backoff (`index.longest_match`, `index.backoff_match`), then the best-first expansion
of `datastore.tree.expand_best_first` with the kernel's `split` and a mirror of the heap's best
waiting counts. Trees must be identical: node order, tokens, parents, counts and match_len; and,
for contexts without barrier ids, equal to the brute-force trie of tests/datastore_naive.py."""
from __future__ import annotations

import dataclasses
import threading
from typing import Iterable
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import datastore.index as index_mod
import datastore.tree as tree_mod
from datastore.index import (
    SuffixIndex, _as_ints, _barrier, _check_draft_args, _separator, backoff_match, draft_batch,
    draft_from, longest_match, split_children,
)
from datastore.tree import DraftTree, expand_best_first
from datastore_naive import make_index, reference_draft, stream

VOCAB = 5
SAMPLING_MODES = [  # (SAMPLES, DENSITY): strides > 1 everywhere, sparse to dense hunting, read whole
    (128, 2), (1, 1), (2, 3), (3, 1), (2, 64), (1 << 40, 1),
]


# ------------------------------------------------------------------------------ the reference


class _Frontier:
    """The best counts waiting in expand_best_first's heap, mirrored from its pushes and pops
    (only the `left` largest: left = pops still to come)."""

    def __init__(self, budget: int) -> None:
        self.top: list[int] = []  # descending
        self.budget = budget
        self.popped = 0

    def push(self, kids: list) -> None:
        left = self.budget - self.popped
        self.top = sorted(self.top + [c for _, c, _ in kids[:left]], reverse=True)[:left]

    def pop(self, count: int) -> int:
        self.popped += 1
        if self.top and self.top[0] == count:
            del self.top[0]
        else:
            self.top = []
        return self.popped

    def floor(self, r: int) -> int:
        return self.top[r - 1] if 0 < r <= len(self.top) else 0


def python_draft(indexes, context, budget=64, max_depth=16, max_suffix=16, min_suffix=1,
                 separator=None, min_count=1) -> DraftTree:
    """datastore.index.draft_from as it was before the expansion moved into C (less its cache)."""
    _check_draft_args(budget, max_depth, max_suffix, min_suffix, min_count)
    indexes = list(indexes)
    sep = _separator(indexes, separator)
    tail = _as_ints(context[-max_suffix:] if len(context) else context)
    tail = tail[_barrier(tail, sep) + 1:]
    if budget == 0 or len(tail) < min_suffix or not indexes:
        return DraftTree.empty()
    L, ranges = longest_match(indexes, tail, min_suffix)
    if L == 0:
        return DraftTree.empty()
    L, ranges = backoff_match(indexes, tail, min_suffix, L, ranges, min_count, max_suffix)
    frontier = _Frontier(budget)
    roots = split_children(indexes, ranges, L, sep, budget, 0, [])
    frontier.push(roots)

    def children(handle) -> Iterable:
        k, rng, count = handle
        left = budget - frontier.pop(count)
        if k - L >= max_depth or left <= 0:
            return ()
        kids = split_children(indexes, rng, k, sep, left, frontier.floor(left), frontier.top)
        frontier.push(kids)
        return kids

    tokens, parents, counts = expand_best_first(roots, children, budget, max_depth + 1)
    return DraftTree(tokens, parents, counts, match_len=L)


def split_docs(docs, cuts):
    bounds = sorted({min(c, len(docs)) for c in cuts})
    groups, start = [], 0
    for b in bounds + [len(docs)]:
        groups.append(docs[start:b])
        start = b
    return groups


def same(got: DraftTree, want: DraftTree) -> bool:
    return got.same_as(want) and got.source == want.source == "retrieval"


# ------------------------------------------------------------------------------ hypothesis


docs_st = st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=60), min_size=1, max_size=8)
# contexts may hold the separator and foreign ids (barriers): VOCAB, VOCAB + 2, -1, 2**70
token_st = st.one_of(st.integers(0, VOCAB - 1), st.sampled_from([VOCAB, VOCAB + 2, -1, 2**70]))
contexts_st = st.lists(st.lists(st.one_of(st.integers(0, VOCAB - 1), st.integers(0, VOCAB - 1), token_st),
                                max_size=12), min_size=1, max_size=6)


@settings(max_examples=250, deadline=None)
@given(docs=docs_st, contexts=contexts_st, cuts=st.lists(st.integers(0, 8), max_size=3),
       budgets=st.lists(st.sampled_from([0, 1, 2, 3, 5, 16, 64]), min_size=6, max_size=6),
       depths=st.lists(st.integers(1, 7), min_size=6, max_size=6),
       max_suffix=st.integers(1, 9), min_suffix=st.integers(1, 3),
       min_count=st.sampled_from([1, 2, 3, 5, 20]),
       separator=st.sampled_from([None, VOCAB, VOCAB - 1, VOCAB + 3]),
       mode=st.integers(0, len(SAMPLING_MODES) - 1), per_context=st.booleans())
def test_batch_equals_the_python_expansion_and_brute_force(
        docs, contexts, cuts, budgets, depths, max_suffix, min_suffix, min_count, separator, mode,
        per_context):
    """Random shard splits, separators (the index's, a smaller and a larger one), barriers in the
    context, min_count, per-context budgets and depths, every sampling density."""
    min_suffix = min(min_suffix, max_suffix)
    shards = [make_index(g, VOCAB) for g in split_docs(docs, cuts)]  # some may be empty
    n = len(contexts)
    budget = budgets[:n] if per_context else budgets[0]
    depth = depths[:n] if per_context else depths[0]
    samples, density = SAMPLING_MODES[mode]
    with mock.patch.multiple(index_mod, SAMPLES=samples, DENSITY=density):
        got = draft_batch(shards, contexts, budget, depth, max_suffix, min_suffix, separator, min_count)
        want = [python_draft(shards, c, budgets[i] if per_context else budget,
                             depths[i] if per_context else depth, max_suffix, min_suffix, separator,
                             min_count) for i, c in enumerate(contexts)]
    assert len(got) == n
    for i, (g, w) in enumerate(zip(got, want)):
        assert same(g, w), (i, g.paths(), w.paths(), g.match_len, w.match_len)
        b = budgets[i] if per_context else budget
        d = depths[i] if per_context else depth
        assert draft_from(shards, contexts[i], b, d, max_suffix, min_suffix, separator,
                          min_count).same_as(g)
        tail = contexts[i][-max_suffix:]
        if separator in (None, VOCAB) and all(0 <= t < VOCAB for t in tail):
            assert g.same_as(reference_draft(docs, tail, b, d, max_suffix, min_suffix, min_count))


@settings(max_examples=60, deadline=None)
@given(docs=docs_st, contexts=contexts_st, cuts=st.lists(st.integers(0, 8), min_size=1, max_size=4),
       budget=st.sampled_from([1, 3, 64]), min_count=st.sampled_from([1, 4]))
def test_sharded_batch_equals_unsharded(docs, contexts, cuts, budget, min_count):
    whole = draft_batch([make_index(docs, VOCAB)], contexts, budget, 5, 4, min_count=min_count)
    shards = [make_index(g, VOCAB) for g in split_docs(docs, cuts)]
    parts = draft_batch(shards, contexts, budget, 5, 4, min_count=min_count)
    assert all(a.same_as(b) for a, b in zip(parts, whole))


# ------------------------------------------------------------------------------ seeded sweeps


def test_seeded_sweep_against_the_python_expansion():
    """300 random stores (2-60 token vocabularies, 1-4 shards), a batch of 12 contexts each with
    per-context budgets and depths: every tree identical to the Python expansion's."""
    rng = np.random.default_rng(10)
    trees = nodes = 0
    for _ in range(300):
        vocab = int(rng.integers(2, 61))
        docs = [rng.integers(0, vocab, rng.integers(1, 300)) for _ in range(rng.integers(1, 12))]
        shards = [make_index(g, vocab) for g in split_docs(docs, rng.integers(0, 12, rng.integers(0, 4)))]
        contexts = []
        for _ in range(12):
            doc = docs[rng.integers(len(docs))]
            cut = int(rng.integers(0, len(doc) + 1))
            ctx = doc[max(0, cut - 20):cut].astype(np.int64)
            if rng.random() < 0.1:  # a barrier somewhere
                ctx = np.insert(ctx, int(rng.integers(0, len(ctx) + 1)), vocab)
            contexts.append(ctx)
        budgets = rng.choice([1, 2, 7, 16, 64, 100], 12).tolist()
        depths = rng.integers(1, 12, 12).tolist()
        max_suffix = int(rng.integers(1, 17))
        min_suffix = int(rng.integers(1, min(3, max_suffix) + 1))
        min_count = int(rng.choice([1, 1, 2, 16]))
        got = draft_batch(shards, contexts, budgets, depths, max_suffix, min_suffix, None, min_count)
        threaded = draft_batch(shards, contexts, budgets, depths, max_suffix, min_suffix, None,
                               min_count, threads=int(rng.integers(2, 6)))
        assert all(a.same_as(b) for a, b in zip(threaded, got))
        for c, b, d, g in zip(contexts, budgets, depths, got):
            want = python_draft(shards, c, b, d, max_suffix, min_suffix, None, min_count)
            assert same(g, want), (c, b, d, max_suffix, min_suffix, min_count)
            trees += 1
            nodes += len(g)
    assert trees == 3600 and nodes > 20_000


def test_large_sampled_ranges_are_identical():
    """Ranges of ~100k suffixes (one frequent token), split by sampling, over 3 shards."""
    rng = np.random.default_rng(3)
    docs = [np.where(rng.random(5000) < 0.5, 0, rng.integers(1, 300, 5000)) for _ in range(40)]
    shards = [make_index(g, 300) for g in split_docs(docs, [10, 25])]
    contexts = [[7, 0], [5, 9, 0], [299], [0, 0, 0], [0, 1], list(docs[3][:40])]
    for budget, depth, min_count in ((64, 3, 1), (64, 16, 1), (200, 8, 16), (5, 2, 1000)):
        got = draft_batch(shards, contexts, budget, depth, 8, min_count=min_count)
        for c, g in zip(contexts, got):
            assert same(g, python_draft(shards, c, budget, depth, 8, min_count=min_count))
    first = draft_batch(shards, contexts[:3], 64, 3, 3)
    for c, g in zip(contexts[:3], first):
        assert g.same_as(reference_draft(docs, c, 64, 3, 3))


# ------------------------------------------------------------------------------ inputs and API


def test_every_context_type_drafts_alike():
    docs = [[0, 1, 2, 3, 1, 2, 4], [1, 2, 3, 0, 1, 2, 3]]
    ix = make_index(docs, 5)
    base = [3, 0, 1, 2]
    want = draft_from([ix], base, 16, 4)
    assert len(want) and want.match_len == 4
    long = np.array([4] * 5000 + base, dtype=np.int64)  # only the tail is read
    variants = [base, tuple(base), np.array(base, np.int64), np.array(base, np.int32),
                np.array(base, np.uint16), np.array(base, np.uint64), np.array(base, np.int8),
                np.repeat(np.array(base, np.int64), 2)[::2],  # a strided view
                np.array(base, np.int64).astype(">i8"),  # non-native byte order
                [np.int64(t) for t in base], long, long.tolist()]
    try:
        import torch

        variants += [torch.tensor(base), torch.tensor(base, dtype=torch.int32)]
    except ImportError:  # pragma: no cover
        pass
    got = draft_batch([ix], variants, 16, 4)
    assert all(g.same_as(want) for g in got)
    # ids beyond int64 and negative ids are barriers, in lists and in unsigned arrays
    cut = draft_from([ix], [1, 2], 16, 4)
    for noisy in ([0, 2**70, 1, 2], [0, -(2**70), 1, 2], [0, -1, 1, 2],
                  np.array([0, 2**64 - 1, 1, 2], np.uint64)):
        assert draft_from([ix], noisy, 16, 4).same_as(cut)


def test_bad_inputs_are_rejected():
    ix = make_index([[0, 1, 2]], 3)
    for bad in ([0.5, 1.0], np.array([0.0, 1.0]), np.zeros((2, 2), np.int64), "ab", [None]):
        with pytest.raises(TypeError):
            draft_batch([ix], [[0], bad])
    for kwargs in ({"budget": [1]}, {"budget": [1, -1]}, {"max_depth": [1, 0]}, {"max_depth": [1, 2, 3]},
                   {"min_suffix": 0}, {"min_count": 0}, {"max_suffix": 0}):
        with pytest.raises(ValueError):
            draft_batch([ix], [[0], [1]], **kwargs)
    with pytest.raises(ValueError):
        index_mod._kernel.draft_batch((ix.kernel,), [[0]], 4, 4, 4, 1, 3, 1, 0, 2)  # samples 0
    with pytest.raises(ValueError):
        draft_batch([ix], [[0]], threads=0)
    with pytest.raises(TypeError):
        index_mod._kernel.draft_batch(("not a shard",), [[0]], 4, 4, 4, 1, 3, 1, 8, 2)


def test_empty_batches_and_sources():
    ix = make_index([[0, 1, 0, 1]], 2)
    assert draft_batch([ix], []) == []
    assert [len(t) for t in draft_batch([], [[0, 1], [1]])] == [0, 0]
    empty = SuffixIndex(np.zeros(0, np.uint16), np.zeros(0, np.int32))
    assert [len(t) for t in draft_batch([empty], [[0, 1]])] == [0]
    got = draft_batch([empty, ix, empty], [[], [0], [1, 0], [1, 0, 1]], [8, 0, 8, 8], 3)
    assert [len(t) for t in got[:2]] == [0, 0] and got[2].paths() == {(1,): 1}
    assert got[3].match_len == 3 and len(got[3]) == 0  # [1, 0, 1] ends the only document


def test_kernel_trees_are_plain_draft_trees():
    """The trees skip DraftTree's checks (trusted arrays): every field is set, the arrays have the
    checked dtypes, are writable and independent of one another."""
    rng = np.random.default_rng(4)
    docs = [rng.integers(0, 6, 200) for _ in range(5)]
    ix = make_index(docs, 6)
    got = draft_batch([ix], [d[:30] for d in docs], 32, 6)
    names = {f.name for f in dataclasses.fields(DraftTree)}
    assert names == set(tree_mod._FIELDS)
    for tree in got:
        checked = DraftTree(tree.tokens, tree.parents, tree.counts, tree.match_len, tree.source)
        assert tree.same_as(checked) and tree.source == checked.source
        assert (tree.tokens.dtype, tree.parents.dtype, tree.counts.dtype) == (np.int32, np.int32, np.int64)
        assert tree.tokens.flags.c_contiguous and tree.tokens.flags.writeable
    before = got[1].tokens.copy()
    got[0].tokens[:] = 0
    assert np.array_equal(got[1].tokens, before)


def test_uint32_tokens_and_int64_suffix_array():
    vocab = 70_000
    rng = np.random.default_rng(5)
    docs = [np.concatenate([rng.integers(65_530, vocab, 50), [66_000, 69_999, 1]]) for _ in range(20)]
    ix = make_index(docs, vocab, np.uint32)
    ix64 = SuffixIndex(stream(docs, vocab, np.uint32), ix.sa.astype(np.int64))
    contexts = [[5, 66_000], [66_000, 69_999], list(docs[0][:20]), [70_000, 1]]
    for c, a, b in zip(contexts, draft_batch([ix], contexts, 16), draft_batch([ix64], contexts, 16)):
        assert a.same_as(b) and a.same_as(python_draft([ix], c, 16))


def test_threads_draft_concurrently_and_identically():
    """The kernel keeps no state between calls, drafts with the GIL released, and a batch drafted
    by several kernel threads gives the same trees in the same order."""
    rng = np.random.default_rng(6)
    docs = [np.where(rng.random(4000) < 0.3, 0, rng.integers(1, 50, 4000)) for _ in range(20)]
    shards = [make_index(g, 50) for g in split_docs(docs, [7])]
    contexts = [d[: int(rng.integers(1, 400))] for d in docs for _ in range(3)]
    want = draft_batch(shards, contexts, 64, 8, min_count=4, threads=1)
    results: list = [None] * 4

    def work(i):  # Python threads, each running a batch over 1-4 kernel threads
        results[i] = draft_batch(shards, contexts, 64, 8, min_count=4, threads=i + 1)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        assert all(a.same_as(b) for a, b in zip(r, want))
