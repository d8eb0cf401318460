"""datastore.errors: the one exception -> status mapping; a caller's mistake is never INTERNAL."""
from __future__ import annotations

import logging

import grpc
import pytest

from datastore import errors
from datastore.format import DatastoreError


class FakeContext:
    def __init__(self, remaining=None):
        self.aborted = None
        self.remaining = remaining

    def abort(self, code, details):
        self.aborted = (code, details)
        raise RuntimeError("aborted")  # grpc raises too

    def time_remaining(self):
        return self.remaining


@pytest.mark.parametrize("exc, code", [
    (errors.InvalidArgument("context[3] bad"), grpc.StatusCode.INVALID_ARGUMENT),
    (errors.TokenizerMismatch("fp"), grpc.StatusCode.FAILED_PRECONDITION),
    (errors.FailedPrecondition("no live"), grpc.StatusCode.FAILED_PRECONDITION),
    (errors.Unauthenticated("token"), grpc.StatusCode.UNAUTHENTICATED),
    (errors.Overloaded("busy"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.DeadlinePassed("late"), grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.NotReady("opening"), grpc.StatusCode.UNAVAILABLE),
    (DatastoreError("/x: truncated"), grpc.StatusCode.DATA_LOSS),
    (KeyError("surprise"), grpc.StatusCode.INTERNAL),
])
def test_each_exception_maps_to_its_status(exc, code, caplog):
    ctx, seen = FakeContext(), []

    def boom():
        raise exc

    with caplog.at_level(logging.ERROR, logger="draftstore.server"):
        with pytest.raises(RuntimeError, match="aborted"):
            errors.run_mapped(boom, ctx, "Draft", seen.append)
    assert ctx.aborted[0] == code and seen == [code]
    logged = any("Draft failed unexpectedly" in r.getMessage() for r in caplog.records)
    assert logged == (code == grpc.StatusCode.INTERNAL)  # only the unexpected is logged
    if code != grpc.StatusCode.INTERNAL:
        assert str(exc).strip("'") in ctx.aborted[1]
    else:
        assert "KeyError" in ctx.aborted[1] and "surprise" not in ctx.aborted[1]


def test_ok_passes_through_and_deadline_check():
    ctx, seen = FakeContext(), []
    assert errors.run_mapped(lambda: 42, ctx, "Info", seen.append) == 42
    assert seen == [grpc.StatusCode.OK] and ctx.aborted is None
    errors.check_deadline(FakeContext(remaining=0.5), "x")
    errors.check_deadline(FakeContext(remaining=None), "x")
    with pytest.raises(errors.DeadlinePassed, match="after 3"):
        errors.check_deadline(FakeContext(remaining=-0.01), "after 3")
