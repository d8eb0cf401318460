"""Suffix-array search on typed token arrays and the exact weighted trie of DESIGN.md.

A `SuffixIndex` is one shard (or an in-memory live index): tokens and their suffix array, both
typed numpy arrays that may be zero-copy views of LMDB pages. Everything here is exact:

* `pattern_range` finds the suffix-array range of a token pattern by binary search, comparing the
  pattern with the first tokens of a suffix (pydivsufsort's `sa_search` only takes bytes).
* `split_children` divides a range whose suffixes share a prefix of length k into its children: the
  sub-ranges that share the token at offset k. Small ranges are read whole; large ones (a short
  suffix can match millions of positions) are sampled at a stride: every sampled token's count is
  bracketed by its neighbouring samples, any unsampled token's count by the widest gap it could hide
  in, and only tokens that can still make the cut get exact boundaries, by binary searches inside one
  gap. Nothing is materialised beyond the samples.
* `draft_from` finds the longest matching context suffix by bisection over its length (a suffix of
  length L matches wherever one of length L + 1 does) and expands the trie best-first with
  `datastore.tree.expand_best_first`, counting occurrences summed over all indexes, so a sharded
  datastore drafts exactly what one unsharded datastore drafts. It mirrors the counts waiting in
  the expansion's heap: a child that ranks below `left` of them (left = pops still to come), or
  below `left` of its siblings, can never be popped, so it is neither needed nor computed.

The separator that ends every document is never a child and never part of a match: ids outside
[0, separator) in a context act as barriers, since no document contains them.
"""
from __future__ import annotations

import itertools
import operator
import threading
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from typing import Iterable, Sequence

import numpy as np

from datastore.tree import DraftTree, expand_best_first

# Ranges this small are split with plain Python reads: a numpy call costs ~1 µs, a read ~0.1 µs.
SMALL_RANGE = 24
# Ranges up to this size are gathered whole (one vectorised gather, ~10 ns a suffix); larger ones
# are sampled with SAMPLES positions first.
DENSE_RANGE = 8192
SAMPLES = 1024
# Up to this many boundary searches run as plain Python binary searches (~0.3 µs a step) rather
# than vectorised steps (~20 µs a step, whatever the number of queries).
SCALAR_QUERIES = 16
# A split whose floor allows this few samples runs in plain Python (no numpy call overhead).
SPARSE_SAMPLES = 96
# Large splits remembered (each <= budget children): the same frequent n-grams recur across calls.
SPLIT_CACHE = 4096
Ranges = tuple[tuple[int, int], ...]  # (lo, hi) per index
Handle = tuple[int, Ranges, int]  # a trie node: (offset of its children's token, ranges, count)
_SERIALS = itertools.count()


class SuffixIndex:
    """Tokens [n] uint16|uint32 and their suffix array [n] int32|int64 (zero-copy views are fine).

    `separator` defaults to the last token: every shard ends with the separator after its last
    document. Suffixes must be sorted by token value, a shorter suffix first (pydivsufsort's order).
    """

    __slots__ = ("tokens", "sa", "n", "separator", "serial", "starts", "_tok", "_sa")

    def __init__(self, tokens: np.ndarray, sa: np.ndarray, separator: int | None = None) -> None:
        assert tokens.ndim == 1 and tokens.dtype in (np.uint16, np.uint32), (tokens.shape, tokens.dtype)
        assert sa.shape == tokens.shape and sa.dtype in (np.int32, np.int64), (sa.shape, sa.dtype)
        self.tokens = np.ascontiguousarray(tokens)  # [n] uint16|uint32
        self.sa = np.ascontiguousarray(sa)  # [n] int32|int64
        self.n = int(tokens.shape[0])
        if separator is None and self.n:
            separator = int(self.tokens[-1])
        self.separator = None if separator is None else int(separator)
        # memoryviews give Python ints ~3x faster than numpy scalar indexing in the binary searches
        self.serial = next(_SERIALS)  # identifies the index in split caches (ids can be reused)
        self.starts = _bucket_starts(self.tokens)  # [max token + 2] int64
        self._tok = _int_view(self.tokens)
        self._sa = _int_view(self.sa)

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"SuffixIndex(n={self.n}, tokens={self.tokens.dtype}, sa={self.sa.dtype})"


def _bucket_starts(tokens: np.ndarray) -> np.ndarray:
    """[V + 1] int64: the suffixes starting with token v are sa[starts[v]:starts[v + 1]].
    Saves the first ~5 of ~25 binary-search steps of every pattern search."""
    top = int(tokens.max()) + 1 if tokens.shape[0] else 0
    counts = np.zeros(top, dtype=np.int64)
    for start in range(0, tokens.shape[0], 1 << 22):  # bincount widens to int64: chunk it
        counts += np.bincount(tokens[start:start + (1 << 22)], minlength=top)
    return np.concatenate(([0], np.cumsum(counts)))


def _int_view(arr: np.ndarray) -> memoryview:
    """A memoryview with a native struct format (numpy may export '=i', which memoryview cannot
    index), reached through bytes so that any exported format works."""
    code = {np.dtype(np.uint16): "H", np.dtype(np.uint32): "I", np.dtype(np.int32): "i",
            np.dtype(np.int64): "q"}[arr.dtype.newbyteorder("=")]
    assert arr.dtype.isnative, arr.dtype
    return memoryview(arr.view(np.uint8)).cast(code)


# ----------------------------------------------------------------------------------- searching


def pattern_range(index: SuffixIndex, pattern: Sequence[int], lo: int = 0,
                  hi: int | None = None) -> tuple[int, int]:
    """[lo, hi) of the suffixes inside [lo, hi) that start with `pattern` (list of int).

    O(log n) steps, each comparing one suffix's first len(pattern) tokens as a Python list
    (a shorter suffix that is a prefix of the pattern sorts first, as in the suffix array).
    """
    tok, sa = index._tok, index._sa
    pat = list(pattern)
    m = len(pat)
    start, b = _lower_bound(index, pat, lo, index.n if hi is None else hi)
    a = start
    while a < b:
        mid = (a + b) >> 1
        s = sa[mid]
        if tok[s:s + m].tolist() <= pat:
            a = mid + 1
        else:
            b = mid
    return start, a


def occurs(index: SuffixIndex, pattern: list[int]) -> bool:
    """Whether `pattern` (list of int) occurs: half the steps of pattern_range."""
    start, top = _lower_bound(index, pattern, 0, index.n)
    if start >= top:
        return False
    s = index._sa[start]
    return index._tok[s:s + len(pattern)].tolist() == pattern


def _lower_bound(index: SuffixIndex, pat: list[int], lo: int, hi: int) -> tuple[int, int]:
    """(first suffix in [lo, hi) >= pat, first suffix seen above every pattern match) by binary
    search; starts inside the first token's bucket when searching the whole array."""
    tok, sa = index._tok, index._sa
    m = len(pat)
    if m and lo == 0 and hi == index.n:
        first = pat[0]
        if not 0 <= first < index.starts.shape[0] - 1:
            return 0, 0
        lo, hi = int(index.starts[first]), int(index.starts[first + 1])
    a, b, top = lo, hi, hi
    while a < b:
        mid = (a + b) >> 1
        s = sa[mid]
        head = tok[s:s + m].tolist()
        if head < pat:
            a = mid + 1
        else:
            if head != pat:
                top = mid  # the upper bound is at most here
            b = mid
    return a, top


def count_in(indexes: Sequence[SuffixIndex], pattern: Sequence[int],
             separator: int | None = None) -> int:
    """Exact occurrences of `pattern` inside documents, summed over indexes.

    A pattern holding the separator or any id outside [0, separator) occurs nowhere (0).
    """
    pat = _as_ints(pattern)
    if not pat:
        raise ValueError("count: the pattern is empty")
    sep = _separator(indexes, separator)
    if _barrier(pat, sep) >= 0:
        return 0
    total = 0
    for index in indexes:
        if index.n:
            lo, hi = pattern_range(index, pat)
            total += hi - lo
    return total


def _as_ints(seq) -> list[int]:
    """A list of Python ints from a list, tuple, numpy array or (CPU/CUDA) torch tensor."""
    items = seq.tolist() if hasattr(seq, "tolist") else list(seq)
    try:
        return [operator.index(x) for x in items]
    except TypeError as exc:
        raise TypeError(f"token ids must be a 1-D sequence of integers: {exc}") from exc


def _separator(indexes: Sequence[SuffixIndex], separator: int | None) -> int | None:
    if separator is not None:
        return int(separator)
    return next((ix.separator for ix in indexes if ix.separator is not None), None)


def _barrier(tokens: list[int], sep: int | None) -> int:
    """Position of the last id no document contains (< 0, or >= separator); -1 if none."""
    for i in range(len(tokens) - 1, -1, -1):
        t = tokens[i]
        if t < 0 or (sep is not None and t >= sep):
            return i
    return -1


# ------------------------------------------------------------------------------ child splitting


def _values(index: SuffixIndex, positions: np.ndarray, k: int) -> np.ndarray:
    """[m] int64 token at offset k of the suffixes at SA positions [m], -1 past the end."""
    starts = index.sa[positions].astype(np.int64) + k  # [m] int64
    inside = starts < index.n
    vals = index.tokens[np.minimum(starts, index.n - 1)].astype(np.int64)  # [m] int64
    return np.where(inside, vals, -1)


def _boundaries(indexes, k: int, ranges: Ranges, live: list[int], samples: dict,
                cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) [live, c] int64: the exact sub-range of each candidate token in each live
    index, from samples {i: (sorted positions sp [m], their values sv [m])}.

    Each boundary lies between two neighbouring samples, so the searches take log2(gap) steps; all
    indexes and both sides advance together in one vectorised loop.
    """
    c = cand.shape[0]
    wins_a, wins_b, dense = [], [], []
    for i in live:
        lo, hi = ranges[i]
        sp, sv = samples[i]
        m = sp.shape[0]
        for side in ("left", "right"):
            j = np.searchsorted(sv, cand, side)  # [c]
            wins_a.append(np.where(j > 0, sp[np.maximum(j - 1, 0)] + 1, lo))
            wins_b.append(np.where(j < m, sp[np.minimum(j, m - 1)], hi))
        dense.append(m == hi - lo)
    a, b = np.concatenate(wins_a), np.concatenate(wins_b)  # [live * 2 * c] int64
    if not all(dense):  # with every position sampled the windows are already closed
        a = _search(indexes, k, ranges, live, a, b, np.tile(cand, 2 * len(live)), c)
    both = a.reshape(len(live), 2, c)
    return both[:, 0], both[:, 1]


def _search(indexes, k: int, ranges: Ranges, live: list[int], a: np.ndarray, b: np.ndarray,
            q: np.ndarray, c: int) -> np.ndarray:
    """Binary searches [live * 2 * c]: the first p in [a, b] whose value is >= q (left blocks of c)
    or > q (right blocks of c)."""
    if q.shape[0] <= SCALAR_QUERIES:
        out = a.tolist()
        for n, (x, y, t) in enumerate(zip(out, b.tolist(), q.tolist())):
            i = live[n // (2 * c)]
            out[n] = _scalar_bound(indexes[i], k, x, y, t, (n // c) % 2 == 1)
        return np.asarray(out, dtype=np.int64)
    strict = (np.arange(q.shape[0]) // c) % 2 == 1  # [n] right-side searches
    v = np.empty_like(a)
    while True:
        open_ = a < b
        if not open_.any():
            return a
        mid = (a + b) >> 1
        for g, i in enumerate(live):
            sl = slice(g * 2 * c, (g + 1) * 2 * c)
            v[sl] = _values(indexes[i], np.minimum(mid[sl], ranges[i][1] - 1), k)
        ok = (v > q) | ((v == q) & ~strict)
        b = np.where(open_ & ok, mid, b)
        a = np.where(open_ & ~ok, mid + 1, a)


def _scalar_bound(index: SuffixIndex, k: int, a: int, b: int, t: int, strict: bool) -> int:
    """First position p in [a, b] whose value at offset k is >= t (> t if strict); b if none."""
    tok, sa, n = index._tok, index._sa, index.n
    while a < b:
        mid = (a + b) >> 1
        p = sa[mid] + k
        v = tok[p] if p < n else -1
        if v > t or (v == t and not strict):
            b = mid
        else:
            a = mid + 1
    return a


def _sample(index: SuffixIndex, lo: int, hi: int, k: int, stride: int
            ) -> tuple[np.ndarray, np.ndarray]:
    """(positions [m] int64, values [m] int64) every `stride` positions of [lo, hi), the last one
    included, so that any child of >= stride suffixes holds a sample."""
    sp = np.arange(lo, hi, max(1, stride), dtype=np.int64)
    if sp[-1] != hi - 1:
        sp = np.append(sp, hi - 1)
    return sp, _values(index, sp, k)


def _small_groups(index: SuffixIndex, lo: int, hi: int, k: int) -> list[tuple[int, int, int]]:
    """[(token, lo, hi)] of a small range, read with plain Python (sorted by token)."""
    tok, n = index._tok, index.n
    groups: list[tuple[int, int, int]] = []
    prev, start = None, lo
    for i, s in enumerate(index._sa[lo:hi].tolist(), lo):
        p = s + k
        t = tok[p] if p < n else -1
        if t != prev:
            if prev is not None:
                groups.append((prev, start, i))
            prev, start = t, i
    if prev is not None:
        groups.append((prev, start, hi))
    return groups


def _small_children(indexes: Sequence[SuffixIndex], ranges: Ranges, live: list[int], k: int,
                    sep: int | None, keep: int, floor: int) -> list[tuple[int, int, Handle]]:
    """Exact children when every nonempty range (indexes `live`) is small; see split_children."""
    if len(live) == 1:  # the common case deep in a tree: no merging across indexes
        i = live[0]
        lo, hi = ranges[i]
        if hi - lo == 1:  # one occurrence: one child, same range
            ix = indexes[i]
            p = ix._sa[lo] + k
            t = ix._tok[p] if p < ix.n else -1
            return [(t, 1, (k + 1, ranges, 1))] if t >= 0 and (sep is None or t < sep) else []
        out = []
        for t, a, b in _small_groups(indexes[i], *ranges[i], k):
            if b - a >= floor and t >= 0 and (sep is None or t < sep):
                out.append((t, b - a, (k + 1, ranges[:i] + ((a, b),) + ranges[i + 1:], b - a)))
        if len(out) > 1:
            out.sort(key=lambda x: (-x[1], x[0]))
        return out[:keep]
    found: dict[int, list] = {}
    for i in live:
        for t, a, b in _small_groups(indexes[i], *ranges[i], k):
            if t < 0 or (sep is not None and t >= sep):
                continue
            entry = found.get(t)
            if entry is None:
                entry = found[t] = [0, [(0, 0)] * len(ranges)]
            entry[0] += b - a
            entry[1][i] = (a, b)
    order = sorted(found.items(), key=lambda kv: (-kv[1][0], kv[0]))[:keep]
    return [(t, c, (k + 1, tuple(r), c)) for t, (c, r) in order if c >= floor]


def split_children(indexes: Sequence[SuffixIndex], ranges: Ranges, k: int,
                   separator: int | None = None, keep: int | None = None, floor: int = 0,
                   waiting: Sequence[int] = ()) -> list[tuple[int, int, Handle]]:
    """Children of the trie node whose suffixes are `ranges` (one (lo, hi) per index), all of which
    share their first k tokens: [(token, count summed over indexes, handle)], sorted by larger count
    then smaller token, the separator excluded; at most `keep` of them and only counts >= floor.
    handle = (k + 1, child ranges, count).

    Exact: a child is left out only when `keep` siblings outrank it or its count is below floor.
    `waiting` (descending counts of the nodes already waiting to be expanded) may leave out more:
    children that `keep` siblings and waiting nodes together outrank.
    """
    keep = 1 << 62 if keep is None else keep
    if keep <= 0:
        return []
    live, width, small = [], 0, True
    for i, (lo, hi) in enumerate(ranges):
        if hi > lo:
            live.append(i)
            width += hi - lo
            small = small and hi - lo <= SMALL_RANGE
    if width < max(floor, 1):
        return []
    if small:
        return _small_children(indexes, ranges, live, k, separator, keep, floor)
    stride = floor // len(live)  # gaps shorter than this hide < floor occurrences in total
    if stride > 1 and width // stride + len(live) <= SPARSE_SAMPLES:
        return _sparse_children(indexes, ranges, k, separator, keep, floor, live, stride, waiting)
    if width <= DENSE_RANGE:
        return _large_children(indexes, ranges, k, separator, keep, floor)
    key = (tuple(ix.serial for ix in indexes), ranges, k, separator)  # frequent n-grams recur
    hit = _SPLITS.get(key, keep, floor)
    if hit is None:
        hit = _large_children(indexes, ranges, k, separator, keep, floor)
        _SPLITS.put(key, keep, floor, hit)
    return hit


def _sparse_children(indexes, ranges: Ranges, k: int, sep: int | None, keep: int, floor: int,
                     live: list[int], stride: int, waiting: Sequence[int]
                     ) -> list[tuple[int, int, Handle]]:
    """split_children when the floor is high: few samples, read and searched in plain Python.

    With samples every `stride` <= floor / indexes positions, a token no sample shows has fewer
    than `stride` occurrences in each index, under the floor in total, so the sampled tokens are
    all the candidates; those whose sample-gap upper bound reaches the floor get exact boundaries.
    """
    sampled = []  # (index, positions, values ascending)
    for i in live:
        lo, hi = ranges[i]
        ix = indexes[i]
        tok, sa, n = ix._tok, ix._sa, ix.n
        pos = list(range(lo, hi, stride))
        if pos[-1] != hi - 1:
            pos.append(hi - 1)
        vals = []
        for p in pos:
            q = sa[p] + k
            vals.append(tok[q] if q < n else -1)
        sampled.append((i, pos, vals))
    cands = sorted({t for _, _, vals in sampled for t in vals
                    if t >= 0 and (sep is None or t < sep)})
    bracketed = []  # (token, windows, upper bound of its count)
    lows = []  # lower bounds: the samples of a token span at least that many positions
    for t in cands:
        windows, upper, low = [], 0, 0
        for i, pos, vals in sampled:
            lo, hi = ranges[i]
            jl, jr = bisect_left(vals, t), bisect_right(vals, t)
            a = pos[jl - 1] + 1 if jl else lo  # the first t lies in [a, b]
            b = pos[jl] if jl < len(pos) else hi
            c = pos[jr - 1] + 1 if jr else lo  # the first value above t lies in [c, d]
            d = pos[jr] if jr < len(pos) else hi
            windows.append((i, a, b, c, d))
            upper += d - a
            low += pos[jr - 1] - pos[jl] + 1 if jr > jl else 0
        if upper >= floor:
            bracketed.append((t, windows, upper))
            lows.append(low)
    # Below the keep-th best of the waiting counts and the siblings' lower bounds, a child is
    # outranked by `keep` nodes that will all be in the heap with it: it can never be popped.
    rivals = sorted(list(waiting[:keep]) + lows, reverse=True)
    cut = max(floor, rivals[keep - 1] if len(rivals) >= keep else 0)
    found = []
    for t, windows, upper in bracketed:
        if upper < cut:
            continue
        count, child = 0, [(0, 0)] * len(ranges)
        for i, a, b, c, d in windows:
            start = _scalar_bound(indexes[i], k, a, b, t, False)
            end = _scalar_bound(indexes[i], k, max(c, start), d, t, True)
            if end > start:
                child[i] = (start, end)
                count += end - start
        if count >= cut:
            found.append((t, count, child))
    found.sort(key=lambda x: (-x[1], x[0]))
    return [(t, c, (k + 1, tuple(r), c)) for t, c, r in found[:keep]]


def _strides(ranges: Ranges, live: list[int], floor: int) -> dict[int, int]:
    """Initial sampling stride per index: SAMPLES per range, dense up to DENSE_RANGE, and as sparse
    as the floor allows (gaps < floor / 2 in total can hide no child worth returning)."""
    by_floor = floor // (2 * len(live))
    out = {}
    for i in live:
        width = ranges[i][1] - ranges[i][0]
        base = 1 if width <= DENSE_RANGE else -(-width // SAMPLES)
        out[i] = max(base, by_floor)
    return out


def _large_children(indexes, ranges: Ranges, k: int, sep: int | None, keep: int, floor: int):
    """split_children by sampling. Each round bounds every sampled token's count from its samples,
    and any unsampled token's count by the widest gap between samples it could hide in; sampling
    denser inside the wide gaps until `keep` tokens (or the floor) are known to outrank anything
    unseen. Only tokens that can still make the cut get exact boundaries (binary searches within
    one gap)."""
    live = [i for i, (lo, hi) in enumerate(ranges) if hi > lo]
    strides = _strides(ranges, live, floor)
    samples = {i: _sample(indexes[i], *ranges[i], k, strides[i]) for i in live}  # i -> (sp, sv)
    while True:
        cand = np.sort(np.concatenate([sv for _, sv in samples.values()]))  # [c] int64
        cand = cand[np.concatenate(([True], cand[1:] != cand[:-1]))]
        cand = cand[(cand >= 0) & ((cand < sep) if sep is not None else True)]
        low = np.zeros(cand.shape[0], dtype=np.int64)
        high = np.zeros(cand.shape[0], dtype=np.int64)
        unseen = 0  # most occurrences a token no sample shows can have, summed over indexes
        for i in live:
            sp, sv = samples[i]
            lo_c, hi_c, gap = _count_bounds(sp, sv, cand, *ranges[i])
            low += lo_c
            high += hi_c
            unseen += gap
        cut = max(floor, int(np.partition(low, -keep)[-keep]) if cand.shape[0] >= keep else 0)
        if unseen < cut or unseen == 0:
            break
        step = max(1, cut // len(live))  # gaps below `step` bound unseen tokens to < cut in total
        for i in live:
            samples[i] = _refine(indexes[i], k, *samples[i], step)
    survivors = cand[high >= cut]  # the others have `keep` candidates strictly above them
    return _exact_children(indexes, ranges, k, live, samples, survivors, keep, floor)


def _count_bounds(sp: np.ndarray, sv: np.ndarray, cand: np.ndarray, lo: int, hi: int):
    """Per candidate (lower, upper) bounds of its count in one index from samples sp [m] (sorted
    positions, sp[0] == lo, sp[-1] == hi - 1) with values sv [m]; and the widest gap that could hide
    an unsampled token (its neighbours' values differ by >= 2)."""
    jl = np.searchsorted(sv, cand, "left")  # [c]
    jr = np.searchsorted(sv, cand, "right")  # [c]
    padded = np.concatenate(([lo - 1], sp, [hi]))  # [m + 2]
    upper = padded[jr + 1] - padded[jl] - 1
    lower = np.where(jr > jl, sp[np.maximum(jr - 1, 0)] - sp[np.minimum(jl, sp.shape[0] - 1)] + 1, 0)
    hiding = (sv[1:] - sv[:-1]) >= 2
    gaps = (sp[1:] - sp[:-1] - 1)[hiding]
    return lower, upper, int(gaps.max()) if gaps.shape[0] else 0


def _refine(index: SuffixIndex, k: int, sp: np.ndarray, sv: np.ndarray, step: int):
    """Samples every `step` positions inside the gaps of >= step positions that could hide a token."""
    gap = sp[1:] - sp[:-1] - 1  # [m - 1] unsampled positions between neighbours
    wide = np.flatnonzero((gap >= step) & ((sv[1:] - sv[:-1]) >= 2))
    if wide.shape[0] == 0:
        return sp, sv
    starts, lengths = sp[wide] + 1, gap[wide]
    per = -(-lengths // step)  # [w] new samples per gap
    offsets = np.arange(int(per.sum()), dtype=np.int64) - np.repeat(np.cumsum(per) - per, per)
    new = np.repeat(starts, per) + offsets * step  # [new] inside the gaps
    pos = np.concatenate((sp, new))
    order = np.argsort(pos, kind="stable")
    return pos[order], np.concatenate((sv, _values(index, new, k)))[order]


def _exact_children(indexes, ranges: Ranges, k: int, live: list[int], samples: dict,
                    cand: np.ndarray, keep: int, floor: int):
    """Exact sub-ranges and counts of the candidate tokens [c]; the best `keep` as children."""
    if cand.shape[0] == 0:
        return []
    lo_arr, hi_arr = _boundaries(indexes, k, ranges, live, samples, cand)  # [live, c] int64
    counts = (hi_arr - lo_arr).sum(axis=0)  # [c] int64
    order = np.lexsort((cand, -counts))[:keep]
    order = order[counts[order] >= max(floor, 1)]
    out = []
    empty = [(0, 0)] * len(ranges)
    rows = zip(cand[order].tolist(), counts[order].tolist(), lo_arr[:, order].T.tolist(),
               hi_arr[:, order].T.tolist())
    for t, c, a_row, b_row in rows:
        child = list(empty)
        for i, a, b in zip(live, a_row, b_row):
            child[i] = (a, b)
        out.append((t, c, (k + 1, tuple(child), c)))
    return out


class _SplitCache:
    """LRU of large splits: {(index serials, ranges, k, separator): (keep, floor, children)}. An
    entry answers any call with a smaller keep and a higher floor (a prefix of the same order).
    Serials are never reused, so an entry can never be read for another index."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._data: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, keep: int, floor: int):
        with self._lock:
            hit = self._data.get(key)
            if hit is None or hit[0] < keep or hit[1] > floor:
                return None
            self._data.move_to_end(key)
        return [c for c in hit[2][:keep] if c[1] >= floor]

    def put(self, key, keep: int, floor: int, children: list) -> None:
        with self._lock:
            old = self._data.get(key)
            if old is None or old[0] < keep or old[1] > floor:
                self._data[key] = (keep, floor, children)
            self._data.move_to_end(key)
            while len(self._data) > self.capacity:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


_SPLITS = _SplitCache(SPLIT_CACHE)


# ------------------------------------------------------------------------------------- drafting


def longest_match(indexes: Sequence[SuffixIndex], tail: list[int], min_suffix: int
                  ) -> tuple[int, Ranges]:
    """(L, ranges of the last L tokens per index) for the longest L in [min_suffix, len(tail)]
    whose suffix occurs in any index; (0, ()) when none does. Bisection: matching is monotone."""
    live = [ix for ix in indexes if ix.n]
    best, a, b = 0, min_suffix, len(tail)
    while a <= b:
        mid = (a + b) >> 1
        pat = tail[len(tail) - mid:]
        if any(occurs(ix, pat) for ix in live):
            best, a = mid, mid + 1
        else:
            b = mid - 1
    if best == 0:
        return 0, ()
    pat = tail[len(tail) - best:]
    return best, tuple(pattern_range(ix, pat) if ix.n else (0, 0) for ix in indexes)


def _check_draft_args(budget: int, max_depth: int, max_suffix: int, min_suffix: int) -> None:
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    if max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    if not 1 <= min_suffix <= max_suffix:
        raise ValueError(f"need 1 <= min_suffix <= max_suffix, got {min_suffix}, {max_suffix}")


def draft_from(indexes: Sequence[SuffixIndex], context, budget: int = 64, max_depth: int = 16,
               max_suffix: int = 16, min_suffix: int = 1, separator: int | None = None
               ) -> DraftTree:
    """The exact weighted trie after `context` over all indexes together (DESIGN.md).

    context: 1-D token ids (list, numpy or torch); only its last max_suffix ids are read.
    separator: defaults to the indexes' own. match_len = the longest matching suffix length L.
    """
    _check_draft_args(budget, max_depth, max_suffix, min_suffix)
    indexes = list(indexes)
    sep = _separator(indexes, separator)
    tail = _as_ints(context[-max_suffix:] if len(context) else context)
    tail = tail[_barrier(tail, sep) + 1:]
    if budget == 0 or len(tail) < min_suffix or not indexes:
        return DraftTree.empty()
    L, ranges = longest_match(indexes, tail, min_suffix)
    if L == 0:
        return DraftTree.empty()
    frontier = _Frontier(budget)
    roots = split_children(indexes, ranges, L, sep, budget)
    frontier.push(roots)

    def children(handle: Handle) -> Iterable:
        k, rng, count = handle
        left = budget - frontier.pop(count)
        if k - L >= max_depth or left <= 0:  # depth k - L; see the max_depth + 1 below
            return ()
        # A child below the left-th best count waiting in the heap can never be popped.
        kids = split_children(indexes, rng, k, sep, left, frontier.floor(left), frontier.top)
        frontier.push(kids)
        return kids

    # One level deeper than asked, so that every pop reaches children() (which returns nothing at
    # max_depth): the frontier then knows exactly which counts are still waiting in the heap.
    tokens, parents, counts = expand_best_first(roots, children, budget, max_depth + 1)
    return DraftTree(tokens, parents, counts, match_len=L)


class _Frontier:
    """The best counts waiting in expand_best_first's heap, mirrored from its pushes and pops.

    Only the `left` largest are kept (left = pops still to come): a count below them can never be
    the left-th largest again, since every pop removes the largest waiting count.
    """

    __slots__ = ("top", "budget", "popped")

    def __init__(self, budget: int) -> None:
        self.top: list[int] = []  # descending
        self.budget = budget
        self.popped = 0

    def push(self, kids: list) -> None:
        left = self.budget - self.popped
        self.top = sorted(self.top + [c for _, c, _ in kids[:left]], reverse=True)[:left]

    def pop(self, count: int) -> int:
        """The node with `count` (the largest waiting) was popped; -> nodes popped so far."""
        self.popped += 1
        if self.top and self.top[0] == count:
            del self.top[0]
        else:  # cannot happen with expand_best_first's order; stay exact regardless
            self.top = []
        return self.popped

    def floor(self, r: int) -> int:
        """The r-th largest waiting count (0 when fewer than r wait)."""
        return self.top[r - 1] if 0 < r <= len(self.top) else 0
