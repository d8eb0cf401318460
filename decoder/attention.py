"""The 4D additive attention mask and position ids of one verification forward.

Per row the q query slots are: 0 = the last committed token, 1..n = the kept tree nodes (level
order), n+1..n+m = side-branch tokens, then padding. The cache holds S earlier slots of which
`valid[b]` marks the row's committed tokens (left padding and per-row holes are invalid).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from decoder.drafters.base import SideBranch


@dataclass(frozen=True)
class RowInput:
    """One row's new tokens for a forward."""

    root: int  # the last committed token
    base: int  # its position (= number of committed tokens before it)
    tokens: np.ndarray  # [n] int64 tree tokens
    parents: np.ndarray  # [n] int64 local parent index, -1 = the root
    depths: np.ndarray  # [n] int64 >= 1
    side: SideBranch | None = None

    @property
    def n_side(self) -> int:
        return 0 if self.side is None else int(self.side.tokens.shape[0])

    @property
    def width(self) -> int:
        return 1 + int(self.tokens.shape[0]) + self.n_side


def ancestor_matrix(parents: np.ndarray, depths: np.ndarray) -> np.ndarray:
    """[n, n] bool, a[i, j] = node j is node i or one of its ancestors (level order)."""
    n = parents.shape[0]
    anc = np.eye(n, dtype=bool)
    if n == 0:
        return anc
    for d in range(2, int(depths.max()) + 1):  # vectorised per level, <= max_depth iterations
        level = np.flatnonzero(depths == d)
        anc[level] |= anc[parents[level]]
    return anc


def row_block(row: RowInput, q: int) -> np.ndarray:
    """[q, q] bool: which new slots each new slot attends."""
    n, m = int(row.tokens.shape[0]), row.n_side
    block = np.zeros((q, q), dtype=bool)
    block[np.arange(q), np.arange(q)] = True  # padding attends itself only: no empty softmax
    block[: 1 + n + m, 0] = True  # everything sees the last committed token
    block[1 : 1 + n, 1 : 1 + n] = ancestor_matrix(row.parents, row.depths)
    if m:
        block[1 + n : 1 + n + m, 1 + n : 1 + n + m] = row.side.mask
    return block


def build_inputs(
    rows: list[RowInput], valid: torch.Tensor, dtype: torch.dtype, device: torch.device, pad_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> input_ids [B, q] int64, position_ids [B, q] int64, mask [B, 1, q, S+q] `dtype`.

    valid: [B, S] bool, the cache slots each row may attend.
    """
    b = len(rows)
    assert valid.dim() == 2 and valid.shape[0] == b, f"valid must be [{b}, S], got {tuple(valid.shape)}"
    q = max(r.width for r in rows)
    ids = np.full((b, q), pad_id, dtype=np.int64)
    pos = np.zeros((b, q), dtype=np.int64)
    block = np.zeros((b, q, q), dtype=bool)
    real = np.zeros((b, q), dtype=bool)  # non-padding slots
    for i, r in enumerate(rows):  # per row, not per token
        n, m = int(r.tokens.shape[0]), r.n_side
        ids[i, 0], ids[i, 1 : 1 + n] = r.root, r.tokens
        pos[i, :] = r.base
        pos[i, 1 : 1 + n] = r.base + r.depths
        if m:
            ids[i, 1 + n : 1 + n + m] = r.side.tokens
            pos[i, 1 + n : 1 + n + m] = r.base + r.side.depths
        block[i] = row_block(r, q)
        real[i, : 1 + n + m] = True
    real_t = torch.from_numpy(real).to(device)
    prefix = valid.to(device)[:, None, :] & real_t[:, :, None]  # [B, q, S]
    allowed = torch.cat([prefix, torch.from_numpy(block).to(device)], dim=2)  # [B, q, S+q]
    mask = additive(allowed, dtype)
    return torch.from_numpy(ids).to(device), torch.from_numpy(pos).to(device), mask


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, q, K] bool -> [B, 1, q, K] float: 0 attend, dtype-min masked."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


def prefill_inputs(
    prompts: list[np.ndarray], dtype: torch.dtype, device: torch.device, pad_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded causal prefill of each prompt.

    -> input_ids [B, L], position_ids [B, L], mask [B, 1, L, L], valid [B, L] bool.
    """
    b = len(prompts)
    L = max(int(p.shape[0]) for p in prompts)
    ids = np.full((b, L), pad_id, dtype=np.int64)
    valid = np.zeros((b, L), dtype=bool)
    for i, p in enumerate(prompts):
        if p.shape[0]:
            ids[i, L - p.shape[0] :] = p
            valid[i, L - p.shape[0] :] = True
    pos = np.maximum(np.cumsum(valid, axis=1) - 1, 0)
    causal = np.tril(np.ones((L, L), dtype=bool))
    allowed = causal[None] & valid[:, None, :]  # [B, L, L]
    allowed |= np.eye(L, dtype=bool)[None]  # padding queries attend themselves: no empty softmax
    valid_t = torch.from_numpy(valid).to(device)
    return (
        torch.from_numpy(ids).to(device),
        torch.from_numpy(pos).to(device),
        additive(torch.from_numpy(allowed).to(device), dtype),
        valid_t,
    )
