"""Shared by tests/test_client_*.py (no tests here): a deliberately slow DraftService.

A real gRPC server whose handlers sleep: it stands for an overloaded or stuck server, so that
deadline tests do not depend on how long real drafting takes on a loaded machine (and a real
server in the test process would also share the client's GIL).
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import grpc

from protos.draftstore.v1 import draftstore_pb2 as pb
from protos.draftstore.v1 import draftstore_pb2_grpc as pb_grpc

SLOW_S = 1.0


class SlowService(pb_grpc.DraftServiceServicer):
    def Draft(self, request, context):
        time.sleep(SLOW_S)
        return pb.DraftResponse()

    def DraftBatch(self, request, context):
        time.sleep(SLOW_S)
        return pb.DraftBatchResponse(trees=[pb.DraftTree() for _ in request.requests])

    def Info(self, request, context):
        return pb.InfoResponse()


@contextmanager
def slow_server():
    """-> "127.0.0.1:PORT" of a SlowService, stopped on exit."""
    server = grpc.server(ThreadPoolExecutor(4))
    pb_grpc.add_DraftServiceServicer_to_server(SlowService(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)


class FlakyService(pb_grpc.DraftServiceServicer):
    """Aborts the first `fail` Draft calls with `code`, then answers a one-node tree;
    `attempts` counts every call that reached it."""

    def __init__(self, code: grpc.StatusCode, fail: int) -> None:
        self.code, self.fail, self.attempts = code, fail, 0

    def Draft(self, request, context):
        self.attempts += 1
        if self.attempts <= self.fail:
            context.abort(self.code, f"attempt {self.attempts} fails on purpose")
        return pb.DraftResponse(tree=pb.DraftTree(tokens=[7], parents=[-1], counts=[1],
                                                  match_len=1))


@contextmanager
def flaky_server(code: grpc.StatusCode, fail: int):
    """-> (address, FlakyService)."""
    service = FlakyService(code, fail)
    server = grpc.server(ThreadPoolExecutor(4))
    pb_grpc.add_DraftServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", service
    finally:
        server.stop(0)
