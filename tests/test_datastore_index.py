"""SuffixIndex search and exact weighted-trie drafting against brute-force references (no LMDB)."""
from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import datastore.index as index_mod
from datastore.index import SuffixIndex, count_in, draft_from, pattern_range, split_children
from datastore_naive import backoff_length, count, longest_match, make_index, reference_draft, stream

VOCAB = 5  # tiny: many repeats, many ties
SETTINGS = settings(max_examples=80, deadline=None)

docs_st = st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=60), min_size=1, max_size=8)
context_st = st.lists(st.integers(0, VOCAB - 1), min_size=0, max_size=9)
pattern_st = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=5)


def split_docs(docs, cuts):
    """docs cut into consecutive groups (shards) at the given points."""
    bounds = sorted({min(c, len(docs)) for c in cuts})
    groups, start = [], 0
    for b in bounds + [len(docs)]:
        groups.append(docs[start:b])
        start = b
    return groups


SAMPLING_MODES = [  # every range sampled with strides > 1, hunted sparsely to densely
    dict(SAMPLES=1, DENSITY=1),
    dict(SAMPLES=2, DENSITY=3),
    dict(SAMPLES=3, DENSITY=1),
    dict(SAMPLES=2, DENSITY=64),
    dict(SAMPLES=1 << 40, DENSITY=1),  # every range read whole
]


def force_sampling(mode: int = 0):
    return mock.patch.multiple(index_mod, **SAMPLING_MODES[mode])


@SETTINGS
@given(docs=docs_st, pattern=pattern_st)
def test_count_equals_brute_force(docs, pattern):
    ix = make_index(docs, VOCAB)
    assert count_in([ix], pattern) == count(docs, pattern)


@SETTINGS
@given(docs=docs_st, pattern=pattern_st, cuts=st.lists(st.integers(0, 8), max_size=3))
def test_count_sums_over_indexes(docs, pattern, cuts):
    indexes = [make_index(g, VOCAB) for g in split_docs(docs, cuts)]
    assert count_in(indexes, pattern) == count(docs, pattern)


@SETTINGS
@given(docs=docs_st, pattern=pattern_st)
def test_pattern_range_holds_exactly_the_matching_suffixes(docs, pattern):
    ix = make_index(docs, VOCAB)
    lo, hi = pattern_range(ix, pattern)
    tokens = ix.tokens.astype(np.int64)
    heads = [tuple(tokens[s:s + len(pattern)]) for s in ix.sa.tolist()]
    inside = [i for i, h in enumerate(heads) if h == tuple(pattern)]
    assert (lo, hi) == ((inside[0], inside[-1] + 1) if inside else (lo, lo))


@SETTINGS
@given(docs=docs_st, context=context_st, budget=st.sampled_from([1, 2, 5, 64]),
       max_depth=st.integers(1, 6), max_suffix=st.integers(1, 5), min_suffix=st.integers(1, 3))
def test_draft_is_the_exact_best_first_trie(docs, context, budget, max_depth, max_suffix, min_suffix):
    min_suffix = min(min_suffix, max_suffix)
    ix = make_index(docs, VOCAB)
    got = draft_from([ix], context, budget, max_depth, max_suffix, min_suffix)
    want = reference_draft(docs, context, budget, max_depth, max_suffix, min_suffix)
    assert got.same_as(want), (got.paths(), want.paths())
    assert got.match_len == longest_match(docs, context, max_suffix, min_suffix) or len(context) < min_suffix


@SETTINGS
@given(docs=docs_st, context=context_st, cuts=st.lists(st.integers(0, 8), max_size=3),
       budget=st.sampled_from([1, 5, 64]), max_suffix=st.integers(1, 9), min_suffix=st.integers(1, 3),
       min_count=st.sampled_from([1, 2, 3, 5, 20]))
def test_backoff_draft_is_the_brute_force_trie_of_the_longest_frequent_suffix(
        docs, context, cuts, budget, max_suffix, min_suffix, min_count):
    min_suffix = min(min_suffix, max_suffix)
    shards = [make_index(g, VOCAB) for g in split_docs(docs, cuts)]  # counts summed over shards
    got = draft_from(shards, context, budget, 5, max_suffix, min_suffix, min_count=min_count)
    want = reference_draft(docs, context, budget, 5, max_suffix, min_suffix, min_count)
    assert got.same_as(want), (got.paths(), want.paths())
    if len(context) >= min_suffix:
        assert got.match_len == backoff_length(docs, context, max_suffix, min_suffix, min_count)


def test_backoff_prefers_a_frequent_shorter_suffix_and_falls_back_to_the_longest_match():
    # [1, 2] is seen 3 times (always followed by 3), [0, 1, 2] once (followed by 4)
    docs = [[0, 1, 2, 4], [1, 2, 3], [1, 2, 3]]
    ix = make_index(docs, VOCAB)
    assert draft_from([ix], [0, 1, 2], budget=1, max_depth=1).paths() == {(4,): 1}
    backed = draft_from([ix], [0, 1, 2], budget=1, max_depth=1, min_count=3)
    assert backed.match_len == 2 and backed.paths() == {(3,): 2}
    rare = draft_from([ix], [0, 1, 2], budget=1, max_depth=1, min_count=4)  # [2] is seen 3 times
    assert rare.match_len == 3 and rare.paths() == {(4,): 1}
    whole = draft_from([ix], [0, 1, 2], budget=1, max_depth=1, max_suffix=3, min_count=3)
    assert whole.match_len == 3 and whole.paths() == {(4,): 1}  # the whole window matched: kept


@SETTINGS
@given(docs=docs_st, context=context_st, cuts=st.lists(st.integers(0, 8), min_size=1, max_size=4),
       budget=st.sampled_from([1, 3, 64]))
def test_sharded_draft_equals_unsharded(docs, context, cuts, budget):
    whole = draft_from([make_index(docs, VOCAB)], context, budget, 5, 4)
    shards = [make_index(g, VOCAB) for g in split_docs(docs, cuts)]  # some may be empty
    assert draft_from(shards, context, budget, 5, 4).same_as(whole)


@SETTINGS
@given(docs=docs_st, context=context_st, cuts=st.lists(st.integers(0, 8), max_size=3),
       budget=st.sampled_from([1, 4, 64]), mode=st.integers(0, len(SAMPLING_MODES) - 1))
def test_sampled_splitting_is_exact(docs, context, cuts, budget, mode):
    shards = [make_index(g, VOCAB) for g in split_docs(docs, cuts)]
    with force_sampling(mode):
        got = draft_from(shards, context, budget, 5, 4)
    assert got.same_as(reference_draft(docs, context, budget, 5, 4))


def test_every_node_count_is_the_count_of_suffix_plus_path():
    rng = np.random.default_rng(7)
    docs = [rng.integers(0, 4, rng.integers(20, 400)) for _ in range(30)]
    ix = make_index(docs, 4)
    checked = 0
    for _ in range(20):
        context = rng.integers(0, 4, 12)
        tree = draft_from([ix], context, budget=40, max_depth=8, max_suffix=6)
        assert len(tree) > 0 and tree.match_len == longest_match(docs, context, 6, 1)
        suffix = tuple(context[len(context) - tree.match_len:].tolist())
        for path, c in tree.paths().items():
            assert c == count(docs, suffix + path) > 0
            checked += 1
    assert checked > 200


def test_large_ranges_are_sampled_and_exact():
    """A range of ~100k suffixes (one frequent token) is split by sampling: same tree as the
    brute-force trie, far fewer values read than the range holds."""
    rng = np.random.default_rng(3)
    docs = [np.where(rng.random(5000) < 0.5, 0, rng.integers(1, 300, 5000)) for _ in range(40)]
    ix = make_index(docs, 300)
    assert pattern_range(ix, [0])[1] - pattern_range(ix, [0])[0] > 100 * index_mod.SAMPLES
    for context in ([7, 0], [5, 9, 0], [299]):
        got = draft_from([ix], context, budget=64, max_depth=3, max_suffix=3)
        assert got.same_as(reference_draft(docs, context, 64, 3, 3))
        assert got.match_len >= 1


def test_no_path_crosses_a_document():
    sep = 3
    docs = [[0, 1, 2], [0, 1], [2, 0, 1, 2, 2], [1]]
    ix = make_index(docs, sep)
    tree = draft_from([ix], [0, 1], budget=64, max_depth=8, max_suffix=4)
    assert sep not in tree.tokens.tolist()
    assert tree.paths() == {(2,): 2, (2, 2): 1}
    # [2, 2] ends a document: its only continuation is the separator, which is never drafted
    ends = draft_from([ix], [2, 2], budget=64, max_depth=8)
    assert len(ends) == 0 and ends.match_len == 2


def test_separator_and_foreign_ids_in_context_act_as_barriers():
    sep = 4
    docs = [[0, 1, 2, 3], [1, 2, 0]]
    ix = make_index(docs, sep)
    clean = draft_from([ix], [1, 2], max_suffix=8)
    for noise in ([sep], [sep + 5], [-1], [2**40], [65535]):
        tree = draft_from([ix], [0] + noise + [1, 2], max_suffix=8)
        assert tree.same_as(clean), noise
        assert len(draft_from([ix], [1, 2] + noise, max_suffix=8)) == 0
        assert count_in([ix], [1] + noise) == 0
    assert count_in([ix], [1, 2]) == 2


def test_short_context_and_zero_budget_give_empty_trees():
    ix = make_index([[0, 1, 0, 1]], 2)
    assert len(draft_from([ix], [], budget=8)) == 0
    assert len(draft_from([ix], [0], budget=8, min_suffix=2)) == 0
    assert len(draft_from([ix], [0, 1], budget=0)) == 0
    assert len(draft_from([], [0, 1], budget=8)) == 0
    tree = draft_from([ix], np.array([1, 0], dtype=np.int64), budget=8)
    assert tree.match_len == 2 and tree.paths() == {(1,): 1}


def test_bad_arguments_are_rejected():
    ix = make_index([[0, 1]], 2)
    for kwargs in ({"budget": -1}, {"max_depth": 0}, {"min_suffix": 0}, {"min_suffix": 5, "max_suffix": 4},
                   {"min_count": 0}):
        with pytest.raises(ValueError):
            draft_from([ix], [0], **kwargs)
    with pytest.raises(ValueError):
        count_in([ix], [])
    with pytest.raises(TypeError):
        draft_from([ix], [0.5, 1.5])


def test_uint32_tokens_and_int64_suffix_array():
    vocab = 70_000
    rng = np.random.default_rng(5)
    docs = [np.concatenate([rng.integers(65_530, vocab, 50), [66_000, 69_999, 1]]) for _ in range(20)]
    tokens = stream(docs, vocab, np.uint32)
    ix = make_index(docs, vocab, np.uint32)
    ix64 = SuffixIndex(tokens, ix.sa.astype(np.int64))
    assert ix.separator == vocab
    for pattern in ([66_000, 69_999], [69_999, 1], [1, 66_000], [66_000 - 65_536]):
        assert count_in([ix], pattern) == count_in([ix64], pattern) == count(docs, pattern)
    tree = draft_from([ix64], [5, 66_000], budget=16)
    assert tree.same_as(reference_draft(docs, [5, 66_000], 16)) and tree.match_len == 1
    assert tree.paths()[(69_999,)] == 20


def test_split_children_keeps_only_what_can_be_popped():
    docs = [[0, t] for t in range(1, 9)] + [[0, 1]] * 3 + [[0, 5]] * 2
    ix = make_index(docs, 9)
    ranges = (pattern_range(ix, [0]),)
    everything = split_children([ix], ranges, 1, 9)
    assert [(t, c) for t, c, _ in everything] == [(1, 4), (5, 3), (2, 1), (3, 1), (4, 1), (6, 1), (7, 1), (8, 1)]
    assert [(t, c) for t, c, _ in split_children([ix], ranges, 1, 9, keep=3)] == [(1, 4), (5, 3), (2, 1)]
    assert split_children([ix], ranges, 1, 9, keep=0) == []


def test_split_children_floor():
    """A floor drops exactly the children below it, on a large (sampled) range; another index with
    the same shape gives its own answer."""
    rng = np.random.default_rng(11)
    docs = [np.where(rng.random(3000) < 0.4, 0, rng.integers(1, 40, 3000)) for _ in range(10)]
    ix = make_index(docs, 40)
    ranges = (pattern_range(ix, [0]),)
    assert ranges[0][1] - ranges[0][0] > 4 * index_mod.SAMPLES  # the sampled path
    full = split_children([ix], ranges, 1, 40)
    want = {}
    for d in docs:
        d = d.tolist()
        for a, b in zip(d, d[1:]):
            if a == 0:
                want[b] = want.get(b, 0) + 1
    assert {t: c for t, c, _ in full} == want
    assert [c for _, c, _ in full] == sorted((c for _, c, _ in full), reverse=True)
    floor = full[5][1]
    for keep, fl in ((64, floor), (3, 0), (2, floor), (64, 0)):
        expect = [x for x in full if x[1] >= fl][:keep]
        assert split_children([ix], ranges, 1, 40, keep, fl) == expect
    other = make_index([d[::-1] for d in docs], 40)  # same shape, other contents
    assert split_children([other], ranges, 1, 40)[:3] != full[:3]


def brute_children(docs, prefix: list[int], vocab: int) -> list[tuple[int, int]]:
    """[(token, count of prefix + [token])], larger count first, then smaller token."""
    found = [(t, count(docs, prefix + [t])) for t in range(vocab)]
    return sorted(((t, c) for t, c in found if c), key=lambda x: (-x[1], x[0]))


@settings(max_examples=150, deadline=None)
@given(docs=docs_st, prefix=st.lists(st.integers(0, VOCAB - 1), min_size=0, max_size=3),
       cuts=st.lists(st.integers(0, 8), max_size=3), keep=st.integers(1, 7), floor=st.integers(0, 12),
       waiting=st.lists(st.integers(1, 40), max_size=8), samples=st.integers(1, 5),
       density=st.integers(1, 4))
def test_kernel_split_is_the_exact_best_children(docs, prefix, cuts, keep, floor, waiting, samples,
                                                 density):
    """_kernel.split against brute force, every sampling density: the children are exactly the
    best `keep` of those counting >= the returned cut, with their exact sub-ranges; and a child
    left out below the cut is below floor or outranked by keep siblings and waiting nodes."""
    shards = [make_index(g, VOCAB) for g in split_docs(docs, cuts)]
    ranges = tuple(pattern_range(ix, prefix) if ix.n else (0, 0) for ix in shards)
    waiting = sorted(waiting, reverse=True)
    kids, cut = index_mod._kernel.split(tuple(ix.kernel for ix in shards), ranges, len(prefix), VOCAB,
                                        keep, floor, waiting, samples, density)
    full = brute_children(docs, prefix, VOCAB)
    assert [(t, c) for t, c, _ in kids] == [x for x in full if x[1] >= cut][:keep]
    rivals = sorted([c for _, c in full] + waiting[:keep], reverse=True)
    bar = max(floor, 1, rivals[keep - 1] if len(rivals) >= keep else 0)  # the best possible cut
    assert max(floor, 1) <= cut <= bar
    assert {t for t, c in full[:keep] if c >= bar} <= {t for t, _, _ in kids}
    for t, c, (k, child, c2) in kids:
        assert k == len(prefix) + 1 and c2 == c
        for ix, (lo, hi) in zip(shards, child):
            want = pattern_range(ix, prefix + [t]) if ix.n else (0, 0)
            assert hi - lo == want[1] - want[0] and (lo == hi or (lo, hi) == want)


@settings(max_examples=80, deadline=None)
@given(docs=docs_st, pattern=pattern_st, a=st.integers(0, 400), b=st.integers(0, 400))
def test_pattern_range_inside_a_window(docs, pattern, a, b):
    """pattern_range(lo, hi) finds exactly the matching suffixes inside the window."""
    ix = make_index(docs, VOCAB)
    lo, hi = sorted((min(a, ix.n), min(b, ix.n)))
    got = pattern_range(ix, pattern, lo, hi)
    tokens = ix.tokens.astype(np.int64)
    inside = [i for i in range(lo, hi)
              if tuple(tokens[ix.sa[i]:ix.sa[i] + len(pattern)]) == tuple(pattern)]
    assert got[1] - got[0] == len(inside)
    if inside:
        assert got == (inside[0], inside[-1] + 1)


def test_kernel_rejects_bad_arguments():
    ix = make_index([[0, 1, 2]], 3)
    with pytest.raises(TypeError):
        index_mod._kernel.Shard(ix.tokens.astype(np.int8), ix.sa, ix.starts)
    with pytest.raises(ValueError):
        index_mod._kernel.Shard(ix.tokens, ix.sa[:-1], ix.starts)
    with pytest.raises(ValueError):
        index_mod._kernel.split((ix.kernel,), ((0, ix.n + 1),), 0, 3, 4, 0, [], 8, 2)
    with pytest.raises(ValueError):
        index_mod._kernel.split((ix.kernel,), (), 0, 3, 4, 0, [], 8, 2)
    with pytest.raises(TypeError):
        index_mod._kernel.split(("not a shard",), ((0, 1),), 0, 3, 4, 0, [], 8, 2)
    with pytest.raises(ValueError):
        pattern_range(ix, [0], 2, 1)


@settings(max_examples=60, deadline=None)
@given(docs=docs_st, prefix=st.lists(st.integers(0, VOCAB - 1), min_size=0, max_size=2),
       cuts=st.lists(st.integers(0, 8), max_size=2),
       calls=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 10),
                                st.lists(st.integers(1, 30), max_size=6)), min_size=1, max_size=6))
def test_split_children_answers_any_keep_floor_and_waiting(docs, prefix, cuts, calls):
    """Calls on one node with any keep, floor and waiting nodes, in any order, every range sampled:
    each answer is a prefix of the exact best `keep` (floor applied) holding every child that can
    be popped."""
    shards = [make_index(g, VOCAB) for g in split_docs(docs, cuts)]
    ranges = tuple(pattern_range(ix, prefix) if ix.n else (0, 0) for ix in shards)
    full = brute_children(docs, prefix, VOCAB)
    with force_sampling(0):
        for keep, floor, waiting in calls:
            waiting = sorted(waiting, reverse=True)
            got = [(t, c) for t, c, _ in split_children(shards, ranges, len(prefix), VOCAB, keep,
                                                         floor, waiting)]
            best = [x for x in full if x[1] >= max(floor, 1)][:keep]
            rivals = sorted([c for _, c in full] + waiting[:keep], reverse=True)
            bar = rivals[keep - 1] if len(rivals) >= keep else 0
            assert got == best[:len(got)]
            assert {t for t, c in best if c >= bar} <= {t for t, _ in got}


def test_kernel_split_seeded_sweep():
    """Many small random nodes (2-5 token vocabularies: ties, and bounds that land exactly on the
    cut) through every sampling density, against brute force; hypothesis alone rarely builds the
    cases where a token's upper bound equals the cut."""
    rng = np.random.default_rng(20)
    for _ in range(500):
        vocab = int(rng.integers(2, 6))
        docs = [rng.integers(0, vocab, rng.integers(1, 80)) for _ in range(rng.integers(1, 8))]
        shards = [make_index(g, vocab) for g in split_docs(docs, rng.integers(0, 8, rng.integers(0, 3)))]
        prefix = rng.integers(0, vocab, rng.integers(0, 3)).tolist()
        ranges = tuple(pattern_range(ix, prefix) if ix.n else (0, 0) for ix in shards)
        keep, floor = int(rng.integers(1, 6)), int(rng.integers(0, 6))
        waiting = sorted(rng.integers(1, 20, rng.integers(0, 4)).tolist(), reverse=True)
        kids, cut = index_mod._kernel.split(tuple(ix.kernel for ix in shards), ranges, len(prefix),
                                            vocab, keep, floor, waiting, int(rng.integers(1, 4)),
                                            int(rng.integers(1, 3)))
        full = brute_children(docs, prefix, vocab)
        assert [(t, c) for t, c, _ in kids] == [x for x in full if x[1] >= cut][:keep]
