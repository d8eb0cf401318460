"""GramIndex, continuation tries and helpers of the local drafters, against brute force."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from datastore.tree import DraftTree
from decoder.drafters._util import (
    SEP, GramIndex, accepted_depth, continuation_rows, tree_depths, trie_from_rows,
)

tokens = st.lists(st.integers(0, 4), min_size=0, max_size=60)


def brute_find(buf: list[int], gram: list[int]) -> list[int]:
    m = len(gram)
    return [e for e in range(m, len(buf) + 1) if buf[e - m : e] == gram]


@settings(max_examples=60, deadline=None)
@given(chunks=st.lists(tokens, min_size=1, max_size=5), seps=st.lists(st.booleans(), min_size=5, max_size=5),
       m=st.integers(1, 5), gram=st.lists(st.integers(0, 4), min_size=5, max_size=5))
def test_gram_index_finds_every_occurrence(chunks, seps, m, gram):
    index = GramIndex([m])
    buf: list[int] = []
    for chunk, sep in zip(chunks, seps):  # grows in pieces, like a decode
        piece = chunk + ([SEP] if sep else [])
        index.extend(np.array(piece, dtype=np.int64))
        buf += piece
        for g in (gram[:m], buf[-m:] if len(buf) >= m else None):
            if g is None or SEP in g:
                continue
            assert index.find(np.array(g)).tolist() == brute_find(buf, g)
    assert index.tokens.tolist() == buf


def test_gram_index_long_grams_survive_hash_collisions():
    # order 6 uses a wrapping hash; every hit is verified against the buffer
    rng = np.random.default_rng(0)
    buf = rng.integers(0, 3, size=3000)
    index = GramIndex([6])
    index.extend(buf)
    for start in range(0, 2990, 97):
        g = buf[start : start + 6].tolist()
        assert index.find(np.array(g)).tolist() == brute_find(buf.tolist(), g)


def test_gram_index_rejects_unindexed_order():
    index = GramIndex([2])
    index.extend(np.arange(5))
    with pytest.raises(AssertionError, match="order 3 is not indexed"):
        index.find(np.array([1, 2, 3]))


def test_continuation_rows_stop_at_separator_and_end():
    buf = np.array([1, 2, 3, SEP, 4, 5], dtype=np.int64)
    rows = continuation_rows(buf, np.array([1, 4, 5]), 4)
    assert rows.tolist() == [[2, 3, -1, -1], [4, 5, -1, -1], [5, -1, -1, -1]]


def naive_trie_paths(rows: list[list[int]]) -> dict[tuple[int, ...], int]:
    out: dict[tuple[int, ...], int] = {}
    for r in rows:
        path: tuple[int, ...] = ()
        for t in r:
            if t < 0:
                break
            path += (t,)
            out[path] = out.get(path, 0) + 1
    return out


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.lists(st.integers(-1, 3), min_size=4, max_size=4), min_size=1, max_size=20),
       budget=st.integers(1, 40), depth=st.integers(1, 5))
def test_trie_from_rows_matches_naive_counts_and_best_first(rows, budget, depth):
    arr = np.array(rows, dtype=np.int64)
    arr = np.where(np.cumprod(arr >= 0, axis=1).astype(bool), arr, -1)  # PAD-terminated
    full = naive_trie_paths(arr.tolist())
    tree = trie_from_rows(arr, budget, depth, "x", match_len=3)
    got = tree.paths()
    assert len(tree) <= budget and tree.match_len == 3 and tree.source == "x"
    assert all(len(p) <= depth for p in got)
    assert all(full[p] == c for p, c in got.items())  # every path occurs, with its exact count
    assert all(p[:-1] in got for p in got if len(p) > 1)  # ancestor-closed
    reachable = {p: c for p, c in full.items() if len(p) <= depth}
    assert len(tree) == min(budget, len(reachable))
    frontier = [c for p, c in reachable.items() if p not in got and (len(p) == 1 or p[:-1] in got)]
    if frontier:  # best-first: nothing left out outweighs what was kept
        assert max(frontier) <= min(got.values())


def test_tree_depths_and_accepted_depth():
    tree = DraftTree(np.array([5, 6, 7, 8, 9]), np.array([-1, 0, 0, 2, -1]), np.array([3, 1, 1, 1, 1]))
    assert tree_depths(tree.parents).tolist() == tree.depths().tolist() == [1, 2, 2, 3, 1]
    assert accepted_depth(tree, np.array([5, 7, 8, 1])) == 3
    assert accepted_depth(tree, np.array([5, 6, 9])) == 2
    assert accepted_depth(tree, np.array([1, 5])) == 0
    assert accepted_depth(DraftTree.empty(), np.array([1])) == 0
