"""Corpus readers, tokenization and the shard writer behind `datastore-build`.

`builder.build(BuildSettings(...)) -> meta` is the Python API; `builder.writer.write_datastore`
writes token-id documents directly. Imported lazily so `builder.tokenizer` stays light.
"""
from __future__ import annotations

__all__ = ["BuildSettings", "build", "write_datastore"]


def __getattr__(name: str):
    if name in ("BuildSettings", "build"):
        from builder import pipeline

        return getattr(pipeline, name)
    if name == "write_datastore":
        from builder.writer import write_datastore

        return write_datastore
    raise AttributeError(f"module 'builder' has no attribute {name!r}")
