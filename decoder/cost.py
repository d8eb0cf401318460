"""Cost model: forward latency by number of new tokens, and the tree size that maximises speed.

`measure_latency` times one forward of q new tokens (q = 1 last committed token + tree + side
tokens) over a ~300-token cache for q = 1, 2, 4 ... 128 (median of a few) on this model, device
and dtype. A step with the n most probable nodes kept is expected to commit 1 + sum of their path
probabilities (sorted descending) tokens; `CostModel.choose` picks the n maximising that per
second. SmolLM2 on 2 CPU cores: fp32 q=16 costs 2x q=1, bf16 1.2x on DESIGN.md's AMX CPU; on this
project's AMD EPYC (AVX2, no AVX512-BF16) fp32 with packed linears q=2 1.1x, q=16 1.8x, while bf16
q=16 costs 8x (no bf16 matrix kernel: its cost grows with every row).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from decoder import kv
from decoder.attention import additive

SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def measure_latency(model, sizes=SIZES, context: int = 300, repeats: int = 3, vocab: int | None = None) -> dict:
    """-> {q: median seconds of one forward of q new tokens over a `context`-token cache}."""
    device, dtype = model.device, model.dtype
    vocab = vocab or int(model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (1, context), generator=gen).to(device)
    cache = kv.new_cache()
    model(input_ids=prefix, cache=cache, use_cache=True)
    curve = {}
    for q in sizes:
        ids = torch.randint(0, vocab, (1, q), generator=gen).to(device)
        pos = torch.arange(context, context + q, device=device)[None]
        allowed = torch.ones(1, q, context + q, dtype=torch.bool, device=device)
        allowed[0, :, context:] = torch.tril(torch.ones(q, q, dtype=torch.bool, device=device))
        mask = additive(allowed, dtype)
        times = []
        for _ in range(repeats + 1):  # the first run of each size warms kernels up
            _sync(device)
            t0 = time.perf_counter()
            model(input_ids=ids, position_ids=pos, attention_mask=mask, cache=cache, use_cache=True)
            _sync(device)
            times.append(time.perf_counter() - t0)
            cache.crop(-q)
        curve[int(q)] = float(np.median(times[1:]))
    return monotone(curve)


def monotone(curve: dict[int, float]) -> dict[int, float]:
    """latency(q) = min over q' >= q: more tokens never cost less. A timing spike (a busy shared
    machine measured 9.3 s for q=2 and 1.6 s for q=4) must not make small trees look dear."""
    qs = sorted(curve)
    t = np.minimum.accumulate(np.asarray([curve[q] for q in qs])[::-1])[::-1]
    return {int(q): float(v) for q, v in zip(qs, t)}


class CostModel:
    def __init__(self, curve: dict[int, float]):
        if not curve:
            raise ValueError("cost model needs a non-empty latency curve")
        qs = np.asarray(sorted(curve), dtype=np.float64)
        if qs[0] < 1 or any(curve[int(q)] <= 0 for q in qs):
            raise ValueError(f"bad latency curve {curve}")
        self.curve = {int(q): float(curve[int(q)]) for q in qs}
        self._q = qs
        self._t = np.asarray([curve[int(q)] for q in qs])

    def latency(self, q: np.ndarray | int) -> np.ndarray:
        """Seconds for q new tokens: linear between measured sizes, linear extrapolation above."""
        q = np.asarray(q, dtype=np.float64)
        t = np.interp(q, self._q, self._t)
        if self._q.shape[0] >= 2:
            slope = (self._t[-1] - self._t[-2]) / (self._q[-1] - self._q[-2])
            t = np.where(q > self._q[-1], self._t[-1] + slope * (q - self._q[-1]), t)
        return t

    def choose(self, path_p_sorted: np.ndarray, extra: int = 0, max_nodes: int | None = None) -> int:
        """Number of tree nodes to keep. path_p_sorted: [n] descending; extra: side tokens."""
        return self.best(path_p_sorted, extra, max_nodes)[0]

    def best(self, path_p_sorted: np.ndarray, extra: int = 0, max_nodes: int | None = None,
             bonus: float = 0.0) -> tuple[int, float]:
        """-> (nodes to keep, expected tokens per second). bonus: tokens the `extra` side tokens
        are expected to bring beyond the tree (lookahead's harvest), added to every choice."""
        limit = path_p_sorted.shape[0] if max_nodes is None else min(max_nodes, path_p_sorted.shape[0])
        n, rate = self.best_rows(path_p_sorted[None, :limit], np.asarray([limit]), extra, bonus)
        return int(n[0]), float(rate[0])

    def best_rows(self, p: np.ndarray, lengths: np.ndarray, extra: int = 0,
                  bonus: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """best() for B rows at once. p: [B, L] each row's path probabilities descending, only
        the first lengths[r] of row r count -> (nodes [B] int64, tokens per second [B])."""
        b, width = p.shape
        assert lengths.shape == (b,), f"lengths must be [{b}], got {lengths.shape}"
        gain = 1.0 + bonus + np.concatenate((np.zeros((b, 1)), np.cumsum(p, axis=1)), axis=1)  # [B, L+1]
        n = np.arange(width + 1)
        rate = gain / self.latency(1 + n + extra)[None, :]  # [B, L+1]
        rate[n[None, :] > lengths[:, None]] = -np.inf
        best = np.argmax(rate, axis=1)  # first maximum: the smaller tree on ties
        return best.astype(np.int64), rate[np.arange(b), best]
