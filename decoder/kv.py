"""KV-cache compaction on a transformers `DynamicCache` (layer `.keys`/`.values` [B, H, S, D]).

After a verification forward the cache holds the S old slots plus the q new ones; only the
last committed token's slot and the accepted path's slots may stay, contiguous, in path order.
Cropping alone keeps the first nodes of the tree, which is wrong for any other path: the kept
slots are gathered with index_select/gather along the sequence dim.
"""
from __future__ import annotations

import numpy as np
import torch
from transformers import DynamicCache


class CacheAPIError(RuntimeError):
    """The transformers cache no longer looks like the one this module was written against."""


def new_cache() -> DynamicCache:
    # No config: plain DynamicLayers (full attention). Sliding-window layers would drop slots
    # on their own and break the gather below.
    return DynamicCache()


def layers(cache: DynamicCache) -> list:
    found = getattr(cache, "layers", None)
    if found is None:
        raise CacheAPIError("DynamicCache has no .layers (transformers cache API changed; tested with 5.24)")
    for layer in found:
        if getattr(layer, "is_sliding", False):
            raise CacheAPIError("sliding-window cache layers are not supported by the tree decoder")
        if getattr(layer, "is_initialized", True) and not hasattr(layer, "keys"):
            raise CacheAPIError("cache layer has no .keys/.values (transformers cache API changed)")
    return found


def seq_length(cache: DynamicCache) -> int:
    return int(cache.get_seq_length())


def keep_new(cache: DynamicCache, old_len: int, keep: torch.Tensor | np.ndarray, crop: bool | None = None) -> None:
    """Keep the old_len old slots, then for row b the new slots keep[b] (indices into the new part).

    keep: [B, K] int64 (rows keeping fewer slots repeat an index; the caller masks those holes).
    crop: whether keep is 0..K-1 on every row (a chain accepted from its start), when the caller
    knows; else checked here. The caller checks the cache's layers with `layers(cache)` once.
    The gathered slots are written over the start of the new part in place and the rest cut off:
    no copy of the old slots (the next forward's concatenation copies them anyway).
    """
    assert keep.ndim == 2, f"keep must be [B, K], got {tuple(keep.shape)}"
    width = keep.shape[1]
    if isinstance(keep, np.ndarray):  # checked on the host: torch.equal cost ~30 us a step
        if crop is None:
            crop = bool((keep == np.arange(width)).all())
        if not crop:
            keep = torch.from_numpy(keep)
    elif crop is None:
        crop = bool(torch.equal(keep, torch.arange(width, device=keep.device).expand_as(keep)))
    index = None  # [B, H, K, D] the gather index, expanded once for every layer of one shape
    for layer in cache.layers:  # the caller checked them once with layers() (~1 us a layer a step)
        if not getattr(layer, "is_initialized", True) or layer.keys is None:
            continue
        k, v = layer.keys, layer.values  # [B, H, S, D]
        assert keep.shape[0] == k.shape[0], f"keep rows {keep.shape[0]} != cache batch"
        if not crop:
            shape = (k.shape[0], k.shape[1], width, k.shape[3])
            if index is None or index.shape != shape or index.device != k.device:
                index = keep.to(k.device)[:, None, :, None].expand(shape)
            # the gathered slots are copies: safe to write back over their source
            picked_k, picked_v = k[:, :, old_len:].gather(2, index), v[:, :, old_len:].gather(2, index)
            k[:, :, old_len : old_len + width] = picked_k
            v[:, :, old_len : old_len + width] = picked_v
        layer.keys = k[:, :, : old_len + width]
        layer.values = v[:, :, : old_len + width]


def select(cache: DynamicCache, rows: torch.Tensor | None = None, start: int = 0) -> None:
    """Keep batch rows `rows` ([r] int64; None = all) and sequence slots from `start` on."""
    for layer in layers(cache):
        if not getattr(layer, "is_initialized", True) or layer.keys is None:
            continue
        k, v = layer.keys, layer.values
        if rows is not None:
            k, v = k.index_select(0, rows.to(k.device)), v.index_select(0, rows.to(v.device))
        layer.keys, layer.values = k[:, :, start:], v[:, :, start:]
