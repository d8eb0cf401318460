"""Clients of the draft service: `DraftClient` (sync), `AsyncDraftClient` (asyncio),
`ShardedClient` (one datastore over several servers), and the `datastore-query` CLI.

Exports are imported lazily so that `import client` stays cheap for the decoder.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "DraftClient": "client.draft_client",
    "AsyncDraftClient": "client.aio",
    "ShardedClient": "client.sharded",
    "ShardedSettings": "client.sharded",
    "merge_shards": "client.sharded",
    "ClientSettings": "client.settings",
    "TlsConfig": "client.settings",
    "DraftServiceError": "client.failures",
    "DatastoreInfo": "client.messages",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'client' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
