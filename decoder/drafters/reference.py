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
    PAD, SEP, TokenBuffer, as_tokens, chain_tree, continuation_rows, empty_tree, lists_tree, path_depth,
    trie_arrays, trie_lists,
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
    toks: list[int]  # references + SEP + prompt + output, as a list (scalar reads are cheap)
    buf: TokenBuffer  # the same tokens as an array, for the vectorised path over many occurrences
    grams: dict[tuple[int, ...], list[int]]  # min_match-gram -> ascending end offsets (no SEP inside)
    context_start: int  # buffer offset where the prompt starts
    match_floor: int  # adaptive: shortest suffix accepted as a match
    copy_len: int  # adaptive: continuation length
    last_tokens: list[int] = field(default_factory=list)  # the last proposal (tokens, parents)
    last_parents: list[int] = field(default_factory=list)
    last_depth: int = 0

    def extend(self, new: list[int], m: int) -> None:
        """Append tokens and index the m-grams ending at each (those holding no SEP)."""
        toks, grams = self.toks, self.grams
        for tok in new:
            toks.append(tok)
            e = len(toks)
            if e >= m:
                key = tuple(toks[e - m : e])
                if SEP not in key:
                    hit = grams.get(key)
                    if hit is None:
                        grams[key] = [e]
                    else:
                        hit.append(e)
        self.buf.extend(np.array(new, dtype=np.int64))


MANY = 24  # more occurrences than this: match lengths and the trie in numpy


def longest_matches(buf: np.ndarray, ends: np.ndarray, max_match: int) -> np.ndarray:
    """[k] int64: how many tokens before each end e agree with the buffer's own suffix (which
    must hold no SEP within max_match tokens)."""
    n = buf.shape[0]
    back = np.arange(1, max_match + 1, dtype=np.int64)  # [L]
    idx = ends[:, None] - back[None, :]  # [k, L] positions compared with buf[n - back]
    eq = (idx >= 0) & (buf[np.maximum(idx, 0)] == buf[n - back][None, :])
    return np.cumprod(eq, axis=1).sum(axis=1)


def copy_candidates(state: _Row, context_len: int, settings: ReferenceSettings, floor: int
                    ) -> tuple[list[int], int]:
    """Start offsets of the continuations of every occurrence of the longest matching suffix
    of the context (length >= floor), and that length (0 = no match)."""
    toks = state.toks
    n = len(toks)
    m = settings.min_match
    if context_len < max(m, floor):
        return [], 0
    ends = state.grams.get(tuple(toks[n - m :]), ())
    if ends and ends[-1] == n:  # the context's own suffix has no continuation yet
        ends = ends[:-1]
    limit = min(settings.max_match, context_len)
    if len(ends) > MANY:
        arr = np.array(ends, dtype=np.int64)
        arr = arr[state.buf.tokens[arr] != SEP]
        if not arr.shape[0]:
            return [], 0
        lengths = longest_matches(state.buf.tokens, arr, limit)
        best = int(lengths.max())
        if best < floor:
            return [], 0
        return arr[lengths == best][-settings.max_occurrences :].tolist(), best
    best, starts = 0, []
    for e in ends:
        if toks[e] == SEP:
            continue
        j = m  # the gram itself matched
        while j < limit and e > j and toks[e - 1 - j] == toks[n - 1 - j]:
            j += 1
        if j > best:
            best, starts = j, [e]
        elif j == best:
            starts.append(e)
    if best < floor or not starts:
        return [], 0
    return starts[-settings.max_occurrences :], best


class ReferenceDrafter(Drafter):
    name = "reference"

    def __init__(self, settings: ReferenceSettings | None = None, **overrides):
        self.settings = replace(settings or ReferenceSettings(), **overrides)
        self._rows: dict[int, _Row] = {}

    def begin(self, row: int, prompt: np.ndarray, references: Sequence[np.ndarray] = ()) -> None:
        s = self.settings
        prompt = as_tokens("prompt", prompt)
        state = _Row([], TokenBuffer(2 * (prompt.shape[0] + sum(len(r) for r in references)) + 64), {},
                     0, s.min_match, s.start_copy)
        for i, ref in enumerate(references):
            state.extend(as_tokens(f"references[{i}]", ref).tolist() + [SEP], s.min_match)
        state.context_start = len(state.toks)
        state.extend(prompt.tolist(), s.min_match)
        self._rows[row] = state

    def _sync(self, state: _Row, context: np.ndarray) -> None:
        """Bring the buffer's copy of the context up to `context` (propose is the source of truth:
        observe only adapts lengths)."""
        have = len(state.toks) - state.context_start
        if context.shape[0] < have or (have and state.toks[-1] != context[have - 1]):
            raise ValueError(
                f"reference drafter: row context ({context.shape[0]} tokens) does not extend the "
                f"{have} tokens seen so far; call begin() for a new sequence"
            )
        if context.shape[0] > have:
            state.extend(context[have:].tolist(), self.settings.min_match)

    def propose(self, row: int, context: np.ndarray, budget: int, max_depth: int) -> DraftTree:
        state = self._rows.get(row)
        if state is None:
            self.begin(row, context)
            state = self._rows[row]
        self._sync(state, np.asarray(context, dtype=np.int64).reshape(-1))
        context_len = len(state.toks) - state.context_start
        starts, length = copy_candidates(state, context_len, self.settings, state.match_floor)
        width = min(state.copy_len, max_depth)
        if not starts or budget <= 0 or width <= 0:
            state.last_tokens, state.last_parents, state.last_depth = [], [], 0
            return empty_tree(self.name)
        toks = state.toks
        if len(starts) == 1:  # one occurrence: a chain
            s0 = starts[0]
            chain = toks[s0 : s0 + min(width, budget)]
            if SEP in chain:
                chain = chain[: chain.index(SEP)]
            state.last_tokens, state.last_parents = chain, list(range(-1, len(chain) - 1))
            state.last_depth = len(chain)
            return chain_tree(chain, 1, length, self.name)
        if len(starts) > MANY:
            rows = continuation_rows(state.buf.tokens, np.array(starts, dtype=np.int64), width)
            t, p, c, d = trie_arrays(rows, budget, width)
        else:
            lists = []
            for s0 in starts:
                r = toks[s0 : s0 + width]
                if SEP in r:
                    r = r[: r.index(SEP)]
                lists.append(r + [PAD] * (width - len(r)))
            t, p, c, d = trie_lists(lists, budget, width)
        state.last_tokens, state.last_parents = t, p
        state.last_depth = max(d) if d else 0
        return lists_tree(t, p, c, length, self.name)

    def observe(self, row: int, accepted: np.ndarray) -> None:
        state = self._rows.get(row)
        if state is None or not self.settings.adaptive:
            return
        adapt(state, self.settings, accepted)
        state.last_tokens, state.last_parents, state.last_depth = [], [], 0

    def end(self, row: int) -> None:
        self._rows.pop(row, None)

    def state(self, row: int) -> tuple[int, int]:
        """(match floor, copy length) of a row, for stats and tests."""
        st = self._rows[row]
        return st.match_floor, st.copy_len


def adapt(state: _Row, s: ReferenceSettings, accepted: np.ndarray) -> None:
    if not state.last_tokens:  # nothing matched the floor: relax it, or it could never hit again
        state.match_floor = max(s.min_match, state.match_floor - 1)
        return
    hits = path_depth(state.last_tokens, state.last_parents, np.asarray(accepted).reshape(-1).tolist())
    if hits >= state.last_depth:  # copied to the end: copy further next time
        state.copy_len = min(s.max_copy, 2 * state.copy_len)
    elif hits > 0:
        state.copy_len = max(s.min_copy, (state.copy_len + hits + 1) // 2)
    if hits == 0:
        state.match_floor = min(s.max_match, state.match_floor + 1)
    else:
        state.match_floor = max(s.min_match, state.match_floor - 1)
