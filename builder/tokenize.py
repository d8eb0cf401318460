"""Batch tokenization with the fast (Rust) tokenizer, in order, optionally in worker processes.

workers == 1 encodes in this process (the Rust tokenizer already spreads a batch over all cores);
workers > 1 starts that many processes, each building the Rust tokenizer once from its JSON and
using one thread, with a bounded window of batches in flight so
memory stays flat however large the corpus. No special tokens are added.
"""
from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Iterable, Iterator

import numpy as np

from builder.prefetch import prefetch
from builder.tokenizer import load_tokenizer

BATCH_CHARS = 1 << 20  # ~250k tokens of code per batch: large enough to amortise the call overhead
BATCH_DOCS = 2048
AHEAD_BATCHES = 64  # tokenized batches buffered ahead of the writer (~80 MB): tokenizing goes on while a shard sorts
_worker_backend = None


def batches(items: Iterable[tuple[int, str]], max_chars: int = BATCH_CHARS,
            max_docs: int = BATCH_DOCS) -> Iterator[tuple[list[int], list[str]]]:
    """Group (tag, text) pairs into (tags, texts) batches of bounded size, keeping the order."""
    tags, texts, chars = [], [], 0
    for tag, text in items:
        tags.append(tag)
        texts.append(text)
        chars += len(text)
        if chars >= max_chars or len(texts) >= max_docs:
            yield tags, texts
            tags, texts, chars = [], [], 0
    if texts:
        yield tags, texts


def encode_texts(backend, texts: list[str]) -> list[np.ndarray]:
    """-> one [n_i] int32 array of token ids per text (no special tokens)."""
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    return [np.array(e.ids, dtype=np.int32) for e in encode(texts, add_special_tokens=False)]


def tokenize_stream(items: Iterable[tuple[int, str]], spec: str, workers: int = 1,
                    ahead: int = AHEAD_BATCHES) -> Iterator[tuple[int, np.ndarray]]:
    """(tag, text) pairs -> (tag, [n] int32 token ids), in the input order.

    Reading runs in one thread and tokenizing in another, each a bounded number of batches ahead of
    its consumer, so file reads, tokenization and the writer's sorting overlap.
    """
    read = prefetch(batches(items), 8, "reader")
    for tags, ids in prefetch(tokenize_batches(read, spec, workers), ahead, "tokenizer"):
        yield from zip(tags, ids)


def tokenize_batches(batched: Iterable[tuple[list[int], list[str]]], spec: str, workers: int = 1
                     ) -> Iterator[tuple[list[int], list[np.ndarray]]]:
    """(tags, texts) batches -> (tags, [n_i] int32 ids per text), in order."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if workers == 1:
        backend = load_tokenizer(spec).backend_tokenizer
        for tags, texts in batched:
            yield tags, encode_texts(backend, texts)
        return
    yield from _tokenize_in_pool(batched, spec, workers)


def _tokenize_in_pool(batched, spec: str, workers: int) -> Iterator[tuple[list[int], list[np.ndarray]]]:
    ctx = multiprocessing.get_context("spawn")  # no fork of a process holding Rust thread pools
    # workers rebuild the Rust tokenizer from its JSON: no transformers import (~5 s) per worker
    serialized = load_tokenizer(spec).backend_tokenizer.to_str()
    window = deque()
    with ctx.Pool(workers, initializer=_init_worker, initargs=(serialized,)) as pool:
        for tags, texts in batched:
            window.append((tags, pool.apply_async(_encode_in_worker, (texts,))))
            if len(window) >= 2 * workers:
                tags, pending = window.popleft()
                yield tags, pending.get()
        while window:
            tags, pending = window.popleft()
            yield tags, pending.get()


def _init_worker(serialized: str) -> None:
    global _worker_backend
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker: the workers are the parallelism
    from tokenizers import Tokenizer

    _worker_backend = Tokenizer.from_str(serialized)


def _encode_in_worker(texts: list[str]) -> list[np.ndarray]:
    return encode_texts(_worker_backend, texts)
