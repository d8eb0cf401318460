"""RetrievalDrafter: drafts from the shared datastore, in process (`datastore.Datastore`) or over
gRPC (`client.DraftClient`), through the same `.draft(context, budget, max_depth, max_suffix,
min_suffix, min_count) -> DraftTree` call; `propose_batch` drafts every row of a step in one
`.draft_batch(contexts, ...)` call where the source has one (the in-process store: one call of its
C kernel; a client: one DraftBatch RPC per distinct max_depth).

The tokenizer fingerprint is checked once, at construction: drafts in another vocabulary are
garbage that verification would reject at full cost. A remote source never fails the decode: the
client returns an empty tree and counts the failure; anything it raises anyway is caught and
counted here too.
"""
from __future__ import annotations

import inspect
import warnings
from typing import Sequence

import numpy as np

from datastore.tree import DraftTree, trusted
from decoder.drafters.base import Drafter


class TokenizerMismatchError(ValueError):
    """The datastore was built with another tokenizer than the model's."""


def source_fingerprint(source) -> str | None:
    """The datastore's tokenizer fingerprint: Datastore.tokenizer, else source.info()."""
    info = getattr(source, "tokenizer", None)
    if info is None and hasattr(source, "info"):
        info = source.info()
    for step in ("tokenizer", "fingerprint"):  # info() may nest it: {tokenizer: {fingerprint}}
        if isinstance(info, dict):
            info = info.get(step, info if step == "tokenizer" else None)
        elif info is not None and hasattr(info, step):
            info = getattr(info, step)
    return info if isinstance(info, str) and info else None


def _is_remote(source) -> bool:
    return hasattr(source, "failures") and not hasattr(source, "tokenizer")


# Back off from a context suffix seen fewer times than this to the longest one seen this often,
# unless the match spans the whole max_suffix window (`datastore.index.backoff_match`). 40 HumanEval
# greedy outputs replayed against the 107M-token code store: 64-node tries 1.73 -> 2.03 tokens/step,
# 4-node 1.48 -> 1.51 (16 beat 4 and 64 at 64 nodes). Decoding with the cost model (fixed
# latency curve, same prompts): 1.48 -> 1.54 tokens/step at about the same modeled speed-up (1.19x -> 1.18x).
MIN_COUNT = 16


class RetrievalDrafter(Drafter):
    name = "retrieval"

    def __init__(self, source, tokenizer_fingerprint: str | None = None, budget: int | None = None,
                 max_depth: int | None = None, max_suffix: int = 16, min_suffix: int = 1,
                 min_count: int = MIN_COUNT, spec_factor: float = 0.0):
        if max_suffix < min_suffix or min_suffix < 1:
            raise ValueError(f"need 1 <= min_suffix <= max_suffix, got {min_suffix}, {max_suffix}")
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        if not spec_factor >= 0:
            raise ValueError(f"spec_factor must be >= 0, got {spec_factor}")
        self.spec_factor = float(spec_factor)  # > 0: no deeper than spec_factor x match length
        self.source = source
        self.budget, self.max_depth = budget, max_depth
        self.max_suffix, self.min_suffix = max_suffix, min_suffix
        self.min_count = min_count
        self.remote = _is_remote(source)
        self._own_failures = 0
        self._batch_ok: bool | None = None  # the source has a synchronous draft_batch
        if tokenizer_fingerprint is not None:
            try:
                theirs = source_fingerprint(source)
            except Exception as exc:  # noqa: BLE001 - a remote source that is down right now
                if not self.remote:
                    raise
                warnings.warn(f"cannot check the datastore's tokenizer ({exc}); drafting unchecked "
                              "until it answers (the client passes the fingerprint with each call)")
                return
            if theirs is None:
                raise TokenizerMismatchError(f"the datastore {source!r} reports no tokenizer fingerprint")
            if theirs != tokenizer_fingerprint:
                raise TokenizerMismatchError(
                    f"tokenizer mismatch: the model's tokenizer has fingerprint {tokenizer_fingerprint}, "
                    f"the datastore's is {theirs}; rebuild the datastore with the model's tokenizer"
                )

    @property
    def failures(self) -> int:
        return self._own_failures + int(getattr(self.source, "failures", 0) if self.remote else 0)

    def propose(self, row: int, context: np.ndarray, budget: int, max_depth: int) -> DraftTree:
        if self._batched():  # the same tree as a batch of one
            return self.propose_batch([row], [context], budget, [max_depth])[0]
        budget = budget if self.budget is None else min(budget, self.budget)
        max_depth = max_depth if self.max_depth is None else min(max_depth, self.max_depth)
        tail = np.ascontiguousarray(context[-self.max_suffix :], dtype=np.int64)
        args = dict(budget=budget, max_depth=max_depth, max_suffix=self.max_suffix,
                    min_suffix=self.min_suffix, min_count=self.min_count)
        if not self.remote:
            tree = self.source.draft(tail, **args)
        else:
            try:
                tree = self.source.draft(tail, **args)
            except Exception:  # noqa: BLE001 - decoding never fails because of the datastore
                self._own_failures += 1
                return DraftTree.empty(self.name)
        return self._named(tree)

    def propose_batch(self, rows: Sequence[int], contexts: Sequence[np.ndarray], budget: int,
                      max_depths: Sequence[int]) -> list[DraftTree]:
        """Every row's tree from one `source.draft_batch` call (the same trees as `propose` row by
        row). An in-process store takes per-row depths; a remote source gets one call per distinct
        depth, and a failed call gives its rows empty trees, counted in `failures`."""
        if not self._batched() or not len(rows):
            return super().propose_batch(rows, contexts, budget, max_depths)
        batch = self.source.draft_batch
        budget = budget if self.budget is None else min(budget, self.budget)
        depths = [int(d) for d in max_depths]
        if self.max_depth is not None:
            depths = [min(d, self.max_depth) for d in depths]
        tails = [c[-self.max_suffix:] for c in contexts]  # the kernel reads lists and int arrays
        args = dict(budget=budget, max_suffix=self.max_suffix, min_suffix=self.min_suffix,
                    min_count=self.min_count)
        if not self.remote:  # one kernel call, per-row depths
            depth = depths[0] if len(set(depths)) == 1 else depths
            if self.spec_factor:
                args["spec_factor"] = self.spec_factor
            return [self._named(t, capped=True) for t in batch(tails, max_depth=depth, **args)]
        tails = [np.ascontiguousarray(t, dtype=np.int64) for t in tails]
        out: list[DraftTree | None] = [None] * len(tails)
        for depth in sorted(set(depths)):
            group = [i for i, d in enumerate(depths) if d == depth]
            try:
                trees = batch([tails[i] for i in group], max_depth=depth, **args)
                if len(trees) != len(group):
                    raise ValueError(f"draft_batch returned {len(trees)} trees for {len(group)} contexts")
            except Exception:  # noqa: BLE001 - decoding never fails because of the datastore
                self._own_failures += len(group)
                trees = [None] * len(group)
            for i, tree in zip(group, trees):
                out[i] = self._named(tree)
        return out

    def _batched(self) -> bool:
        if self._batch_ok is None:  # once: inspect costs a few us a step
            batch = getattr(self.source, "draft_batch", None)
            self._batch_ok = batch is not None and not inspect.iscoroutinefunction(batch)
        return self._batch_ok

    def _named(self, tree: DraftTree | None, capped: bool = False) -> DraftTree:
        """The tree under this drafter's name; capped: the kernel already applied spec_factor."""
        if tree is None:
            return DraftTree.empty(self.name)
        if self.spec_factor and not capped and len(tree):
            tree = cap_depth(tree, max(1, int(self.spec_factor * tree.match_len)))
        if tree.source == self.name:
            return tree
        return trusted(tree.tokens, tree.parents, tree.counts, tree.match_len, self.name)  # checked arrays


def cap_depth(tree: DraftTree, depth: int) -> DraftTree:
    """The nodes of `tree` at most `depth` deep (an ancestor-closed subset, order kept): spec_factor
    for a source that cannot cap the depth while it expands (a server's Draft over gRPC, whose tree
    then holds fewer nodes than the in-process kernel's capped expansion)."""
    from decoder.tree import depths_of

    keep = depths_of(tree.parents.astype(np.int64)) <= depth  # [n]
    if keep.all():
        return tree
    index = np.flatnonzero(keep)
    new = np.full(len(tree), -1, dtype=np.int64)
    new[index] = np.arange(index.shape[0])
    par = tree.parents[index]
    return DraftTree(tree.tokens[index], np.where(par >= 0, new[np.maximum(par, 0)], -1), tree.counts[index],
                     tree.match_len, tree.source)


# The longest match, not backed off, drafted no deeper than its length (SuffixDecoding's
# max_spec_factor 1.0): a long match predicts its next few tokens well, not a whole 16-deep trie.
# Beside the backed-off retrieval drafts, as a source calibrated on its own (4 ShareGPT chat
# prompts, fixed latency curve: 2.12 -> 2.26 tokens/step, modeled 43.8 -> 45.2 tok/s; stdlib
# rework prompts with references: 7.50 -> 8.18 tokens/step at 64 nodes).
SPEC_FACTOR = 1.0


class LongestMatchDrafter(RetrievalDrafter):
    name = "longest"

    def __init__(self, source, tokenizer_fingerprint: str | None = None, min_count: int = 1,
                 spec_factor: float = SPEC_FACTOR, **kwargs):
        super().__init__(source, tokenizer_fingerprint, min_count=min_count, spec_factor=spec_factor, **kwargs)
