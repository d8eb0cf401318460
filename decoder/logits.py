"""The step's one read of the logits on a CPU: the top-k token ids of every position in one pass.

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
    if (logits.device.type != "cpu" or logits.dtype != torch.float32 or not logits.is_contiguous()
            or not 1 <= k <= min(MAX_K, logits.shape[-1]) or logits.dim() != 3):
        return None
    b, q, v = logits.shape
    out = np.empty((b, q, k), dtype=np.int64)  # [B, q, k]
    if _step.topk(logits.detach().numpy().reshape(b * q, v), out.reshape(b * q, k)):
        return None  # a NaN: torch's ordering of NaNs decides
    return out
