"""Adaptive multi-level n-grams (ANPD) over the prompt and the output so far.

Tables of orders 2..K (K = `max_order`) map the previous n-1 tokens to the counts of the token
that followed. The prompt's tables are counted with numpy (np.unique over the sliding windows);
every accepted token then adds one entry per order (`observe`), and each prefix caches its most
frequent continuations until it is updated again, so a lookup while drafting is a dict access.

To expand a node (the context, or the context followed by a draft path) the highest order whose
prefix has been seen is used, falling back to lower orders; the node's children are its most
frequent next tokens. A path's weight is SCALE x the product of the conditional frequencies
along it, so the best-first expansion pops the most probable paths first and the decoder's
count / parent-count estimate is exactly the table's conditional frequency.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from datastore.tree import DraftTree, expand_best_first
from decoder.drafters._util import SCALE, TokenBuffer, as_tokens
from decoder.drafters.base import Drafter


@dataclass(frozen=True)
class NGramSettings:
    max_order: int = 4  # K: orders 2..K (prefixes of 1..K-1 tokens)
    min_order: int = 2  # lowest order fallen back to
    max_children: int = 4  # most frequent continuations kept per node
    min_count: int = 1  # a continuation seen fewer times is ignored

    def __post_init__(self) -> None:
        if not 2 <= self.min_order <= self.max_order:
            raise ValueError(
                f"ngram orders must satisfy 2 <= min_order <= max_order, got {self.min_order}, {self.max_order}"
            )
        if self.max_order > 12:
            raise ValueError(f"ngram max_order must be <= 12, got {self.max_order}")
        if self.max_children < 1:
            raise ValueError(f"ngram max_children must be >= 1, got {self.max_children}")
        if self.min_count < 1:
            raise ValueError(f"ngram min_count must be >= 1, got {self.min_count}")


class NGramTables:
    """{prefix tuple: {next token: count}} for prefix lengths lo..hi, over a growing sequence."""

    def __init__(self, lo: int, hi: int, settings: NGramSettings):
        self.lo, self.hi, self.settings = lo, hi, settings
        self.seq = TokenBuffer()
        self.counts: dict[tuple[int, ...], dict[int, int]] = {}
        self._top: dict[tuple[int, ...], tuple[list[tuple[int, int]], int]] = {}  # prefix -> (best, total)

    def __len__(self) -> int:
        return self.seq.n

    def extend(self, tokens: np.ndarray) -> None:
        old = self.seq.n
        self.seq.extend(tokens)
        seq = self.seq.tokens
        for k in range(self.lo, self.hi + 1):
            first = max(old, k)  # positions i of the newly known "prefix -> seq[i]" entries
            if first >= seq.shape[0]:
                continue
            grams = sliding_window_view(seq[first - k :], k + 1)  # [g, k+1] prefix + next
            if grams.shape[0] > 16:  # the prompt: count in numpy first
                uniq, cnt = np.unique(grams, axis=0, return_counts=True)
                rows, weights = uniq.tolist(), cnt.tolist()
            else:
                rows, weights = grams.tolist(), [1] * grams.shape[0]
            for row, c in zip(rows, weights):  # per distinct n-gram (per accepted token later)
                prefix = tuple(row[:-1])
                table = self.counts.setdefault(prefix, {})
                table[row[-1]] = table.get(row[-1], 0) + c
                self._top.pop(prefix, None)

    def best(self, prefix: tuple[int, ...]) -> tuple[list[tuple[int, int]], int]:
        """([(token, count)] most frequent first (ties: smaller id), <= max_children; total count
        of the continuations seen >= min_count times)."""
        hit = self._top.get(prefix)
        if hit is None:
            table = self.counts.get(prefix)
            if not table:
                return [], 0
            s = self.settings
            items = [(t, c) for t, c in table.items() if c >= s.min_count]
            items.sort(key=lambda tc: (-tc[1], tc[0]))
            hit = (items[: s.max_children], sum(c for _, c in items))
            self._top[prefix] = hit
        return hit

    def lookup(self, path: tuple[int, ...]) -> tuple[list[tuple[int, int]], int, int]:
        """(best continuations, their total, order) of the longest suffix of `path` with a
        continuation, highest order first; order 0 when none."""
        for k in range(min(self.hi, len(path)), self.lo - 1, -1):
            best, total = self.best(path[len(path) - k :])
            if best:
                return best, total, k + 1
        return [], 0, 0


class NGramDrafter(Drafter):
    name = "ngram"

    def __init__(self, settings: NGramSettings | None = None, **overrides):
        self.settings = replace(settings or NGramSettings(), **overrides)
        self._rows: dict[int, NGramTables] = {}
        self.orders_used: dict[int, int] = {}  # order -> steps it drafted the first level (stats)

    def begin(self, row: int, prompt: np.ndarray, references: Sequence[np.ndarray] = ()) -> None:
        s = self.settings
        tables = NGramTables(s.min_order - 1, s.max_order - 1, s)
        tables.extend(as_tokens("prompt", prompt))
        self._rows[row] = tables

    def observe(self, row: int, accepted: np.ndarray) -> None:
        """Every accepted token updates the tables of every order."""
        tables = self._rows.get(row)
        if tables is not None:
            tables.extend(as_tokens("accepted", accepted))

    def _sync(self, tables: NGramTables, context: np.ndarray) -> None:
        """Catch up with tokens committed without `observe` (a caller that only proposes)."""
        if context.shape[0] > len(tables):
            tables.extend(context[len(tables) :])
        elif context.shape[0] < len(tables):
            raise ValueError(
                f"ngram drafter: row context ({context.shape[0]} tokens) is shorter than the "
                f"{len(tables)} tokens observed; call begin() for a new sequence"
            )

    def propose(self, row: int, context: np.ndarray, budget: int, max_depth: int) -> DraftTree:
        tables = self._rows.get(row)
        if tables is None:
            self.begin(row, context)
            tables = self._rows[row]
        context = np.asarray(context, dtype=np.int64).reshape(-1)
        self._sync(tables, context)
        keep = self.settings.max_order - 1
        tail = tuple(context[-keep:].tolist())
        if budget <= 0 or max_depth <= 0 or not tail:
            return DraftTree.empty(self.name)
        best, _, order = tables.lookup(tail)
        if not best:
            return DraftTree.empty(self.name)

        def children(handle: tuple[tuple[int, ...], int]) -> Iterable[tuple[int, int, tuple]]:
            path, weight = handle
            best, total, _ = tables.lookup(path)
            out = []
            for t, c in best:
                w = max(1, weight * c // total)
                out.append((t, w, ((path + (t,))[-keep:], w)))
            return out

        t, p, c = expand_best_first(children((tail, SCALE)), children, budget, max_depth)
        self.orders_used[order] = self.orders_used.get(order, 0) + 1
        return DraftTree(t, p, c, order - 1, self.name)

    def end(self, row: int) -> None:
        self._rows.pop(row, None)
