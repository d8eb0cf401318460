"""`datastore-serve DIR`: serve a datastore over gRPC (draftstore.v1.DraftService).

Prints exactly one `serving on HOST:PORT` line on stdout once every worker has opened and
verified the store (health SERVING). SIGTERM/SIGINT: health NOT_SERVING, in-flight calls get
--grace seconds to finish, exit 0. Exit 2 for bad input: a datastore that cannot be served, an
unreadable token/TLS file, a port already in use.

--workers N forks N processes sharing the port with SO_REUSEPORT (handlers are CPU-bound and do
not scale with threads under the GIL); each opens LMDB after the fork. So that a second server
on the same port fails instead of silently sharing it, the parent holds an exclusive lock file
per port (in the temp dir) for its whole life, and a single worker binds without SO_REUSEPORT.
"""
from __future__ import annotations

import argparse
import fcntl
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from dataclasses import replace
from pathlib import Path

from protos.channel import read_token_file

log = logging.getLogger("draftstore.serve")
EXIT_BAD_INPUT = 2


class CliError(Exception):
    """Bad input: printed as `datastore-serve: error: ...`, exit 2."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="datastore-serve", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: datastore-serve store/ --port 50051 --workers 2 --auth-token-file tok")
    p.add_argument("dir", metavar="DIR", help="datastore directory (from datastore-build)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; use auth and TLS for anything wider)")
    p.add_argument("--port", type=int, default=0, help="port; 0 picks a free one (default)")
    p.add_argument("--workers", type=int, default=1,
                   help="server processes sharing the port via SO_REUSEPORT (default 1)")
    p.add_argument("--threads", type=int, default=8, help="handler threads per worker")
    p.add_argument("--max-concurrent", type=int, default=None,
                   help="calls in flight per worker beyond which new calls get "
                        "RESOURCE_EXHAUSTED (rejected, not queued)")
    p.add_argument("--auth-token-file", default=None,
                   help="file holding a token; clients must send 'authorization: Bearer TOKEN'")
    p.add_argument("--tls-cert", default=None, help="PEM server certificate (with --tls-key)")
    p.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    p.add_argument("--tls-client-ca", default=None,
                   help="PEM CA: require client certificates signed by it (mutual TLS)")
    p.add_argument("--reflection", action="store_true", help="enable gRPC server reflection")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics on HOST:PORT (summed over workers)")
    p.add_argument("--live", action=argparse.BooleanOptionalAction, default=True,
                   help="live tier: Insert + drafts from inserted sequences (default on)")
    p.add_argument("--live-dir", default=None, help="live tier LMDB directory (default DIR.live)")
    p.add_argument("--live-max-tokens", type=int, default=10_000_000,
                   help="cap on live tokens; the oldest sequences are evicted beyond it")
    p.add_argument("--limit-budget", type=int, default=1024,
                   help="most draft nodes one context may ask for (default 1024; reported by Info)")
    p.add_argument("--limit-batch", type=int, default=256,
                   help="most contexts in one DraftBatch (default 256; reported by Info)")
    p.add_argument("--grace", type=float, default=5.0,
                   help="seconds in-flight calls get to finish on SIGTERM/SIGINT (default 5)")
    p.add_argument("--log-level", default="INFO", type=str.upper,
                   choices=("DEBUG", "INFO", "WARNING", "ERROR"), help="logging on stderr")
    return p


def settings_from_args(args: argparse.Namespace):
    from datastore.server import ServeSettings

    if args.workers < 1:
        raise CliError(f"--workers must be >= 1, got {args.workers}")
    token = _read_token(args.auth_token_file) if args.auth_token_file else None
    for flag in ("tls_cert", "tls_key", "tls_client_ca"):
        path = getattr(args, flag)
        if path is not None and not os.access(path, os.R_OK):
            raise CliError(f"--{flag.replace('_', '-')} {path}: not a readable file")
    try:
        return ServeSettings(
            host=args.host, port=args.port, threads=args.threads,
            max_concurrent=args.max_concurrent, auth_token=token, tls_cert=args.tls_cert,
            tls_key=args.tls_key, tls_client_ca=args.tls_client_ca, reflection=args.reflection,
            metrics_port=args.metrics_port, live=args.live, live_dir=args.live_dir,
            live_max_tokens=args.live_max_tokens, grace=args.grace, limit_budget=args.limit_budget,
            limit_batch=args.limit_batch,
            reuseport=args.workers > 1,
        )
    except ValueError as exc:
        raise CliError(str(exc)) from exc


def _read_token(path: str) -> str:
    try:
        return read_token_file(path)
    except ValueError as exc:
        raise CliError(str(exc)) from exc


# ------------------------------------------------------------------------------ port ownership


class PortLock:
    """An exclusive lock file per port, held for the server's life: a second datastore-serve
    on the same port (which SO_REUSEPORT would otherwise let in) fails instead."""

    def __init__(self, port: int) -> None:
        self.path = Path(tempfile.gettempdir()) / f"draftstore-serve-{port}.lock"
        while True:
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise CliError(f"cannot create the port lock {self.path}: {exc.strerror}") from exc
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = os.pread(self._fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(self._fd)
                raise CliError(f"port {port} is already served by datastore-serve (pid {owner})")
            try:  # the holder may have unlinked the file between our open and flock: retry
                if os.stat(self.path).st_ino == os.fstat(self._fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(self._fd)
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd >= 0:
            self.path.unlink(missing_ok=True)  # while still locked, so nobody locks a stale inode
            os.close(self._fd)
            self._fd = -1


def probe_port(host: str, port: int) -> socket.socket:
    """Bind (not listen) a SO_REUSEPORT socket: picks the port for port 0, and fails when the
    port is held by a socket that does not share (another program's listener)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return sock


# ------------------------------------------------------------------------------ signals


def _stop_event() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _wait(stop: threading.Event, alive=lambda: True) -> bool:
    """Wait for a signal; -> False if alive() turned False first."""
    while not stop.wait(0.2):
        if not alive():
            return False
    return True


# ------------------------------------------------------------------------------ one process


def run_single(store_dir: str, settings) -> int:
    from datastore.format import DatastoreError
    from datastore.server import serve

    stop = _stop_event()
    try:
        handle = serve(store_dir, settings)
    except (DatastoreError, OSError, ValueError) as exc:
        raise CliError(str(exc)) from exc
    try:
        lock = PortLock(handle.port)
    except CliError:
        handle.stop(0)
        raise
    try:
        _announce(settings.host, handle.port, handle.metrics_port)
        _wait(stop)
        log.info("stopping: draining in-flight calls (grace %.1f s)", settings.grace)
        handle.stop()
    finally:
        lock.release()
    return 0


def _announce(host: str, port: int, metrics_port: int | None) -> None:
    if metrics_port is not None:
        log.info("metrics on http://%s:%d/metrics", host, metrics_port)
    shown = f"[{host}]" if ":" in host else host
    print(f"serving on {shown}:{port}", flush=True)


# ------------------------------------------------------------------------------ workers


def _die_with_parent(parent: int) -> None:
    """SIGTERM this worker when the parent dies, even by SIGKILL (Linux prctl), so no orphan
    keeps serving the port."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not Linux: the parent's SIGTERM forwarding still works
        return
    if os.getppid() != parent:  # died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _worker(store_dir: str, settings, conn, parent: int) -> None:
    """A forked worker: serve, report ready (or the error), drain on SIGTERM/SIGINT."""
    from datastore.format import DatastoreError
    from datastore.server import serve

    stop = _stop_event()
    _die_with_parent(parent)
    try:
        handle = serve(store_dir, settings)
    except (DatastoreError, OSError, ValueError) as exc:
        conn.send(("error", str(exc)))
        sys.exit(EXIT_BAD_INPUT)
    conn.send(("ready", handle.port))
    _wait(stop)
    handle.stop()
    sys.exit(0)


def run_workers(store_dir: str, settings, workers: int) -> int:
    from datastore import metrics

    probe = probe_port(settings.host, settings.port)
    port = probe.getsockname()[1]
    lock = PortLock(port)
    metrics_dir = None
    if settings.metrics_port is not None:
        metrics_dir = tempfile.mkdtemp(prefix="draftstore-metrics-")
        metrics.enable_multiprocess(metrics_dir)
    worker_settings = replace(settings, port=port, reuseport=True, metrics_port=None)
    ctx = multiprocessing.get_context("fork")  # grpc objects are created only after the fork
    stop = _stop_event()
    procs, conns = [], []
    try:
        for i in range(workers):
            parent_end, child_end = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_worker, args=(store_dir, worker_settings, child_end, os.getpid()),
                               name=f"draftstore-worker-{i}", daemon=False)
            proc.start()
            child_end.close()
            procs.append(proc)
            conns.append(parent_end)
        _await_ready(procs, conns)
        probe.close()
        metrics_port = (metrics.serve_http(settings.metrics_port, settings.host,
                                           multiprocess_dir=metrics_dir)
                        if metrics_dir else None)
        _announce(settings.host, port, metrics_port)
        clean = _wait(stop, alive=lambda: all(p.is_alive() for p in procs))
        if not clean:
            log.error("a worker exited unexpectedly; stopping the others")
        _stop_workers(procs, settings.grace)
        return 0 if clean else 1
    finally:
        _stop_workers(procs, 0)
        probe.close()
        lock.release()
        if metrics_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def _await_ready(procs, conns) -> None:
    """Wait for every worker's report; CliError with the first worker's error message."""
    for proc, conn in zip(procs, conns):
        while not conn.poll(0.2):
            if not proc.is_alive():
                raise CliError(f"{proc.name} exited with code {proc.exitcode} before serving")
        try:
            kind, value = conn.recv()
        except EOFError:
            raise CliError(f"{proc.name} exited before serving") from None
        if kind == "error":
            raise CliError(value)


def _stop_workers(procs, grace: float) -> None:
    """SIGTERM every live worker (each drains for `grace`), then SIGKILL stragglers."""
    for proc in procs:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGTERM)
    for proc in procs:
        proc.join(grace + 5)
        if proc.is_alive():
            log.error("%s did not stop within %.1f s; killing it", proc.name, grace + 5)
            proc.kill()
            proc.join()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    try:
        settings = settings_from_args(args)
        if args.host not in ("127.0.0.1", "localhost", "::1") and settings.auth_token is None:
            log.warning("serving on %s without --auth-token-file: anyone who can reach the "
                        "port can draft and insert", args.host)
        if args.workers == 1:
            return run_single(args.dir, settings)
        return run_workers(args.dir, settings, args.workers)
    except CliError as exc:
        print(f"datastore-serve: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
