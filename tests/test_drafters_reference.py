"""ReferenceDrafter (LLMA copy) against a brute-force search of every occurrence."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from datastore.tree import DraftTree, reselect
from decoder.drafters.reference import ReferenceDrafter, ReferenceSettings

SEP = -1


def naive_reference_tree(refs, context, s: ReferenceSettings, floor: int, copy_len: int, budget: int,
                         max_depth: int) -> DraftTree:
    """Scan every position of every text for the longest matching suffix; count continuations."""
    buf: list[int] = []
    for r in refs:
        buf += list(r) + [SEP]
    buf += list(context)
    n = len(buf)
    for L in range(min(s.max_match, len(context)), floor - 1, -1):
        suffix = buf[n - L :]
        starts = [e for e in range(L, n) if buf[e - L : e] == suffix and buf[e] != SEP]
        if starts:
            break
    else:
        return DraftTree.empty("reference")
    starts = starts[-s.max_occurrences :]
    total: dict[tuple[int, ...], int] = {}
    for e in starts:
        path: tuple[int, ...] = ()
        for t in buf[e : e + min(copy_len, max_depth)]:
            if t == SEP:
                break
            path += (t,)
            total[path] = total.get(path, 0) + 1
    paths = sorted(total, key=lambda p: (len(p), p))
    index = {p: i for i, p in enumerate(paths)}
    full = DraftTree([p[-1] for p in paths], [index[p[:-1]] if len(p) > 1 else -1 for p in paths],
                     [total[p] for p in paths], L, "reference")
    return reselect(full, budget, max_depth)


texts = st.lists(st.integers(0, 3), min_size=0, max_size=40)


@settings(max_examples=80, deadline=None)
@given(refs=st.lists(texts, max_size=3), prompt=st.lists(st.integers(0, 3), min_size=1, max_size=30),
       steps=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4), max_size=4),
       budget=st.integers(1, 30), max_depth=st.integers(1, 8), min_match=st.integers(1, 3),
       max_occ=st.integers(1, 6))
def test_reference_matches_brute_force(refs, prompt, steps, budget, max_depth, min_match, max_occ):
    s = ReferenceSettings(min_match=min_match, max_match=6, start_copy=5, max_occurrences=max_occ,
                          adaptive=False)
    drafter = ReferenceDrafter(s)
    drafter.begin(0, np.array(prompt), [np.array(r) for r in refs])
    context = list(prompt)
    for accepted in [[]] + steps:  # the output grows between proposals
        context += accepted
        got = drafter.propose(0, np.array(context), budget, max_depth)
        want = naive_reference_tree(refs, context, s, min_match, 5, budget, max_depth)
        assert got.paths() == want.paths()
        assert got.match_len == want.match_len
        assert len(got) <= budget and (not len(got) or got.depths().max() <= max_depth)


def test_every_occurrence_contributes_weighted_by_frequency():
    # "a b" is followed by "c d" twice and by "e" once across the references and the prompt
    a, b, c, d, e = 10, 11, 12, 13, 14
    drafter = ReferenceDrafter()
    drafter.begin(0, np.array([1, a, b, c, d, 2, a, b]), [np.array([a, b, c, d, 3]), np.array([5, a, b, e])])
    tree = drafter.propose(0, np.array([1, a, b, c, d, 2, a, b]), 16, 8)
    paths = tree.paths()
    assert paths[(c,)] == 2 and paths[(c, d)] == 2 and paths[(e,)] == 1
    assert tree.tokens[0] == c  # best-first: the most frequent continuation first
    assert tree.match_len == 2


def test_longest_suffix_wins():
    # "x a b" occurs once (followed by 7); "a b" alone also occurs followed by 8
    drafter = ReferenceDrafter()
    drafter.begin(0, np.array([9, 1, 2]), [np.array([9, 1, 2, 7, 0, 0, 1, 2, 8])])
    tree = drafter.propose(0, np.array([9, 1, 2]), 8, 4)
    assert tree.match_len == 3 and tree.tokens[0] == 7 and (8,) not in tree.paths()


def test_copy_never_crosses_a_reference_boundary():
    drafter = ReferenceDrafter()
    drafter.begin(0, np.array([4, 5]), [np.array([4, 5, 6]), np.array([7, 8, 9])])
    tree = drafter.propose(0, np.array([4, 5]), 8, 8)
    assert tree.paths() == {(6,): 1}


def test_adaptivity_copy_length_and_match_floor_move_with_acceptance():
    ref = np.arange(100, 160)
    s = ReferenceSettings(min_match=2, max_match=8, min_copy=2, start_copy=4, max_copy=16)
    drafter = ReferenceDrafter(s)
    drafter.begin(0, np.array([100, 101]), [ref])
    ctx = [100, 101]
    tree = drafter.propose(0, np.array(ctx), 64, 32)
    assert tree.depths().max() == 4
    drafter.observe(0, np.arange(102, 107))  # all 4 accepted + bonus: copy further
    assert drafter.state(0) == (2, 8)
    ctx += list(range(102, 107))
    tree = drafter.propose(0, np.array(ctx), 64, 32)
    assert tree.depths().max() == 8
    drafter.observe(0, np.array([107, 108, 999]))  # 2 of 8 accepted: shrink toward that
    assert drafter.state(0) == (2, (8 + 2 + 1) // 2)
    ctx += [107, 108, 999]
    drafter.propose(0, np.array(ctx), 64, 32)  # "108 999" never occurred: nothing proposed
    drafter.observe(0, np.array([1]))
    assert drafter.state(0) == (2, 5)  # no proposal: the copy length stays, the floor is at its minimum
    drafter2 = ReferenceDrafter(s)
    drafter2.begin(0, np.array([5, 6]), [np.array([5, 6, 7, 8])])
    drafter2.propose(0, np.array([5, 6]), 8, 8)
    drafter2.observe(0, np.array([3]))  # rejected at the first token: demand longer matches
    assert drafter2.state(0) == (3, 4)
    assert not len(drafter2.propose(0, np.array([5, 6, 3]), 8, 8))
    drafter2.observe(0, np.array([5]))  # a step without any match relaxes the floor again
    assert drafter2.state(0) == (2, 4)


def test_match_floor_relaxes_after_a_hit():
    s = ReferenceSettings(min_match=2, max_match=8, start_copy=4)
    drafter = ReferenceDrafter(s)
    drafter.begin(0, np.array([1, 2, 3]), [np.array([1, 2, 3, 4, 5, 6, 7, 8])])
    drafter._rows[0].match_floor = 4
    tree = drafter.propose(0, np.array([1, 2, 3]), 8, 8)
    assert not len(tree)  # only a 3-token match exists
    drafter._rows[0].match_floor = 3
    tree = drafter.propose(0, np.array([1, 2, 3]), 8, 8)
    drafter.observe(0, np.array([4, 5, 0]))
    assert drafter.state(0)[0] == 2


def test_rows_are_independent_and_end_drops_state():
    drafter = ReferenceDrafter()
    drafter.begin(0, np.array([1, 2, 3, 1, 2]))
    drafter.begin(1, np.array([1, 2, 4, 1, 2]))
    assert drafter.propose(0, np.array([1, 2, 3, 1, 2]), 4, 4).tokens[0] == 3
    assert drafter.propose(1, np.array([1, 2, 4, 1, 2]), 4, 4).tokens[0] == 4
    drafter.end(0)
    with pytest.raises(KeyError):
        drafter.state(0)


def test_context_that_does_not_extend_the_row_is_an_error():
    drafter = ReferenceDrafter()
    drafter.begin(0, np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="call begin"):
        drafter.propose(0, np.array([1, 2]), 4, 4)


@pytest.mark.parametrize("kwargs, field", [
    ({"min_match": 0}, "min_match"), ({"max_match": 1, "min_match": 2}, "max_match"),
    ({"min_copy": 5, "start_copy": 4}, "copy"), ({"max_occurrences": 0}, "max_occurrences"),
])
def test_settings_are_validated(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ReferenceSettings(**kwargs)


def test_bad_tokens_are_rejected_with_the_field_name():
    drafter = ReferenceDrafter()
    with pytest.raises(ValueError, match=r"references\[1\]"):
        drafter.begin(0, np.array([1, 2]), [np.array([1]), np.array([-3])])
    with pytest.raises(ValueError, match="prompt"):
        drafter.begin(0, np.zeros((2, 2), dtype=np.int64))
