"""Client settings, channel credentials and the gRPC service config, shared by the sync, asyncio
and sharded clients.

Retries are gRPC's own (the `retryPolicy` of the service config, `grpc.enable_retries`), and only
for UNAVAILABLE: that status means the request never reached a handler (connection refused or
reset, server still opening its store), so a retry cannot run a call twice. Every other status is
a real answer and is not retried. Retries happen inside the call's one deadline.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import grpc

from protos import channel

SERVICE_NAME = "draftstore.v1.DraftService"
LOAD_BALANCING = (None, "pick_first", "round_robin")


@dataclass(frozen=True)
class TlsConfig:
    """PEM files (paths) or PEM bytes. root_cert None = the system roots.

    client_cert/client_key together give mutual TLS. server_name overrides the name checked
    against the server certificate (e.g. when connecting by IP to a cert issued for a DNS name).
    """

    root_cert: str | Path | bytes | None = None
    client_cert: str | Path | bytes | None = None
    client_key: str | Path | bytes | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("TlsConfig: client_cert and client_key go together")

    def credentials(self) -> grpc.ChannelCredentials:
        """Reads the files now; ValueError naming the field for an unreadable one."""
        return grpc.ssl_channel_credentials(
            root_certificates=_pem(self.root_cert, "root_cert"),
            private_key=_pem(self.client_key, "client_key"),
            certificate_chain=_pem(self.client_cert, "client_cert"),
        )


def _pem(value: str | Path | bytes | None, field: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    try:
        data = Path(value).read_bytes()
    except OSError as exc:
        raise ValueError(f"TlsConfig.{field}: cannot read {value}: {exc.strerror or exc}") from exc
    if b"-----BEGIN" not in data:
        raise ValueError(f"TlsConfig.{field}: {value} is not a PEM file")
    return data


@dataclass(frozen=True)
class ClientSettings:
    timeout: float = 0.05  # seconds; deadline of each draft call (a decode step must not wait)
    admin_timeout: float = 5.0  # seconds; deadline of info() and insert() (insert fsyncs)
    auth_token: str | None = None  # sent as `authorization: Bearer <token>`
    tls: TlsConfig | None = None  # None = plaintext (loopback / trusted network only)
    tokenizer_fingerprint: str | None = None  # sent with every request; mismatch = no drafts
    load_balancing: str | None = None  # "round_robin" spreads calls over all resolved addresses
    tier: str | None = None  # "static" | "live" | "both" | None (server default)
    # gRPC transparent retries of UNAVAILABLE, inside the deadline
    retry_attempts: int = 3  # total attempts, first included (gRPC caps this at 5)
    retry_initial_backoff_s: float = 0.005
    retry_max_backoff_s: float = 0.05
    # Reconnection: a server back on the port is found within about max_reconnect_backoff_s.
    min_reconnect_backoff_s: float = 0.1
    max_reconnect_backoff_s: float = 1.0
    # Fast path while the server is down: after `breaker_failures` consecutive UNAVAILABLE or
    # DEADLINE_EXCEEDED answers, calls return an empty tree at once for `breaker_cooldown_s`,
    # then one call probes the server again (a half-open circuit breaker).
    breaker_failures: int = 3
    breaker_cooldown_s: float = 0.25
    max_batch: int = 256  # contexts per DraftBatch call (the server's default limit)

    def __post_init__(self) -> None:
        for name in ("timeout", "admin_timeout", "retry_initial_backoff_s", "retry_max_backoff_s",
                     "min_reconnect_backoff_s", "max_reconnect_backoff_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.retry_max_backoff_s < self.retry_initial_backoff_s:
            raise ValueError("retry_max_backoff_s must be >= retry_initial_backoff_s")
        if self.max_reconnect_backoff_s < self.min_reconnect_backoff_s:
            raise ValueError("max_reconnect_backoff_s must be >= min_reconnect_backoff_s")
        if not 1 <= self.retry_attempts <= 5:
            raise ValueError(f"retry_attempts must be in [1, 5], got {self.retry_attempts}")
        if self.breaker_failures < 1:
            raise ValueError(f"breaker_failures must be >= 1, got {self.breaker_failures}")
        if self.breaker_cooldown_s < 0:
            raise ValueError(f"breaker_cooldown_s must be >= 0, got {self.breaker_cooldown_s}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.load_balancing not in LOAD_BALANCING:
            raise ValueError(f"load_balancing must be one of {LOAD_BALANCING}, "
                             f"got {self.load_balancing!r}")
        if self.tier not in (None, "static", "live", "both"):
            raise ValueError(f"tier must be static, live, both or None, got {self.tier!r}")
        if self.auth_token is not None and (not self.auth_token.strip()
                                            or "\n" in self.auth_token.strip()):
            raise ValueError("auth_token is empty or spans several lines")
        if self.tls is not None and not isinstance(self.tls, TlsConfig):
            raise ValueError(f"tls must be a TlsConfig, got {type(self.tls).__name__}")

    def metadata(self) -> tuple[tuple[str, str], ...]:
        if self.auth_token is None:
            return ()
        return (("authorization", f"Bearer {self.auth_token.strip()}"),)


def service_config(s: ClientSettings) -> dict:
    """The gRPC service config the client sets: retry UNAVAILABLE only; optional LB policy."""
    backoff = lambda x: f"{x:.3f}s"  # noqa: E731 - proto Duration JSON form
    config: dict = {
        "methodConfig": [{
            "name": [{"service": SERVICE_NAME}],
            "waitForReady": False,  # a down server is an instant UNAVAILABLE, not a wait
            "retryPolicy": {
                "maxAttempts": s.retry_attempts,
                "initialBackoff": backoff(s.retry_initial_backoff_s),
                "maxBackoff": backoff(s.retry_max_backoff_s),
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }],
    }
    if s.retry_attempts == 1:
        del config["methodConfig"][0]["retryPolicy"]
    if s.load_balancing is not None:
        config["loadBalancingConfig"] = [{s.load_balancing: {}}]
    return config


def channel_options(s: ClientSettings) -> list[tuple[str, int | str]]:
    """Keepalive (agreeing with the server's, see protos.channel), retries, reconnect backoff."""
    opts: list[tuple[str, int | str]] = list(channel.client_options())
    opts += [
        ("grpc.enable_retries", 1),
        ("grpc.service_config", json.dumps(service_config(s))),
        ("grpc.initial_reconnect_backoff_ms", int(s.min_reconnect_backoff_s * 1000)),
        ("grpc.min_reconnect_backoff_ms", int(s.min_reconnect_backoff_s * 1000)),
        ("grpc.max_reconnect_backoff_ms", int(s.max_reconnect_backoff_s * 1000)),
    ]
    if s.tls is not None and s.tls.server_name:
        opts.append(("grpc.ssl_target_name_override", s.tls.server_name))
    return opts
