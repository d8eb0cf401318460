"""Reference copy (LLMA): draft by copying what followed the context's suffix in the texts at hand.

Texts to copy from: the caller's references, the prompt and the output so far, in one buffer
(texts separated by SEP, so no copy crosses a text). The longest suffix of the context (between
the adaptive floor and `max_match` tokens) that occurs elsewhere in the buffer is found through
an index of `min_match`-grams; EVERY occurrence of it contributes its continuation, and the
continuations form a trie weighted by how many occurrences share each path.

Adaptivity (per row, from `observe`): when the proposal is accepted to its end the copy length
grows (x2 up to `max_copy`); when it is partly accepted it shrinks toward what was accepted;
when nothing is accepted the required match length rises by one (fewer, surer matches) and it
falls back by one after each hit and after each step with no match at all.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from datastore.tree import DraftTree
from decoder.drafters._util import (
    SEP, GramIndex, accepted_depth, as_tokens, continuation_rows, tree_depths, trie_from_rows,
)
from decoder.drafters.base import Drafter


@dataclass(frozen=True)
class ReferenceSettings:
    min_match: int = 2  # shortest context suffix that may trigger a copy (also the index order)
    max_match: int = 16  # longest suffix compared
    min_copy: int = 2  # adaptive copy length bounds (tokens per continuation)
    max_copy: int = 32
    start_copy: int = 8
    max_occurrences: int = 1024  # most recent occurrences kept when a suffix is very common
    adaptive: bool = True

    def __post_init__(self) -> None:
        if self.min_match < 1:
            raise ValueError(f"reference min_match must be >= 1, got {self.min_match}")
        if self.max_match < self.min_match:
            raise ValueError(f"reference max_match ({self.max_match}) must be >= min_match ({self.min_match})")
        if not 1 <= self.min_copy <= self.start_copy <= self.max_copy:
            raise ValueError(
                "reference copy lengths must satisfy 1 <= min_copy <= start_copy <= max_copy, got "
                f"{self.min_copy}, {self.start_copy}, {self.max_copy}"
            )
        if self.max_occurrences < 1:
            raise ValueError(f"reference max_occurrences must be >= 1, got {self.max_occurrences}")


@dataclass
class _Row:
    index: GramIndex
    context_start: int  # buffer offset where the prompt starts
    match_floor: int  # adaptive: shortest suffix accepted as a match
    copy_len: int  # adaptive: continuation length
    last: DraftTree = field(default_factory=lambda: DraftTree.empty("reference"))
    last_depth: int = 0


def longest_matches(buf: np.ndarray, ends: np.ndarray, max_match: int) -> np.ndarray:
    """[k] int64: how many tokens before each end e agree with the buffer's own suffix (which
    must hold no SEP within max_match tokens)."""
    n = buf.shape[0]
    back = np.arange(1, max_match + 1, dtype=np.int64)  # [L]
    idx = ends[:, None] - back[None, :]  # [k, L] positions compared with buf[n - back]
    eq = (idx >= 0) & (buf[np.maximum(idx, 0)] == buf[n - back][None, :])
    return np.cumprod(eq, axis=1).sum(axis=1)


def copy_candidates(
    index: GramIndex, context_len: int, settings: ReferenceSettings, floor: int
) -> tuple[np.ndarray, int]:
    """Start offsets of the continuations of every occurrence of the longest matching suffix
    of the context (length >= floor), and that length (0 = no match)."""
    buf = index.tokens
    n = buf.shape[0]
    m = settings.min_match
    if context_len < max(m, floor):
        return np.zeros(0, dtype=np.int64), 0
    ends = index.find(buf[n - m :])
    ends = ends[ends < n]  # the context's own suffix has no continuation yet
    ends = ends[buf[ends] != SEP]
    if not ends.shape[0]:
        return ends, 0
    lengths = longest_matches(buf, ends, min(settings.max_match, context_len))  # [k]
    best = int(lengths.max())
    if best < floor:
        return np.zeros(0, dtype=np.int64), 0
    starts = ends[lengths == best][-settings.max_occurrences :]  # most recent when too many
    return starts, best


class ReferenceDrafter(Drafter):
    name = "reference"

    def __init__(self, settings: ReferenceSettings | None = None, **overrides):
        self.settings = replace(settings or ReferenceSettings(), **overrides)
        self._rows: dict[int, _Row] = {}

    def begin(self, row: int, prompt: np.ndarray, references: Sequence[np.ndarray] = ()) -> None:
        s = self.settings
        prompt = as_tokens("prompt", prompt)
        index = GramIndex([s.min_match], capacity=2 * (prompt.shape[0] + sum(len(r) for r in references)) + 64)
        for i, ref in enumerate(references):
            index.extend(np.append(as_tokens(f"references[{i}]", ref), SEP))
        start = len(index)
        index.extend(prompt)
        self._rows[row] = _Row(index, start, s.min_match, s.start_copy)

    def _sync(self, state: _Row, context: np.ndarray) -> None:
        """Bring the buffer's copy of the context up to `context` (propose is the source of truth:
        observe only adapts lengths)."""
        have = len(state.index) - state.context_start
        if context.shape[0] < have or (have and state.index.tokens[-1] != context[have - 1]):
            raise ValueError(
                f"reference drafter: row context ({context.shape[0]} tokens) does not extend the "
                f"{have} tokens seen so far; call begin() for a new sequence"
            )
        if context.shape[0] > have:
            state.index.extend(context[have:])

    def propose(self, row: int, context: np.ndarray, budget: int, max_depth: int) -> DraftTree:
        state = self._rows.get(row)
        if state is None:
            self.begin(row, context)
            state = self._rows[row]
        self._sync(state, np.asarray(context, dtype=np.int64).reshape(-1))
        context_len = len(state.index) - state.context_start
        starts, length = copy_candidates(state.index, context_len, self.settings, state.match_floor)
        if not starts.shape[0]:
            tree = DraftTree.empty(self.name)
        else:
            rows = continuation_rows(state.index.tokens, starts, min(state.copy_len, max_depth))
            tree = trie_from_rows(rows, budget, max_depth, self.name, match_len=length)
        state.last = tree
        state.last_depth = int(tree_depths(tree.parents).max()) if len(tree) else 0
        return tree

    def observe(self, row: int, accepted: np.ndarray) -> None:
        state = self._rows.get(row)
        if state is None or not self.settings.adaptive:
            return
        adapt(state, self.settings, accepted)
        state.last = DraftTree.empty(self.name)
        state.last_depth = 0

    def end(self, row: int) -> None:
        self._rows.pop(row, None)

    def state(self, row: int) -> tuple[int, int]:
        """(match floor, copy length) of a row, for stats and tests."""
        st = self._rows[row]
        return st.match_floor, st.copy_len


def adapt(state: _Row, s: ReferenceSettings, accepted: np.ndarray) -> None:
    if not len(state.last):  # nothing matched the floor: relax it, or it could never hit again
        state.match_floor = max(s.min_match, state.match_floor - 1)
        return
    hits = accepted_depth(state.last, accepted)
    if hits >= state.last_depth:  # copied to the end: copy further next time
        state.copy_len = min(s.max_copy, 2 * state.copy_len)
    elif hits > 0:
        state.copy_len = max(s.min_copy, (state.copy_len + hits + 1) // 2)
    if hits == 0:
        state.match_floor = min(s.max_match, state.match_floor + 1)
    else:
        state.match_floor = max(s.min_match, state.match_floor - 1)
