"""RecycleDrafter (Token Recycling) against a dict-based successor table."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from decoder.drafters._util import SCALE
from decoder.drafters.recycle import RecycleDrafter, RecycleSettings


def naive_paths(table: dict[int, list[int]], last: int, weights, max_depth: int) -> dict[tuple[int, ...], int]:
    """Every known path from `last` through the successor dict, weighted like the template."""
    out: dict[tuple[int, ...], int] = {}
    frontier = [((), last, SCALE)]
    for _ in range(max_depth):
        nxt = []
        for path, tok, weight in frontier:
            for r, succ in enumerate(table.get(tok, [])):
                w = max(1, int(weight * weights[r]))
                out[path + (succ,)] = w
                nxt.append((path + (succ,), succ, w))
        frontier = nxt
    return out


@settings(max_examples=60, deadline=None)
@given(updates=st.lists(st.tuples(st.integers(0, 9), st.permutations(list(range(10)))), max_size=12),
       k=st.integers(1, 3), last=st.integers(0, 9), budget=st.integers(1, 30), max_depth=st.integers(1, 3),
       vocab=st.sampled_from([0, 4, 10]))
def test_recycle_matches_dict_table(updates, k, last, budget, max_depth, vocab):
    weights = (0.5, 0.2, 0.1)[:k]
    drafter = RecycleDrafter(k=k, rank_weights=weights, vocab_size=vocab)
    table: dict[int, list[int]] = {}
    for i in range(0, len(updates), 3):  # batches of verified positions, as the decoder sends them
        batch = updates[i : i + 3]
        toks = np.array([t for t, _ in batch], dtype=np.int64)
        topk = np.array([p[:5] for _, p in batch], dtype=np.int64)  # the decoder may send more than k
        drafter.observe_topk(toks, topk)
        for t, p in batch:
            table[t] = list(p[:k])
    assert drafter.table.dtype == np.int32 and drafter.table.shape[1] == k
    for t in range(drafter.table.shape[0]):
        assert drafter.table[t].tolist() == table.get(t, [-1] * k)
    tree = drafter.propose(0, np.array([3, last]), budget, max_depth)
    full = naive_paths(table, last, weights, max_depth)
    got = tree.paths()
    assert len(tree) == min(budget, len(full))
    assert all(full[p] == c for p, c in got.items())
    assert all(p[:-1] in got for p in got if len(p) > 1)
    frontier = [c for p, c in full.items() if p not in got and (len(p) == 1 or p[:-1] in got)]
    if frontier:
        assert max(frontier) <= min(got.values())


def test_tree_follows_successors_and_ranks():
    drafter = RecycleDrafter(k=2, rank_weights=(0.6, 0.3))
    drafter.observe_topk(np.array([1, 2, 3]), np.array([[2, 3], [4, 5], [6, 7]]))
    tree = drafter.propose(0, np.array([1]), 6, 2)
    paths = tree.paths()
    assert set(paths) == {(2,), (3,), (2, 4), (2, 5), (3, 6), (3, 7)}
    assert tree.tokens[0] == 2  # rank 0 first
    # count / parent count = the rank's prior
    assert paths[(2, 5)] == int(paths[(2,)] * 0.3)


def test_table_persists_across_requests_and_grows():
    drafter = RecycleDrafter(k=2)
    drafter.begin(0, np.array([1]))
    drafter.observe_topk(np.array([5000]), np.array([[7, 8]]))
    drafter.end(0)
    drafter.begin(0, np.array([2]))
    assert drafter.table.shape[0] > 5000
    assert drafter.propose(0, np.array([5000]), 4, 1).tokens.tolist() == [7, 8]
    assert len(drafter.propose(0, np.array([4999]), 4, 1)) == 0  # unknown successor
    assert len(drafter.propose(0, np.array([10**6]), 4, 1)) == 0  # beyond the table


def test_topk_attribute_asks_the_decoder_for_successors():
    assert RecycleDrafter(k=5).topk == 5


@pytest.mark.parametrize("kwargs, field", [
    ({"k": 0}, "k must"), ({"vocab_size": -1}, "vocab_size"), ({"k": 3, "rank_weights": (0.5, 0.2)}, "rank_weights"),
    ({"k": 2, "rank_weights": (0.2, 0.5)}, "rank_weights"), ({"max_depth": 0}, "max_depth"),
])
def test_settings_are_validated(kwargs, field):
    with pytest.raises(ValueError, match=field):
        RecycleSettings(**kwargs)


@pytest.mark.parametrize("weights", [(0.5, 0.15, 0.08, 0.05, 0.04, 0.03, 0.02, 0.02), (0.5, 0.2, 0.2, 0.1),
                                     (0.3, 0.3, 0.3), (0.9,)])
def test_templates_cut_from_the_shared_expansion_equal_a_direct_one(weights):
    """template() takes the first `budget` nodes of one expansion per depth cap: the same arrays
    as expanding best-first for that budget alone (ties included: equal weights)."""
    from datastore.tree import expand_best_first
    from decoder.drafters._util import SCALE, tree_depths
    from decoder.drafters.recycle import template

    def children(weight):
        return [(r, max(1, int(weight * w)), max(1, int(weight * w))) for r, w in enumerate(weights)]

    for budget in (1, 7, 64, 300, 4096):
        for depth in (1, 2, 3, 5, 8):
            ranks, parents, counts = expand_best_first(children(SCALE), children, budget, depth)
            want = (ranks, parents, tree_depths(parents.astype(np.int64)), counts)
            got = template.__wrapped__(weights, budget, depth)
            assert all(np.array_equal(g, w) for g, w in zip(got, want)), (budget, depth)


@settings(max_examples=80, deadline=None)
@given(batches=st.lists(st.lists(st.tuples(st.integers(-2, 3000), st.lists(st.integers(-1, 5000), min_size=3,
                                                                               max_size=3)),
                                 max_size=6), max_size=5),
       k=st.integers(1, 4), cols=st.integers(0, 3))
def test_observe_topk_keeps_the_latest_successors(batches, k, cols):
    """Against a dict: negative tokens skipped, the latest of a repeated token wins, fewer columns
    than k leave the rest unknown, negative successors are unknown, and the table grows for new
    token ids and successors in any order."""
    drafter = RecycleDrafter(k=k, rank_weights=(0.5, 0.2, 0.1, 0.05)[:k])
    table: dict[int, list[int]] = {}
    for batch in batches:
        toks = np.array([t for t, _ in batch], dtype=np.int64)
        topk = np.array([s[:cols] for _, s in batch], dtype=np.int64).reshape(len(batch), cols)
        drafter.observe_topk(toks, topk)
        for t, s in batch:
            if t >= 0:
                table[t] = [x if x >= 0 else -1 for x in (s[:cols] + [-1] * k)[:k]]
    got = drafter.table
    for t in range(got.shape[0]):
        assert got[t].tolist() == table.get(t, [-1] * k)
    assert set(table) <= set(range(got.shape[0]))
