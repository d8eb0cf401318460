"""`ShardedClient`: one datastore split over several servers, queried as one.

Each shard is asked, in parallel and under one deadline, for `budget * overfetch` nodes; the
trees are merged by summing the counts of identical paths (`datastore.tree.merge_sum`) and the
budget is re-selected with the shared best-first tie rule. When every shard's tree is complete
(its whole trie fits in the over-fetched budget) the result is exactly what one datastore of the
whole corpus gives; otherwise a path a shard cut off is missing that shard's count.
With min_count > 1 each shard backs off on its own counts, so the merged tree can grow from
another suffix than one whole store would pick (a shorter one where only the shards' summed
counts reach min_count): exact only for min_count = 1, like the over-fetch caveat above.
A shard that fails is just absent (and counted in `failures`): drafts degrade, decoding goes on.
"""
from __future__ import annotations

import time
import zlib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable, Sequence

from client import messages
from client.draft_client import DraftClient, call_timeout
from client.failures import DraftServiceError
from client.messages import DatastoreInfo
from client.settings import ClientSettings, TlsConfig
from datastore.tree import DraftTree, merge_sum

# A shard thread that has not returned this long after the deadline is treated as absent
# (each shard call carries the deadline itself; this only guards against a stuck thread).
JOIN_SLACK_S = 0.02


@dataclass(frozen=True)
class ShardedSettings:
    client: ClientSettings = field(default_factory=ClientSettings)
    overfetch: int = 4  # each shard drafts budget * overfetch nodes
    max_shard_budget: int = 1024  # the server's default limit on budget

    def __post_init__(self) -> None:
        if self.overfetch < 1:
            raise ValueError(f"overfetch must be >= 1, got {self.overfetch}")
        if self.max_shard_budget < 1:
            raise ValueError(f"max_shard_budget must be >= 1, got {self.max_shard_budget}")

    def shard_budget(self, budget: int) -> int:
        return min(budget * self.overfetch, max(self.max_shard_budget, budget))


def merge_shards(trees: Sequence[DraftTree], budget: int, max_depth: int) -> DraftTree:
    """merge_sum over the trees matched on the longest suffix.

    A shard can match the longest suffix and still have no continuation (the match ends a
    document); the whole datastore then answers an empty tree with that match_len, and so must
    the merge, instead of falling back to a shorter match of another shard.
    """
    best = max((t.match_len for t in trees), default=0)
    top = [t for t in trees if t.match_len == best and len(t)]
    if best == 0 or not top:
        empty = DraftTree.empty(messages.SOURCE)
        return replace_match(empty, best)
    return merge_sum(top, budget, max_depth)


def replace_match(tree: DraftTree, match_len: int) -> DraftTree:
    return DraftTree(tree.tokens, tree.parents, tree.counts, match_len, tree.source)


def shard_for(sequences: Sequence, n: int) -> int:
    """A stable shard index for an Insert: crc32 of the sequences' ids (same on every node)."""
    h = 0
    for seq in sequences:
        h = zlib.crc32(messages.ids(seq, "sequence").astype("<i8").tobytes(), h)
    return h % n


class ShardedClient:
    """Same methods as DraftClient: draft, draft_batch, insert (one shard by stable hash),
    info (aggregated), close, failures / failures_by_code."""

    def __init__(self, targets: Sequence[str], timeout: float = 0.05, overfetch: int = 4,
                 auth_token: str | None = None, tls: TlsConfig | None = None,
                 tokenizer_fingerprint: str | None = None, *,
                 settings: ShardedSettings | None = None, **more) -> None:
        targets = list(targets)
        if not targets:
            raise ValueError("ShardedClient needs at least one target")
        if len(set(targets)) != len(targets):
            raise ValueError(f"ShardedClient targets repeat: {targets} (a shard counted twice "
                             "would double its counts)")
        self.settings = settings or ShardedSettings(
            ClientSettings(timeout=timeout, auth_token=auth_token, tls=tls,
                           tokenizer_fingerprint=tokenizer_fingerprint, **more), overfetch)
        self.targets = targets
        self.clients = [DraftClient(t, settings=self.settings.client) for t in targets]
        self._pool = ThreadPoolExecutor(max_workers=len(targets), thread_name_prefix="shard")
        self._own: Counter[str] = Counter()  # bad requests; shard calls abandoned at the join

    # ------------------------------------------------------------------ counters
    @property
    def failures(self) -> int:
        return sum(c.failures for c in self.clients) + sum(self._own.values())

    @property
    def failures_by_code(self) -> dict[str, int]:
        total: Counter[str] = Counter(self._own)
        for c in self.clients:
            total.update(c.failures_by_code)
        return dict(total)

    @property
    def failures_by_target(self) -> dict[str, int]:
        return {c.target: c.failures for c in self.clients}

    # ------------------------------------------------------------------ fan-out
    def _fan_out(self, call: Callable[[DraftClient, float], object], timeout: float) -> list:
        """call(client, seconds_left) on every shard in parallel; None for a shard that did not
        come back in time."""
        deadline = time.monotonic() + timeout
        futures = [self._pool.submit(lambda c=c: call(c, max(deadline - time.monotonic(), 1e-3)))
                   for c in self.clients]
        wait(futures, timeout=timeout + JOIN_SLACK_S)
        out = []
        for f in futures:
            if f.done() and f.exception() is None:
                out.append(f.result())
            else:
                self._own["DEADLINE_EXCEEDED"] += 1
                out.append(None)
        return out

    def draft(self, context, budget: int = 64, max_depth: int = 16, max_suffix: int = 16,
              min_suffix: int = 1, min_count: int = 1, *,
              timeout: float | None = None) -> DraftTree:
        if budget == 0:
            return DraftTree.empty(messages.SOURCE)
        try:
            context = messages.tail(context, max_suffix)  # once, not once per shard
        except ValueError:
            self._own["CLIENT_ERROR"] += 1  # one bad request, not one per shard
            return DraftTree.empty(messages.SOURCE)
        b = self.settings.shard_budget(budget)
        trees = self._fan_out(lambda c, left: c.draft(context, b, max_depth, max_suffix,
                                                      min_suffix, min_count, timeout=left),
                              call_timeout(timeout, self.settings.client.timeout))
        return merge_shards([t for t in trees if t is not None], budget, max_depth)

    def draft_batch(self, contexts: Sequence, budget: int = 64, max_depth: int = 16,
                    max_suffix: int = 16, min_suffix: int = 1, min_count: int = 1, *,
                    timeout: float | None = None) -> list[DraftTree]:
        contexts = list(contexts)
        if not contexts or budget == 0:
            return messages.empties(len(contexts))
        b = self.settings.shard_budget(budget)
        per_shard = self._fan_out(lambda c, left: c.draft_batch(contexts, b, max_depth,
                                                                max_suffix, min_suffix,
                                                                min_count, timeout=left),
                                  call_timeout(timeout, self.settings.client.timeout))
        per_shard = [trees for trees in per_shard if trees is not None]
        return [merge_shards([trees[i] for trees in per_shard], budget, max_depth)
                for i in range(len(contexts))]

    def insert(self, sequences: Sequence, *, raise_on_error: bool = True,
               timeout: float | None = None) -> int:
        """To the one shard `shard_for(sequences)` picks, so every node sends the same
        sequences to the same shard; the others draft them as if it were a static shard."""
        sequences = list(sequences)
        if not sequences:
            return 0
        client = self.clients[shard_for(sequences, len(self.clients))]
        return client.insert(sequences, raise_on_error=raise_on_error, timeout=timeout)

    def info(self, timeout: float | None = None) -> DatastoreInfo:
        """Totals over shards; DraftServiceError if a shard fails or the tokenizers differ."""
        infos = list(self._pool.map(lambda c: c.info(timeout), self.clients))
        fps = {i.fingerprint for i in infos}
        if len(fps) > 1:
            raise DraftServiceError(", ".join(self.targets), "Info", "FAILED_PRECONDITION",
                                    "the shards were built with different tokenizers")
        first = infos[0]
        total = lambda name: sum(getattr(i, name) for i in infos)  # noqa: E731
        low = lambda name: min(getattr(i, name) for i in infos)  # noqa: E731
        return DatastoreInfo(
            format_version=first.format_version, tokenizer=first.tokenizer,
            tokens=total("tokens"), documents=total("documents"), shards=total("shards"),
            token_dtype=first.token_dtype, live_tokens=total("live_tokens"),
            live_sequences=total("live_sequences"), max_budget=low("max_budget"),
            max_depth=low("max_depth"), max_context=low("max_context"),
            max_batch=low("max_batch"), targets=tuple(self.targets))

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        for c in self.clients:
            c.close()
        self._pool.shutdown(wait=False)

    def __enter__(self) -> "ShardedClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ShardedClient({self.targets!r}, failures={self.failures})"
