"""The client against a `datastore-serve` subprocess: SIGKILL while drafting (empty trees within
the deadline, failures counted, recovery once a server is back on the same port), and the
`datastore-query` console script."""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from client import DraftClient
from datastore.store import Datastore
from datastore.server import ServeSettings, serve
from server_support import build_store, encode, serve_command

ENV = dict(os.environ, PYTHONUNBUFFERED="1")
TEXT = "    def __init__(self"
TIMEOUT_S = 0.1
SLACK_S = 0.2  # thread scheduling on a shared, heavily loaded 2-core machine


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, smollm2_tokenizer):
    path = tmp_path_factory.mktemp("client_proc") / "store"
    docs = build_store(path, smollm2_tokenizer, modules=("textwrap.py", "shlex.py"))
    return path, docs


def start_server(store: Path, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(serve_command(store, "--port", str(port), "--no-live"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    ready, _, _ = select.select([proc.stdout], [], [], 90)
    line = proc.stdout.readline().strip() if ready else ""
    if line != f"serving on 127.0.0.1:{port}":
        proc.kill()
        raise AssertionError(f"server did not start: {line!r} {proc.stderr.read()[-2000:]}")
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class DraftLoop(threading.Thread):
    """Drafts one context over and over, recording (start, seconds, tree size) per call."""

    def __init__(self, client: DraftClient, context: list[int]) -> None:
        super().__init__(daemon=True)
        self.client, self.context = client, context
        self.calls: list[tuple[float, float, int]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            start = time.monotonic()
            tree = self.client.draft(self.context, budget=32)
            self.calls.append((start, time.monotonic() - start, len(tree)))
            time.sleep(0.002)


def test_sigkill_gives_empty_trees_within_the_deadline_then_recovers(corpus, free_port):
    store, docs = corpus
    with Datastore.open(store) as ds:
        context = next(d[:12].tolist() for d in docs if len(ds.draft(d[:12], budget=32)) > 1)
        want = ds.draft(context, budget=32)
    proc = start_server(store, free_port)
    again = None
    try:
        with DraftClient(f"127.0.0.1:{free_port}", timeout=TIMEOUT_S) as client:
            client.info()  # connected before the loop: its first call is not the handshake
            loop = DraftLoop(client, context)
            loop.start()
            time.sleep(1.0)
            up = list(loop.calls)
            # on a loaded machine a call can miss its 100 ms deadline now and then
            assert len(up) > 10 and sum(size > 0 for _, _, size in up) >= 0.8 * len(up), up
            killed_at = time.monotonic()
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            time.sleep(1.5)
            down = [c for c in loop.calls if c[0] > killed_at + 0.05]
            assert len(down) > 20 and all(size == 0 for _, _, size in down), down
            worst = max(took for _, took, _ in loop.calls)
            assert worst < TIMEOUT_S + SLACK_S, (worst, client.failures_by_code)
            assert client.failures >= len(down)
            codes = client.failures_by_code
            assert set(codes) <= {"UNAVAILABLE", "CIRCUIT_OPEN", "DEADLINE_EXCEEDED"}, codes
            assert codes.get("CIRCUIT_OPEN", 0) > 0  # the fast path engaged

            again = start_server(store, free_port)
            back_at = time.monotonic()
            while time.monotonic() - back_at < 10:
                if loop.calls[-1][2] > 0 and loop.calls[-1][0] > back_at:
                    break
                time.sleep(0.02)
            recovered = time.monotonic() - back_at
            loop.halt.set()
            loop.join(5)
            # back within the reconnect backoff (1 s) plus the breaker cooldown
            assert recovered < 3.0, recovered
            assert client.draft(context, budget=32).same_as(want)
            assert max(took for _, took, _ in loop.calls) < TIMEOUT_S + SLACK_S
    finally:
        stop(proc)
        if again is not None:
            stop(again)


def test_datastore_query_console_script(corpus, tmp_path, smollm2_tokenizer):
    """The installed script, once, over gRPC (main([...]) covers the rest in-process)."""
    store, _ = corpus
    served = tmp_path / "served"  # py-lmdb opens an environment once per process
    shutil.copytree(store, served)
    script = Path(sys.executable).parent / "datastore-query"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "client.query_cli"]
    with serve(served, ServeSettings(live=False)) as srv:
        out = subprocess.run(cmd + ["--address", srv.address, "--text", TEXT, "--budget", "8",
                                    "--json"], capture_output=True, text=True, timeout=120,
                             env=ENV)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    ids = encode(smollm2_tokenizer, TEXT)
    with Datastore.open(store) as ds:
        want = ds.draft(ids, budget=8)
    assert len(want) > 0 and got["context"] == ids.tolist()
    assert (got["tokens"], got["parents"], got["counts"], got["match_len"]) == (
        want.tokens.tolist(), want.parents.tolist(), want.counts.tolist(), want.match_len)
