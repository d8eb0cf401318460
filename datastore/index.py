"""Suffix-array search on typed token arrays and the exact weighted trie of DESIGN.md.

A `SuffixIndex` is one shard (or an in-memory live index): tokens and their suffix array, both
typed numpy arrays that may be zero-copy views of LMDB pages. Everything here is exact. The search
and the child splitting run in the compiled `datastore._kernel` (datastore/_kernel.c, built by
`pip install -e .`); this module holds the trie around it:

* `pattern_range` finds the suffix-array range of a token pattern by binary search, comparing the
  pattern with the first tokens of a suffix (pydivsufsort's `sa_search` only takes bytes).
* `split_children` divides a range whose suffixes share a prefix of length k into its children: the
  sub-ranges that share the token at offset k. A short suffix can match millions of positions, so
  ranges are sampled, never read whole: every sampled token's count is bracketed by its
  neighbouring samples, any unsampled token's count by the widest gap it could hide in, and only
  the gaps around tokens that can still make the cut are sampled further, until their boundaries
  are exact (the kernel's comment has the details). Large splits are cached: the same frequent
  n-grams recur across calls.
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
from collections import OrderedDict
from typing import Iterable, Sequence

import numpy as np

from datastore.tree import DraftTree, expand_best_first

try:
    from datastore import _kernel
except ImportError as exc:  # pragma: no cover - a source tree without the built extension
    raise ImportError("datastore._kernel (datastore/_kernel.c) is not built: run `make install` "
                      "or `pip install -e .` in the repository") from exc

# First samples per shard range (a range this small or smaller is read whole). Measured on the
# 107M-token code store (1000 HumanEval contexts, thread-CPU p99 of a draft): 1.91 ms at 64,
# 1.65 at 128, 1.69 at 256.
SAMPLES = 128
# Samples per shard for a child at the (estimated) cut when hunting for tokens no sample shows:
# sparser leaves more small tokens whose upper bound reaches the cut (each then needs exact
# boundary searches), denser reads more samples. Same measure: 2.79 ms at 1, 1.65 at 2, 1.68 at 3.
DENSITY = 2
# Splits of ranges wider than this are cached (a hit costs ~2 µs, a large split 10-800 µs).
CACHE_RANGE = 4096
# Splits remembered (each <= budget children): the same frequent n-grams recur across calls.
SPLIT_CACHE = 4096
NO_SEPARATOR = (1 << 63) - 1  # token limit when there is no separator: every id >= 0 is a token
Ranges = tuple[tuple[int, int], ...]  # (lo, hi) per index
Handle = tuple[int, Ranges, int]  # a trie node: (offset of its children's token, ranges, count)
_SERIALS = itertools.count()


class SuffixIndex:
    """Tokens [n] uint16|uint32 and their suffix array [n] int32|int64 (zero-copy views are fine).

    `separator` defaults to the last token: every shard ends with the separator after its last
    document. Suffixes must be sorted by token value, a shorter suffix first (pydivsufsort's order).
    """

    __slots__ = ("tokens", "sa", "n", "separator", "serial", "starts", "kernel")

    def __init__(self, tokens: np.ndarray, sa: np.ndarray, separator: int | None = None) -> None:
        assert tokens.ndim == 1 and tokens.dtype in (np.uint16, np.uint32), (tokens.shape, tokens.dtype)
        assert sa.shape == tokens.shape and sa.dtype in (np.int32, np.int64), (sa.shape, sa.dtype)
        assert tokens.dtype.isnative and sa.dtype.isnative, (tokens.dtype, sa.dtype)
        self.tokens = np.ascontiguousarray(tokens)  # [n] uint16|uint32
        self.sa = np.ascontiguousarray(sa)  # [n] int32|int64
        self.n = int(tokens.shape[0])
        if separator is None and self.n:
            separator = int(self.tokens[-1])
        self.separator = None if separator is None else int(separator)
        self.serial = next(_SERIALS)  # identifies the index in split caches (ids can be reused)
        self.starts = _bucket_starts(self.tokens)  # [max token + 2] int64
        self.kernel = _kernel.Shard(self.tokens, self.sa, self.starts)  # holds views of all three

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
    return np.concatenate(([0], np.cumsum(counts))).astype(np.int64)


# ----------------------------------------------------------------------------------- searching


def pattern_range(index: SuffixIndex, pattern: Sequence[int], lo: int = 0,
                  hi: int | None = None) -> tuple[int, int]:
    """[lo, hi) of the suffixes inside [lo, hi) that start with `pattern` (ints); O(log n) steps
    (a shorter suffix that is a prefix of the pattern sorts first, as in the suffix array)."""
    return _kernel.pattern_range(index.kernel, _as_ints(pattern), lo, index.n if hi is None else hi)


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
    sep = _separator(indexes, separator)
    split = _Splitter(indexes, NO_SEPARATOR if sep is None else sep)
    return split(tuple(ranges), k, keep, floor, list(waiting), sum(hi - lo for lo, hi in ranges))


class _Splitter:
    """split_children for one draft: the kernel's shards, and the split cache for wide ranges."""

    __slots__ = ("shards", "serials", "seplim")

    def __init__(self, indexes: Sequence[SuffixIndex], seplim: int) -> None:
        self.shards = tuple(ix.kernel for ix in indexes)
        self.serials = tuple(ix.serial for ix in indexes)
        self.seplim = seplim

    def __call__(self, ranges: Ranges, k: int, keep: int, floor: int, waiting: list[int],
                 width: int) -> list[tuple[int, int, Handle]]:
        """width: the suffixes in ranges (the node's count)."""
        if width <= CACHE_RANGE:
            return _kernel.split(self.shards, ranges, k, self.seplim, keep, floor, waiting,
                                 SAMPLES, DENSITY)[0]
        key = (self.serials, ranges, k, self.seplim)
        hit = _SPLITS.get(key, keep, floor)
        if hit is None:
            kids, cut = _kernel.split(self.shards, ranges, k, self.seplim, keep, floor, waiting,
                                      SAMPLES, DENSITY)
            _SPLITS.put(key, keep, cut, kids)
            return kids
        return hit


class _SplitCache:
    """LRU of large splits: {(index serials, ranges, k, separator): (keep, cut, children)}, where
    children are the best `keep` of the children with count >= cut: a prefix of the full sorted
    list. It answers a call (keep', floor') when it holds keep' children, or all down to the cut
    and floor' >= cut. Serials are never reused, so an entry can never be read for another index."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._data: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, keep: int, floor: int):
        with self._lock:
            hit = self._data.get(key)
            if hit is None:
                return None
            most, cut, kids = hit
            if len(kids) < keep and (floor < cut or len(kids) >= most):
                return None
            self._data.move_to_end(key)
        return [c for c in kids[:keep] if c[1] >= floor]

    def put(self, key, keep: int, cut: int, children: list) -> None:
        with self._lock:
            self._data[key] = (keep, cut, children)
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
    return _kernel.longest_match(tuple(ix.kernel for ix in indexes), tail, min_suffix)


def _check_draft_args(budget: int, max_depth: int, max_suffix: int, min_suffix: int,
                      min_count: int = 1) -> None:
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    if max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    if not 1 <= min_suffix <= max_suffix:
        raise ValueError(f"need 1 <= min_suffix <= max_suffix, got {min_suffix}, {max_suffix}")
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")


def draft_from(indexes: Sequence[SuffixIndex], context, budget: int = 64, max_depth: int = 16,
               max_suffix: int = 16, min_suffix: int = 1, separator: int | None = None,
               min_count: int = 1) -> DraftTree:
    """The exact weighted trie after `context` over all indexes together (DESIGN.md).

    context: 1-D token ids (list, numpy or torch); only its last max_suffix ids are read.
    separator: defaults to the indexes' own. match_len = the suffix length L the trie grows from:
    the longest that matches, or with min_count > 1 and a match shorter than max_suffix the
    longest seen >= min_count times (`backoff_match`).
    """
    _check_draft_args(budget, max_depth, max_suffix, min_suffix, min_count)
    indexes = list(indexes)
    sep = _separator(indexes, separator)
    tail = _as_ints(context[-max_suffix:] if len(context) else context)
    tail = tail[_barrier(tail, sep) + 1:]
    if budget == 0 or len(tail) < min_suffix or not indexes:
        return DraftTree.empty()
    L, ranges = longest_match(indexes, tail, min_suffix)
    if L == 0:
        return DraftTree.empty()
    L, ranges = backoff_match(indexes, tail, min_suffix, L, ranges, min_count, max_suffix)
    split = _Splitter(indexes, NO_SEPARATOR if sep is None else sep)
    frontier = _Frontier(budget)
    roots = split(ranges, L, budget, 0, [], sum(hi - lo for lo, hi in ranges))
    frontier.push(roots)

    def children(handle: Handle) -> Iterable:
        k, rng, count = handle
        left = budget - frontier.pop(count)
        if k - L >= max_depth or left <= 0:  # depth k - L; see the max_depth + 1 below
            return ()
        # A child below the left-th best count waiting in the heap can never be popped.
        kids = split(rng, k, left, frontier.floor(left), frontier.top, count)
        frontier.push(kids)
        return kids

    # One level deeper than asked, so that every pop reaches children() (which returns nothing at
    # max_depth): the frontier then knows exactly which counts are still waiting in the heap.
    tokens, parents, counts = expand_best_first(roots, children, budget, max_depth + 1)
    return DraftTree(tokens, parents, counts, match_len=L)


def backoff_match(indexes: Sequence[SuffixIndex], tail: list[int], min_suffix: int, L: int,
                  ranges: Ranges, min_count: int, keep: int) -> tuple[int, Ranges]:
    """(L', ranges) for the longest L' in [min_suffix, L] whose suffix occurs >= min_count times
    over all indexes; the longest match (L, ranges) itself when it is `keep` tokens long (the
    whole max_suffix window) or when no length reaches min_count.

    A short match seen once or twice drafts one document's continuation, which the model follows
    far less often than the continuations of a shorter, well-attested suffix: on the 107M-token
    code store (40 HumanEval greedy outputs replayed) a 64-node trie gives 1.73 tokens/step from
    the longest match and 2.03 from the longest suffix seen >= 16 times. A match of the whole
    window is a real repeat (a live-tier copy of an earlier output, a quoted file) and is kept:
    keeping it costs nothing there (2.03 either way). Counts only fall as L grows, so bisection
    finds L' (ceil(log2 L) searches per index).
    """
    if min_count <= 1 or L >= keep or sum(hi - lo for lo, hi in ranges) >= min_count:
        return L, ranges
    best: tuple[int, Ranges] = (L, ranges)
    lo_len, hi_len = min_suffix, L  # the answer lies in [lo_len, hi_len); L itself is too rare
    while lo_len < hi_len:
        mid = (lo_len + hi_len) // 2
        found = tuple(pattern_range(ix, tail[-mid:]) if ix.n else (0, 0) for ix in indexes)
        if sum(hi - lo for lo, hi in found) >= min_count:
            best, lo_len = (mid, found), mid + 1
        else:
            hi_len = mid
    return best


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
