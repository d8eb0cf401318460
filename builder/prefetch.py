"""Run an iterator in a background thread, a bounded number of items ahead of its consumer.

The build's stages mostly run outside the GIL (file reads, the Rust tokenizer, libdivsufsort through
ctypes), so reading, tokenizing and sorting overlap when each stage runs in its own thread.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator

_DONE = object()


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


def prefetch(items: Iterable, ahead: int, name: str = "prefetch") -> Iterator:
    """Yield items in order while a daemon thread produces up to `ahead` of them in advance.

    An exception in the producer is re-raised in the consumer; a consumer that stops early (or
    fails) stops the producer at its next item.
    """
    if ahead < 1:
        raise ValueError(f"ahead must be >= 1, got {ahead}")
    q: queue.Queue = queue.Queue(maxsize=ahead)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
        except BaseException as exc:  # handed to the consumer, which decides
            put(_Failure(exc))
            return
        put(_DONE)

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)
