"""Acceptance of a verified tree: greedy (longest path agreeing with the argmax) and lossless sampling.

Slots follow decoder.attention: slot 0 = the last committed token, slot 1 + i = tree node i.
Both return (path [k] int64 local node indices, root to leaf; tokens [k + 1] int64 = the path's
tokens followed by the bonus token).
"""
from __future__ import annotations

import numpy as np
import torch


def greedy_accept(tokens: np.ndarray, parents: np.ndarray, depths: np.ndarray, argmax: np.ndarray):
    """tokens/parents/depths: [n] the tree (level order); argmax: [>= 1 + n] int64 per slot."""
    n = tokens.shape[0]
    assert parents.shape == depths.shape == (n,) and argmax.shape[0] >= 1 + n, "greedy_accept shapes"
    if n == 0:
        return np.zeros(0, dtype=np.int64), argmax[:1].astype(np.int64)
    ok = tokens == argmax[parents + 1]  # [n] right given its parent
    for d in range(2, int(depths.max()) + 1):  # chain: right all the way from the root
        level = np.flatnonzero(depths == d)
        ok[level] &= ok[parents[level]]
    path = _path_to(int(np.argmax(np.where(ok, depths, 0))), parents) if ok.any() else []
    path = np.asarray(path, dtype=np.int64)
    last = 0 if not path.shape[0] else int(path[-1]) + 1
    return path, np.concatenate([tokens[path], argmax[last : last + 1]]).astype(np.int64)


def _path_to(node: int, parents: np.ndarray) -> list[int]:
    path = []
    while node >= 0:  # <= max_depth iterations
        path.append(node)
        node = int(parents[node])
    return path[::-1]


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
