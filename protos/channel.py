"""Channel settings shared by the server and the client, in one place so they agree.

The client pings every KEEPALIVE_TIME_MS (also when idle) so a dead server or a dropped NAT entry
is noticed before a call waits on it; the server must *permit* pings that often, or it answers
with GOAWAY ("too_many_pings") after `max_ping_strikes` pings and the client sees UNAVAILABLE.
"""
from __future__ import annotations

KEEPALIVE_TIME_MS = 30_000  # client: ping an idle connection every 30 s
KEEPALIVE_TIMEOUT_MS = 10_000  # both: a ping unanswered for 10 s closes the connection
PERMIT_WITHOUT_CALLS = 1  # client may ping with no call in flight; server allows it
# Server: accept pings as often as every 10 s (< KEEPALIVE_TIME_MS, with margin for jitter).
MIN_RECV_PING_INTERVAL_MS = 10_000
SERVER_KEEPALIVE_TIME_MS = 60_000  # server pings idle clients too, to drop dead connections
MAX_PING_STRIKES = 2  # gRPC default; stated so the two sides' arithmetic is visible here
# DraftBatch of 256 contexts x 4096 ids x <= 5 bytes is ~5 MiB, over gRPC's 4 MiB default.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def client_options() -> list[tuple[str, int]]:
    """grpc channel options for a DraftClient (pair with `server_options`)."""
    return [
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", PERMIT_WITHOUT_CALLS),
        ("grpc.http2.max_pings_without_data", 0),  # keep pinging an idle connection
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]


def server_options(reuseport: bool = False) -> list[tuple[str, int]]:
    """grpc server options; `reuseport` lets forked workers share one port (SO_REUSEPORT)."""
    return [
        ("grpc.keepalive_time_ms", SERVER_KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", PERMIT_WITHOUT_CALLS),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", MIN_RECV_PING_INTERVAL_MS),
        ("grpc.http2.min_ping_interval_without_data_ms", MIN_RECV_PING_INTERVAL_MS),
        ("grpc.http2.max_ping_strikes", MAX_PING_STRIKES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 1 if reuseport else 0),
    ]


def read_token_file(path: str) -> str:
    """The bearer token in `path` (surrounding whitespace dropped), for server and clients alike.
    Raises ValueError naming the flag and the file when it cannot be read or is empty."""
    from pathlib import Path

    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise ValueError(f"--auth-token-file {path}: {exc.strerror or exc}") from exc
    if not token:
        raise ValueError(f"--auth-token-file {path}: the file is empty")
    return token
