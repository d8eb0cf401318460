"""Snapshot of the local drafters as they were before the lean rewrite (issue 10, item 2):
the naive reference implementations the new ones must match exactly (same DraftTree node order,
tokens, parents, counts, match_len) on every input. Copied verbatim from decoder/drafters/
(_util, reference, ngram, recycle, lookahead at commit 11ae2da), renamed only where two modules
used the same name (_Row). Do not "improve" this file: it is the specification.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from datastore.tree import DraftTree, expand_best_first
from decoder.drafters.base import Drafter, SideBranch



# ---- _util --------------------------------------------------------------------------------
SEP = -1  # separates texts in a buffer; never a token, so no gram or continuation crosses it
PAD = -1  # pads continuation rows past their end
HASH_BASE = np.int64(1_000_003)  # keys are exact (no collisions) for grams of <= 3 tokens of a vocab < 1e6
SCALE = 1 << 40  # integer weight of probability 1, for sources that weight paths by probabilities


class TokenBuffer:
    """Append-only int64 token array with amortised O(1) growth."""

    def __init__(self, capacity: int = 1024):
        self._buf = np.empty(max(capacity, 16), dtype=np.int64)  # [capacity] int64
        self.n = 0

    @property
    def tokens(self) -> np.ndarray:
        """[n] int64 view; valid until the next append."""
        return self._buf[: self.n]

    def extend(self, tokens: np.ndarray) -> None:
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        need = self.n + tokens.shape[0]
        if need > self._buf.shape[0]:
            grown = np.empty(max(need, 2 * self._buf.shape[0]), dtype=np.int64)
            grown[: self.n] = self._buf[: self.n]
            self._buf = grown
        self._buf[self.n : need] = tokens
        self.n = need


def gram_keys(buf: np.ndarray, ends: np.ndarray, m: int) -> np.ndarray:
    """[k] int64 polynomial hash of buf[e - m : e] for each end e (int64 arithmetic wraps)."""
    key = np.zeros(ends.shape[0], dtype=np.int64)
    with np.errstate(over="ignore"):
        for i in range(m):  # m <= a handful; vectorised over all ends
            key = key * HASH_BASE + buf[ends - m + i]
    return key


class GramIndex:
    """Every position of every m-gram (m in `orders`) of a growing buffer, by binary search.

    Per order: gram hashes sorted ascending with the end offset of each gram (the index of the
    token that follows it). Appending k tokens costs one searchsorted + np.insert per order
    (a memmove of the arrays, ~50 us at 100k grams): no Python loop over the buffer, and a
    lookup never scans it. Grams containing SEP are not indexed.
    """

    def __init__(self, orders: Sequence[int], capacity: int = 1024):
        assert orders and min(orders) >= 1, "gram orders must be >= 1"
        self.orders = tuple(sorted(set(int(m) for m in orders)))
        self.buffer = TokenBuffer(capacity)
        self._keys = {m: np.zeros(0, dtype=np.int64) for m in self.orders}  # [g] sorted hashes
        self._ends = {m: np.zeros(0, dtype=np.int64) for m in self.orders}  # [g] end offsets

    def __len__(self) -> int:
        return self.buffer.n

    @property
    def tokens(self) -> np.ndarray:
        return self.buffer.tokens

    def extend(self, tokens: np.ndarray) -> None:
        old = self.buffer.n
        self.buffer.extend(tokens)
        buf = self.buffer.tokens
        for m in self.orders:
            ends = np.arange(max(old + 1, m), self.buffer.n + 1, dtype=np.int64)  # [k] new grams
            if not ends.shape[0]:
                continue
            window = buf[ends[:, None] - m + np.arange(m)]  # [k, m]
            ends = ends[~np.any(window == SEP, axis=1)]
            keys = gram_keys(buf, ends, m)
            order = np.argsort(keys, kind="stable")
            keys, ends = keys[order], ends[order]
            at = np.searchsorted(self._keys[m], keys, side="right")  # equal keys keep buffer order
            self._keys[m] = np.insert(self._keys[m], at, keys)
            self._ends[m] = np.insert(self._ends[m], at, ends)

    def find(self, gram: np.ndarray) -> np.ndarray:
        """[k] int64 ascending end offsets e with buf[e - len(gram) : e] == gram."""
        gram = np.asarray(gram, dtype=np.int64).reshape(-1)
        m = gram.shape[0]
        assert m in self._keys, f"order {m} is not indexed (orders {self.orders})"
        key = gram_keys(gram, np.array([m], dtype=np.int64), m)[0]
        keys = self._keys[m]
        lo, hi = np.searchsorted(keys, key, side="left"), np.searchsorted(keys, key, side="right")
        ends = self._ends[m][lo:hi]
        if m > 3 and ends.shape[0]:  # longer grams may collide: verify
            ok = np.all(self.buffer.tokens[ends[:, None] - m + np.arange(m)] == gram, axis=1)
            ends = ends[ok]
        return np.sort(ends)


def continuation_rows(buf: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """[k, length] int64: buf[s : s + length] per start, PAD past the end or from a SEP on."""
    idx = starts[:, None] + np.arange(length, dtype=np.int64)  # [k, length]
    rows = np.where(idx < buf.shape[0], buf[np.minimum(idx, buf.shape[0] - 1)], PAD)
    alive = np.cumprod(rows != SEP, axis=1).astype(bool)  # SEP == PAD: stop at the first
    return np.where(alive, rows, PAD)


def trie_from_rows(
    rows: np.ndarray, budget: int, max_depth: int, source: str, match_len: int = 0
) -> DraftTree:
    """The trie of token rows (PAD-terminated), each node weighted by how many rows pass through
    it, selected best-first by count with `expand_best_first` (ties: smaller token id).

    Rows are sorted lexicographically once, so a node's rows are a contiguous range and its
    children are the runs of equal tokens in the next column: no per-row Python work.
    """
    assert rows.ndim == 2, f"rows must be [k, length], got {rows.shape}"
    depth_cap = min(rows.shape[1], max_depth)
    if budget <= 0 or depth_cap <= 0 or rows.shape[0] == 0:
        return DraftTree.empty(source)
    srt = rows[np.lexsort(rows[:, ::-1].T)] if rows.shape[0] > 1 else rows  # column 0 primary

    def children(handle: tuple[int, int, int]) -> Iterable[tuple[int, int, tuple[int, int, int]]]:
        lo, hi, d = handle
        if d >= srt.shape[1]:
            return ()
        col = srt[lo:hi, d]  # sorted: PAD (-1) rows come first
        first = int(np.searchsorted(col, 0))
        if first == col.shape[0]:
            return ()
        bounds = np.concatenate(([first], first + 1 + np.flatnonzero(np.diff(col[first:])), [col.shape[0]]))
        toks = col[bounds[:-1]].tolist()
        b = bounds.tolist()
        return [(toks[i], b[i + 1] - b[i], (lo + b[i], lo + b[i + 1], d + 1)) for i in range(len(toks))]

    t, p, c = expand_best_first(children((0, srt.shape[0], 0)), children, budget, depth_cap)
    return DraftTree(t, p, c, match_len, source)


def tree_depths(parents: np.ndarray) -> np.ndarray:
    """[n] int64 depth of each node (1 = child of the context), by pointer jumping."""
    parents = np.asarray(parents, dtype=np.int64)
    depth = np.ones(parents.shape[0], dtype=np.int64)
    up = parents.copy()
    while np.any(up >= 0):  # <= max depth iterations
        live = up >= 0
        depth += live
        up = np.where(live, parents[np.maximum(up, 0)], -1)
    return depth


def accepted_depth(tree: DraftTree, accepted: np.ndarray) -> int:
    """How many leading tokens of `accepted` form a path of `tree` from its root."""
    node, hits = -1, 0
    for tok in np.asarray(accepted).reshape(-1).tolist():  # <= max_depth + 1 iterations
        child = np.flatnonzero((tree.parents == node) & (tree.tokens == tok))
        if not child.shape[0]:
            break
        node, hits = int(child[0]), hits + 1
    return hits


def as_tokens(name: str, tokens: np.ndarray) -> np.ndarray:
    """Validated [n] int64 copy of a 1-D array of non-negative token ids."""
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D token array, got shape {arr.shape}")
    if arr.shape[0] and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integer token ids, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if arr.shape[0] and arr.min() < 0:
        raise ValueError(f"{name} holds a negative token id ({int(arr.min())})")
    return arr


# ---- reference ----------------------------------------------------------------------------
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
class _RefRow:
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
        self._rows: dict[int, _RefRow] = {}

    def begin(self, row: int, prompt: np.ndarray, references: Sequence[np.ndarray] = ()) -> None:
        s = self.settings
        prompt = as_tokens("prompt", prompt)
        index = GramIndex([s.min_match], capacity=2 * (prompt.shape[0] + sum(len(r) for r in references)) + 64)
        for i, ref in enumerate(references):
            index.extend(np.append(as_tokens(f"references[{i}]", ref), SEP))
        start = len(index)
        index.extend(prompt)
        self._rows[row] = _RefRow(index, start, s.min_match, s.start_copy)

    def _sync(self, state: _RefRow, context: np.ndarray) -> None:
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


def adapt(state: _RefRow, s: ReferenceSettings, accepted: np.ndarray) -> None:
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


# ---- ngram --------------------------------------------------------------------------------
@dataclass(frozen=True)
class NGramSettings:
    max_order: int = 4  # K: orders 2..K (prefixes of 1..K-1 tokens)
    min_order: int = 2  # lowest order fallen back to
    max_children: int = 4  # most frequent continuations kept per node
    min_count: int = 1  # a continuation seen fewer times is ignored

    def __post_init__(self) -> None:
        if not 2 <= self.min_order <= self.max_order:
            raise ValueError(
                f"ngram orders must satisfy 2 <= min_order <= max_order, got {self.min_order}, {self.max_order}"
            )
        if self.max_order > 12:
            raise ValueError(f"ngram max_order must be <= 12, got {self.max_order}")
        if self.max_children < 1:
            raise ValueError(f"ngram max_children must be >= 1, got {self.max_children}")
        if self.min_count < 1:
            raise ValueError(f"ngram min_count must be >= 1, got {self.min_count}")


class NGramTables:
    """{prefix tuple: {next token: count}} for prefix lengths lo..hi, over a growing sequence."""

    def __init__(self, lo: int, hi: int, settings: NGramSettings):
        self.lo, self.hi, self.settings = lo, hi, settings
        self.seq = TokenBuffer()
        self.counts: dict[tuple[int, ...], dict[int, int]] = {}
        self._top: dict[tuple[int, ...], tuple[list[tuple[int, int]], int]] = {}  # prefix -> (best, total)

    def __len__(self) -> int:
        return self.seq.n

    def extend(self, tokens: np.ndarray) -> None:
        old = self.seq.n
        self.seq.extend(tokens)
        seq = self.seq.tokens
        for k in range(self.lo, self.hi + 1):
            first = max(old, k)  # positions i of the newly known "prefix -> seq[i]" entries
            if first >= seq.shape[0]:
                continue
            grams = sliding_window_view(seq[first - k :], k + 1)  # [g, k+1] prefix + next
            if grams.shape[0] > 16:  # the prompt: count in numpy first
                uniq, cnt = np.unique(grams, axis=0, return_counts=True)
                rows, weights = uniq.tolist(), cnt.tolist()
            else:
                rows, weights = grams.tolist(), [1] * grams.shape[0]
            for row, c in zip(rows, weights):  # per distinct n-gram (per accepted token later)
                prefix = tuple(row[:-1])
                table = self.counts.setdefault(prefix, {})
                table[row[-1]] = table.get(row[-1], 0) + c
                self._top.pop(prefix, None)

    def best(self, prefix: tuple[int, ...]) -> tuple[list[tuple[int, int]], int]:
        """([(token, count)] most frequent first (ties: smaller id), <= max_children; total count
        of the continuations seen >= min_count times)."""
        hit = self._top.get(prefix)
        if hit is None:
            table = self.counts.get(prefix)
            if not table:
                return [], 0
            s = self.settings
            items = [(t, c) for t, c in table.items() if c >= s.min_count]
            items.sort(key=lambda tc: (-tc[1], tc[0]))
            hit = (items[: s.max_children], sum(c for _, c in items))
            self._top[prefix] = hit
        return hit

    def lookup(self, path: tuple[int, ...]) -> tuple[list[tuple[int, int]], int, int]:
        """(best continuations, their total, order) of the longest suffix of `path` with a
        continuation, highest order first; order 0 when none."""
        for k in range(min(self.hi, len(path)), self.lo - 1, -1):
            best, total = self.best(path[len(path) - k :])
            if best:
                return best, total, k + 1
        return [], 0, 0


class NGramDrafter(Drafter):
    name = "ngram"

    def __init__(self, settings: NGramSettings | None = None, **overrides):
        self.settings = replace(settings or NGramSettings(), **overrides)
        self._rows: dict[int, NGramTables] = {}
        self.orders_used: dict[int, int] = {}  # order -> steps it drafted the first level (stats)

    def begin(self, row: int, prompt: np.ndarray, references: Sequence[np.ndarray] = ()) -> None:
        s = self.settings
        tables = NGramTables(s.min_order - 1, s.max_order - 1, s)
        tables.extend(as_tokens("prompt", prompt))
        self._rows[row] = tables

    def observe(self, row: int, accepted: np.ndarray) -> None:
        """Every accepted token updates the tables of every order."""
        tables = self._rows.get(row)
        if tables is not None:
            tables.extend(as_tokens("accepted", accepted))

    def _sync(self, tables: NGramTables, context: np.ndarray) -> None:
        """Catch up with tokens committed without `observe` (a caller that only proposes)."""
        if context.shape[0] > len(tables):
            tables.extend(context[len(tables) :])
        elif context.shape[0] < len(tables):
            raise ValueError(
                f"ngram drafter: row context ({context.shape[0]} tokens) is shorter than the "
                f"{len(tables)} tokens observed; call begin() for a new sequence"
            )

    def propose(self, row: int, context: np.ndarray, budget: int, max_depth: int) -> DraftTree:
        tables = self._rows.get(row)
        if tables is None:
            self.begin(row, context)
            tables = self._rows[row]
        context = np.asarray(context, dtype=np.int64).reshape(-1)
        self._sync(tables, context)
        keep = self.settings.max_order - 1
        tail = tuple(context[-keep:].tolist())
        if budget <= 0 or max_depth <= 0 or not tail:
            return DraftTree.empty(self.name)
        best, _, order = tables.lookup(tail)
        if not best:
            return DraftTree.empty(self.name)

        def children(handle: tuple[tuple[int, ...], int]) -> Iterable[tuple[int, int, tuple]]:
            path, weight = handle
            best, total, _ = tables.lookup(path)
            out = []
            for t, c in best:
                w = max(1, weight * c // total)
                out.append((t, w, ((path + (t,))[-keep:], w)))
            return out

        t, p, c = expand_best_first(children((tail, SCALE)), children, budget, max_depth)
        self.orders_used[order] = self.orders_used.get(order, 0) + 1
        return DraftTree(t, p, c, order - 1, self.name)

    def end(self, row: int) -> None:
        self._rows.pop(row, None)


# ---- recycle ------------------------------------------------------------------------------
DEFAULT_RANK_WEIGHTS = (0.5, 0.15, 0.08, 0.05, 0.04, 0.03, 0.02, 0.02)


@dataclass(frozen=True)
class RecycleSettings:
    k: int = 8  # successors kept per token
    vocab_size: int = 0  # table rows up front; 0 = grow as tokens appear
    rank_weights: tuple[float, ...] = DEFAULT_RANK_WEIGHTS  # prior P(rank r is right), k of them
    max_depth: int = 8  # cap on top of the decoder's

    def __post_init__(self) -> None:
        if not 1 <= self.k <= 64:
            raise ValueError(f"recycle k must be in 1..64, got {self.k}")
        if self.vocab_size < 0:
            raise ValueError(f"recycle vocab_size must be >= 0, got {self.vocab_size}")
        w = tuple(float(x) for x in self.rank_weights)
        if len(w) < self.k:
            raise ValueError(f"recycle rank_weights needs {self.k} entries (one per rank), got {len(w)}")
        if any(not 0 < x <= 1 for x in w) or any(a < b for a, b in zip(w, w[1:])):
            raise ValueError(f"recycle rank_weights must be in (0, 1] and non-increasing, got {w}")
        if self.max_depth < 1:
            raise ValueError(f"recycle max_depth must be >= 1, got {self.max_depth}")
        object.__setattr__(self, "rank_weights", w[: self.k])


@lru_cache(maxsize=64)
def template(weights: tuple[float, ...], budget: int, max_depth: int) -> tuple[np.ndarray, ...]:
    """Static tree: (ranks [n] int64, parents [n] int64, depths [n] int64, counts [n] int64),
    best-first by path weight, parents before children."""
    def children(weight: int) -> Iterable[tuple[int, int, int]]:
        return [(r, max(1, int(weight * w)), max(1, int(weight * w))) for r, w in enumerate(weights)]

    ranks, parents, counts = expand_best_first(children(SCALE), children, budget, max_depth)
    parents = parents.astype(np.int64)
    return ranks.astype(np.int64), parents, tree_depths(parents), counts


class RecycleDrafter(Drafter):
    name = "recycle"

    def __init__(self, settings: RecycleSettings | None = None, **overrides):
        self.settings = replace(settings or RecycleSettings(), **overrides)
        self.topk = self.settings.k
        rows = self.settings.vocab_size
        self.table = np.full((rows, self.topk), -1, dtype=np.int32)  # [vocab, k] int32, -1 = unknown

    def _grow(self, max_token: int) -> None:
        if max_token < self.table.shape[0]:
            return
        rows = max(max_token + 1, 2 * self.table.shape[0], 1024)
        grown = np.full((rows, self.topk), -1, dtype=np.int32)
        grown[: self.table.shape[0]] = self.table
        self.table = grown

    def observe_topk(self, tokens: np.ndarray, topk: np.ndarray) -> None:
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)  # [n]
        topk = np.asarray(topk, dtype=np.int64)  # [n, k'] best first
        assert topk.ndim == 2 and topk.shape[0] == tokens.shape[0], f"topk must be [n, k], got {topk.shape}"
        ok = tokens >= 0
        tokens, topk = tokens[ok], topk[ok]
        if not tokens.shape[0]:
            return
        _, last_rev = np.unique(tokens[::-1], return_index=True)  # a token seen twice: latest evidence
        pick = tokens.shape[0] - 1 - last_rev
        tokens, topk = tokens[pick], topk[pick]
        k = min(self.topk, topk.shape[1])
        self._grow(int(tokens.max()))
        row = np.full((tokens.shape[0], self.topk), -1, dtype=np.int32)
        row[:, :k] = topk[:, :k]
        self.table[tokens] = row

    def propose(self, row: int, context: np.ndarray, budget: int, max_depth: int) -> DraftTree:
        context = np.asarray(context).reshape(-1)
        depth_cap = min(max_depth, self.settings.max_depth)
        if budget <= 0 or depth_cap <= 0 or not context.shape[0]:
            return DraftTree.empty(self.name)
        last = int(context[-1])
        if last >= self.table.shape[0] or self.table[last, 0] < 0:
            return DraftTree.empty(self.name)
        return best_live_tree(self.table, last, self.settings.rank_weights, budget, depth_cap, self.name)

    def reset(self) -> None:
        """Forget every successor (the table otherwise persists across requests)."""
        self.table[:] = -1


def best_live_tree(
    table: np.ndarray, last: int, weights: tuple[float, ...], budget: int, max_depth: int, source: str
) -> DraftTree:
    """The `budget` heaviest known nodes: fill a template of `size` nodes, drop the unknown ones and
    keep the first `budget` survivors in pop order (pop order is by weight, parents first). While
    too few survive a template that was cut short, retry one 4x larger (at most 64x budget)."""
    full = sum(len(weights) ** d for d in range(1, max_depth + 1))  # every node of the k-ary tree
    size = min(budget, full)
    while True:
        ranks, parents, depths, counts = template(weights, size, max_depth)
        tree = fill_template(table, last, ranks, parents, depths, counts, source)
        if len(tree) >= budget or size >= full or size >= 64 * budget:
            break
        size = min(4 * size, full, 64 * budget)
    if len(tree) <= budget:
        return tree
    return DraftTree(tree.tokens[:budget], tree.parents[:budget], tree.counts[:budget], 1, source)


def fill_template(
    table: np.ndarray, last: int, ranks: np.ndarray, parents: np.ndarray, depths: np.ndarray,
    counts: np.ndarray, source: str,
) -> DraftTree:
    """Tokens of the template's nodes from the table, one gather per depth; unknown dropped."""
    n = ranks.shape[0]
    tokens = np.full(n, -1, dtype=np.int64)  # [n]
    vocab = table.shape[0]
    for d in range(1, int(depths.max()) + 1 if n else 1):  # <= max_depth gathers
        level = np.flatnonzero(depths == d)
        prev = np.full(level.shape[0], last, dtype=np.int64) if d == 1 else tokens[parents[level]]
        known = (prev >= 0) & (prev < vocab)
        tokens[level] = np.where(known, table[np.where(known, prev, 0), ranks[level]], -1)
    alive = tokens >= 0  # an unknown parent gave its children -1 too: the kept set is ancestor-closed
    keep = np.flatnonzero(alive)
    new_index = np.cumsum(alive) - 1
    par = parents[keep]
    return DraftTree(tokens[keep], np.where(par >= 0, new_index[np.maximum(par, 0)], -1), counts[keep], 1, source)


# ---- lookahead ----------------------------------------------------------------------------
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
class _LookRow:
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


def shift_columns(state: _LookRow, shift: int) -> None:
    """`shift` more tokens were committed than the window assumed: column w takes column w+shift."""
    if shift <= 0:
        return
    w = state.window.shape[1]
    s = min(shift, w)
    state.window[:, : w - s] = state.window[:, s:]
    state.made[:, : w - s] = state.made[:, s:]
    state.window[:, w - s :] = random_fill(state, (state.window.shape[0], s))
    state.made[:, w - s :] = False


def random_fill(state: _LookRow, shape: tuple[int, int]) -> np.ndarray:
    ctx = state.context.tokens
    if not ctx.shape[0]:
        return np.zeros(shape, dtype=np.int64)
    return ctx[state.rng.integers(0, ctx.shape[0], size=shape)]


class LookaheadDrafter(Drafter):
    name = "lookahead"

    def __init__(self, settings: LookaheadSettings | None = None, **overrides):
        self.settings = replace(settings or LookaheadSettings(), **overrides)
        self._rows: dict[int, _LookRow] = {}

    @property
    def side_tokens(self) -> int:
        """Tokens the window adds to every forward of a row (for the cost model)."""
        return (self.settings.ngram - 1) * self.settings.window

    def begin(self, row: int, prompt: np.ndarray, references: Sequence[np.ndarray] = ()) -> None:
        s = self.settings
        ctx = TokenBuffer(2 * len(prompt) + 64)
        ctx.extend(as_tokens("prompt", prompt))
        shape = (s.ngram - 1, s.window)
        state = _LookRow(np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=bool), ctx,
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
