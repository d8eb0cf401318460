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
from decoder.drafters._util import TokenBuffer, as_tokens, trie_from_rows
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
    steps: int = 0  # observed steps, for `every`


def harvest(pool: dict[int, OrderedDict], grams: np.ndarray, limit: int) -> None:
    """Insert n-grams [g, N] (first token = key) with LRU eviction beyond `limit` per key."""
    for gram in grams.tolist():  # <= W n-grams a step
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
        last_out = argmax.reshape(levels, w)[-1]  # [W] the model's token after each column's end
        ready = np.all(state.made, axis=0)  # [W] columns made entirely by the model
        grams = np.concatenate([state.window, last_out[None, :]], axis=0).T[ready]  # [g, N]
        harvest(state.pool, grams, self.settings.pool)
        state.window, state.made = jacobi_step(state.window, state.made, last_out)
        state.stepped = True

    def observe(self, row: int, accepted: np.ndarray) -> None:
        state = self._rows.get(row)
        if state is None:
            return
        accepted = as_tokens("accepted", accepted)
        state.context.extend(accepted)
        shift_columns(state, accepted.shape[0] - (1 if state.stepped else 0))
        state.stepped = False
        state.steps += 1

    def propose(self, row: int, context: np.ndarray, budget: int, max_depth: int) -> DraftTree:
        state = self._rows.get(row)
        context = np.asarray(context).reshape(-1)
        if state is None or not context.shape[0]:
            return DraftTree.empty(self.name)
        entries = state.pool.get(int(context[-1]))
        if not entries:
            return DraftTree.empty(self.name)
        rows = np.array(list(entries), dtype=np.int64)  # [g, N-1]
        return trie_from_rows(rows, budget, max_depth, self.name, match_len=1)

    def pool_of(self, row: int) -> dict[int, list[tuple[int, ...]]]:
        """{first token: n-gram tails, least recent first} (stats and tests)."""
        return {k: list(v) for k, v in self._rows[row].pool.items()}

    def window_of(self, row: int) -> np.ndarray:
        return self._rows[row].window.copy()

    def end(self, row: int) -> None:
        self._rows.pop(row, None)
