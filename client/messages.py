"""Request building and response reading shared by DraftClient and AsyncDraftClient."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from client.settings import ClientSettings
from datastore.tree import DraftTree
from protos import convert
from protos.draftstore.v1 import draftstore_pb2 as pb

SOURCE = "retrieval"  # the DraftTree source name, as the in-process Datastore gives it


@dataclass(frozen=True)
class DatastoreInfo:
    """What a server (or, for ShardedClient, all shards together) reports."""

    format_version: int
    tokenizer: dict  # {name, fingerprint, vocab_size}
    tokens: int
    documents: int
    shards: int
    token_dtype: str
    live_tokens: int
    live_sequences: int
    max_budget: int
    max_depth: int
    max_context: int
    max_batch: int
    targets: tuple[str, ...] = field(default=())

    @property
    def fingerprint(self) -> str:
        return self.tokenizer["fingerprint"]


def info_from_proto(msg: pb.InfoResponse, target: str) -> DatastoreInfo:
    return DatastoreInfo(
        format_version=msg.format_version,
        tokenizer={"name": msg.tokenizer.name, "fingerprint": msg.tokenizer.fingerprint,
                   "vocab_size": msg.tokenizer.vocab_size},
        tokens=msg.tokens, documents=msg.documents, shards=msg.shards,
        token_dtype=msg.token_dtype, live_tokens=msg.live_tokens,
        live_sequences=msg.live_sequences, max_budget=msg.max_budget, max_depth=msg.max_depth,
        max_context=msg.max_context, max_batch=msg.max_batch, targets=(target,),
    )


@dataclass(frozen=True)
class DraftArgs:
    budget: int = 64
    max_depth: int = 16
    max_suffix: int = 16
    min_suffix: int = 1
    min_count: int = 1

    def __post_init__(self) -> None:
        if self.budget < 0 or self.max_depth < 1 or not 1 <= self.min_suffix <= self.max_suffix:
            raise ValueError(f"need budget >= 0, max_depth >= 1, 1 <= min_suffix <= max_suffix; "
                             f"got {self}")
        if self.min_count < 1:
            raise ValueError(f"need min_count >= 1; got {self}")

    def params(self) -> dict[str, int]:
        """The keywords of `convert.draft_request` (the tier comes from ClientSettings)."""
        return dict(budget=self.budget, max_depth=self.max_depth, max_suffix=self.max_suffix,
                    min_suffix=self.min_suffix, min_count=self.min_count)


def ids(tokens, what: str = "context") -> np.ndarray:
    """[n] token ids from a 1-D list, numpy array or torch tensor (any device)."""
    if hasattr(tokens, "detach"):  # a torch tensor, possibly on CUDA
        tokens = tokens.detach().cpu().numpy()
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be 1-D token ids, got shape {arr.shape}")
    return arr


def tail(context, max_suffix: int) -> np.ndarray:
    """The last max_suffix ids: only they matter, so only they travel."""
    arr = ids(context)
    return arr[-max_suffix:] if arr.shape[0] else arr


def draft_request(context, a: DraftArgs, s: ClientSettings) -> pb.DraftRequest:
    return convert.draft_request(tail(context, a.max_suffix), s.tokenizer_fingerprint,
                                 tier=s.tier, **a.params())


def batch_request(contexts: Sequence, a: DraftArgs, s: ClientSettings) -> pb.DraftBatchRequest:
    msg = pb.DraftBatchRequest(requests=[
        convert.draft_request(tail(c, a.max_suffix), None, tier=s.tier, **a.params())
        for c in contexts])
    if s.tokenizer_fingerprint is not None:
        msg.tokenizer_fingerprint = s.tokenizer_fingerprint
    return msg


def insert_request(sequences: Sequence, s: ClientSettings) -> pb.InsertRequest:
    msg = pb.InsertRequest(sequences=[
        pb.TokenSequence(tokens=convert.tokens_to_list(ids(q, f"sequences[{i}]")))
        for i, q in enumerate(sequences)])
    if s.tokenizer_fingerprint is not None:
        msg.tokenizer_fingerprint = s.tokenizer_fingerprint
    return msg


def tree_from(msg: pb.DraftTree) -> DraftTree:
    return convert.tree_from_proto(msg, SOURCE)


def trees_from(msg: pb.DraftBatchResponse, n: int) -> list[DraftTree]:
    if len(msg.trees) != n:
        raise ValueError(f"DraftBatch answered {len(msg.trees)} trees for {n} contexts")
    return [tree_from(t) for t in msg.trees]


def empties(n: int) -> list[DraftTree]:
    return [DraftTree.empty(SOURCE) for _ in range(n)]


def chunks(items: Sequence, size: int) -> list[Sequence]:
    return [items[i:i + size] for i in range(0, len(items), size)] or [items[:0]]
