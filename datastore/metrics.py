"""Prometheus metrics of the draft service: per-RPC counts by status code and latency histograms.

Each server gets its own `CollectorRegistry` (several servers in one test process must not clash
on metric names). With `--workers N` the CLI sets PROMETHEUS_MULTIPROC_DIR before the workers
create their metrics, and the parent serves the sum over workers on one port
(prometheus_client's multiprocess mode).
"""
from __future__ import annotations

import os

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client import multiprocess, values

# Loopback drafts take ~0.3-3 ms; DraftBatch and Insert up to ~100 ms.
LATENCY_BUCKETS = (
    0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0,
    2.5, 5.0,
)


class Metrics:
    """`observe(method, code_name, seconds)` after every DraftService call."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.calls = Counter(
            "draftstore_rpc_total", "DraftService calls by method and status code",
            ["method", "code"], registry=self.registry,
        )
        self.latency = Histogram(
            "draftstore_rpc_latency_seconds", "DraftService call latency by method",
            ["method"], buckets=LATENCY_BUCKETS, registry=self.registry,
        )

    def observe(self, method: str, code: str, seconds: float) -> None:
        self.calls.labels(method, code).inc()
        self.latency.labels(method).observe(seconds)


def enable_multiprocess(folder: str) -> None:
    """Make metrics created from now on write to `folder` (call in the parent before forking)."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
    # the value class is chosen at import time; pick it again in case the module is loaded already
    values.ValueClass = values.get_value_class()


def serve_http(port: int, host: str, registry: CollectorRegistry | None = None,
               multiprocess_dir: str | None = None) -> int:
    """Expose `registry` (or the multiprocess sum over `multiprocess_dir`) on HOST:port; -> port."""
    if multiprocess_dir is not None:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=multiprocess_dir)
    server, _thread = prometheus_client.start_http_server(port, addr=host, registry=registry)
    return int(server.server_port)
