"""Lookahead decoding: a Jacobi window riding in the verification forward, harvesting n-grams.

Per row a window of N-1 levels x W columns (level-major in the side branch). Token (l, w) sits
at depth w + 1 + l after the last committed token and attends (besides the committed prefix,
which the decoder provides) the level-0 tokens of columns 0..w and the tokens of its own column
at levels 1..l, itself included. So each column w is one sequence
    level0[0..w], level1[w], ..., level{N-2}[w]
of consecutive positions: the mask of Fu et al. 2024 (Fig. 2 / llama.cpp's lookahead example).

After the forward (`side_result`) the model's argmax after (N-2, w) closes the n-gram
(level0[w], ..., level{N-2}[w], argmax) -- harvested into a pool keyed by its first token, at
most G per key, least recently seen evicted -- and the window takes one Jacobi step: levels
move down one (level l <- level l+1) and the last level becomes the argmax row. That step
assumes one committed token; `observe` shifts the columns left by the extra tokens committed
(filling the right end with tokens drawn from the context, like LADE's initialisation).
An n-gram is harvested only once all its window tokens came from the model, not the random fill.
`propose` returns the pool's n-grams that start with the last context token, as a trie.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Sequence

import numpy as np

from datastore.tree import DraftTree
from decoder.drafters._util import TokenBuffer, as_tokens, empty_tree, lists_tree, token_list, trie_lists
from decoder.drafters.base import Drafter, SideBranch


@dataclass(frozen=True)
class LookaheadSettings:
    window: int = 5  # W: columns (positions looked ahead at once)
    ngram: int = 4  # N: n-gram size; the window has N-1 levels
    pool: int = 5  # G: n-grams kept per first token
    seed: int = 0  # random fill of the window from the context
    every: int = 1  # ride in one forward out of `every` (the window costs W*(N-1) tokens a forward)

    def __post_init__(self) -> None:
        if not 1 <= self.window <= 64:
            raise ValueError(f"lookahead window (W) must be in 1..64, got {self.window}")
        if not 2 <= self.ngram <= 16:
            raise ValueError(f"lookahead ngram (N) must be in 2..16, got {self.ngram}")
        if self.pool < 1:
            raise ValueError(f"lookahead pool (G) must be >= 1, got {self.pool}")
        if self.every < 1:
            raise ValueError(f"lookahead every must be >= 1, got {self.every}")


@lru_cache(maxsize=16)
def window_layout(window: int, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """(depths [m] int64, mask [m, m] bool) of a levels x window Jacobi window, m = levels*window,
    slot i = level * window + column."""
    lvl = np.repeat(np.arange(levels, dtype=np.int64), window)  # [m]
    col = np.tile(np.arange(window, dtype=np.int64), levels)  # [m]
    first_level = (lvl[None, :] == 0) & (col[None, :] <= col[:, None])
    same_column = (lvl[None, :] >= 1) & (lvl[None, :] <= lvl[:, None]) & (col[None, :] == col[:, None])
    mask = first_level | same_column  # [m, m] query i attends key j
    mask.setflags(write=False)
    depths = col + lvl + 1
    depths.setflags(write=False)
    return depths, mask


@dataclass
class _Row:
    window: np.ndarray  # [N-1, W] int64 current guesses
    made: np.ndarray  # [N-1, W] bool: guess came from the model (not the random fill)
    context: TokenBuffer  # prompt + committed tokens, for the random fill
    rng: np.random.Generator
    pool: dict[int, OrderedDict] = field(default_factory=dict)  # first token -> {tail tuple: None}
    stepped: bool = False  # a Jacobi step ran since the last observe
    tries: dict = field(default_factory=dict)  # first token -> {(budget, depth): trie of its n-grams}
    steps: int = 0  # observed steps, for `every`


def harvest(pool: dict[int, OrderedDict], grams: np.ndarray, limit: int, tries: dict | None = None) -> None:
    """Insert n-grams [g, N] (first token = key) with LRU eviction beyond `limit` per key;
    `tries` (memoised proposals by first token) forgets the keys that changed."""
    for gram in grams.tolist():  # <= W n-grams a step
        if tries:
            tries.pop(gram[0], None)
        entries = pool.setdefault(gram[0], OrderedDict())
        tail = tuple(gram[1:])
        entries[tail] = None
        entries.move_to_end(tail)
        while len(entries) > limit:
            entries.popitem(last=False)


def jacobi_step(window: np.ndarray, made: np.ndarray, last_out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Levels move down one, the argmax row after the last level becomes the last level."""
    return (
        np.concatenate([window[1:], last_out[None, :]], axis=0),
        np.concatenate([made[1:], np.ones((1, made.shape[1]), dtype=bool)], axis=0),
    )


def shift_columns(state: _Row, shift: int) -> None:
    """`shift` more tokens were committed than the window assumed: column w takes column w+shift."""
    if shift <= 0:
        return
    w = state.window.shape[1]
    s = min(shift, w)
    state.window[:, : w - s] = state.window[:, s:]
    state.made[:, : w - s] = state.made[:, s:]
    state.window[:, w - s :] = random_fill(state, (state.window.shape[0], s))
    state.made[:, w - s :] = False


def random_fill(state: _Row, shape: tuple[int, int]) -> np.ndarray:
    ctx = state.context.tokens
    if not ctx.shape[0]:
        return np.zeros(shape, dtype=np.int64)
    return ctx[state.rng.integers(0, ctx.shape[0], size=shape)]


class LookaheadDrafter(Drafter):
    name = "lookahead"

    def __init__(self, settings: LookaheadSettings | None = None, **overrides):
        self.settings = replace(settings or LookaheadSettings(), **overrides)
        self._rows: dict[int, _Row] = {}

    @property
    def side_tokens(self) -> int:
        """Tokens the window adds to every forward of a row (for the cost model)."""
        return (self.settings.ngram - 1) * self.settings.window

    def begin(self, row: int, prompt: np.ndarray, references: Sequence[np.ndarray] = ()) -> None:
        s = self.settings
        ctx = TokenBuffer(2 * len(prompt) + 64)
        ctx.extend(as_tokens("prompt", prompt))
        shape = (s.ngram - 1, s.window)
        state = _Row(np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=bool), ctx,
                     np.random.default_rng([s.seed, row]))
        state.window[:] = random_fill(state, shape)
        self._rows[row] = state

    def side_branch(self, row: int) -> SideBranch | None:
        state = self._rows.get(row)
        if state is None or state.steps % self.settings.every:
            return None
        depths, mask = window_layout(self.settings.window, self.settings.ngram - 1)
        return SideBranch(state.window.reshape(-1).copy(), depths.copy(), mask.copy())

    def side_result(self, row: int, argmax: np.ndarray) -> None:
        state = self._rows.get(row)
        if state is None:
            return
        levels, w = state.window.shape
        argmax = np.asarray(argmax, dtype=np.int64).reshape(-1)
        assert argmax.shape == (levels * w,), f"side_result argmax must be [{levels * w}], got {argmax.shape}"
        last_out = argmax[(levels - 1) * w :]  # [W] the model's token after each column's end
        ready = state.made.all(axis=0)  # [W] columns made entirely by the model
        if ready.any():
            grams = np.concatenate([state.window, last_out[None, :]], axis=0).T[ready]  # [g, N]
            harvest(state.pool, grams, self.settings.pool, state.tries)
        # the Jacobi step in place: levels move down one, the argmax row becomes the last level
        state.window[:-1] = state.window[1:]
        state.window[-1] = last_out
        state.made[:-1] = state.made[1:]
        state.made[-1] = True
        state.stepped = True

    def observe(self, row: int, accepted: np.ndarray) -> None:
        state = self._rows.get(row)
        if state is None:
            return
        n = len(token_list("accepted", accepted))  # validates
        state.context.extend(accepted)
        shift_columns(state, n - (1 if state.stepped else 0))
        state.stepped = False
        state.steps += 1

    def propose(self, row: int, context: np.ndarray, budget: int, max_depth: int) -> DraftTree:
        state = self._rows.get(row)
        if state is None or not len(context):
            return empty_tree(self.name)
        key = int(context[-1])
        entries = state.pool.get(key)
        depth_cap = min(self.settings.ngram - 1, max_depth)
        if not entries or budget <= 0 or depth_cap <= 0:
            return empty_tree(self.name)
        memo = state.tries.get(key)  # dropped when the key's n-grams change
        if memo is None:
            memo = state.tries[key] = {}
        hit = memo.get((budget, depth_cap))
        if hit is None:
            hit = memo[(budget, depth_cap)] = trie_lists(list(entries), budget, depth_cap)
        t, p, c, _ = hit
        return lists_tree(t, p, c, 1, self.name)

    def pool_of(self, row: int) -> dict[int, list[tuple[int, ...]]]:
        """{first token: n-gram tails, least recent first} (stats and tests)."""
        return {k: list(v) for k, v in self._rows[row].pool.items()}

    def window_of(self, row: int) -> np.ndarray:
        return self._rows[row].window.copy()

    def end(self, row: int) -> None:
        self._rows.pop(row, None)
