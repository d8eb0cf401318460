"""The datastore: on-disk format, `Datastore` reader, exact weighted-trie drafting.

Exports are imported lazily so that light users (the verifying child process, `datastore.format`)
do not pay for the rest.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "Datastore": "datastore.store",
    "DatastoreError": "datastore.format",
    "DraftTree": "datastore.tree",
    "SuffixIndex": "datastore.index",
    "count_in": "datastore.index",
    "draft_from": "datastore.index",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'datastore' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
