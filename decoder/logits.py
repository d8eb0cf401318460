"""The step's one read of the logits: argmax and top-k token ids of every position.

A full-vocabulary reduction (device work on a GPU, where `SpeculativeDecoder._reduce` uses torch's
topk). On a CPU, torch's topk over [1, 65, 49,152] float32 logits took ~0.9 ms a step in the decode
loop (3.9 ms cold) and left the caches cold: the first host operations after it cost 20-40 us more
each. `decoder/_step.c` streams each row once against the k-th best so far: ~0.25 ms, no scratch.
Ties keep the smaller index first, so column 0 is exactly argmax's choice.
"""
from __future__ import annotations

import numpy as np
import torch

from decoder import _step

MAX_K = 64  # the C pass keeps at most this many per row


def host_topk(logits: torch.Tensor, k: int) -> np.ndarray | None:
    """logits [B, q, V] -> top-k ids [B, q, k] int64 (largest first; equal logits: smaller id first),
    or None where this pass does not apply (not a contiguous float32 CPU tensor, k > MAX_K, or a
    NaN among the logits): the caller then uses torch."""
    if (logits.dim() != 3 or logits.device.type != "cpu" or logits.dtype != torch.float32
            or not logits.is_contiguous() or not 1 <= k <= min(MAX_K, logits.shape[-1])):
        return None
    b, q, v = logits.shape
    out = np.empty((b, q, k), dtype=np.int64)  # [B, q, k]
    if _step.topk(logits.detach().numpy().reshape(b * q, v), out.reshape(b * q, k)):
        return None  # a NaN: torch's ordering of NaNs decides
    return out


def top_tokens(logits: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray | None]:
    """logits [B, q, V] -> (argmax [B, q] int64, top-k ids [B, q, k] int64 or None when k = 0), with
    one read of the logits and one device->host copy. The top-k holds the argmax; where the two
    best logits tie exactly, argmax's first-index choice is taken (what plain greedy picks)."""
    top = host_topk(logits, max(k, 1))  # CPU float32: one C pass, ties -> smaller id
    if top is not None:
        return top[..., 0].copy(), (top if k else None)
    if k == 0:
        return logits.argmax(dim=-1).cpu().numpy(), None
    return torch_top(logits, k, packed=logits.device.type != "cpu")


def torch_top(logits: torch.Tensor, k: int, packed: bool) -> tuple[np.ndarray, np.ndarray]:
    """top_tokens with torch's topk (k >= 1). packed: the ids and a tie flag concatenated on the
    device, one copy to the host (a GPU); else both read from host memory with numpy (on a CPU
    each torch op right after topk cost 20-40 us: 4 of them were ~90 us)."""
    values, indices = logits.topk(max(k, 2), dim=-1)  # [B, q, k']
    if packed:
        tie = values[..., 0] == values[..., 1]  # [B, q]
        both = torch.cat([indices, tie[..., None].to(indices.dtype)], dim=-1).cpu().numpy()
        top, tie = both[..., :-1], both[..., -1] != 0
    else:
        top = indices.cpu().numpy()
        best2 = (values if values.dtype == torch.float32 else values.float()).cpu().numpy()[..., :2]
        tie = best2[..., 0] == best2[..., 1]  # [B, q]
    argmax = top[..., 0].copy()
    ties = np.nonzero(tie)
    if ties[0].shape[0]:  # exact ties at the top are rare: one more read, of those rows only
        b, j = (torch.from_numpy(t).to(logits.device) for t in ties)
        argmax[ties] = logits[b, j].argmax(dim=-1).cpu().numpy()
    return argmax, top[..., :k]
