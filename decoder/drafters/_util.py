"""Helpers shared by the local drafters: a growing token buffer with an n-gram position index,
a trie of continuation rows, and the acceptance bookkeeping the adaptive drafters need."""
from __future__ import annotations

import heapq
from typing import Iterable, Sequence

import numpy as np

from datastore.tree import DraftTree, expand_best_first, trusted

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


# ---- lean paths (issue 10): exact equivalents of the helpers above, a few microseconds a row --------

_EMPTY: dict[str, DraftTree] = {}
_I64 = np.dtype(np.int64)
make_tree = trusted  # the drafters build their arrays themselves (see datastore.tree.trusted)


def empty_tree(source: str) -> DraftTree:
    """DraftTree.empty(source), one shared instance per source (its arrays hold nothing)."""
    tree = _EMPTY.get(source)
    if tree is None:
        tree = _EMPTY[source] = DraftTree.empty(source)
    return tree


def chain_tree(tokens: list[int], count: int, match_len: int, source: str) -> DraftTree:
    """A single path (parents -1, 0, 1, ...) with every count `count`."""
    n = len(tokens)
    if not n:
        return empty_tree(source)
    return make_tree(np.array(tokens, dtype=np.int32), np.arange(-1, n - 1, dtype=np.int32),
                     np.full(n, count, dtype=np.int64), match_len, source)


def lists_tree(tokens: list[int], parents: list[int], counts: list[int], match_len: int,
               source: str) -> DraftTree:
    if not tokens:
        return empty_tree(source)
    return make_tree(np.array(tokens, dtype=np.int32), np.array(parents, dtype=np.int32),
                     np.array(counts, dtype=np.int64), match_len, source)


def trie_lists(rows: list[list[int]], budget: int, depth_cap: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """`trie_from_rows` on Python lists: rows (PAD-terminated, equal length, depth_cap <= length)
    -> (tokens, parents, counts, depths) in the same pop order. For a few short rows (a lookahead
    pool, a handful of copy occurrences) plain Python beats the numpy version's fixed cost."""
    srt = sorted(rows) if len(rows) > 1 else rows  # lists compare lexicographically: lexsort's order

    def kids(lo: int, hi: int, d: int) -> list[tuple[int, int, int, int]]:
        out = []
        i = lo
        while i < hi and srt[i][d] == PAD:  # PAD (-1) rows sort first
            i += 1
        while i < hi:
            tok = srt[i][d]
            j = i + 1
            while j < hi and srt[j][d] == tok:
                j += 1
            out.append((tok, j - i, i, j))
            i = j
        return out

    heap: list = []
    seq = 0
    for tok, cnt, lo, hi in kids(0, len(srt), 0):
        heap.append((-cnt, tok, seq, -1, 1, lo, hi))
        seq += 1
    heapq.heapify(heap)
    tokens: list[int] = []
    parents: list[int] = []
    counts: list[int] = []
    depths: list[int] = []
    pop, push = heapq.heappop, heapq.heappush
    while heap and len(tokens) < budget:
        neg, tok, _, parent, depth, lo, hi = pop(heap)
        index = len(tokens)
        tokens.append(tok)
        parents.append(parent)
        counts.append(-neg)
        depths.append(depth)
        if depth < depth_cap:
            for ctok, ccnt, clo, chi in kids(lo, hi, depth):
                push(heap, (-ccnt, ctok, seq, index, depth + 1, clo, chi))
                seq += 1
    return tokens, parents, counts, depths


def trie_arrays(rows: np.ndarray, budget: int, depth_cap: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """`trie_lists` for many rows: the whole trie is materialised with numpy (a fixed ~20 array
    operations, whatever its size), then only the popped nodes cost Python work."""
    srt = rows[:, :depth_cap]
    k, width = srt.shape
    if k > 1:
        srt = srt[np.lexsort(srt[:, ::-1].T)]
    # newgrp[i, c]: row i starts a new group at column c (its prefix :c+1 differs from row i-1's)
    ne = np.empty((k, width), dtype=bool)
    ne[0] = True
    ne[1:] = srt[1:] != srt[:-1]
    newgrp = np.logical_or.accumulate(ne, axis=1)  # [k, width]
    node = newgrp & np.logical_and.accumulate(srt != PAD, axis=1)  # nothing after a PAD
    flat_grp = np.flatnonzero(newgrp.T)  # column-major group starts
    grp_next = np.append(flat_grp[1:], k * width)
    size = np.zeros(k * width, dtype=np.int64)
    size[flat_grp] = grp_next - flat_grp  # group size at its start (next start of a column is its end)
    flat_node = np.flatnonzero(node.T)  # node ids in column-major order: parents before children
    col, row = np.divmod(flat_node, k)
    node_id = np.full(k * width, -1, dtype=np.int64)
    node_id[flat_node] = np.arange(flat_node.shape[0])
    start_row = np.maximum.accumulate(np.where(newgrp, np.arange(k)[:, None], 0), axis=0)  # [k, width]
    parent = np.where(col > 0, node_id[np.maximum(col - 1, 0) * k + start_row[row, np.maximum(col - 1, 0)]], -1)
    ids = np.arange(flat_node.shape[0])
    first = np.searchsorted(parent, ids, side="left").tolist()
    last = np.searchsorted(parent, ids, side="right").tolist()
    tok = srt[row, col].tolist()
    cnt = size[flat_node].tolist()
    n_roots = int(np.searchsorted(parent, 0))
    heap = [(-cnt[j], tok[j], j, -1, 1, j) for j in range(n_roots)]
    heapq.heapify(heap)
    seq = n_roots
    tokens: list[int] = []
    parents: list[int] = []
    counts: list[int] = []
    depths: list[int] = []
    pop, push = heapq.heappop, heapq.heappush
    while heap and len(tokens) < budget:
        neg, t, _, par, depth, j = pop(heap)
        index = len(tokens)
        tokens.append(t)
        parents.append(par)
        counts.append(-neg)
        depths.append(depth)
        for c in range(first[j], last[j]):  # children: ascending tokens, contiguous ids
            push(heap, (-cnt[c], tok[c], seq, index, depth + 1, c))
            seq += 1
    return tokens, parents, counts, depths


def path_depth(tokens: list[int], parents: list[int], accepted: list[int]) -> int:
    """`accepted_depth` on Python lists (first matching child wins, as flatnonzero(...)[0])."""
    node, hits = -1, 0
    n = len(tokens)
    for tok in accepted:
        for i in range(node + 1, n):  # children come after their parent
            if parents[i] == node and tokens[i] == tok:
                node, hits = i, hits + 1
                break
        else:
            break
    return hits


def token_list(name: str, tokens) -> list[int]:
    """`as_tokens(name, tokens).tolist()` without its numpy calls for the usual case (a 1-D int64
    array of a few accepted tokens); anything else goes through as_tokens and its errors."""
    if type(tokens) is np.ndarray and tokens.dtype == _I64 and tokens.ndim == 1:
        out = tokens.tolist()
        if not out or min(out) >= 0:
            return out
    return as_tokens(name, tokens).tolist()
