"""Tokenization stage: same ids as the tokenizer itself, in order, in-process and in worker processes."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from builder.prefetch import prefetch
from builder.tokenize import batches, tokenize_batches, tokenize_stream

TEXTS = ["def add(a, b):\n    return a + b\n", "Hello, world!", "x" * 3000, "ünïcödé ✓ 中文",
         "<|im_start|>user\nhi<|im_end|>", "    indented\n\tand tabs\n"]


def reference(tok, texts):
    return [tok.encode(t, add_special_tokens=False) for t in texts]


def test_batches_keep_order_and_bounds():
    items = [(i, "x" * (i % 5 + 1)) for i in range(23)]
    got = list(batches(items, max_chars=7, max_docs=3))
    assert [t for tags, _ in got for t in tags] == list(range(23))
    assert all(len(tags) <= 3 for tags, _ in got)
    assert all(sum(map(len, texts)) - len(texts[-1]) < 7 for _, texts in got)


def test_stream_matches_the_tokenizer(smollm2_tokenizer):
    items = list(enumerate(TEXTS * 3))
    out = list(tokenize_stream(items, "smollm2", workers=1))
    assert [tag for tag, _ in out] == list(range(len(items)))
    assert all(ids.dtype == np.int32 for _, ids in out)
    assert [ids.tolist() for _, ids in out] == reference(smollm2_tokenizer, TEXTS * 3)


def test_worker_processes_give_the_same_ids_in_order(smollm2_tokenizer):
    texts = [f"{i}: {TEXTS[i % len(TEXTS)]}" for i in range(40)]
    small = [(tags, txts) for tags, txts in batches(enumerate(texts), max_chars=50)]
    assert len(small) > 4  # several batches in flight across the two workers
    got = [ids.tolist() for _, chunk in tokenize_batches(iter(small), "smollm2", workers=2)
           for ids in chunk]
    assert got == reference(smollm2_tokenizer, texts)


def test_workers_must_be_positive():
    with pytest.raises(ValueError):
        list(tokenize_batches(iter([]), "smollm2", workers=0))


def test_prefetch_order_and_errors():
    assert list(prefetch(iter(range(100)), 3)) == list(range(100))

    def failing():
        yield 1
        raise KeyError("from the producer")

    got = []
    with pytest.raises(KeyError, match="from the producer"):
        for x in prefetch(failing(), 2):
            got.append(x)
    assert got == [1]


def test_prefetch_stops_its_producer_when_the_consumer_stops():
    produced = []

    def endless():
        i = 0
        while True:
            produced.append(i)
            yield i
            i += 1

    gen = prefetch(endless(), 2, name="test-prefetch")
    assert next(gen) == 0
    gen.close()
    time.sleep(0.3)
    count = len(produced)
    time.sleep(0.3)
    assert len(produced) == count <= 5
    assert not any(t.name == "test-prefetch" for t in threading.enumerate())
