"""Token Recycling: the model's top-k next tokens after every token it verified, kept in a
`[vocab, k]` table that outlives requests, expanded from the last context token into a tree.

The tree's shape is a static template (best-first over rank weights: the child of rank r
weighs `rank_weights[r]` times its parent, so a node's count / parent count is the prior
probability that rank r is right), built once per (budget, max_depth); filling it is one gather
from the table per depth, and nodes whose parent or table entry is unknown (-1) are dropped.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Iterable

import numpy as np

from datastore.tree import DraftTree, expand_best_first
from decoder.drafters._util import SCALE, tree_depths
from decoder.drafters.base import Drafter

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
