"""The 4D additive attention mask and position ids of one verification forward.

Per row the q query slots are: 0 = the last committed token, 1..n = the kept tree nodes (level
order), n+1..n+m = side-branch tokens, then padding. The cache holds S earlier slots of which
`valid[b]` marks the row's committed tokens (left padding and per-row holes are invalid).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from decoder import _step
from decoder.drafters.base import SideBranch
from decoder.tree import as_i64




@dataclass(frozen=True)
class RowInput:
    """One row's new tokens for a forward."""

    root: int  # the last committed token
    base: int  # its position (= number of committed tokens before it)
    tokens: np.ndarray  # [n] int64 tree tokens
    parents: np.ndarray  # [n] int64 local parent index, -1 = the root
    depths: np.ndarray  # [n] int64 >= 1
    side: SideBranch | None = None


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


def build_inputs(
    rows: list[RowInput], valid: torch.Tensor, dtype: torch.dtype, device: torch.device, pad_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> input_ids [B, q] int64, position_ids [B, q] int64, mask [B, 1, q, S+q] `dtype`.

    valid: [B, S] bool, the cache slots each row may attend.
    """
    sizes = np.asarray([r.tokens.shape[0] for r in rows], dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(sizes)))
    local = np.concatenate([r.parents for r in rows] or [np.zeros(0)]).astype(np.int64)
    row = np.repeat(np.arange(len(rows)), sizes)
    tree = TreeSlots(
        tokens=np.concatenate([r.tokens for r in rows] or [np.zeros(0)]).astype(np.int64),
        parents=np.where(local >= 0, local + starts[row], -1),
        depths=np.concatenate([r.depths for r in rows] or [np.zeros(0)]).astype(np.int64),
        row=row, starts=starts,
    )
    roots = np.asarray([r.root for r in rows], dtype=np.int64)
    bases = np.asarray([r.base for r in rows], dtype=np.int64)
    return build_batch(roots, bases, tree, [r.side for r in rows], valid, dtype, device, pad_id)[:3]


@dataclass(frozen=True)
class TreeSlots:
    """Every row's tree nodes, flat: row r owns starts[r]:starts[r+1], in level order."""

    tokens: np.ndarray  # [k] int64
    parents: np.ndarray  # [k] int64 index into these arrays, -1 = the row's root
    depths: np.ndarray  # [k] int64 >= 1
    row: np.ndarray  # [k] int64
    starts: np.ndarray  # [B + 1] int64


def build_batch(
    roots: np.ndarray, bases: np.ndarray, tree: TreeSlots, sides: list, valid: torch.Tensor | np.ndarray,
    dtype: torch.dtype, device: torch.device, pad_id: int = 0, full: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """build_inputs from flat arrays: roots/bases [B] int64 (last committed token, its position),
    sides: [B] SideBranch or None, valid: [B, S] bool. Vectorised over rows; a Python step per side
    branch only. -> build_inputs' three tensors, then the input ids on the host ([B, q] int64 numpy).
    full: the whole mask built on the host (None: on a CPU device; tests choose both ways).

    One C call writes the ids, positions and the mask as `dtype` bits on the host. On a CPU that
    is the whole [B, 1, q, S + q] mask (no further op); for another device it is, per row, the
    prefix mask and the [q, q] block of the new slots (a fraction of the bytes: B=32, q=65,
    S=1000 is 8.8 MB whole), one copy, then the device broadcasts the prefix and concatenates.
    Every query, padding included, attends the row's committed prefix: padding outputs are never
    read and their cache slots are dropped. Each torch op cost ~10-20 us in the decode loop at
    batch 1 (cold caches after the forward); the 9 ops this replaced cost ~110 us.
    """
    b = roots.shape[0]
    valid = valid.cpu().numpy() if isinstance(valid, torch.Tensor) else valid
    assert valid.ndim == 2 and valid.shape[0] == b, f"valid must be [{b}, S], got {tuple(valid.shape)}"
    m = np.asarray([0 if s is None else int(s.tokens.shape[0]) for s in sides], dtype=np.int64)  # [B]
    starts = as_i64(tree.starts)
    q = _step.width(starts, m)
    s = valid.shape[1]
    item, low = _mask_bits(dtype)
    full = device.type == "cpu" if full is None else full
    ids_pos = np.empty((2, b, q), dtype=np.int64)  # input ids, positions (padding: the root's)
    host = np.empty((b, 1, q, s + q) if full else (b, s + q * q), dtype=item)
    _step.inputs(as_i64(tree.tokens), as_i64(tree.parents), as_i64(tree.depths), starts, as_i64(roots), as_i64(bases),
                 m, int(pad_id), np.ascontiguousarray(valid, dtype=bool), low, full, ids_pos, host)
    if m.any():  # side branches (lookahead): per riding row
        n = np.diff(starts)
        block = host[:, 0, :, s:] if full else host[:, s:].reshape(b, q, q)  # [B, q, q] views
        for i in np.flatnonzero(m):
            side, lo = sides[i], 1 + int(n[i])
            hi = lo + int(m[i])
            ids_pos[0, i, lo:hi] = side.tokens
            ids_pos[1, i, lo:hi] = bases[i] + side.depths
            block[i, lo:hi, lo:hi] = np.where(side.mask, item.type(0), item.type(low))
    if full:
        mask = torch.from_numpy(host).view(dtype)  # [B, 1, q, S + q]
    else:
        flat = torch.from_numpy(host).view(dtype).to(device)  # [B, S + q*q]
        mask = torch.cat((flat[:, None, None, :s].expand(b, 1, q, s), flat[:, None, s:].view(b, 1, q, q)), dim=3)
    ip = torch.from_numpy(ids_pos).to(device)
    return ip[0], ip[1], mask, ids_pos[0]


_BITS: dict[torch.dtype, tuple[np.dtype, int]] = {}


def _mask_bits(dtype: torch.dtype) -> tuple[np.dtype, int]:
    """(unsigned numpy dtype of dtype's size, the bit pattern of dtype's lowest value): the mask is
    written as raw bits so that bfloat16 needs no numpy type."""
    got = _BITS.get(dtype)
    if got is None:
        size = torch.finfo(dtype).bits // 8
        assert size in (2, 4), f"attention masks in 16- or 32-bit floats, got {dtype}"
        signed = torch.int16 if size == 2 else torch.int32
        low = int(torch.tensor(torch.finfo(dtype).min, dtype=dtype).view(signed).item()) & ((1 << 8 * size) - 1)
        got = _BITS[dtype] = (np.dtype(np.uint16 if size == 2 else np.uint32), low)
    return got


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
