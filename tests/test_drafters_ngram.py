"""NGramDrafter (ANPD) against brute-force n-gram counts over the token list."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from datastore.tree import DraftTree, expand_best_first
from decoder.drafters._util import SCALE
from decoder.drafters.ngram import NGramDrafter, NGramSettings


def brute_counts(seq: list[int], path: tuple[int, ...], s: NGramSettings) -> tuple[dict[int, int], int]:
    """Next-token counts after the longest suffix of `path` seen in `seq`, highest order first."""
    for k in range(min(s.max_order - 1, len(path)), s.min_order - 2, -1):
        prefix = list(path[len(path) - k :])
        counts: dict[int, int] = {}
        for i in range(k, len(seq)):
            if seq[i - k : i] == prefix:
                counts[seq[i]] = counts.get(seq[i], 0) + 1
        counts = {t: c for t, c in counts.items() if c >= s.min_count}
        if counts:
            return counts, k + 1
    return {}, 0


def naive_ngram_tree(seq: list[int], s: NGramSettings, budget: int, max_depth: int) -> DraftTree:
    def children(handle):
        path, weight = handle
        counts, _ = brute_counts(seq, path, s)
        total = sum(counts.values())
        best = sorted(counts, key=lambda t: (-counts[t], t))[: s.max_children]
        out = []
        for t in best:
            w = max(1, weight * counts[t] // total)
            out.append((t, w, ((path + (t,))[-(s.max_order - 1) :], w)))
        return out

    tail = tuple(seq[-(s.max_order - 1) :])
    t, p, c = expand_best_first(children((tail, SCALE)), children, budget, max_depth)
    order = brute_counts(seq, tail, s)[1]
    return DraftTree(t, p, c, order - 1 if len(t) else 0, "ngram")


@settings(max_examples=60, deadline=None)
@given(prompt=st.lists(st.integers(0, 3), min_size=1, max_size=40),
       steps=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4), max_size=4),
       max_order=st.integers(2, 5), min_order=st.integers(2, 3), max_children=st.integers(1, 4),
       min_count=st.integers(1, 2), budget=st.integers(1, 20), max_depth=st.integers(1, 6))
def test_ngram_matches_brute_force(prompt, steps, max_order, min_order, max_children, min_count, budget,
                                   max_depth):
    s = NGramSettings(max_order=max(max_order, min_order), min_order=min_order,
                      max_children=max_children, min_count=min_count)
    drafter = NGramDrafter(s)
    drafter.begin(0, np.array(prompt))
    seq = list(prompt)
    for accepted in [[]] + steps:
        if accepted:
            drafter.observe(0, np.array(accepted))  # the tables learn every accepted token
            seq += accepted
        got = drafter.propose(0, np.array(seq), budget, max_depth)
        want = naive_ngram_tree(seq, s, budget, max_depth)
        assert got.same_as(want), (got.paths(), want.paths())


def test_highest_order_wins_then_falls_back():
    # after "1 2" comes 3 (order 3); after "2" alone comes 4 more often (order 2)
    seq = [1, 2, 3, 5, 2, 4, 6, 2, 4, 7, 1, 2]
    drafter = NGramDrafter(max_order=3)
    drafter.begin(0, np.array(seq))
    tree = drafter.propose(0, np.array(seq), 1, 1)
    assert tree.tokens.tolist() == [3] and tree.match_len == 2
    seq2 = seq + [9, 2]  # "9 2" unseen: falls back to the order-2 table ("2" -> 4 twice, 3 and 9 once)
    drafter.observe(0, np.array([9, 2]))
    tree = drafter.propose(0, np.array(seq2), 3, 1)
    assert tree.tokens.tolist()[0] == 4 and tree.match_len == 1
    assert tree.paths()[(4,)] == SCALE * 2 // 4


def test_weights_are_path_probabilities():
    seq = [1, 2, 1, 3, 1, 2, 1, 2]
    drafter = NGramDrafter(max_order=2)
    drafter.begin(0, np.array(seq))
    paths = drafter.propose(0, np.array(seq), 10, 2).paths()
    # after 2 always 1 (p=1); after 1: 2 (3/4), 3 (1/4)
    assert paths[(1,)] == SCALE
    assert paths[(1, 2)] == SCALE * 3 // 4 and paths[(1, 3)] == SCALE // 4


def test_observe_and_context_catch_up_agree():
    seq = [5, 6, 7, 5, 6]
    a, b = NGramDrafter(), NGramDrafter()
    a.begin(0, np.array(seq[:2]))
    b.begin(0, np.array(seq[:2]))
    a.observe(0, np.array(seq[2:]))
    assert a.propose(0, np.array(seq), 8, 4).same_as(b.propose(0, np.array(seq), 8, 4))
    with pytest.raises(ValueError, match="call begin"):
        a.propose(0, np.array(seq[:3]), 8, 4)


def test_unseen_context_gives_empty_tree():
    drafter = NGramDrafter()
    drafter.begin(0, np.array([1, 2, 3]))
    assert len(drafter.propose(0, np.array([1, 2, 3]), 8, 4)) == 0


@pytest.mark.parametrize("kwargs, field", [
    ({"max_order": 1, "min_order": 1}, "orders"), ({"min_order": 4, "max_order": 3}, "orders"),
    ({"max_children": 0}, "max_children"), ({"min_count": 0}, "min_count"), ({"max_order": 20}, "max_order"),
])
def test_settings_are_validated(kwargs, field):
    with pytest.raises(ValueError, match=field):
        NGramSettings(**kwargs)
