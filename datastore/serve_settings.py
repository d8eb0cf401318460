"""`ServeSettings`: everything a draft server is configured with, validated once."""
from __future__ import annotations

from dataclasses import dataclass

# min_count has no limit below the wire's uint32: a threshold above every count just keeps the
# longest match, and backing off costs the same ~log2(max_suffix) searches whatever it is.
MAX_MIN_COUNT = 2**32 - 1


@dataclass(frozen=True)
class ServeSettings:
    host: str = "127.0.0.1"
    port: int = 0  # 0 = a free port (see RunningServer.port)
    threads: int = 8  # handler threads (raised to max_concurrent + 4 when that is set)
    max_concurrent: int | None = None  # calls in flight beyond this get RESOURCE_EXHAUSTED
    auth_token: str | None = None  # clients must send `authorization: Bearer <token>`
    tls_cert: str | None = None  # PEM files; cert and key together
    tls_key: str | None = None
    tls_client_ca: str | None = None  # when set, client certificates signed by it are required
    reflection: bool = False
    metrics_port: int | None = None  # Prometheus on host:metrics_port (0 = free port)
    live: bool = True
    live_dir: str | None = None  # default <DIR>.live beside the store
    live_max_tokens: int = 10_000_000
    live_refresh_s: float = 0.05
    grace: float = 5.0  # seconds in-flight calls get on stop
    reuseport: bool = False  # forked workers share the port (set by datastore-serve --workers)
    # request defaults (the proto's "unset" means these)
    budget: int = 64
    max_depth: int = 16
    max_suffix: int = 16
    min_suffix: int = 1
    min_count: int = 1  # back off to the longest suffix seen >= this often (1 = longest match)
    # limits; also reported by Info so clients can respect them
    limit_budget: int = 1024
    limit_depth: int = 64
    limit_context: int = 4096
    limit_batch: int = 256
    limit_insert_tokens: int = 1_000_000
    limit_insert_sequences: int = 4096

    def __post_init__(self) -> None:
        _positive(self, "threads", "limit_budget", "limit_depth", "limit_context", "limit_batch",
                  "limit_insert_tokens", "limit_insert_sequences", "live_max_tokens")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {self.max_concurrent}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port must be in [0, 65535], got {self.metrics_port}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca needs tls_cert and tls_key")
        if self.auth_token is not None and not self.auth_token.strip():
            raise ValueError("auth_token is empty")
        if self.grace < 0:
            raise ValueError(f"grace must be >= 0, got {self.grace}")
        if not 1 <= self.budget <= self.limit_budget:
            raise ValueError(f"default budget must be in [1, {self.limit_budget}]")
        if not 1 <= self.max_depth <= self.limit_depth:
            raise ValueError(f"default max_depth must be in [1, {self.limit_depth}]")
        if not 1 <= self.min_suffix <= self.max_suffix <= self.limit_context:
            raise ValueError("need 1 <= min_suffix <= max_suffix <= limit_context")
        if not 1 <= self.min_count <= MAX_MIN_COUNT:
            raise ValueError(f"default min_count must be in [1, {MAX_MIN_COUNT}], "
                             f"got {self.min_count}")

    @property
    def handler_threads(self) -> int:
        # more threads than admitted calls, so the call over the limit is rejected, not queued
        return max(self.threads, (self.max_concurrent or 0) + 4)


def _positive(settings, *names: str) -> None:
    for name in names:
        if getattr(settings, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(settings, name)}")
