"""Merge the drafters' DraftTrees into one trie per row and keep the most probable nodes, for
all rows of a batch at once (flat arrays with a row id per node; no Python loop over rows; the
loops run in the C kernel decoder/_step.c, one call per operation for the whole batch).

Every node gets a probability estimate: within a source, count / (parent count) (siblings
normalised so they never sum above 1), scaled per source and depth by `Calibration` (observed
acceptance), combined over the sources that proposed the node as 1 - prod(1 - p). A node's path
probability is the product along its path; it never exceeds its parent's, so the top-T nodes of
a row by path probability (ties to the earlier, i.e. shallower-first, index) always include
their ancestors.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from datastore.tree import DraftTree
from decoder import _step

MAX_SOURCES = 62  # source bitmasks live in int64
EVIDENCE_BINS = 8  # evidence of an estimate: bin floor(log2(parent count)), 0..7 (>= 128 shares 7)


@dataclass(frozen=True, eq=False)
class MergedTree:
    """The merged tries of B rows. Row r owns nodes starts[r]:starts[r+1]; inside a row the
    nodes are in level order (a parent precedes its children; depth never decreases) and, per
    level, ordered by (parent, token). parents are indices into these arrays."""

    tokens: np.ndarray  # [n] int64
    parents: np.ndarray  # [n] int64, -1 = child of the row's last committed token
    depths: np.ndarray  # [n] int64 >= 1
    sources: np.ndarray  # [n] int64 bitmask: bit s = drafter s proposed this path
    raw_p: np.ndarray  # [n, S] float64 per-source conditional probability before calibration (0 = absent)
    bins: np.ndarray  # [n, S] int64 per-source evidence bin of raw_p (see evidence_bins)
    cond_p: np.ndarray  # [n] float64 calibrated, combined conditional probability
    path_p: np.ndarray  # [n] float64 product of cond_p along the path
    starts: np.ndarray  # [B + 1] int64 row offsets

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def rows(self) -> int:
        return int(self.starts.shape[0]) - 1

    @property
    def row(self) -> np.ndarray:
        """[n] int64 the row of each node."""
        return np.repeat(np.arange(self.rows, dtype=np.int64), np.diff(self.starts))

    @classmethod
    def empty(cls, n_sources: int = 1, rows: int = 1) -> "MergedTree":
        z = np.zeros(0, dtype=np.int64)
        f = np.zeros(0, dtype=np.float64)
        return cls(z, z, z, z, np.zeros((0, n_sources)), np.zeros((0, n_sources), dtype=np.int64), f, f,
                   np.zeros(rows + 1, dtype=np.int64))


def as_i64(a: np.ndarray) -> np.ndarray:
    """a as a C-contiguous int64 array (itself when it already is one): what decoder/_step.c reads."""
    return np.ascontiguousarray(a, dtype=np.int64)


def _denominators(counts: np.ndarray, parents: np.ndarray, root_slot: np.ndarray) -> np.ndarray:
    """[n] float64 max(parent count, sum of sibling counts); parents global (-1 = root),
    root_slot [n] a slot per tree for its roots (>= n)."""
    slot = np.where(parents >= 0, parents, root_slot)  # [n]
    sibling_sum = np.bincount(slot, weights=counts, minlength=int(root_slot.max()) + 1 if slot.shape[0] else 0)
    parent_count = np.where(parents >= 0, counts[np.maximum(parents, 0)], 0.0)  # roots: siblings only
    return np.maximum(parent_count, sibling_sum[slot])


def _tree_arrays(tree: DraftTree) -> tuple[np.ndarray, np.ndarray]:
    counts = np.maximum(tree.counts, 0).astype(np.float64)
    parents = tree.parents.astype(np.int64)
    return counts, _denominators(counts, parents, np.full(len(tree), len(tree), dtype=np.int64))


def raw_probabilities(tree: DraftTree, smoothing: float = 0.0) -> np.ndarray:
    """[n] float64: count / (max(parent count, sum of sibling counts) + smoothing), in [0, 1].

    smoothing > 0 discounts thin evidence: a continuation seen once of once is no certainty.
    """
    return _probabilities(*_tree_arrays(tree), smoothing)


def evidence_bins(tree: DraftTree) -> np.ndarray:
    """[n] int64 floor(log2(parent count)) clipped to 0..EVIDENCE_BINS-1.

    How far to trust count / parent count depends on how many occurrences it rests on: on
    HumanEval with the 107M-token code store the top first draft token was right 7% of the time
    when its suffix occurred once, 42% at 5-16 occurrences and 67% beyond 100.
    """
    return _bins(_tree_arrays(tree)[1])


def _probabilities(counts: np.ndarray, denom: np.ndarray, smoothing: float) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(denom > 0, counts / np.where(denom > 0, denom + smoothing, 1.0), 0.0)
    return np.clip(p, 0.0, 1.0)


def _bins(denom: np.ndarray) -> np.ndarray:
    return np.clip(np.floor(np.log2(np.maximum(denom, 1.0))), 0, EVIDENCE_BINS - 1).astype(np.int64)


def depths_of(parents: np.ndarray) -> np.ndarray:
    """[n] int64 depth of each node (1 = root child) by pointer jumping: O(log depth) passes."""
    depth = np.ones(parents.shape[0], dtype=np.int64)
    up = parents.copy()
    while True:
        live = up >= 0
        if not live.any():
            return depth
        # depth[i] counts the nodes from i up to, not including, up[i]: each pass doubles the jump
        depth[live] += depth[up[live]]
        up[live] = up[up[live]]


def merge_trees(
    trees: Sequence[DraftTree], factors: np.ndarray | None = None, max_depth: int = 1 << 30,
    smoothing: float = 0.0,
) -> MergedTree:
    """Merge trees[s] (s = source index) into one trie (one row). See merge_rows."""
    return merge_rows([list(trees)], factors, np.asarray([max_depth], dtype=np.int64), smoothing,
                      n_sources=len(trees))


def merge_rows(
    trees: Sequence[Sequence[DraftTree]], factors: np.ndarray | None, max_depths: np.ndarray,
    smoothing: float = 0.0, n_sources: int | None = None,
) -> MergedTree:
    """trees[r][s]: source s's tree for row r -> the merged tries of all rows.

    factors: [S, D, E] calibration multipliers per source, depth (column d-1 for depth d; depths
    beyond D use the last column) and evidence bin; None = 1. max_depths: [B] int64, deeper nodes
    are dropped. smoothing: see raw_probabilities.

    One call of the C kernel (decoder/_step.c) for every row: equal paths are united level by
    level (a level ordered by (merged parent, token)), then sources, raw_p and bins are the maxima
    over the merged inputs, cond_p is `combine` and path_p `path_products`, bit for bit.
    """
    n_rows = len(trees)
    n_src = n_sources if n_sources is not None else max((len(t) for t in trees), default=0)
    assert n_src <= MAX_SOURCES, f"at most {MAX_SOURCES} drafters"
    assert max_depths.shape == (n_rows,), f"max_depths must be [{n_rows}], got {max_depths.shape}"
    toks, pars, cnts, meta = [], [], [], []  # the non-empty trees, row by row, and (size, row, source)
    for r, ts in enumerate(trees):
        for s, t in enumerate(ts):
            size = t.tokens.shape[0]
            if size:
                toks.append(t.tokens)
                pars.append(t.parents)
                cnts.append(t.counts)
                meta += (size, r, s)
    if not toks:
        return MergedTree.empty(max(n_src, 1), n_rows)
    width = max(n_src, 1)
    if len(toks) == 1:
        tok, local, counts = toks[0], pars[0], cnts[0]
    else:
        tok = np.concatenate(toks)  # [N] int32
        local = np.concatenate(pars)  # [N] int32, per-tree parents
        counts = np.concatenate(cnts)  # [N] int64
    fac = None
    if factors is not None:
        assert factors.ndim == 3 and factors.shape[0] >= width, \
            f"factors must be [>= {width}, D, E], got {factors.shape}"
        fac = (np.ascontiguousarray(factors, dtype=np.float64), factors.shape[1], factors.shape[2])
    n = tok.shape[0]
    ints = np.empty((4, n), dtype=np.int64)  # tokens, parents, depths, sources
    raw_p = np.zeros((n, width), dtype=np.float64)
    bins = np.zeros((n, width), dtype=np.int64)
    floats = np.empty((2, n), dtype=np.float64)  # cond_p, path_p
    starts = np.empty(n_rows + 1, dtype=np.int64)
    m = _step.merge(tok, local, counts, np.array(meta, dtype=np.int64), np.ascontiguousarray(max_depths, dtype=np.int64),
                    float(smoothing), fac, width, ints, raw_p, bins, floats, starts)
    return MergedTree(ints[0, :m], ints[1, :m], ints[2, :m], ints[3, :m], raw_p[:m], bins[:m],
                      floats[0, :m], floats[1, :m], starts)


def combine(raw_p: np.ndarray, depths: np.ndarray, factors: np.ndarray | None,
            bins: np.ndarray) -> np.ndarray:
    """[n] 1 - prod_s (1 - min(1, raw_p[:, s] * factors[s, depth, bins[:, s]]))."""
    p = raw_p
    if factors is not None and raw_p.shape[0]:
        n, s = raw_p.shape
        assert factors.ndim == 3 and factors.shape[0] >= s, f"factors must be [>= {s}, D, E], got {factors.shape}"
        col = np.minimum(depths, factors.shape[1]) - 1  # [n]
        b = np.minimum(bins, factors.shape[2] - 1)  # [n, S]
        p = raw_p * factors[np.arange(s)[None, :], col[:, None], b]  # [n, S]
    p = np.clip(p, 0.0, 1.0)
    return 1.0 - np.prod(1.0 - p, axis=1)


def path_products(cond_p: np.ndarray, parents: np.ndarray, depths: np.ndarray) -> np.ndarray:
    """[n] product of cond_p from the root to each node (parents precede children per level)."""
    out = np.empty(cond_p.shape[0], dtype=np.float64)
    _step.path_products(np.ascontiguousarray(cond_p, dtype=np.float64), as_i64(parents), out)
    return out


def ranked(tree: MergedTree) -> np.ndarray:
    """[n] node indices, row by row, each row's nodes by descending path probability (ties: the
    smaller index first)."""
    out = np.empty(len(tree), dtype=np.int64)
    _step.ranked(np.ascontiguousarray(tree.path_p, dtype=np.float64), as_i64(tree.starts), out)
    return out


def select_rows(tree: MergedTree, n: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """Indices (ascending: row by row, level order) of the n[r] nodes of each row r with the
    largest path probability. Ancestor-closed: path_p[child] <= path_p[parent] and a parent has
    the smaller index. order: `ranked(tree)` when the caller already has it."""
    assert n.shape == (tree.rows,), f"n must be [{tree.rows}], got {n.shape}"
    if not len(tree):
        return np.zeros(0, dtype=np.int64)
    keep = np.empty(len(tree), dtype=np.int64)
    k = _step.select(np.ascontiguousarray(tree.path_p, dtype=np.float64), as_i64(tree.parents),
                     as_i64(tree.starts), as_i64(n), None if order is None else as_i64(order), keep)
    return keep[:k]


def select_top(tree: MergedTree, n: int) -> np.ndarray:
    """select_rows for one row."""
    return select_rows(tree, np.asarray([max(n, 0)], dtype=np.int64))


@dataclass(frozen=True, eq=False)
class Kept:
    """The kept nodes of every row, re-indexed: row r owns starts[r]:starts[r+1]."""

    tokens: np.ndarray  # [k] int64
    parents: np.ndarray  # [k] int64 index into these arrays, -1 = root
    local: np.ndarray  # [k] int64 index inside the row's kept nodes (slot = 1 + local)
    depths: np.ndarray  # [k] int64
    row: np.ndarray  # [k] int64
    starts: np.ndarray  # [B + 1] int64
    merged: np.ndarray  # [k] int64 the merged-tree index of each kept node


def kept_nodes(tree: MergedTree, keep: np.ndarray) -> Kept:
    """keep: ascending merged-tree indices (select_rows) -> those nodes re-indexed."""
    keep = as_i64(keep)
    out = np.empty((5, keep.shape[0]), dtype=np.int64)  # tokens, parents, local, depths, row
    starts = np.empty(tree.rows + 1, dtype=np.int64)
    _step.kept(as_i64(tree.tokens), as_i64(tree.parents), as_i64(tree.depths), as_i64(tree.starts), keep, out, starts)
    return Kept(out[0], out[1], out[2], out[3], out[4], starts, keep)


def subtree(tree: MergedTree, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One row's kept nodes re-indexed: (tokens [k] int64, parents [k] int64 local, -1 root; depths [k])."""
    k = kept_nodes(tree, keep)
    return k.tokens, np.where(k.parents >= 0, k.local[np.maximum(k.parents, 0)], -1), k.depths
