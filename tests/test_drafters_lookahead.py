"""LookaheadDrafter: the Jacobi window's mask, its update and the n-gram pool, against naive code."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from decoder.drafters.lookahead import LookaheadDrafter, LookaheadSettings, window_layout


def test_mask_small_case_by_hand():
    # W = 2 columns, N = 3 (levels 0 and 1); slots: (0,0) (0,1) (1,0) (1,1)
    depths, mask = window_layout(2, 2)
    assert depths.tolist() == [1, 2, 2, 3]
    assert mask.astype(int).tolist() == [
        [1, 0, 0, 0],  # (0,0): itself
        [1, 1, 0, 0],  # (0,1): level-0 chain up to its column
        [1, 0, 1, 0],  # (1,0): level 0 column 0, itself
        [1, 1, 0, 1],  # (1,1): level 0 columns 0..1, itself
    ]


def test_layout_of_the_papers_example():
    # W = 5, N = 4 (Fu et al. 2024, Fig. 2; llama.cpp's lookahead example): level l holds
    # positions l+1 .. l+5; column w is the sequence level0[0..w], level1[w], level2[w]
    W, levels = 5, 3
    depths, mask = window_layout(W, levels)
    assert depths.reshape(levels, W).tolist() == [[1, 2, 3, 4, 5], [2, 3, 4, 5, 6], [3, 4, 5, 6, 7]]
    slot = lambda level, col: level * W + col  # noqa: E731
    want = np.zeros_like(mask)
    for col in range(W):
        seq = [slot(0, c) for c in range(col + 1)] + [slot(lv, col) for lv in range(1, levels)]
        for i, q in enumerate(seq):  # each token attends its sequence up to itself
            want[q, seq[: i + 1]] = True
    assert np.array_equal(mask, want)


@settings(max_examples=40, deadline=None)
@given(W=st.integers(1, 8), N=st.integers(2, 6))
def test_every_window_token_sees_one_token_per_earlier_position(W, N):
    depths, mask = window_layout(W, N - 1)
    assert mask.dtype == np.bool_ and mask.shape == (W * (N - 1),) * 2
    for i in range(mask.shape[0]):
        seen = np.sort(depths[mask[i]])
        assert seen.tolist() == list(range(1, depths[i] + 1))  # a consistent sequence of positions
        assert mask[i, i]


class NaiveLookahead:
    """Lists and dicts, one token at a time: the reference for the window and pool updates."""

    def __init__(self, window: list[list[int]], G: int):
        self.win = [row[:] for row in window]
        self.made = [[False] * len(window[0]) for _ in window]
        self.pool: dict[int, list[tuple[int, ...]]] = {}
        self.G = G
        self.stepped = False

    def side_result(self, argmax: list[int]) -> None:
        levels, W = len(self.win), len(self.win[0])
        out = argmax[(levels - 1) * W :]
        for w in range(W):
            if all(self.made[lv][w] for lv in range(levels)):
                gram = [self.win[lv][w] for lv in range(levels)] + [out[w]]
                lst = self.pool.setdefault(gram[0], [])
                tail = tuple(gram[1:])
                if tail in lst:
                    lst.remove(tail)
                lst.append(tail)
                if len(lst) > self.G:
                    lst.pop(0)
        self.win = self.win[1:] + [list(out)]
        self.made = self.made[1:] + [[True] * W]
        self.stepped = True

    def observe(self, accepted: list[int], fill: np.ndarray) -> None:
        shift = len(accepted) - (1 if self.stepped else 0)
        self.stepped = False
        W = len(self.win[0])
        for _ in range(min(shift, W)):
            for lv in range(len(self.win)):
                self.win[lv] = self.win[lv][1:] + [None]
                self.made[lv] = self.made[lv][1:] + [False]
        return shift


@settings(max_examples=40, deadline=None)
@given(W=st.integers(1, 5), N=st.integers(2, 5), G=st.integers(1, 3),
       steps=st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 3), min_size=1, max_size=4),
                                st.integers(0, 2 ** 31)), min_size=1, max_size=12))
def test_window_and_pool_updates_match_naive(W, N, G, steps):
    drafter = LookaheadDrafter(window=W, ngram=N, pool=G)
    drafter.begin(0, np.array([0, 1, 2, 3]))
    naive = NaiveLookahead(drafter.window_of(0).tolist(), G)
    for use_side, accepted, seed in steps:
        if use_side:  # the decoder may leave the window out of a forward (cost model)
            branch = drafter.side_branch(0)
            assert branch.tokens.tolist() == sum(naive.win, [])
            argmax = np.random.default_rng(seed).integers(0, 4, size=W * (N - 1))
            drafter.side_result(0, argmax)
            naive.side_result(argmax.tolist())
        drafter.observe(0, np.array(accepted))
        naive.observe(accepted, None)
        got = drafter.window_of(0)
        for lv in range(N - 1):  # refilled columns are random draws from the context
            for w in range(W):
                if naive.win[lv][w] is None:
                    naive.win[lv][w] = int(got[lv, w])
                    assert 0 <= got[lv, w] <= 3
        assert got.tolist() == naive.win
        assert drafter.pool_of(0) == naive.pool


def test_jacobi_window_converges_to_a_bigram_models_ngrams():
    """With a model whose next token depends only on the current one, argmax after each window
    token is f(token); Jacobi iteration must harvest the true n-grams t, f(t), f(f(t)), ..."""
    V = 7
    f = lambda t: (3 * t + 1) % V  # noqa: E731
    drafter = LookaheadDrafter(window=3, ngram=4, pool=5)
    out = [0, 1, 2]
    drafter.begin(0, np.array(out))
    for _ in range(12):
        branch = drafter.side_branch(0)
        drafter.side_result(0, np.array([f(t) for t in branch.tokens.tolist()]))
        nxt = f(out[-1])
        out.append(nxt)
        drafter.observe(0, np.array([nxt]))
    pool = drafter.pool_of(0)
    assert pool, "nothing harvested"
    for first, tails in pool.items():
        for tail in tails:  # every harvested n-gram is a true trajectory of the model
            seq = (first,) + tail
            assert all(seq[i + 1] == f(seq[i]) for i in range(len(seq) - 1))
    assert out[-1] in pool
    tree = drafter.propose(0, np.array(out), 8, 3)
    want = (f(out[-1]), f(f(out[-1])), f(f(f(out[-1]))))
    assert tree.paths() == {want[:1]: 1, want[:2]: 1, want: 1}


def test_pool_is_lru_with_g_entries_per_key():
    drafter = LookaheadDrafter(window=1, ngram=2, pool=2)  # one column, one level: 2-grams
    drafter.begin(0, np.array([5]))
    drafter._rows[0].made[:] = True
    for nxt in (1, 2, 1, 3):  # key 5 each time: 1, 2, 1 (refreshed), 3 evicts 2
        drafter._rows[0].window[:] = 5
        drafter.side_result(0, np.array([nxt]))
        drafter.observe(0, np.array([0]))
    assert drafter.pool_of(0) == {5: [(1,), (3,)]}
    tree = drafter.propose(0, np.array([9, 5]), 8, 4)
    assert tree.paths() == {(1,): 1, (3,): 1} and tree.source == "lookahead"
    assert len(drafter.propose(0, np.array([9, 4]), 8, 4)) == 0


def test_side_branch_shapes_and_no_state_without_begin():
    drafter = LookaheadDrafter(window=4, ngram=3)
    assert drafter.side_branch(0) is None
    drafter.begin(2, np.arange(10))
    branch = drafter.side_branch(2)
    assert branch.tokens.shape == (8,) and branch.depths.shape == (8,) and branch.mask.shape == (8, 8)
    assert drafter.side_tokens == 8
    with pytest.raises(AssertionError, match="argmax"):
        drafter.side_result(2, np.zeros(3, dtype=np.int64))
    drafter.end(2)
    assert drafter.side_branch(2) is None


def test_every_k_steps_the_window_rides_and_stays_aligned():
    drafter = LookaheadDrafter(window=4, ngram=3, every=2)
    drafter.begin(0, np.arange(20))
    before = drafter.window_of(0)
    assert drafter.side_branch(0) is not None
    drafter.side_result(0, np.arange(8))
    drafter.observe(0, np.array([7]))
    assert drafter.side_branch(0) is None  # skipped step: no Jacobi update, shift by what was committed
    drafter.observe(0, np.array([8]))
    after = drafter.window_of(0)
    assert after[0, :3].tolist() == before[1, 1:].tolist()  # level 1 moved to level 0, then one column left
    assert after[1, :3].tolist() == list(range(5, 8))  # the argmax row, one column left
    assert drafter.side_branch(0) is not None


@pytest.mark.parametrize("kwargs, field", [
    ({"window": 0}, "window"), ({"ngram": 1}, "ngram"), ({"pool": 0}, "pool"), ({"every": 0}, "every"),
])
def test_settings_are_validated(kwargs, field):
    with pytest.raises(ValueError, match=field):
        LookaheadSettings(**kwargs)
