"""`DraftClient`: the gRPC twin of `Datastore.draft`, safe to call from a decode loop.

    with DraftClient("127.0.0.1:50051", timeout=0.05) as c:
        tree = c.draft(context_ids, budget=64)     # DraftTree; empty on any failure

Error policy (documented contract):
- `draft` / `draft_batch` never raise. On any failure (server down, deadline, bad request,
  malformed answer) they return empty trees and count it: `failures`, `failures_by_code`
  (gRPC status names, plus CIRCUIT_OPEN for calls skipped by the fast path, CLIENT_ERROR for a
  request that could not be built, BAD_RESPONSE for an answer that is not a valid tree).
- `info` and `insert` raise `DraftServiceError` (with `.code`); `insert(..., raise_on_error=False)`
  returns 0 instead, for callers in a decode loop.
Every call has a deadline; gRPC retries UNAVAILABLE inside it (service config, settings.py).
"""
from __future__ import annotations

import time
from typing import Sequence

import grpc

from client import messages
from client.failures import BAD_RESPONSE, CallGuard, DraftServiceError
from client.messages import DatastoreInfo, DraftArgs
from client.settings import ClientSettings, TlsConfig, channel_options
from datastore.tree import DraftTree
from protos.draftstore.v1 import draftstore_pb2 as pb
from protos.draftstore.v1 import draftstore_pb2_grpc as pb_grpc

def make_settings(timeout: float, auth_token: str | None, tls: TlsConfig | None,
                  tokenizer_fingerprint: str | None, settings: ClientSettings | None,
                  **more) -> ClientSettings:
    """The keyword arguments of a client constructor as one ClientSettings."""
    if settings is not None:
        return settings
    return ClientSettings(timeout=timeout, auth_token=auth_token, tls=tls,
                          tokenizer_fingerprint=tokenizer_fingerprint, **more)


def call_timeout(timeout: float | None, default: float) -> float:
    """A call's deadline in seconds: the caller's, else the settings' (never <= 0)."""
    return default if timeout is None else max(float(timeout), 1e-3)


def open_channel(target: str, s: ClientSettings) -> grpc.Channel:
    opts = channel_options(s)
    if s.tls is None:
        return grpc.insecure_channel(target, options=opts)
    return grpc.secure_channel(target, s.tls.credentials(), options=opts)


class ClientBase:
    """Construction and failure counters shared by `DraftClient` and `AsyncDraftClient`;
    `open_channel` is the one thing that differs (grpc vs grpc.aio)."""

    open_channel = staticmethod(open_channel)

    def __init__(self, target: str, timeout: float = 0.05, auth_token: str | None = None,
                 tls: TlsConfig | None = None, tokenizer_fingerprint: str | None = None, *,
                 settings: ClientSettings | None = None, **more) -> None:
        self.target = target
        self.settings = make_settings(timeout, auth_token, tls, tokenizer_fingerprint,
                                      settings, **more)
        s = self.settings
        self._guard = CallGuard(target, s.breaker_failures, s.breaker_cooldown_s)
        self._metadata = s.metadata()
        self._channel = self.open_channel(target, s)
        self._stub = pb_grpc.DraftServiceStub(self._channel)

    @property
    def failures(self) -> int:
        return self._guard.stats.failures

    @property
    def failures_by_code(self) -> dict[str, int]:
        return self._guard.stats.snapshot()

    @property
    def calls(self) -> int:
        return self._guard.stats.calls

    @property
    def last_error(self) -> str:
        return self._guard.stats.last_error


class DraftClient(ClientBase):
    """One server (or one DNS name of replicas with load_balancing="round_robin").

    Extra keywords (retry_attempts, breaker_cooldown_s, load_balancing, tier, ...) are fields
    of `ClientSettings`; or pass `settings=ClientSettings(...)` whole.
    """

    def _rpc(self, method: str, request, timeout: float):
        return getattr(self._stub, method)(request, timeout=timeout, metadata=self._metadata,
                                           wait_for_ready=False)

    def info(self, timeout: float | None = None) -> DatastoreInfo:
        """Raises DraftServiceError (e.g. code UNAVAILABLE for an unreachable server)."""
        try:
            seconds = call_timeout(timeout, self.settings.admin_timeout)
            msg = self._rpc("Info", pb.InfoRequest(), seconds)
        except Exception as exc:  # noqa: BLE001 - every failure becomes one clear error
            code, details = self._guard.failed("Info", exc)
            raise DraftServiceError(self.target, "Info", code, details) from exc
        self._guard.succeeded()
        return messages.info_from_proto(msg, self.target)

    def draft(self, context, budget: int = 64, max_depth: int = 16, max_suffix: int = 16,
              min_suffix: int = 1, min_count: int = 1, *,
              timeout: float | None = None) -> DraftTree:
        """The datastore's tree after `context` (1-D ids); empty on any failure, never raises."""
        if budget == 0:
            return DraftTree.empty(messages.SOURCE)
        if not self._guard.admit("Draft"):
            return DraftTree.empty(messages.SOURCE)
        try:
            request = messages.draft_request(
                context, DraftArgs(budget, max_depth, max_suffix, min_suffix, min_count),
                self.settings)
            msg = self._rpc("Draft", request, call_timeout(timeout, self.settings.timeout))
        except Exception as exc:  # noqa: BLE001 - decoding never fails because of the datastore
            self._guard.failed("Draft", exc)
            return DraftTree.empty(messages.SOURCE)
        try:
            tree = messages.tree_from(msg.tree)
        except ValueError as exc:
            self._guard.failed_code("Draft", BAD_RESPONSE, str(exc))
            return DraftTree.empty(messages.SOURCE)
        self._guard.succeeded()
        return tree

    def draft_batch(self, contexts: Sequence, budget: int = 64, max_depth: int = 16,
                    max_suffix: int = 16, min_suffix: int = 1, min_count: int = 1, *,
                    timeout: float | None = None) -> list[DraftTree]:
        """One tree per context, in order (DraftBatch calls of <= settings.max_batch under one
        deadline); empty trees for any part that failed, never raises."""
        contexts = list(contexts)
        if not contexts or budget == 0:
            return messages.empties(len(contexts))
        deadline = time.monotonic() + call_timeout(timeout, self.settings.timeout)
        args = (budget, max_depth, max_suffix, min_suffix, min_count)
        out: list[DraftTree] = []
        for part in messages.chunks(contexts, self.settings.max_batch):
            out += self._batch_part(part, args, deadline)
        return out

    def _batch_part(self, contexts: list, args: tuple, deadline: float) -> list[DraftTree]:
        if not self._guard.admit("DraftBatch"):
            return messages.empties(len(contexts))
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self._guard.failed_code("DraftBatch", "DEADLINE_EXCEEDED", "no time left for this part")
            return messages.empties(len(contexts))
        try:
            request = messages.batch_request(contexts, DraftArgs(*args), self.settings)
            msg = self._rpc("DraftBatch", request, remaining)
        except Exception as exc:  # noqa: BLE001 - decoding never fails because of the datastore
            self._guard.failed("DraftBatch", exc)
            return messages.empties(len(contexts))
        try:
            trees = messages.trees_from(msg, len(contexts))
        except ValueError as exc:
            self._guard.failed_code("DraftBatch", BAD_RESPONSE, str(exc))
            return messages.empties(len(contexts))
        self._guard.succeeded()
        return trees

    def insert(self, sequences: Sequence, *, raise_on_error: bool = True,
               timeout: float | None = None) -> int:
        """Append token sequences to the server's live tier (durable once this returns).
        -> sequences stored. Raises DraftServiceError, or returns 0 when raise_on_error=False."""
        sequences = list(sequences)
        if not sequences:
            return 0
        if not raise_on_error and not self._guard.admit("Insert"):
            return 0
        try:
            request = messages.insert_request(sequences, self.settings)
            seconds = call_timeout(timeout, self.settings.admin_timeout)
            msg = self._rpc("Insert", request, seconds)
        except Exception as exc:  # noqa: BLE001 - one clear error, or 0
            code, details = self._guard.failed("Insert", exc)
            if raise_on_error:
                raise DraftServiceError(self.target, "Insert", code, details) from exc
            return 0
        self._guard.succeeded()
        return int(msg.sequences)

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "DraftClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"DraftClient({self.target!r}, timeout={self.settings.timeout}, "
                f"failures={self.failures})")
