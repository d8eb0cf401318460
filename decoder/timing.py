"""Per-phase wall-clock time of the decode loop (host work vs device work).

The step's phases, in order: propose (drafters), merge (tries + calibrated probabilities),
budget (cost model + top-T selection), inputs (ids, positions, the 4D mask), forward
(model.forward), reduce (top-k over the logits and the one device->host copy), accept (greedy or
sampled acceptance, commit, calibration, credit), compact (KV gather, finished rows dropped),
observe (drafter updates). On a GPU `forward` and `reduce` are device work; everything else is
the decoder's host time, which must not grow with a Python loop per row.
"""
from __future__ import annotations

import time

PHASES = ("propose", "merge", "budget", "inputs", "forward", "reduce", "accept", "compact", "observe")
DEVICE_PHASES = ("forward", "reduce")


class PhaseTimer:
    """Accumulates seconds per phase: `lap(name)` charges the time since the previous lap."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {p: 0.0 for p in PHASES}
        self.steps = 0
        self._t = time.perf_counter()

    def start(self) -> None:
        self._t = time.perf_counter()

    def lap(self, phase: str) -> float:
        now = time.perf_counter()
        dt = now - self._t
        self.totals[phase] += dt
        self._t = now
        return dt

    def reset(self) -> None:
        self.totals = {p: 0.0 for p in PHASES}
        self.steps = 0
        self._t = time.perf_counter()

    def host_seconds(self) -> float:
        return sum(v for k, v in self.totals.items() if k not in DEVICE_PHASES)

    def per_step(self) -> dict[str, float]:
        """{phase: mean seconds per step}."""
        n = max(self.steps, 1)
        return {k: v / n for k, v in self.totals.items()}
