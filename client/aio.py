"""`AsyncDraftClient`: the asyncio twin of `DraftClient` (grpc.aio), same methods as coroutines,
same settings, same error policy (draft/draft_batch never raise; info/insert raise
DraftServiceError unless insert(raise_on_error=False)).

    async with AsyncDraftClient("127.0.0.1:50051") as c:
        tree = await c.draft(ids, budget=64)

Create it inside the event loop that will use it (a grpc.aio channel belongs to one loop).
"""
from __future__ import annotations

import time
from typing import Sequence

import grpc

from client import messages
from client.draft_client import ClientBase, call_timeout
from client.failures import BAD_RESPONSE, DraftServiceError
from client.messages import DatastoreInfo, DraftArgs
from client.settings import ClientSettings, channel_options
from datastore.tree import DraftTree
from protos.draftstore.v1 import draftstore_pb2 as pb


def open_aio_channel(target: str, s: ClientSettings) -> grpc.aio.Channel:
    opts = channel_options(s)
    if s.tls is None:
        return grpc.aio.insecure_channel(target, options=opts)
    return grpc.aio.secure_channel(target, s.tls.credentials(), options=opts)


class AsyncDraftClient(ClientBase):
    open_channel = staticmethod(open_aio_channel)

    async def _rpc(self, method: str, request, timeout: float):
        return await getattr(self._stub, method)(request, timeout=timeout,
                                                 metadata=self._metadata, wait_for_ready=False)

    async def info(self, timeout: float | None = None) -> DatastoreInfo:
        try:
            msg = await self._rpc("Info", pb.InfoRequest(),
                                  call_timeout(timeout, self.settings.admin_timeout))
        except Exception as exc:  # noqa: BLE001 - every failure becomes one clear error
            code, details = self._guard.failed("Info", exc)
            raise DraftServiceError(self.target, "Info", code, details) from exc
        self._guard.succeeded()
        return messages.info_from_proto(msg, self.target)

    async def draft(self, context, budget: int = 64, max_depth: int = 16, max_suffix: int = 16,
                    min_suffix: int = 1, min_count: int = 1, *,
                    timeout: float | None = None) -> DraftTree:
        if budget == 0 or not self._guard.admit("Draft"):
            return DraftTree.empty(messages.SOURCE)
        try:
            request = messages.draft_request(
                context, DraftArgs(budget, max_depth, max_suffix, min_suffix, min_count),
                self.settings)
            seconds = call_timeout(timeout, self.settings.timeout)
            msg = await self._rpc("Draft", request, seconds)
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

    async def draft_batch(self, contexts: Sequence, budget: int = 64, max_depth: int = 16,
                          max_suffix: int = 16, min_suffix: int = 1, min_count: int = 1, *,
                          timeout: float | None = None) -> list[DraftTree]:
        contexts = list(contexts)
        if not contexts or budget == 0:
            return messages.empties(len(contexts))
        deadline = time.monotonic() + call_timeout(timeout, self.settings.timeout)
        args = (budget, max_depth, max_suffix, min_suffix, min_count)
        out: list[DraftTree] = []
        for part in messages.chunks(contexts, self.settings.max_batch):
            out += await self._batch_part(part, args, deadline)
        return out

    async def _batch_part(self, contexts: list, args: tuple, deadline: float) -> list[DraftTree]:
        if not self._guard.admit("DraftBatch"):
            return messages.empties(len(contexts))
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self._guard.failed_code("DraftBatch", "DEADLINE_EXCEEDED", "no time left for this part")
            return messages.empties(len(contexts))
        try:
            request = messages.batch_request(contexts, DraftArgs(*args), self.settings)
            msg = await self._rpc("DraftBatch", request, remaining)
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

    async def insert(self, sequences: Sequence, *, raise_on_error: bool = True,
                     timeout: float | None = None) -> int:
        sequences = list(sequences)
        if not sequences:
            return 0
        if not raise_on_error and not self._guard.admit("Insert"):
            return 0
        try:
            request = messages.insert_request(sequences, self.settings)
            seconds = call_timeout(timeout, self.settings.admin_timeout)
            msg = await self._rpc("Insert", request, seconds)
        except Exception as exc:  # noqa: BLE001 - one clear error, or 0
            code, details = self._guard.failed("Insert", exc)
            if raise_on_error:
                raise DraftServiceError(self.target, "Insert", code, details) from exc
            return 0
        self._guard.succeeded()
        return int(msg.sequences)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncDraftClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def __repr__(self) -> str:
        return (f"AsyncDraftClient({self.target!r}, timeout={self.settings.timeout}, "
                f"failures={self.failures})")
