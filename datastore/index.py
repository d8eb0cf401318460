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
  are exact (the kernel's comment has the details).
* `draft_from` / `draft_batch` run the whole draft in the kernel, one C call for a batch of
  contexts with the GIL released: the longest matching context suffix by bisection over its length
  (a suffix of length L matches wherever one of length L + 1 does), the min_count backoff, and the
  best-first expansion of the trie (pops by larger count, then smaller token id, then discovery
  order: `datastore.tree.expand_best_first`'s order), counting occurrences summed over all indexes,
  so a sharded datastore drafts exactly what one unsharded datastore drafts. The expansion mirrors
  the counts waiting in its heap: a child that ranks below `left` of them (left = pops still to
  come), or below `left` of its siblings, can never be popped, so it is neither needed nor computed.
  (Until the expansion moved into C it ran here, in Python, with a cache of large splits: ~200 us a
  draft at the median on the stdlib store, against ~25 us now without any cache; that Python
  expansion is kept as a reference in tests/test_datastore_batch.py.)

The separator that ends every document is never a child and never part of a match: ids outside
[0, separator) in a context act as barriers, since no document contains them.
"""
from __future__ import annotations

import operator
from typing import Sequence

import numpy as np

from datastore.tree import DraftTree, trusted

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
# Threads that draft one batch by default (each context is drafted by one thread alone: the trees
# do not depend on it), at most one per CONTEXTS_PER_THREAD contexts (a thread costs ~20-50 us to
# start). 1: the 2-core development machine, shared, shows no gain; raise it on a many-core host.
DRAFT_THREADS = 1
CONTEXTS_PER_THREAD = 8
NO_SEPARATOR = (1 << 63) - 1  # token limit when there is no separator: every id >= 0 is a token
Ranges = tuple[tuple[int, int], ...]  # (lo, hi) per index
Handle = tuple[int, Ranges, int]  # a trie node: (offset of its children's token, ranges, count)


class SuffixIndex:
    """Tokens [n] uint16|uint32 and their suffix array [n] int32|int64 (zero-copy views are fine).

    `separator` defaults to the last token: every shard ends with the separator after its last
    document. Suffixes must be sorted by token value, a shorter suffix first (pydivsufsort's order).
    """

    __slots__ = ("tokens", "sa", "n", "separator", "starts", "kernel")

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
    return _kernel.split(tuple(ix.kernel for ix in indexes), tuple(ranges), k,
                         NO_SEPARATOR if sep is None else sep, keep, floor, list(waiting), SAMPLES,
                         DENSITY)[0]


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
    longest seen >= min_count times (`backoff_match`). One call of the kernel (`draft_batch`).
    """
    return draft_batch(indexes, (context,), budget, max_depth, max_suffix, min_suffix, separator,
                       min_count)[0]


def draft_batch(indexes: Sequence[SuffixIndex], contexts: Sequence, budget=64, max_depth=16,
                max_suffix: int = 16, min_suffix: int = 1, separator: int | None = None,
                min_count: int = 1, threads: int | None = None, spec_factor: float = 0.0
                ) -> list[DraftTree]:
    """`draft_from` for every context, in one call of the kernel with the GIL released.

    budget, max_depth: an int, or one per context. The trees are exactly draft_from's, each
    context drafted on its own: tokens, parents, counts and match_len. threads: how many draft
    the batch (None: up to DRAFT_THREADS, one per CONTEXTS_PER_THREAD contexts). spec_factor > 0:
    a tree grows no deeper than spec_factor x its match length (at least 1), as SuffixDecoding's
    max_spec_factor bounds its drafts (0: max_depth alone).
    """
    if not spec_factor >= 0:
        raise ValueError(f"spec_factor must be >= 0, got {spec_factor}")
    n = len(contexts)
    budgets, depths = _per_context(budget, n, "budget"), _per_context(max_depth, n, "max_depth")
    _check_draft_args(budgets if isinstance(budgets, int) else min(budgets, default=0),
                      depths if isinstance(depths, int) else min(depths, default=1),
                      max_suffix, min_suffix, min_count)
    indexes = list(indexes)
    if not indexes or not n:
        return [DraftTree.empty() for _ in range(n)]
    sep = _separator(indexes, separator)
    # lists, tuples and integer numpy arrays go to the kernel as they are (it reads only their
    # last max_suffix ids); anything else (torch tensors, ...) becomes a list of ints first
    ctxs = [c if type(c) in _NATIVE or (isinstance(c, np.ndarray) and c.dtype.kind in "iub"
                                        and c.dtype.isnative)
            else _as_ints(c[-max_suffix:] if len(c) else c) for c in contexts]
    tok, par, cnt, off, match = _kernel.draft_batch(
        tuple([ix.kernel for ix in indexes]), ctxs, budgets, depths, max_suffix, min_suffix,
        NO_SEPARATOR if sep is None else sep, min_count, SAMPLES, DENSITY,
        max(1, min(DRAFT_THREADS, n // CONTEXTS_PER_THREAD)) if threads is None else threads,
        float(spec_factor))
    tok = np.frombuffer(tok, dtype=np.int32)  # [total] every tree's nodes, concatenated
    par = np.frombuffer(par, dtype=np.int32)
    cnt = np.frombuffer(cnt, dtype=np.int64)
    return [trusted(tok[a:b], par[a:b], cnt[a:b], m, "retrieval")  # off: n + 1 ints, match: n ints
            for a, b, m in zip(off, off[1:], match)]


_NATIVE = (list, tuple)


def _per_context(value, n: int, name: str) -> int | list[int]:
    """An int, or a list of n ints (one per context)."""
    try:
        return operator.index(value)
    except TypeError:
        pass
    values = [operator.index(v) for v in value]
    if len(values) != n:
        raise ValueError(f"{name}: {len(values)} values for {n} contexts")
    return values


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
