"""Failure accounting for the clients: the error type, per-status counters and the fast path
(a circuit breaker) that stops a dead server from costing every decode step its whole deadline."""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter

import grpc

log = logging.getLogger("draftstore.client")

# Codes that say "the server is not there (or not answering)": they feed the breaker.
DOWN_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})
CIRCUIT_OPEN = "CIRCUIT_OPEN"  # not a gRPC code: a call skipped while the breaker is open
CLIENT_ERROR = "CLIENT_ERROR"  # the request could not be built (bad context, ...)
BAD_RESPONSE = "BAD_RESPONSE"  # the server's answer is not a valid tree


class DraftServiceError(Exception):
    """An Info/Insert call failed. `code` is the gRPC status name (or CLIENT_ERROR)."""

    def __init__(self, target: str, method: str, code: str, details: str) -> None:
        super().__init__(f"{method} to {target} failed: {code}: {details}")
        self.target, self.method, self.code, self.details = target, method, code, details


def code_of(exc: BaseException) -> tuple[str, str]:
    """(status name, details) of an exception from a gRPC call (sync or aio)."""
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        code = exc.code()
        details = exc.details() if hasattr(exc, "details") else ""
        return (code.name if code is not None else "UNKNOWN"), (details or "")
    if isinstance(exc, (ValueError, TypeError)):
        return CLIENT_ERROR, f"{type(exc).__name__}: {exc}"
    return "UNKNOWN", f"{type(exc).__name__}: {exc}"


class FailureStats:
    """Thread-safe counters: calls, failures and failures by status name."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.calls = 0
        self.failures = 0
        self.by_code: Counter[str] = Counter()
        self.last_error = ""  # "METHOD CODE: details" of the latest failure
        self._lock = threading.Lock()

    def ok(self) -> None:
        with self._lock:
            self.calls += 1

    def failed(self, method: str, code: str, details: str, n: int = 1) -> None:
        """n: how many trees this failure cost (a DraftBatch call counts once)."""
        with self._lock:
            self.calls += 1
            self.failures += 1
            first = self.by_code[code] == 0
            self.by_code[code] += 1
            self.last_error = f"{method} {code}: {details}"
        # the first failure of each kind is worth a warning; the rest would flood a decode log
        (log.warning if first else log.debug)("%s to %s failed: %s %s", method, self.target,
                                              code, details)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.by_code)


class Breaker:
    """Half-open circuit breaker over consecutive 'server down' answers.

    closed: every call goes out. After `threshold` consecutive DOWN_CODES answers it opens for
    `cooldown` seconds: calls are skipped (empty tree at once). After the cooldown the next call
    probes; its success closes the breaker, its failure re-opens it for another cooldown.
    """

    def __init__(self, threshold: int, cooldown: float) -> None:
        self.threshold, self.cooldown = threshold, cooldown
        self._streak = 0
        self._open_until = 0.0
        self._lock = threading.Lock()

    def allow(self) -> bool:
        with self._lock:
            if self._streak < self.threshold:
                return True
            now = time.monotonic()
            if now < self._open_until:
                return False
            self._open_until = now + self.cooldown  # this call is the probe; others wait
            return True

    def record(self, code: str | None) -> None:
        """code None = success."""
        with self._lock:
            if code is None or code not in DOWN_CODES:
                self._streak = 0  # any real answer means the server is there
                return
            self._streak += 1
            if self._streak >= self.threshold:
                self._open_until = time.monotonic() + self.cooldown

    @property
    def is_open(self) -> bool:
        with self._lock:
            return self._streak >= self.threshold and time.monotonic() < self._open_until


class CallGuard:
    """What every client call goes through: the breaker before, the counters after."""

    def __init__(self, target: str, threshold: int, cooldown: float) -> None:
        self.target = target
        self.stats = FailureStats(target)
        self.breaker = Breaker(threshold, cooldown)

    def admit(self, method: str) -> bool:
        if self.breaker.allow():
            return True
        self.stats.failed(method, CIRCUIT_OPEN, "server down; call skipped (fast path)")
        return False

    def succeeded(self) -> None:
        self.breaker.record(None)
        self.stats.ok()

    def failed(self, method: str, exc: BaseException) -> tuple[str, str]:
        code, details = code_of(exc)
        self.failed_code(method, code, details)
        return code, details

    def failed_code(self, method: str, code: str, details: str) -> None:
        if code != CLIENT_ERROR:  # a request we could not even build says nothing of the server
            self.breaker.record(code)
        self.stats.failed(method, code, details)
