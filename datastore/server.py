"""The gRPC draft service: thin handlers over `Datastore.draft` and the live tier.

    handle = serve("store/", ServeSettings(port=0))   # listening; store opened and verified
    print(handle.address)                             # "127.0.0.1:PORT"
    handle.stop()

Each handler: proto -> validated `DraftQuery` (datastore.validate) -> `Datastore.draft` -> proto.
Every exception becomes a status code in `datastore.errors` (the one mapping point), called from
the interceptor (datastore.guard) that also checks the bearer token, enforces `max_concurrent`
(reject, never queue) and records metrics. Health (`grpc.health.v1`) is NOT_SERVING until the
store is opened and verified.
"""
from __future__ import annotations

import logging
import threading
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from datastore.errors import FailedPrecondition, InvalidArgument, NotReady, check_deadline
from datastore.format import DatastoreError
from datastore.guard import SERVICE_NAME, Guard
from datastore.index import draft_from
from datastore.live import LiveSettings, LiveTier, default_live_dir
from datastore.metrics import Metrics, serve_http
from datastore.serve_settings import ServeSettings
from datastore.tree import DraftTree
from datastore.validate import DraftQuery, check_fingerprint, parse_draft, parse_insert
from protos import channel, convert
from protos.draftstore.v1 import draftstore_pb2 as pb
from protos.draftstore.v1 import draftstore_pb2_grpc as pb_grpc

__all__ = ["RunningServer", "SERVICE_NAME", "ServeSettings", "serve"]
log = logging.getLogger("draftstore.server")


# ------------------------------------------------------------------------------- the service


class _State:
    """What the handlers read: None until the store is open (then NotReady), or the open error."""

    def __init__(self) -> None:
        self.store = None
        self.owns_store = True
        self.live: LiveTier | None = None
        self.failure: DatastoreError | None = None

    def ready(self):
        if self.failure is not None:
            raise self.failure
        if self.store is None:
            raise NotReady("the datastore is still being opened and verified; retry shortly")
        return self.store


def run_query(store, live: LiveTier | None, q: DraftQuery) -> DraftTree:
    args = (q.budget, q.max_depth, q.max_suffix, q.min_suffix)
    if q.tier == "static" or live is None:
        return store.draft(q.context, *args, min_count=q.min_count)
    if q.tier == "both":
        return store.draft(q.context, *args, extra_indexes=live.indexes, min_count=q.min_count)
    return draft_from(live.indexes, q.context, *args, separator=store.separator,
                      min_count=q.min_count)


class DraftServicer(pb_grpc.DraftServiceServicer):
    """Thin handlers: validate (datastore.validate), draft, convert. Errors are raised, not
    aborted: the interceptor maps them (datastore.errors)."""

    def __init__(self, settings: ServeSettings, state: _State) -> None:
        self.s = settings
        self.state = state

    def Info(self, request, context):
        store = self.state.ready()
        live = self.state.live
        tok = store.tokenizer
        s = self.s
        return pb.InfoResponse(
            format_version=int(store.meta["format_version"]),
            tokenizer=pb.Tokenizer(name=tok["name"], fingerprint=tok["fingerprint"],
                                   vocab_size=int(tok["vocab_size"])),
            tokens=store.tokens, documents=store.documents, shards=len(store.shards),
            token_dtype=str(store.meta["token_dtype"]),
            live_tokens=live.tokens if live else 0, live_sequences=live.sequences if live else 0,
            max_budget=s.limit_budget, max_depth=s.limit_depth, max_context=s.limit_context,
            max_batch=s.limit_batch,
        )

    def Draft(self, request, context):
        store = self.state.ready()
        check_fingerprint(request, store.tokenizer["fingerprint"])
        q = parse_draft(request, self.s, store.vocab_size, self.state.live is not None)
        check_deadline(context, "before drafting")
        tree = run_query(store, self.state.live, q)
        return pb.DraftResponse(tree=convert.tree_to_proto(tree))

    def DraftBatch(self, request, context):
        store = self.state.ready()
        if len(request.requests) > self.s.limit_batch:
            raise InvalidArgument(f"DraftBatch of {len(request.requests)} requests; the limit "
                                  f"is {self.s.limit_batch}")
        fingerprint = store.tokenizer["fingerprint"]
        check_fingerprint(request, fingerprint)
        queries = []
        for i, item in enumerate(request.requests):  # validate all before any work
            check_fingerprint(item, fingerprint, f"requests[{i}].")
            queries.append(parse_draft(item, self.s, store.vocab_size,
                                       self.state.live is not None, f"requests[{i}]."))
        trees = []
        for i, q in enumerate(queries):
            check_deadline(context, f"after {i} of {len(queries)} drafts")
            trees.append(convert.tree_to_proto(run_query(store, self.state.live, q)))
        return pb.DraftBatchResponse(trees=trees)

    def Insert(self, request, context):
        store = self.state.ready()
        live = self.state.live
        if live is None:
            raise FailedPrecondition("the live tier is disabled on this server (--no-live)")
        check_fingerprint(request, store.tokenizer["fingerprint"])
        seqs = parse_insert(request, self.s, store.vocab_size)
        check_deadline(context, "before storing")
        stored, tokens = live.append(seqs)  # durable (fsync'd commit) from here on
        try:  # read-your-writes on this worker; others follow within refresh_s
            live.refresh()
        except Exception:  # noqa: BLE001 - stored already: an error now would invite a retry
            log.exception("live refresh after Insert failed; the refresher thread will retry")
        return pb.InsertResponse(sequences=stored, tokens=tokens)


# ------------------------------------------------------------------------------- serving


class RunningServer:
    """A started server. `port` is the bound port; `stop()` drains in-flight calls."""

    def __init__(self, server: grpc.Server, port: int, settings: ServeSettings, state: _State,
                 health_servicer: health.HealthServicer, metrics: Metrics) -> None:
        self.server, self.port, self.settings = server, port, settings
        self.state, self.health, self.metrics = state, health_servicer, metrics
        self.metrics_port: int | None = None
        self.opened = threading.Event()  # set when the store is open (or failed to open)
        self._stopped = False

    @property
    def address(self) -> str:
        host = self.settings.host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def set_serving(self, serving: bool) -> None:
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in ("", SERVICE_NAME):
            self.health.set(name, status)

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until the store is open; raise its DatastoreError if it could not be."""
        if not self.opened.wait(timeout):
            raise TimeoutError(f"the datastore was not open after {timeout} s")
        if self.state.failure is not None:
            raise self.state.failure

    def stop(self, grace: float | None = None) -> None:
        """NOT_SERVING, refuse new calls, let in-flight ones finish within `grace`, close."""
        if self._stopped:
            return
        self._stopped = True
        self.set_serving(False)
        self.server.stop(self.settings.grace if grace is None else grace).wait()
        live, store = self.state.live, self.state.store
        self.state.live = None
        if live is not None:
            live.close()
        if store is not None and self.state.owns_store:
            store.close()

    def wait(self, timeout: float | None = None) -> bool:
        return self.server.wait_for_termination(timeout)

    def __enter__(self) -> "RunningServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop(0)


def _credentials(s: ServeSettings) -> grpc.ServerCredentials | None:
    if s.tls_cert is None:
        return None
    cert, key = _read(s.tls_cert, "--tls-cert"), _read(s.tls_key, "--tls-key")
    ca = _read(s.tls_client_ca, "--tls-client-ca") if s.tls_client_ca else None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                       require_client_auth=ca is not None)


def _read(path: str, flag: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{flag} {path}: {exc.strerror or exc}") from exc


def open_state(store, s: ServeSettings, state: _State) -> None:
    """Open and verify the store (unless given an open `Datastore`), then the live tier."""
    from datastore.store import Datastore

    owned = not isinstance(store, Datastore)
    ds = Datastore.open(store) if owned else store
    try:
        if s.live:
            live_dir = s.live_dir or str(default_live_dir(ds.path))
            state.live = LiveTier(LiveSettings(
                path=live_dir, fingerprint=ds.tokenizer["fingerprint"],
                separator=ds.separator, token_dtype=str(ds.meta["token_dtype"]),
                max_tokens=s.live_max_tokens, refresh_s=s.live_refresh_s))
    except BaseException:
        if owned:
            ds.close()
        raise
    state.store, state.owns_store = ds, owned


def serve(store_dir, settings: ServeSettings = ServeSettings(),
          wait_ready: bool = True) -> RunningServer:
    """Start a server on settings.host:port (NOT_SERVING), open the store, go SERVING.

    store_dir: a datastore directory, or an already open `Datastore` (py-lmdb opens an
    environment once per process, so a test that also drafts in process passes its own; the
    server then leaves it open on stop).

    wait_ready=False returns as soon as the port is bound and opens the store in a thread
    (`RunningServer.wait_ready()` waits for it; calls meanwhile get UNAVAILABLE, a store that
    fails verification gives DATA_LOSS). With wait_ready=True a bad store raises DatastoreError.
    Raises OSError when the port cannot be bound, ValueError for unreadable TLS files.
    """
    s = settings
    creds = _credentials(s)
    metrics = Metrics()
    state = _State()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=s.handler_threads, thread_name_prefix="draft"),
        interceptors=[Guard(s, metrics)], options=channel.server_options(s.reuseport))
    pb_grpc.add_DraftServiceServicer_to_server(DraftServicer(s, state), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if s.reflection:
        from grpc_reflection.v1alpha import reflection

        names = (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, server)
    port = _bind(server, s, creds)
    handle = RunningServer(server, port, s, state, health_servicer, metrics)
    handle.set_serving(False)
    server.start()
    if s.metrics_port is not None:
        handle.metrics_port = serve_http(s.metrics_port, s.host, metrics.registry)

    def open_now() -> None:
        try:
            open_state(store_dir, s, state)
            handle.set_serving(True)
        except DatastoreError as exc:
            state.failure = exc
            if not wait_ready:  # nobody else will see it; callers get DATA_LOSS
                log.error("%s", exc)
        finally:
            handle.opened.set()

    if not wait_ready:
        threading.Thread(target=open_now, name="open-store", daemon=True).start()
        return handle
    open_now()
    if state.failure is not None:
        handle.stop(0)
        raise state.failure
    return handle


def _bind(server: grpc.Server, s: ServeSettings, creds) -> int:
    address = f"[{s.host}]:{s.port}" if ":" in s.host else f"{s.host}:{s.port}"
    try:
        port = (server.add_secure_port(address, creds) if creds is not None
                else server.add_insecure_port(address))
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {address}: {exc} (port in use?)") from exc
    if port == 0:
        raise OSError(f"cannot listen on {address} (port in use?)")
    return port
