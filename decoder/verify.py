"""Acceptance of a verified tree: greedy (longest path agreeing with the argmax) and lossless sampling.

Slots follow decoder.attention: slot 0 = the last committed token, slot 1 + i = tree node i.
Both return (path [k] int64 local node indices, root to leaf; tokens [k + 1] int64 = the path's
tokens followed by the bonus token).
"""
from __future__ import annotations

import numpy as np
import torch

from decoder.attention import TreeSlots


def greedy_accept(tokens: np.ndarray, parents: np.ndarray, depths: np.ndarray, argmax: np.ndarray):
    """tokens/parents/depths: [n] the tree (level order); argmax: [>= 1 + n] int64 per slot."""
    n = tokens.shape[0]
    assert parents.shape == depths.shape == (n,) and argmax.shape[0] >= 1 + n, "greedy_accept shapes"
    tree = TreeSlots(tokens.astype(np.int64), parents.astype(np.int64), depths.astype(np.int64),
                     np.zeros(n, dtype=np.int64), np.asarray([0, n], dtype=np.int64))
    path, length, out = greedy_accept_rows(tree, argmax[None].astype(np.int64))
    k = int(length[0])
    return path[0, :k], out[0, : k + 1]


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


def warp(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """[k, V] logits -> [k, V] float32 probabilities, as transformers' temperature + top-p warpers."""
    scores = logits.float() / temperature
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cum <= (1 - top_p)
        drop_sorted[..., -1] = False  # keep at least one token
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(dim=-1)


def sample_accept(
    tokens: np.ndarray,
    parents: np.ndarray,
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator,
):
    """Lossless tree sampling: sample at the current node from the model's warped distribution;
    descend when the sample is one of its children, else the sample is the bonus token.

    logits: [>= 1 + n, V] this row's logits per slot. Each sample is drawn from exactly the
    distribution plain sampling would use at that point, so the output distribution is unchanged.
    """
    n = tokens.shape[0]
    assert parents.shape == (n,) and logits.shape[0] >= 1 + n, "sample_accept shapes"
    child_of = {}  # (parent slot, token) -> node; the tree is a trie so the key is unique
    for i, (p, t) in enumerate(zip(parents.tolist(), tokens.tolist())):  # <= max_tree nodes
        child_of[(p, t)] = i
    path, out, node = [], [], -1
    while True:  # one sample per accepted node, <= max_depth + 1
        probs = warp(logits[node + 1 : node + 2], temperature, top_p)  # [1, V]
        tok = int(torch.multinomial(probs, 1, generator=generator).item())
        out.append(tok)
        child = child_of.get((node, tok))
        if child is None:
            return np.asarray(path, dtype=np.int64), np.asarray(out, dtype=np.int64)
        path.append(child)
        node = child
