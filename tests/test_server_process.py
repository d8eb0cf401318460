"""`datastore-serve` as a process: workers sharing a port, live inserts across workers and
restarts, SIGTERM draining, a second server on the same port, health, bad input."""
from __future__ import annotations

import os
import select
import signal
import socket
import statistics
import subprocess
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from datastore.store import Datastore
from protos import convert
from protos.channel import MAX_MESSAGE_BYTES
from protos.draftstore.v1 import draftstore_pb2 as pb
from server_support import build_store, sample_contexts, scrape, serve_command, stub_for

ENV = dict(os.environ, PYTHONUNBUFFERED="1")


class Server:
    """A `datastore-serve` subprocess; `address` once it printed its one ready line."""

    def __init__(self, store, *args: str, timeout: float = 90) -> None:
        self.proc = subprocess.Popen(serve_command(store, *args), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=ENV)
        self.address = None
        line = _readline(self.proc.stdout, timeout)
        if line.startswith("serving on "):
            self.address = line.split()[-1]
            self.port = int(self.address.rsplit(":", 1)[1])

    def stop(self, sig=signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            self.proc.kill()
            self.proc.wait()

    def stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.poll() is not None else ""


def _readline(stream, timeout: float) -> str:
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline().strip() if ready else ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, smollm2_tokenizer):
    path = tmp_path_factory.mktemp("proc") / "store"
    return path, build_store(path, smollm2_tokenizer)


def pid_of(call) -> str:
    return dict(call.trailing_metadata())["draftstore-pid"]


def stubs_per_worker(address: str, want: int = 2, tries: int = 40):
    """{pid: stub}: one channel (= one connection, hashed to one worker) per worker."""
    found, spare = {}, []
    for _ in range(tries):
        ch, stub = stub_for(address, options=[("grpc.use_local_subchannel_pool", 1)])
        _, call = stub.Info.with_call(pb.InfoRequest(), timeout=10)
        pid = pid_of(call)
        if pid in found:
            spare.append(ch)
        else:
            found[pid] = stub
        if len(found) == want:
            break
    for ch in spare:
        ch.close()
    return found


def wait_visible(stub, context, want_first: int, limit: float) -> float:
    """Seconds until a live-tier draft after `context` proposes `want_first`."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit:
        tree = stub.Draft(convert.draft_request(context, tier="live"), timeout=5).tree
        if want_first in list(tree.tokens):
            return time.perf_counter() - start
        time.sleep(0.005)
    return float("inf")


def test_two_workers_share_the_port_and_see_each_others_inserts(corpus, smollm2_tokenizer,
                                                                tmp_path):
    store, docs = corpus
    live_dir = tmp_path / "live"
    metrics_port = free_port()
    srv = Server(store, "--workers", "2", "--live-dir", str(live_dir),
                 "--metrics-port", str(metrics_port))
    try:
        assert srv.address, srv.stop() or srv.stderr()
        workers = stubs_per_worker(srv.address)
        assert len(workers) == 2, "connections never reached a second worker"
        (pid_a, a), (pid_b, b) = workers.items()
        # drafts equal the in-process reader, through both workers
        with Datastore.open(store) as ds:
            for i, ctx in enumerate(sample_contexts(smollm2_tokenizer, docs, 30, seed=9)):
                stub = a if i % 2 else b
                tree = stub.Draft(convert.draft_request(ctx, tier="static"), timeout=10).tree
                assert convert.tree_from_proto(tree).same_as(ds.draft(ctx))
        # an Insert through one worker is visible through the other within the bound
        rng = np.random.default_rng(0)
        delays, inserted = [], []
        for i in range(6):
            seq = rng.integers(0, 1000, 12).tolist()
            inserted.append(seq)
            writer, reader = (a, b) if i % 2 == 0 else (b, a)
            _, call = writer.Insert.with_call(
                pb.InsertRequest(sequences=[pb.TokenSequence(tokens=seq)]), timeout=10)
            delays.append(wait_visible(reader, seq[:8], seq[8], limit=2.0))
        assert max(delays) < 2.0, delays
        assert statistics.median(delays) <= 0.2, delays  # refresh period 50 ms + one rebuild
        # concurrent writers in both processes: nothing lost, keys never collide
        def burst(stub, k):
            for j in range(10):
                stub.Insert(pb.InsertRequest(sequences=[pb.TokenSequence(tokens=[k, j, 7])]),
                            timeout=10)
        threads = [threading.Thread(target=burst, args=(s, k)) for k, s in enumerate((a, b))]
        [t.start() for t in threads]
        [t.join() for t in threads]
        total = len(inserted) + 20
        for stub in (a, b):
            deadline = time.time() + 3
            while stub.Info(pb.InfoRequest()).live_sequences != total and time.time() < deadline:
                time.sleep(0.02)
            assert stub.Info(pb.InfoRequest()).live_sequences == total
        text = scrape(metrics_port)  # one port, summed over both workers
        assert text['draftstore_rpc_total{code="OK",method="Insert"}'] == total
    finally:
        assert srv.stop() == 0
    # restart: everything acknowledged is drafted from as soon as the server says it serves
    srv = Server(store, "--workers", "2", "--live-dir", str(live_dir))
    try:
        assert srv.address
        for pid, stub in stubs_per_worker(srv.address).items():
            assert stub.Info(pb.InfoRequest()).live_sequences == total
            for seq in inserted:
                tree = stub.Draft(convert.draft_request(seq[:8], tier="live")).tree
                assert seq[8] in list(tree.tokens)
    finally:
        assert srv.stop() == 0


BIG_REPLIES = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]  # the slow batch's ~8 MB reply
SLOW_BUDGET = 16384  # the datastore's C kernel drafts 256 x 1024 nodes here in ~0.1 s: ask for more


def slow_batch(ds, n: int = 256) -> pb.DraftBatchRequest:
    first = ds.indexes[0].tokens[:n].astype(np.int64)
    return pb.DraftBatchRequest(requests=[
        convert.draft_request([int(t) % ds.vocab_size], budget=SLOW_BUDGET, max_depth=64,
                              max_suffix=1) for t in first])


@pytest.mark.parametrize("workers", ["1", "2"])
def test_sigterm_drains_the_call_in_flight(corpus, workers):
    store, _ = corpus
    with Datastore.open(store) as ds:
        request = slow_batch(ds)
    srv = Server(store, "--no-live", "--grace", "20", "--workers", workers, "--limit-budget", str(SLOW_BUDGET))
    try:
        assert srv.address
        ch, stub = stub_for(srv.address, options=BIG_REPLIES)
        stub.Info(pb.InfoRequest(), timeout=10)  # connected
        start = time.perf_counter()
        future = stub.DraftBatch.future(request, timeout=60)
        time.sleep(0.3)
        assert not future.done(), "the batch was too quick to test draining"
        srv.proc.send_signal(signal.SIGTERM)
        reply = future.result()  # finishes despite the SIGTERM
        assert len(reply.trees) == 256 and time.perf_counter() - start > 0.3
        assert srv.proc.wait(30) == 0
        ch.close()
    finally:
        srv.stop()


def test_a_second_server_on_the_same_port_fails_loudly(corpus, tmp_path):
    store, _ = corpus
    first = Server(store, "--workers", "2", "--no-live")
    try:
        assert first.address
        for extra in ((), ("--workers", "2")):
            second = subprocess.run(serve_command(store, "--port", str(first.port), "--no-live",
                                                  *extra),
                                    capture_output=True, text=True, timeout=60, env=ENV)
            assert second.returncode == 2, second.stderr
            assert "serving on" not in second.stdout
            assert str(first.port) in second.stderr
    finally:
        assert first.stop() == 0
    single = Server(store, "--no-live")
    try:
        assert single.address
        second = subprocess.run(serve_command(store, "--port", str(single.port), "--workers", "2",
                                              "--no-live"),
                                capture_output=True, text=True, timeout=60, env=ENV)
        assert second.returncode == 2 and "serving on" not in second.stdout
    finally:
        assert single.stop() == 0


def test_health_is_not_serving_until_the_store_is_verified(corpus):
    store, _ = corpus
    port = free_port()
    srv_proc = subprocess.Popen(serve_command(store, "--port", str(port), "--no-live"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    ch, _ = stub_for(f"127.0.0.1:{port}")
    health = health_pb2_grpc.HealthStub(ch)
    seen = []
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                status = health.Check(health_pb2.HealthCheckRequest(), timeout=0.5).status
            except grpc.RpcError as exc:
                status = exc.code().name
            if not seen or seen[-1] != status:
                seen.append(status)
            if status == health_pb2.HealthCheckResponse.SERVING:
                break
            time.sleep(0.01)
        assert seen[-1] == health_pb2.HealthCheckResponse.SERVING, seen
        assert health_pb2.HealthCheckResponse.NOT_SERVING in seen, seen
        assert _readline(srv_proc.stdout, 10) == f"serving on 127.0.0.1:{port}"
    finally:
        ch.close()
        srv_proc.send_signal(signal.SIGTERM)
        assert srv_proc.wait(30) == 0


@pytest.mark.parametrize("workers", ["1", "2"])
def test_bad_input_exits_2_with_a_message(tmp_path, workers):
    missing = tmp_path / "nope"
    empty = tmp_path / "empty"
    empty.mkdir()
    for target, extra in ((missing, ()), (empty, ()),
                          (empty, ("--auth-token-file", str(tmp_path / "no-token")))):
        proc = subprocess.run(serve_command(target, "--workers", workers, *extra),
                              capture_output=True, text=True, timeout=60, env=ENV)
        assert proc.returncode == 2, proc.stderr
        assert "datastore-serve: error:" in proc.stderr and "serving on" not in proc.stdout
        named = tmp_path / "no-token" if extra else target
        assert str(named) in proc.stderr


def test_workers_exit_when_the_parent_is_killed(corpus):
    store, _ = corpus
    srv = Server(store, "--workers", "2", "--no-live")
    try:
        assert srv.address
        children = [int(p) for p in subprocess.run(
            ["pgrep", "-P", str(srv.proc.pid)], capture_output=True, text=True).stdout.split()]
        assert len(children) == 2
        srv.proc.kill()  # SIGKILL: no chance to forward anything
        srv.proc.wait(10)
        deadline = time.time() + 20
        alive = children
        while alive and time.time() < deadline:
            alive = [c for c in children if _alive(c)]
            time.sleep(0.1)
        assert not alive, "orphaned workers kept serving"
    finally:
        srv.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "State:\tZ" in status.read_text())


def test_acknowledged_inserts_survive_sigkill(corpus, tmp_path):
    store, _ = corpus
    live_dir = str(tmp_path / "live")
    srv = Server(store, "--live-dir", live_dir)
    seqs = [[5, 6, 7, 8, i] for i in range(25)]
    try:
        assert srv.address
        ch, stub = stub_for(srv.address)
        for seq in seqs:
            stub.Insert(pb.InsertRequest(sequences=[pb.TokenSequence(tokens=seq)]), timeout=10)
        ch.close()
        srv.proc.kill()  # no drain, no goodbye: only what was committed counts
        srv.proc.wait(10)
    finally:
        srv.stop()
    srv = Server(store, "--live-dir", live_dir)
    try:
        assert srv.address
        ch, stub = stub_for(srv.address)
        assert stub.Info(pb.InfoRequest()).live_sequences == len(seqs)
        tree = stub.Draft(convert.draft_request([5, 6, 7, 8], tier="live")).tree
        assert sorted(tree.tokens[: len(seqs)]) == list(range(25))  # each once, count 1
        ch.close()
    finally:
        assert srv.stop() == 0
