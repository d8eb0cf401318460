"""Request validation: proto -> checked domain values, or an error naming the field.

INVALID_ARGUMENT for what the caller got wrong (ids outside the vocabulary, budget/depth 0 or
over the limit, min_count 0, oversized context, batch or insert); FAILED_PRECONDITION for a
tokenizer fingerprint mismatch or a tier this server does not have.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from datastore.errors import FailedPrecondition, InvalidArgument, TokenizerMismatch
from datastore.serve_settings import MAX_MIN_COUNT, ServeSettings
from protos import convert
from protos.draftstore.v1 import draftstore_pb2 as pb


@dataclass(frozen=True)
class DraftQuery:
    context: np.ndarray  # [<= max_suffix] int64, the tail that matters
    budget: int
    max_depth: int
    max_suffix: int
    min_suffix: int
    min_count: int
    tier: str  # "static" | "live" | "both"


def parse_draft(msg: pb.DraftRequest, s: ServeSettings, vocab_size: int, live: bool,
                where: str = "") -> DraftQuery:
    """Validate one DraftRequest against the limits; InvalidArgument names the field."""
    context = convert.tokens_from_proto(msg.context)  # [n] int64
    if context.shape[0] > s.limit_context:
        raise InvalidArgument(f"{where}context has {context.shape[0]} tokens; the limit is "
                              f"{s.limit_context} (only the last max_suffix are used)")
    check_vocab(context, vocab_size, f"{where}context")
    try:
        p = convert.params_from_proto(msg.params)
    except ValueError as exc:
        raise InvalidArgument(f"{where}{exc}") from exc
    budget = _param(p["budget"], s.budget, 1, s.limit_budget, f"{where}params.budget")
    depth = _param(p["max_depth"], s.max_depth, 1, s.limit_depth, f"{where}params.max_depth")
    max_suffix = _param(p["max_suffix"], s.max_suffix, 1, s.limit_context,
                        f"{where}params.max_suffix")
    min_suffix = _param(p["min_suffix"], s.min_suffix, 1, max_suffix,
                        f"{where}params.min_suffix (<= max_suffix)")
    min_count = _param(p["min_count"], s.min_count, 1, MAX_MIN_COUNT, f"{where}params.min_count")
    tier = p["tier"] or ("both" if live else "static")
    if tier != "static" and not live:
        raise FailedPrecondition(f"{where}params.tier={tier}: the live tier is disabled "
                                 "on this server (--no-live)")
    return DraftQuery(context[-max_suffix:], budget, depth, max_suffix, min_suffix, min_count,
                      tier)


def _param(value: int | None, default: int, lo: int, hi: int, name: str) -> int:
    if value is None:
        return default
    if not lo <= value <= hi:
        raise InvalidArgument(f"{name} = {value} is outside [{lo}, {hi}]")
    return value


def check_vocab(tokens: np.ndarray, vocab_size: int, name: str) -> None:
    """InvalidArgument naming the first id >= vocab_size (the separator included)."""
    if tokens.shape[0] and int(tokens.max()) >= vocab_size:
        i = int(np.argmax(tokens >= vocab_size))
        raise InvalidArgument(f"{name}[{i}] = {int(tokens[i])} is outside the vocabulary "
                              f"[0, {vocab_size})")


def check_fingerprint(msg, expected: str, where: str = "") -> None:
    if msg.HasField("tokenizer_fingerprint") and msg.tokenizer_fingerprint != expected:
        raise TokenizerMismatch(
            f"{where}tokenizer_fingerprint {msg.tokenizer_fingerprint[:16]!r}... does not match "
            f"the datastore's {expected[:16]!r}...: the client tokenizes with another vocabulary"
        )


def parse_insert(msg: pb.InsertRequest, s: ServeSettings, vocab_size: int) -> list[np.ndarray]:
    if len(msg.sequences) > s.limit_insert_sequences:
        raise InvalidArgument(f"{len(msg.sequences)} sequences in one Insert; the limit is "
                              f"{s.limit_insert_sequences}")
    total = sum(len(q.tokens) for q in msg.sequences)
    cap = min(s.limit_insert_tokens, s.live_max_tokens)
    if total > cap:
        raise InvalidArgument(f"Insert of {total} tokens; the limit per call is {cap}")
    seqs = [convert.tokens_from_proto(q.tokens) for q in msg.sequences]  # per sequence, not token
    for i, seq in enumerate(seqs):
        check_vocab(seq, vocab_size, f"sequences[{i}].tokens")
    return seqs
