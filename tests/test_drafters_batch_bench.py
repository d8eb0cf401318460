"""benchmarks/bench_local_drafters.py runs every drafter, old and new, on a tiny corpus."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks import bench_local_drafters as bench


@pytest.mark.parametrize("name", bench.DRAFTERS)
def test_harness_runs_old_and_new(name):
    rng = np.random.default_rng(0)
    data = [(rng.integers(0, 50, 30), rng.integers(0, 50, 40)) for _ in range(3)]
    for impl in ("old", "new"):
        propose_us, observe_us, nodes = bench.run(impl, name, data, batch=3, budget=8, steps=5)
        assert propose_us > 0 and observe_us >= 0 and nodes >= 0
