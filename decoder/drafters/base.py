"""The contract between the decoder and every draft source.

Lifecycle for one decode (rows are sequences of a batch, 0..batch-1; a single decode is row 0):
  begin(row, prompt, references)           once per row before the first step
  propose(row, context, budget, max_depth) every step -> DraftTree (may be empty); the decoder
                                           calls propose_batch(rows, contexts, budget, depths)
                                           once a step for all rows (default: a loop of propose)
  side_branch(row)                         every step, optional extra tokens decoded in the same
                                           forward (Jacobi lookahead); None for most drafters
  side_result(row, argmax)                 after the forward, the model's argmax at those tokens
  observe(row, accepted)                   after verification: tokens appended to the output this
                                           step (the accepted draft path plus the bonus token);
                                           called as observe_batch(rows, accepted) for all rows
  observe_topk(tokens, topk)               after the forward, only when `topk > 0`: for every
                                           verified position, its input token and the model's
                                           top-k next tokens (Token Recycling)
  end(row)                                 the row finished; drop per-row state (not tables meant
                                           to persist across requests)

Drafters never raise into the decode loop for a datastore that is slow or down: a remote source
returns an empty tree and counts the failure in `failures`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from datastore.tree import DraftTree


@dataclass(frozen=True)
class SideBranch:
    """Extra tokens that ride in the verification forward but are never accepted directly.

    They attend to the whole committed prefix and to each other as `mask` says, never to the
    draft tree; tree tokens never attend to them. Their KV entries are discarded after the step.
    """

    tokens: np.ndarray  # [m] int64 input tokens
    depths: np.ndarray  # [m] int64 >= 1: position = position of the last committed token + depth
    mask: np.ndarray  # [m, m] bool, mask[i, j] = side token i attends side token j (j == i included)

    def __post_init__(self) -> None:
        m = self.tokens.shape[0]
        assert self.tokens.shape == (m,) and self.depths.shape == (m,), "SideBranch shapes"
        assert self.mask.shape == (m, m) and self.mask.dtype == np.bool_, "SideBranch mask [m, m] bool"


class Drafter:
    """Base class with no-op hooks; subclasses override what they need."""

    name: str = "drafter"
    topk: int = 0  # > 0: wants observe_topk with this many successors per verified position
    failures: int = 0  # calls that fell back to an empty tree (remote sources)

    def begin(self, row: int, prompt: np.ndarray, references: Sequence[np.ndarray] = ()) -> None:
        """prompt: [p] int64 token ids; references: token id arrays to copy from."""

    def propose(self, row: int, context: np.ndarray, budget: int, max_depth: int) -> DraftTree:
        """context: [c] int64, prompt + output so far. Returns <= budget nodes, depth <= max_depth."""
        return DraftTree.empty(self.name)

    def propose_batch(self, rows: Sequence[int], contexts: Sequence[np.ndarray], budget: int,
                      max_depths: Sequence[int]) -> list[DraftTree]:
        """One tree per row (rows: row ids; contexts[i]: [c_i] int64; max_depths[i] >= 1).
        Sources that can draft all rows in one call (a datastore batch, a table gather) override it."""
        return [self.propose(r, c, budget, int(d)) for r, c, d in zip(rows, contexts, max_depths)]

    def side_branch(self, row: int) -> SideBranch | None:
        return None

    def side_result(self, row: int, argmax: np.ndarray) -> None:
        """argmax: [m] int64, the model's greedy next token after each side token."""

    def observe(self, row: int, accepted: np.ndarray) -> None:
        """accepted: [a] int64, a >= 1, appended to the row's output this step."""

    def observe_batch(self, rows: Sequence[int], accepted: Sequence[np.ndarray]) -> None:
        """accepted[i]: [a_i] int64, the tokens rows[i] committed this step."""
        for r, a in zip(rows, accepted):
            self.observe(r, a)

    def observe_topk(self, tokens: np.ndarray, topk: np.ndarray) -> None:
        """tokens: [n] int64; topk: [n, k] int64, best first."""

    def end(self, row: int) -> None:
        pass
