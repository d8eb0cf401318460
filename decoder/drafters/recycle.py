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
from typing import Iterable, Sequence

import numpy as np

from datastore.tree import DraftTree, expand_best_first
from decoder import _step
from decoder.drafters._util import SCALE, empty_tree, make_tree, tree_depths
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


MASTER_SIZE = 8192  # nodes of a shared best-first order (64 x the largest default budget, 128)


@lru_cache(maxsize=32)
def _master(weights: tuple[float, ...], max_depth: int, size: int) -> tuple[np.ndarray, ...]:
    """The first `size` nodes of the best-first expansion to max_depth: (ranks, parents, depths, counts)."""
    def children(weight: int) -> Iterable[tuple[int, int, int]]:
        return [(r, max(1, int(weight * w)), max(1, int(weight * w))) for r, w in enumerate(weights)]

    ranks, parents, counts = expand_best_first(children(SCALE), children, size, max_depth)
    parents = parents.astype(np.int64)
    return ranks.astype(np.int64), parents, tree_depths(parents), counts


@lru_cache(maxsize=64)
def template(weights: tuple[float, ...], budget: int, max_depth: int) -> tuple[np.ndarray, ...]:
    """Static tree: (ranks [n] int64, parents [n] int64, depths [n] int64, counts [n] int64),
    best-first by path weight, parents before children.

    The first `budget` nodes of one expansion per depth cap (`_master`): a best-first expansion
    stopped after n pops is a prefix of the same expansion stopped later. A 4096-node template
    took ~55 ms of Python heap work at the first use of every (budget, depth) pair: at batch 1
    on a cold table that was most of a step's host time; the drafter now expands each depth cap
    once, when it is made."""
    size = max(MASTER_SIZE, budget)
    ranks, parents, depths, counts = _master(weights, max_depth, size)
    return ranks[:budget], parents[:budget], depths[:budget], counts[:budget]


def stage_sizes(budget: int, full: int) -> list[int]:
    """Template sizes `best_live_tree` tries in turn: budget, then 4x, up to min(full, 64 budget)."""
    sizes = [min(budget, full)]
    while sizes[-1] < full and sizes[-1] < 64 * budget:
        sizes.append(min(4 * sizes[-1], full, 64 * budget))
    return sizes


@lru_cache(maxsize=64)
def layout(weights: tuple[float, ...], budget: int, max_depth: int, one_stage: bool = False) -> tuple:
    """The largest template `best_live_tree` may fill, laid out for filling many rows at once.

    A template is a prefix of every larger one, so each stage only adds nodes. Storage
    order: stage by stage, each stage's new nodes sorted by depth, so every (stage, depth) is one
    slice. -> (sizes, per stage [(lo, hi, storage slot of each node's parent (-1: the context),
    ranks)], storage slot of each template node, parents [n] int32, counts [n] int64)."""
    full = sum(len(weights) ** d for d in range(1, max_depth + 1))
    sizes = stage_sizes(budget, full)
    # the result is the first `budget` known nodes of the largest template whichever stage
    # stops (a stage stops once it holds `budget` of them), so two stages do: `budget` nodes,
    # enough for a warm table, then all the rest at once (one slice per depth, not per retry)
    # (one_stage: straight to the largest, for tables so sparse that most rows need it)
    sizes = sizes[-1:] if one_stage else sizes[:1] + sizes[-1:] if len(sizes) > 1 else sizes
    ranks, parents, depths, counts = template(weights, sizes[-1], max_depth)
    order = np.concatenate([lo + np.argsort(depths[lo:hi], kind="stable")
                            for lo, hi in zip([0] + sizes[:-1], sizes)])  # storage slot -> node
    slot = np.empty_like(order)
    slot[order] = np.arange(order.shape[0])  # node -> storage slot
    pslot = np.where(parents[order] >= 0, slot[np.maximum(parents[order], 0)], -1)
    sdepth = depths[order]
    stages = []
    for lo, hi in zip([0] + sizes[:-1], sizes):
        levels = []
        bounds = lo + np.flatnonzero(np.diff(sdepth[lo:hi], prepend=-1, append=-1))
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            levels.append((a, b, pslot[a:b], ranks[order[a:b]], bool(sdepth[a] == 1)))
        stages.append(levels)
    return sizes, stages, slot, parents.astype(np.int32), counts.astype(np.int64)


class RecycleDrafter(Drafter):
    name = "recycle"

    def __init__(self, settings: RecycleSettings | None = None, **overrides):
        self.settings = replace(settings or RecycleSettings(), **overrides)
        self.topk = self.settings.k
        self._n = self.settings.vocab_size  # rows of the public table
        self._sparse = False  # most rows of the last proposal needed more than `budget` template nodes
        self._rows = 0  # rows of `_next` before the sentinel
        self._alloc(self._n)
        for depth in range(1, self.settings.max_depth + 1):  # ~0.3 s once per process, not in a step
            _master(self.settings.rank_weights, depth, MASTER_SIZE)

    def _alloc(self, rows: int) -> None:
        """`_next`: the successor table as flat row offsets, [(rows + 1) * k] int64: entry
        (t, r) = (rank-r successor of t) * k, or `_dead` = rows * k when unknown. Row `rows`, the
        sentinel, is all dead, and `rows` covers every successor id, so filling a tree level is
        one add and one take, with no mask."""
        old = self.table if self._rows else None
        self._rows = rows
        self._dead = rows * self.topk
        self._next = np.full((rows + 1) * self.topk, self._dead, dtype=np.int64)
        if old is not None:
            o = old.astype(np.int64)
            self._next[: o.size] = np.where(o >= 0, o * self.topk, self._dead).reshape(-1)

    @property
    def table(self) -> np.ndarray:
        """[vocab, k] int32 successors, best first; -1 = unknown (read-only: use observe_topk/reset)."""
        nxt = self._next[: self._n * self.topk].reshape(-1, self.topk)
        out = np.where(nxt == self._dead, -1, nxt // self.topk).astype(np.int32)
        out.flags.writeable = False  # a copy: writing into it would change nothing
        return out

    def _grow(self, max_token: int, max_successor: int) -> None:
        if max_token >= self._n:
            self._n = max(max_token + 1, 2 * self._n, 1024)
        need = max(self._n, max_successor + 1)
        if need > self._rows:
            self._alloc(max(need, 2 * self._rows))

    def observe_topk(self, tokens: np.ndarray, topk: np.ndarray) -> None:
        """A token seen twice keeps its latest top-k; one C pass over the positions
        (decoder/_step.c `recycle`; ~40 us of numpy a step at batch 1 before, the numpy version is
        the reference of tests/test_drafters_recycle.py)."""
        tokens = np.ascontiguousarray(tokens, dtype=np.int64).reshape(-1)  # [n]
        topk = np.ascontiguousarray(topk, dtype=np.int64)  # [n, k'] best first
        assert topk.ndim == 2 and topk.shape[0] == tokens.shape[0], f"topk must be [n, k], got {topk.shape}"
        if not tokens.shape[0]:
            return
        max_token, max_successor, written = _step.recycle(tokens, topk, self.topk, self._n, self._rows, self._next)
        if not written:  # a new token or successor beyond the table: grow it, then write
            self._grow(max_token, max_successor)
            _step.recycle(tokens, topk, self.topk, self._n, self._rows, self._next)

    def propose(self, row: int, context: np.ndarray, budget: int, max_depth: int) -> DraftTree:
        return self.propose_batch([row], [context], budget, [max_depth])[0]

    def propose_batch(self, rows: Sequence[int], contexts: Sequence[np.ndarray], budget: int,
                      max_depths: Sequence[int]) -> list[DraftTree]:
        """All rows from one template fill: one gather per depth for the rows sharing a depth cap."""
        out = [empty_tree(self.name)] * len(rows)
        if budget <= 0:
            return out
        cap = self.settings.max_depth
        groups: dict[int, list[tuple[int, int]]] = {}
        for i, (ctx, d) in enumerate(zip(contexts, max_depths)):
            if not len(ctx):
                continue
            last = int(ctx[-1])
            depth_cap = min(int(d), cap)
            if depth_cap <= 0 or last >= self._n or self._next[last * self.topk] == self._dead:
                continue
            groups.setdefault(depth_cap, []).append((i, last))
        for depth_cap, members in groups.items():
            last = np.array([t for _, t in members], dtype=np.int64)
            for (i, _), tree in zip(members, self._fill_rows(last, budget, depth_cap)):
                out[i] = tree
        return out

    def _fill_rows(self, last: np.ndarray, budget: int, depth_cap: int) -> list[DraftTree]:
        """`best_live_tree` for every row of `last` [b] at once: each stage fills only the
        template nodes it adds, one add and one take per depth, for the rows still short."""
        sizes, stages, slot, parents, counts = layout(self.settings.rank_weights, budget, depth_cap, self._sparse)
        trees: list[DraftTree | None] = [None] * last.shape[0]
        todo = np.arange(last.shape[0])
        val = np.empty((last.shape[0], sizes[-1]), dtype=np.int64)  # token * k per storage slot
        n_alive = np.zeros(last.shape[0], dtype=np.int64)
        nxt, dead, k = self._next, self._dead, self.topk
        base = last[:, None] * k
        lo = 0
        for size, levels in zip(sizes, stages):
            for a, b, pslot, ranks, root in levels:
                np.take(nxt, (base if root else val[:, pslot]) + ranks, out=val[:, a:b], mode="clip")
            n_alive += np.count_nonzero(val[:, lo:size] != dead, axis=1)
            final = n_alive >= budget
            # whether most rows need more than the first stage decides the next call's stages
            # (the trees are the same either way: the first `budget` known nodes of the largest)
            if lo == 0 and len(sizes) > 1:
                self._sparse = 2 * int(np.count_nonzero(final)) < final.shape[0]
            elif lo == 0 and size > budget:
                enough = np.count_nonzero((val[:, slot[:budget]] != dead).all(axis=1))
                self._sparse = 2 * int(enough) < final.shape[0]
            if size == sizes[-1]:
                final[:] = True
            for j in np.flatnonzero(final).tolist():
                trees[int(todo[j])] = self._tree(val[j, slot[:size]], parents, counts, budget)
            if final.all():
                return trees
            keep = ~final
            todo, base, val, n_alive = todo[keep], base[keep], val[keep], n_alive[keep]
            lo = size
        return trees

    def _tree(self, val: np.ndarray, parents: np.ndarray, counts: np.ndarray, budget: int) -> DraftTree:
        """The first `budget` known nodes of a filled template (val: [size] token * k, template order)."""
        alive = val != self._dead
        if alive[:budget].all():  # the first `budget` template nodes are all known: the template itself
            n = min(budget, val.shape[0])
            return make_tree((val[:n] // self.topk).astype(np.int32), parents[:n].copy(), counts[:n].copy(),
                             1, self.name)
        keep = np.flatnonzero(alive)[:budget]
        par = parents[keep]  # kept too (parents come first and are known), so their new index is
        new_par = np.searchsorted(keep, par).astype(np.int32)  # their position in `keep`
        return make_tree((val[keep] // self.topk).astype(np.int32), np.where(par >= 0, new_par, np.int32(-1)),
                         counts[keep], 1, self.name)

    def reset(self) -> None:
        """Forget every successor (the table otherwise persists across requests)."""
        self._next[:] = self._dead


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
