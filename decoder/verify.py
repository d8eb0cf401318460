"""Acceptance of a verified tree: greedy (longest path agreeing with the argmax) and lossless sampling.

Slots follow decoder.attention: slot 0 = the last committed token, slot 1 + i = tree node i.
Both return (path [k] int64 local node indices, root to leaf; tokens [k + 1] int64 = the path's
tokens followed by the bonus token).
"""
from __future__ import annotations

import numpy as np
import torch

from decoder import _step
from decoder.attention import TreeSlots
from decoder.tree import as_i64


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
    assert tree.starts.shape == (b + 1,), "greedy_accept_rows: starts must be [B + 1]"
    tokens, parents, starts = as_i64(tree.tokens), as_i64(tree.parents), as_i64(tree.starts)
    argmax = as_i64(argmax).reshape(b, -1)
    best = np.empty(b, dtype=np.int64)
    length = np.empty(b, dtype=np.int64)
    width = _step.accept(tokens, parents, as_i64(tree.depths), starts, argmax, best, length)  # C: one pass
    path = np.empty((b, width), dtype=np.int64)
    out = np.empty((b, width + 1), dtype=np.int64)
    _step.accept_fill(tokens, parents, starts, argmax, best, length, path, out)
    return path, length, out




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
