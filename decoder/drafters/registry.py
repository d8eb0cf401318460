"""`make_drafters(names, ...)`: drafter names (CLI, from_pretrained) -> Drafter objects.

The local drafters' modules are imported only when asked for, so a missing one fails only the
decode that wants it, with its name in the message.
"""
from __future__ import annotations

import importlib
from pathlib import Path

from decoder.drafters.base import Drafter

LOCAL = {
    "reference": ("decoder.drafters.reference", "ReferenceDrafter"),
    "ngram": ("decoder.drafters.ngram", "NGramDrafter"),
    "lookahead": ("decoder.drafters.lookahead", "LookaheadDrafter"),
    "recycle": ("decoder.drafters.recycle", "RecycleDrafter"),
}
NAMES = ("retrieval", "longest", *LOCAL)
STORE = ("retrieval", "longest")  # the drafters that read the datastore
# The recommended sources (demo, specdec, from_pretrained, the benchmarks' "default"): lookahead is
# left out, its window rarely pays on a CPU (alone 0.94x on code).
DEFAULT = ("retrieval", "longest", "reference", "ngram", "recycle")


def open_source(datastore=None, address: str | None = None, timeout: float | None = None):
    """A Datastore (path or object) or a DraftClient for `address`."""
    if datastore is not None and address is not None:
        raise ValueError("give either datastore= or address=, not both")
    if address is not None:
        from client import DraftClient  # noqa: PLC0415 - lands with the service issue

        return DraftClient(address) if timeout is None else DraftClient(address, timeout=timeout)
    if isinstance(datastore, (str, Path)):
        from datastore.store import Datastore  # noqa: PLC0415

        return Datastore.open(datastore)
    return datastore


def make_drafters(names, datastore=None, address: str | None = None, tokenizer=None, **opts) -> list[Drafter]:
    """names: e.g. ("retrieval", "ngram"). opts[name] (a dict) goes to that drafter's constructor;
    `timeout` is the client's for an address. The tokenizer, when given, is checked against the datastore's."""
    if isinstance(names, str):
        names = [n for n in names.split(",") if n]
    out: list[Drafter] = []
    source = None  # one opened store or client, shared by the drafters that read it
    for name in names:
        kwargs = dict(opts.get(name, {}) or {})
        if name in STORE:
            if datastore is None and address is None:
                raise ValueError(f"drafter {name!r} needs a datastore (datastore=PATH) or a server (address=HOST:PORT)")
            source = source or open_source(datastore, address, opts.get("timeout"))
            out.append(_retrieval(name, source, tokenizer, kwargs))
        elif name in LOCAL:
            module, cls = LOCAL[name]
            try:
                factory = getattr(importlib.import_module(module), cls)
            except (ImportError, AttributeError) as exc:
                raise ValueError(f"drafter {name!r} is not available ({module}.{cls}): {exc}") from exc
            out.append(factory(**kwargs))
        else:
            raise ValueError(f"unknown drafter {name!r}; choose from {', '.join(NAMES)}")
    return out


def _retrieval(name, source, tokenizer, kwargs) -> Drafter:
    from builder.tokenizer import tokenizer_info
    from decoder.drafters.retrieval import LongestMatchDrafter, RetrievalDrafter

    fingerprint = tokenizer_info(tokenizer, "model")["fingerprint"] if tokenizer is not None else None
    cls = RetrievalDrafter if name == "retrieval" else LongestMatchDrafter
    return cls(source, tokenizer_fingerprint=fingerprint, **kwargs)
