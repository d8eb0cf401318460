"""Per-source, per-depth acceptance calibration of the drafters' probability estimates.

A node is *tested* when its parent is a node the model actually went through this step (the
root or an accepted node): the model's next token there (argmax or sample) is known, so the node
was right iff its token equals it, whether or not the node was kept in the forward. For every
source s, depth d and evidence bin e (log2 of the count the estimate rests on, see
decoder.tree.evidence_bins) we keep decayed sums of the raw estimate and of the outcome; the factor
is (hits + prior * pooled) / (estimate + prior), where pooled is the same ratio over all evidence
bins of (s, d) with 1 in place of pooled: it starts at 1 and moves toward observed / predicted.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from decoder import _step
from decoder.tree import EVIDENCE_BINS, MergedTree, as_i64


@dataclass(frozen=True)
class CalibrationSettings:
    enabled: bool = True
    prior: float = 4.0  # pseudo-observations pulling the factor toward 1
    decay: float = 0.995  # per update; ~200 steps of memory
    depths: int = 32  # depth bins; deeper nodes share the last bin
    max_factor: float = 4.0

    def __post_init__(self) -> None:
        if self.prior <= 0:
            raise ValueError(f"calibration prior must be > 0, got {self.prior}")
        if not 0 < self.decay <= 1:
            raise ValueError(f"calibration decay must be in (0, 1], got {self.decay}")
        if self.depths < 1:
            raise ValueError(f"calibration depths must be >= 1, got {self.depths}")
        if self.max_factor < 1:
            raise ValueError(f"calibration max_factor must be >= 1, got {self.max_factor}")


class Calibration:
    def __init__(self, n_sources: int, settings: CalibrationSettings | None = None):
        self.settings = settings or CalibrationSettings()
        shape = (max(n_sources, 1), self.settings.depths, EVIDENCE_BINS)
        self.predicted = np.zeros(shape, dtype=np.float64)  # [S, D, E] decayed sum of raw p
        self.hits = np.zeros(shape, dtype=np.float64)  # [S, D, E] decayed sum of outcomes
        self._factors: np.ndarray | None = None  # factors() until the next update

    def factors(self) -> np.ndarray | None:
        """[S, D, E] multipliers for decoder.tree.merge_trees (None when disabled), read-only: the
        same array until the next update (~40 us of numpy a step before; one C pass now).

        Shrunk hierarchically: a (source, depth) factor pooled over evidence bins starts at 1, and
        each bin starts at its pooled factor, so a bin seen rarely borrows from its neighbours.
        """
        if not self.settings.enabled:
            return None
        if self._factors is None:
            out = np.empty_like(self.predicted)
            _step.factors(self.hits, self.predicted, float(self.settings.prior), float(self.settings.max_factor), out)
            out.flags.writeable = False
            self._factors = out
        return self._factors

    def update(self, tree: MergedTree, visited: np.ndarray, next_tokens: np.ndarray) -> None:
        """One row: visited: [v] merged node indices the model went through, -1 = root, in path
        order; next_tokens: [v] the token the model chose after each (the accepted tokens + bonus)."""
        assert visited.shape == next_tokens.shape, "visited/next_tokens shapes"
        chosen = np.full(len(tree) + 1, -1, dtype=np.int64)  # [n+1] slot 0 = root
        chosen[visited + 1] = next_tokens
        self.update_rows(tree, chosen[tree.parents + 1])

    def update_rows(self, tree: MergedTree, after: np.ndarray) -> None:
        """Every row of a step at once. after: [n] int64 the model's token after each node's
        parent, -1 where the model did not go through the parent (the node is untested).

        Each row with a tested node decays the sums once, in row order, as separate updates would:
        row r's outcomes are weighted by decay ** (rows updating after r). One C call
        (decoder/_step.c `calibrate`), bit-identical to the numpy version in
        tests/decoder_step_reference.py."""
        if not self.settings.enabled or not len(tree):
            return
        assert after.shape == (len(tree),), "after must be [n]"
        assert tree.raw_p.shape[1] <= self.predicted.shape[0], "more sources than the calibration has"
        raw_p, bins = tree.raw_p, tree.bins
        if raw_p.shape[1] < self.predicted.shape[0]:  # trees of fewer sources: absent ones are 0
            pad = self.predicted.shape[0] - raw_p.shape[1]
            raw_p = np.pad(raw_p, ((0, 0), (0, pad)))
            bins = np.pad(bins, ((0, 0), (0, pad)))
        if _step.calibrate(as_i64(tree.tokens), as_i64(tree.depths), as_i64(tree.starts), np.ascontiguousarray(raw_p),
                           as_i64(bins), as_i64(after), float(self.settings.decay), self.predicted, self.hits):
            self.changed()

    def changed(self) -> None:
        """predicted/hits were updated in place (here or by the decoder's `_step.settle`)."""
        self._factors = None
