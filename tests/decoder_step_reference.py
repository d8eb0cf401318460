"""The numpy step implementations the C kernel (decoder/_step.c) replaced, kept verbatim as the
naive references of tests/test_decoder_step_kernel.py: one vectorised pass per depth level."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from datastore.tree import DraftTree
from decoder.attention import TreeSlots, additive
from decoder.tree import MAX_SOURCES, EVIDENCE_BINS, Kept, MergedTree

def _denominators(counts: np.ndarray, parents: np.ndarray, root_slot: np.ndarray) -> np.ndarray:
    """[n] float64 max(parent count, sum of sibling counts); parents global (-1 = root),
    root_slot [n] a slot per tree for its roots (>= n)."""
    slot = np.where(parents >= 0, parents, root_slot)  # [n]
    sibling_sum = np.bincount(slot, weights=counts, minlength=int(root_slot.max()) + 1 if slot.shape[0] else 0)
    parent_count = np.where(parents >= 0, counts[np.maximum(parents, 0)], 0.0)  # roots: siblings only
    return np.maximum(parent_count, sibling_sum[slot])


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


def merge_rows(
    trees: Sequence[Sequence[DraftTree]], factors: np.ndarray | None, max_depths: np.ndarray,
    smoothing: float = 0.0, n_sources: int | None = None,
) -> MergedTree:
    """trees[r][s]: source s's tree for row r -> the merged tries of all rows.

    factors: [S, D, E] calibration multipliers per source, depth (column d-1 for depth d; depths
    beyond D use the last column) and evidence bin; None = 1. max_depths: [B] int64, deeper nodes
    are dropped. smoothing: see raw_probabilities.
    """
    n_rows = len(trees)
    n_src = n_sources if n_sources is not None else max((len(t) for t in trees), default=0)
    assert n_src <= MAX_SOURCES, f"at most {MAX_SOURCES} drafters"
    assert max_depths.shape == (n_rows,), f"max_depths must be [{n_rows}], got {max_depths.shape}"
    parts = [(r, s, t) for r, ts in enumerate(trees) for s, t in enumerate(ts) if len(t)]
    if not parts:
        return MergedTree.empty(max(n_src, 1), n_rows)
    sizes = np.fromiter((len(t) for _, _, t in parts), dtype=np.int64, count=len(parts))
    offsets = np.cumsum(sizes) - sizes  # [P]
    tree_id = np.repeat(np.arange(len(parts), dtype=np.int64), sizes)  # [N]
    n = int(sizes.sum())
    tok = np.concatenate([t.tokens for _, _, t in parts]).astype(np.int64)  # [N]
    local = np.concatenate([t.parents for _, _, t in parts]).astype(np.int64)  # [N]
    par = np.where(local >= 0, local + offsets[tree_id], -1)  # [N] global parent, -1 = root
    meta = np.asarray([(r, s) for r, s, _ in parts], dtype=np.int64)  # [P, 2]
    row, src = meta[tree_id, 0], meta[tree_id, 1]  # [N], [N]
    counts = np.maximum(np.concatenate([t.counts for _, _, t in parts]), 0).astype(np.float64)  # [N]
    denom = _denominators(counts, par, n + tree_id)  # [N]
    raw = _probabilities(counts, denom, smoothing)  # [N]
    ev = _bins(denom)  # [N]
    depth = depths_of(par)  # [N]
    merged_id, m_tok, m_par, m_depth, m_row = _merge_levels(tok, par, depth, row, max_depths)
    # rows contiguous: the levels came out level-major (row-sorted within a level)
    order = np.argsort(m_row, kind="stable")
    new_id = np.empty_like(order)
    new_id[order] = np.arange(order.shape[0])
    tokens, rows_sorted, depths = m_tok[order], m_row[order], m_depth[order]
    parents = np.where(m_par[order] >= 0, new_id[np.maximum(m_par[order], 0)], -1)
    keep = merged_id >= 0
    mid = new_id[merged_id[keep]]
    n_merged = tokens.shape[0]
    sources = np.zeros(n_merged, dtype=np.int64)
    np.bitwise_or.at(sources, mid, np.left_shift(1, src[keep]))
    raw_p = np.zeros((n_merged, max(n_src, 1)), dtype=np.float64)
    np.maximum.at(raw_p, (mid, src[keep]), raw[keep])
    bins = np.zeros(raw_p.shape, dtype=np.int64)  # [n, S]
    np.maximum.at(bins, (mid, src[keep]), ev[keep])
    cond_p = combine(raw_p, depths, factors, bins)
    starts = np.searchsorted(rows_sorted, np.arange(n_rows + 1)).astype(np.int64)
    return MergedTree(tokens, parents, depths, sources, raw_p, bins, cond_p,
                      path_products(cond_p, parents, depths), starts)


def _merge_levels(tok, par, depth, row, max_depths):
    """Unite equal paths level by level (vectorised over rows and sources).
    -> (merged id per input node, -1 = too deep; merged tokens, parents, depths, rows)."""
    merged_id = np.full(tok.shape[0], -1, dtype=np.int64)
    fits = depth <= max_depths[row]
    top = int(depth[fits].max()) if fits.any() else 0
    vocab = int(tok.max()) + 1
    span = tok.shape[0] + 1
    out_tok, out_par, out_depth, out_row = [], [], [], []
    n_merged = 0
    for d in range(1, top + 1):  # <= max_depth iterations, each over every row
        level = np.flatnonzero((depth == d) & fits)
        if not level.shape[0]:
            break
        mpar = np.where(par[level] >= 0, merged_id[np.maximum(par[level], 0)], -1)
        key = (row[level] * span + (mpar + 1)) * vocab + tok[level]  # (row, parent, token)
        uniq, first, inv = np.unique(key, return_index=True, return_inverse=True)
        merged_id[level] = n_merged + inv
        out_tok.append(tok[level][first])
        out_par.append(mpar[first])
        out_depth.append(np.full(uniq.shape[0], d, dtype=np.int64))
        out_row.append(row[level][first])
        n_merged += uniq.shape[0]
    if not out_tok:
        z = np.zeros(0, dtype=np.int64)
        return merged_id, z, z, z, z
    return (merged_id, np.concatenate(out_tok), np.concatenate(out_par), np.concatenate(out_depth),
            np.concatenate(out_row))


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
    path = cond_p.copy()
    if not path.shape[0]:
        return path
    for d in range(2, int(depths.max()) + 1):
        level = np.flatnonzero(depths == d)
        path[level] *= path[parents[level]]
    return path


def ranked(tree: MergedTree) -> np.ndarray:
    """[n] node indices, row by row, each row's nodes by descending path probability (ties: the
    smaller index first)."""
    return np.lexsort((np.arange(len(tree)), -tree.path_p, tree.row))


def select_rows(tree: MergedTree, n: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """Indices (ascending: row by row, level order) of the n[r] nodes of each row r with the
    largest path probability. Ancestor-closed: path_p[child] <= path_p[parent] and a parent has
    the smaller index. order: `ranked(tree)` when the caller already has it."""
    assert n.shape == (tree.rows,), f"n must be [{tree.rows}], got {n.shape}"
    if not len(tree):
        return np.zeros(0, dtype=np.int64)
    order = ranked(tree) if order is None else order
    row = tree.row
    rank = np.empty(len(tree), dtype=np.int64)
    rank[order] = np.arange(len(tree)) - tree.starts[row[order]]
    keep = np.flatnonzero(rank < n[row])
    kept = np.zeros(len(tree), dtype=bool)
    kept[keep] = True
    par = tree.parents[keep]
    assert np.all(kept[par[par >= 0]]), "top-T selection is not ancestor-closed"
    return keep


def kept_nodes(tree: MergedTree, keep: np.ndarray) -> Kept:
    new = np.full(len(tree), -1, dtype=np.int64)
    new[keep] = np.arange(keep.shape[0])
    par = tree.parents[keep]
    parents = np.where(par >= 0, new[np.maximum(par, 0)], -1)
    row = tree.row[keep]
    starts = np.searchsorted(row, np.arange(tree.rows + 1)).astype(np.int64)
    local = np.arange(keep.shape[0]) - starts[row]
    return Kept(tree.tokens[keep], parents, local, tree.depths[keep], row, starts, keep)


def build_batch(
    roots: np.ndarray, bases: np.ndarray, tree: TreeSlots, sides: list, valid: torch.Tensor,
    dtype: torch.dtype, device: torch.device, pad_id: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """build_inputs from flat arrays: roots/bases [B] int64 (last committed token, its position),
    sides: [B] SideBranch or None. Vectorised over rows; a Python step per side branch only.
    -> build_inputs' three tensors, then the input ids on the host ([B, q] int64 numpy)."""
    b = roots.shape[0]
    assert valid.dim() == 2 and valid.shape[0] == b, f"valid must be [{b}, S], got {tuple(valid.shape)}"
    n = np.diff(tree.starts)  # [B]
    m = np.asarray([0 if s is None else int(s.tokens.shape[0]) for s in sides], dtype=np.int64)  # [B]
    q = int((1 + n + m).max())
    slot = 1 + np.arange(tree.tokens.shape[0]) - tree.starts[tree.row]  # [k] 1 + local index
    ids = np.full((b, q), pad_id, dtype=np.int64)
    ids[:, 0] = roots
    ids[tree.row, slot] = tree.tokens
    pos = np.repeat(bases[:, None], q, axis=1)  # [B, q]; padding sits at the root's position
    pos[tree.row, slot] = bases[tree.row] + tree.depths
    real = np.arange(q)[None, :] < (1 + n + m)[:, None]  # [B, q] non-padding slots
    block = np.zeros((b, q, q), dtype=bool)
    block[:, np.arange(q), np.arange(q)] = True  # each slot attends itself (padding: itself and the prefix)
    block[:, :, 0] |= real  # everything real sees the last committed token
    up = tree.parents.copy()
    while True:  # each node attends its ancestors: one pass per depth, over every row at once
        live = np.flatnonzero(up >= 0)
        if not live.shape[0]:
            break
        block[tree.row[live], slot[live], slot[up[live]]] = True
        up[live] = tree.parents[up[live]]
    for i in np.flatnonzero(m):  # side branches (lookahead): per riding row
        side, lo = sides[i], 1 + int(n[i])
        hi = lo + int(m[i])
        ids[i, lo:hi] = side.tokens
        pos[i, lo:hi] = bases[i] + side.depths
        block[i, lo:hi, lo:hi] = side.mask
    # Every query, padding included, attends the row's committed prefix: padding outputs are
    # never read and their cache slots are dropped, and one broadcast copy of the prefix mask
    # is ~2x cheaper than masking it per query (B=32, q=65, S=470).
    lowest = torch.finfo(dtype).min
    s = valid.shape[1]
    mask = torch.empty((b, 1, q, s + q), dtype=dtype, device=device)
    mask[:, 0, :, :s] = torch.where(valid.to(device), 0.0, lowest).to(dtype)[:, None, :]
    mask[:, 0, :, s:] = additive(torch.from_numpy(block).to(device), dtype)[:, 0]
    return torch.from_numpy(ids).to(device), torch.from_numpy(pos).to(device), mask, ids


def greedy_accept_rows(tree: TreeSlots, argmax: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Greedy acceptance for every row at once.

    tree: the verified nodes (flat, rows contiguous, level order); argmax: [B, q] int64 per slot.
    -> (path [B, D] int64 indices into `tree`, root to leaf, -1 padded; length [B] int64;
    tokens [B, D + 1] int64: the path's tokens, then the bonus token at [r, length[r]]).
    Each row's path ends at its deepest node that agrees with the argmax all the way from the
    root, the first such node in level order on ties.
    """
    b = argmax.shape[0]
    k = tree.tokens.shape[0]
    assert tree.starts.shape == (b + 1,), "greedy_accept_rows: starts must be [B + 1]"
    slot = 1 + np.arange(k) - tree.starts[tree.row]  # [k]
    parent_slot = np.where(tree.parents >= 0, slot[np.maximum(tree.parents, 0)], 0)
    ok = tree.tokens == argmax[tree.row, parent_slot]  # [k] right given its parent
    top = int(tree.depths.max()) if k else 0
    for d in range(2, top + 1):  # chain: right all the way from the root
        level = np.flatnonzero(tree.depths == d)
        ok[level] &= ok[tree.parents[level]]
    score = np.where(ok, tree.depths, 0)  # [k]
    order = np.lexsort((np.arange(k), -score, tree.row))  # per row: deepest agreeing node first
    has = np.diff(tree.starts) > 0
    best = np.full(b, -1, dtype=np.int64)
    best[has] = order[tree.starts[:-1][has]]
    best[has] = np.where(score[best[has]] > 0, best[has], -1)
    length = np.where(best >= 0, tree.depths[np.maximum(best, 0)], 0) if k else np.zeros(b, dtype=np.int64)
    width = int(length.max()) if b else 0
    path = np.full((b, width), -1, dtype=np.int64)
    node = best.copy()
    for j in range(width):  # walk up: column length - 1 - j holds the j-th node from the leaf
        live = np.flatnonzero(node >= 0)
        path[live, length[live] - 1 - j] = node[live]
        node[live] = tree.parents[node[live]]
    tokens = np.zeros((b, width + 1), dtype=np.int64)
    tokens[:, :width] = np.where(path >= 0, tree.tokens[np.maximum(path, 0)] if k else 0, 0)
    last_slot = np.where(best >= 0, slot[np.maximum(best, 0)] if k else 0, 0)
    tokens[np.arange(b), length] = argmax[np.arange(b), last_slot]
    return path, length.astype(np.int64), tokens


# ---- after the forward: the numpy versions of commit_lengths, credit, calibration and compaction


def commit_lengths(tokens: np.ndarray, length: np.ndarray, remaining: np.ndarray,
                   eos: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """decoder.rows.commit_lengths."""
    n = np.minimum(length + 1, remaining)  # [B]
    reason = np.where(n == remaining, 1, 0)  # 1 = length
    if eos.shape[0]:
        inside = np.arange(tokens.shape[1])[None, :] < n[:, None]  # [B, D+1]
        is_eos = (tokens[:, :, None] == eos).any(axis=2) & inside
        hit = is_eos.any(axis=1)
        n = np.where(hit, np.argmax(is_eos, axis=1) + 1, n)
        reason = np.where(hit, 2, reason)
    names = ("", "length", "eos")
    return n.astype(np.int64), [names[i] for i in reason.tolist()]


def credit(sources: np.ndarray, kept_merged: np.ndarray, path: np.ndarray, n: np.ndarray, side_bits: int,
           n_sources: int) -> tuple[np.ndarray, np.ndarray]:
    """-> (hits [B, S] committed draft tokens per source, only_side [B] those only side-branch
    sources proposed): SpeculativeDecoder._credit's counts."""
    b = path.shape[0]
    on = (np.arange(path.shape[1])[None, :] < n[:, None]) & (path >= 0)  # [B, D]
    b_idx, j_idx = np.nonzero(on)
    bits = sources[kept_merged[path[b_idx, j_idx]]]  # [c]
    side, other = (bits & side_bits) != 0, (bits & ~side_bits) != 0
    only_side = np.bincount(b_idx, weights=side & ~other, minlength=b).astype(np.float64)
    hits = np.zeros((b, n_sources), dtype=np.int64)
    s = np.arange(n_sources)
    np.add.at(hits, b_idx, (bits[:, None] >> s[None, :]) & 1)
    return hits, only_side


def after(tree: MergedTree, kept_merged: np.ndarray, path: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """[n] the model's token after each merged node's parent, -1 untested (_calibrate)."""
    chosen = np.full(len(tree), -1, dtype=np.int64)
    b_idx, j_idx = np.nonzero(path >= 0)
    chosen[kept_merged[path[b_idx, j_idx]]] = tokens[b_idx, j_idx + 1]
    return np.where(tree.parents >= 0, chosen[np.maximum(tree.parents, 0)], tokens[:, 0][tree.row])


def calibrate(predicted: np.ndarray, hits: np.ndarray, depths_bins: int, decay: float, tree: MergedTree,
              after: np.ndarray) -> None:
    """Calibration.update_rows on (predicted, hits) in place."""
    tested = after >= 0
    if not tested.any():
        return
    row = tree.row[tested]  # [t]
    updating = np.zeros(tree.rows, dtype=np.int64)
    updating[row] = 1
    u = int(updating.sum())
    # libm's pow per row, as the C kernel: numpy's vectorised power takes SIMD paths (AVX-512 here)
    # that differ from libm by an ulp for some exponents, so the numpy decoder's weights were
    # machine-dependent in the last bit
    weight = np.array([decay ** int(k) for k in (u - np.cumsum(updating)).tolist()])  # [B]
    hit = (tree.tokens[tested] == after[tested]).astype(np.float64)  # [t]
    raw = tree.raw_p[tested]  # [t, S]
    col = np.minimum(tree.depths[tested], depths_bins) - 1  # [t]
    predicted *= decay**u
    hits *= decay**u
    s_idx, n_idx = np.nonzero((raw > 0).T)  # every (source, tested node) pair
    cell = (s_idx, col[n_idx], tree.bins[tested][n_idx, s_idx])
    w = weight[row[n_idx]]
    np.add.at(predicted, cell, raw[n_idx, s_idx] * w)
    np.add.at(hits, cell, hit[n_idx] * w)


def factors(hits: np.ndarray, predicted: np.ndarray, prior: float, max_factor: float) -> np.ndarray:
    """Calibration.factors."""
    pooled = (hits.sum(axis=2) + prior) / (predicted.sum(axis=2) + prior)  # [S, D]
    f = (hits + prior * pooled[:, :, None]) / (predicted + prior)
    return np.clip(f, 0.0, max_factor)


def compact(kept_local: np.ndarray, path: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """-> (new cache slots kept [B, 1 + D], valid [B, 1 + D]) (SpeculativeDecoder._compact)."""
    b = path.shape[0]
    slot = 1 + np.where(path >= 0, kept_local[np.maximum(path, 0)], -1)  # [B, D] 0 = hole
    idx = np.concatenate((np.zeros((b, 1), dtype=np.int64), slot), axis=1)
    return idx, np.arange(idx.shape[1])[None, :] < (1 + length)[:, None]
