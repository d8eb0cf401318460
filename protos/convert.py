"""DraftTree <-> protobuf, and draft parameters <-> protobuf; shared by the server and the client.

Repeated scalar fields are filled from `ndarray.tolist()` and read back with `np.array(field)`:
~5 us per 64-node tree each way (measured), no per-node Python loop.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from datastore.tree import DraftTree
from protos.draftstore.v1 import draftstore_pb2 as pb

TIERS = {"static": pb.TIER_STATIC, "live": pb.TIER_LIVE, "both": pb.TIER_BOTH, None: pb.TIER_UNSPECIFIED}
TIER_NAMES = {v: k for k, v in TIERS.items()}
PARAM_FIELDS = ("budget", "max_depth", "max_suffix", "min_suffix", "min_count")


def tree_to_proto(tree: DraftTree) -> pb.DraftTree:
    return pb.DraftTree(
        tokens=tree.tokens.tolist(),  # [n] int32 -> uint32 (ids are never negative)
        parents=tree.parents.tolist(),  # [n] int32
        counts=tree.counts.tolist(),  # [n] int64 -> uint64 (counts are never negative)
        match_len=int(tree.match_len),
    )


def tree_from_proto(msg: pb.DraftTree, source: str = "retrieval") -> DraftTree:
    """Raises ValueError (from DraftTree) on a malformed tree, e.g. a parent after its child."""
    return DraftTree(
        np.array(msg.tokens, dtype=np.int32),  # [n]
        np.array(msg.parents, dtype=np.int32),  # [n]
        np.array(msg.counts, dtype=np.int64),  # [n]
        int(msg.match_len),
        source,
    )


def tokens_from_proto(field) -> np.ndarray:
    """[n] int64 from a repeated uint32 field (int64 so ids >= 2^31 stay visible to validation)."""
    return np.array(field, dtype=np.int64)


def tokens_to_list(tokens: Sequence[int] | np.ndarray) -> list[int]:
    """Token ids as a list for a repeated uint32 field; ValueError for negatives or non-integers."""
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"token ids must be a 1-D sequence, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"token ids must be integers, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= 2**32):
        raise ValueError("token ids must be in [0, 2^32)")
    return arr.tolist()


def params_to_proto(
    budget: int | None = None,
    max_depth: int | None = None,
    max_suffix: int | None = None,
    min_suffix: int | None = None,
    tier: str | None = None,
    min_count: int | None = None,
) -> pb.DraftParams:
    """None leaves a field unset, which means "use the server default"."""
    if tier not in TIERS:
        raise ValueError(f"tier must be one of static, live, both or None, got {tier!r}")
    kw = dict(budget=budget, max_depth=max_depth, max_suffix=max_suffix, min_suffix=min_suffix,
              min_count=min_count)
    return pb.DraftParams(tier=TIERS[tier], **{k: int(v) for k, v in kw.items() if v is not None})


def params_from_proto(msg: pb.DraftParams) -> dict[str, int | str | None]:
    """{budget, max_depth, max_suffix, min_suffix, min_count: int or None (unset),
    tier: name or None}.

    Raises ValueError naming the field for an unknown tier value.
    """
    out: dict[str, int | str | None] = {
        k: (getattr(msg, k) if msg.HasField(k) else None) for k in PARAM_FIELDS
    }
    if msg.tier not in TIER_NAMES:  # proto3 enums are open: any int32 arrives
        raise ValueError(f"params.tier: unknown value {msg.tier} (expected 0..3)")
    out["tier"] = TIER_NAMES[msg.tier]
    return out


def draft_request(
    context: Sequence[int] | np.ndarray,
    fingerprint: str | None = None,
    **params,
) -> pb.DraftRequest:
    """One DraftRequest; `params` as `params_to_proto` takes them."""
    msg = pb.DraftRequest(context=tokens_to_list(context), params=params_to_proto(**params))
    if fingerprint is not None:
        msg.tokenizer_fingerprint = fingerprint
    return msg
