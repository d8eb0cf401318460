"""`DraftTree`: the one type every producer emits and the decoder consumes.

A tree of draft continuations after the last context token, stored as flat parent-pointer
arrays in topological order (a parent always precedes its children). Producers: the datastore
(in process or over gRPC), the sharded client and every local drafter.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, Sequence

import numpy as np

# A node handle is whatever a producer needs to find a node's children again (a suffix-array
# range per shard, an index into a materialised tree, ...).
Children = Callable[[Hashable], Iterable[tuple[int, int, Hashable]]]


@dataclass(frozen=True, eq=False)
class DraftTree:
    tokens: np.ndarray  # [n] int32 token id of each node
    parents: np.ndarray  # [n] int32 index of the parent node, -1 = child of the last context token
    counts: np.ndarray  # [n] int64 weight of the path root..node (exact occurrences for the datastore)
    match_len: int = 0  # length of the context suffix the drafts were matched on (0 = no match)
    source: str = "retrieval"

    def __post_init__(self) -> None:
        tokens = np.ascontiguousarray(self.tokens, dtype=np.int32).reshape(-1)
        parents = np.ascontiguousarray(self.parents, dtype=np.int32).reshape(-1)
        counts = np.ascontiguousarray(self.counts, dtype=np.int64).reshape(-1)
        if not (tokens.shape == parents.shape == counts.shape):
            raise ValueError(
                f"DraftTree arrays differ in length: tokens {tokens.shape}, "
                f"parents {parents.shape}, counts {counts.shape}"
            )
        n = tokens.shape[0]
        if n and (np.any(parents < -1) or np.any(parents >= np.arange(n, dtype=np.int32))):
            raise ValueError("DraftTree parents must be -1 or the index of an earlier node")
        if n and np.any(tokens < 0):
            raise ValueError("DraftTree tokens must be non-negative")
        if self.match_len < 0:
            raise ValueError("DraftTree match_len must be >= 0")
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "counts", counts)

    @classmethod
    def empty(cls, source: str = "retrieval") -> "DraftTree":
        z = np.zeros(0, dtype=np.int32)
        return cls(z, z, np.zeros(0, dtype=np.int64), 0, source)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def depths(self) -> np.ndarray:
        """[n] int32, 1 for children of the context."""
        depth = np.zeros(len(self), dtype=np.int32)
        for i, p in enumerate(self.parents.tolist()):  # n <= a few hundred; topological order
            depth[i] = 1 if p < 0 else depth[p] + 1
        return depth

    def paths(self) -> dict[tuple[int, ...], int]:
        """{token path from the root: count}; order-independent view used by tests and merges."""
        out: dict[tuple[int, ...], int] = {}
        path_of: list[tuple[int, ...]] = []
        for tok, par, cnt in zip(self.tokens.tolist(), self.parents.tolist(), self.counts.tolist()):
            path = (path_of[par] if par >= 0 else ()) + (tok,)
            path_of.append(path)
            out[path] = cnt
        return out

    def same_as(self, other: "DraftTree") -> bool:
        """Exact equality of the arrays (order included) and of match_len."""
        return (
            self.match_len == other.match_len
            and np.array_equal(self.tokens, other.tokens)
            and np.array_equal(self.parents, other.parents)
            and np.array_equal(self.counts, other.counts)
        )


def expand_best_first(
    roots: Iterable[tuple[int, int, Hashable]],
    children: Children,
    budget: int,
    max_depth: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Best-first expansion shared by every producer, so that they all break ties alike.

    `roots` and `children(handle)` yield `(token, count, handle)`. Nodes are popped by larger
    count, then smaller token id, then the order they were discovered in; a node's children are
    discovered only when it is popped. Returns (tokens [n] int32, parents [n] int32, counts [n]
    int64) in pop order, n <= budget.
    """
    heap: list[tuple[int, int, int, int, int, Hashable]] = []
    seq = 0
    for tok, cnt, handle in roots:
        heap.append((-cnt, tok, seq, -1, 1, handle))
        seq += 1
    heapq.heapify(heap)
    tokens: list[int] = []
    parents: list[int] = []
    counts: list[int] = []
    while heap and len(tokens) < budget:
        neg, tok, _, parent, depth, handle = heapq.heappop(heap)
        index = len(tokens)
        tokens.append(tok)
        parents.append(parent)
        counts.append(-neg)
        if depth < max_depth:
            for ctok, ccnt, chandle in children(handle):
                heapq.heappush(heap, (-ccnt, ctok, seq, index, depth + 1, chandle))
                seq += 1
    return (
        np.asarray(tokens, dtype=np.int32),
        np.asarray(parents, dtype=np.int32),
        np.asarray(counts, dtype=np.int64),
    )


def _child_index(tree: DraftTree) -> list[list[int]]:
    """children[parent + 1] = child node indices; slot 0 holds the roots."""
    kids: list[list[int]] = [[] for _ in range(len(tree) + 1)]
    for i, p in enumerate(tree.parents.tolist()):
        kids[p + 1].append(i)
    return kids


def reselect(tree: DraftTree, budget: int, max_depth: int) -> DraftTree:
    """Re-run the best-first selection over an already materialised tree."""
    kids = _child_index(tree)
    tok = tree.tokens.tolist()
    cnt = tree.counts.tolist()

    def children(i: int) -> Iterable[tuple[int, int, int]]:
        return ((tok[c], cnt[c], c) for c in kids[i + 1])

    t, p, c = expand_best_first(children(-1), children, budget, max_depth)
    return DraftTree(t, p, c, tree.match_len, tree.source)


def merge_sum(trees: Sequence[DraftTree], budget: int, max_depth: int) -> DraftTree:
    """Sum the counts of identical paths over trees (shards), then re-select `budget` nodes.

    Only trees matched on the longest suffix take part: a shard that matched a shorter suffix
    is not drafting from the same context as one that matched a longer one.
    """
    trees = [t for t in trees if len(t)]
    if not trees:
        return DraftTree.empty()
    best = max(t.match_len for t in trees)
    total: dict[tuple[int, ...], int] = {}
    for t in trees:
        if t.match_len != best:
            continue
        for path, c in t.paths().items():
            total[path] = total.get(path, 0) + c
    paths = sorted(total, key=lambda p: (len(p), p))  # parents before children
    index = {p: i for i, p in enumerate(paths)}
    merged = DraftTree(
        [p[-1] for p in paths],
        [index[p[:-1]] if len(p) > 1 else -1 for p in paths],
        [total[p] for p in paths],
        best,
        trees[0].source,
    )
    return reselect(merged, budget, max_depth)


_FIELDS = ("tokens", "parents", "counts", "match_len", "source")
_FIELDS_MATCH = tuple(f.name for f in __import__("dataclasses").fields(DraftTree)) == _FIELDS
_I32, _I64 = np.dtype(np.int32), np.dtype(np.int64)


def trusted(tokens: np.ndarray, parents: np.ndarray, counts: np.ndarray, match_len: int,
            source: str) -> DraftTree:
    """DraftTree(tokens, parents, counts, match_len, source) for arrays its producer built itself
    (the kernel, a local drafter, a tree being renamed): 1-D contiguous int32 / int32 / int64,
    parents before children, tokens >= 0. Skips the checks (~12-18 us a tree, more than many
    whole drafts); arrays of other dtypes or layouts go through the validating constructor.
    Every producer's tests compare its trees with the validating constructor's."""
    if not (_FIELDS_MATCH and tokens.dtype == _I32 and parents.dtype == _I32 and counts.dtype == _I64
            and tokens.ndim == 1 and tokens.flags.c_contiguous and parents.flags.c_contiguous
            and counts.flags.c_contiguous):
        return DraftTree(tokens, parents, counts, match_len, source)
    tree = object.__new__(DraftTree)
    setattr_ = object.__setattr__
    for name, value in zip(_FIELDS, (tokens, parents, counts, match_len, source)):
        setattr_(tree, name, value)
    return tree
