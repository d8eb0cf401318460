"""Brute-force references for the datastore tests: a token stream scanned position by position and a
fully materialised trie, no suffix array involved."""
from __future__ import annotations

import numpy as np
import pydivsufsort

from datastore.index import SuffixIndex
from datastore.tree import DraftTree, reselect


def stream(docs, separator: int, dtype=np.uint16) -> np.ndarray:
    """[n] documents concatenated, each followed by the separator (the on-disk layout)."""
    parts = []
    for d in docs:
        parts.append(np.asarray(d, dtype=np.int64))
        parts.append(np.array([separator], dtype=np.int64))
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)


def make_index(docs, separator: int, dtype=np.uint16) -> SuffixIndex:
    tokens = stream(docs, separator, dtype)
    sa = pydivsufsort.divsufsort(tokens).astype(np.int32) if len(tokens) else np.zeros(0, np.int32)
    return SuffixIndex(tokens, sa)


def occurrences(docs, pattern) -> list[tuple[int, int]]:
    """[(doc, start)] of every occurrence of pattern inside a document."""
    pat = np.asarray(list(pattern), dtype=np.int64)
    m = len(pat)
    out = []
    for d, doc in enumerate(docs):
        doc = np.asarray(doc, dtype=np.int64)
        if len(doc) < m:
            continue
        windows = np.lib.stride_tricks.sliding_window_view(doc, m)  # [len - m + 1, m] every start
        out.extend((d, int(s)) for s in np.flatnonzero((windows == pat).all(axis=1)))
    return out


def count(docs, pattern) -> int:
    return len(occurrences(docs, pattern))


def longest_match(docs, context, max_suffix: int, min_suffix: int) -> int:
    context = list(map(int, context))
    for L in range(min(max_suffix, len(context)), min_suffix - 1, -1):
        if count(docs, context[len(context) - L:]):
            return L
    return 0


def backoff_length(docs, context, max_suffix: int, min_suffix: int, min_count: int) -> int:
    """The longest suffix length seen >= min_count times, scanning down from the longest match;
    the longest match when it spans all max_suffix tokens or when no length is seen that often."""
    longest = longest_match(docs, context, max_suffix, min_suffix)
    if longest == max_suffix:
        return longest
    context = list(map(int, context))
    for L in range(longest, min_suffix - 1, -1):
        if count(docs, context[len(context) - L:]) >= min_count:
            return L
    return longest


def full_trie(docs, context, max_depth: int, max_suffix: int, min_suffix: int,
              min_count: int = 1) -> DraftTree:
    """Every continuation path (up to max_depth, never past a document's end) of the longest
    matching suffix (seen >= min_count times, see backoff_length), with exact counts, parents
    before children."""
    L = backoff_length(docs, context, max_suffix, min_suffix, min_count)
    if L == 0:
        return DraftTree.empty()
    suffix = list(map(int, context))[len(context) - L:]
    counts: dict[tuple[int, ...], int] = {}
    for d, s in occurrences(docs, suffix):
        cont = list(map(int, docs[d]))[s + L:s + L + max_depth]
        for j in range(1, len(cont) + 1):
            counts[tuple(cont[:j])] = counts.get(tuple(cont[:j]), 0) + 1
    paths = sorted(counts, key=lambda p: (len(p), p))
    index = {p: i for i, p in enumerate(paths)}
    return DraftTree([p[-1] for p in paths], [index[p[:-1]] if len(p) > 1 else -1 for p in paths],
                     [counts[p] for p in paths], L)


def reference_draft(docs, context, budget=64, max_depth=16, max_suffix=16, min_suffix=1,
                    min_count=1) -> DraftTree:
    if len(context) < min_suffix or budget == 0:
        return DraftTree.empty()
    return reselect(full_trie(docs, context, max_depth, max_suffix, min_suffix, min_count), budget,
                    max_depth)
