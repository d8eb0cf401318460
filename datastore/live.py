"""The live tier: sequences inserted at run time, durable in LMDB, drafted from in memory.

On disk: an LMDB environment of its own beside the datastore (`<DIR>.live/` by default), opened
WITH locking because every worker process of every server writes it. Sub-databases:
  b"seq"  key = 8-byte big-endian sequence number (monotonic, never reused) -> tokens '<u4' bytes
  b"meta" b"fingerprint" (tokenizer of the store it belongs to), b"next", b"tokens", b"sequences"
An `append` is one write transaction committed with fsync (durable once it returns).

Eviction (bounded memory): when the stored tokens exceed `max_tokens`, the same write
transaction deletes the OLDEST sequences until the total fits again (FIFO by sequence number).
Every process then drops them from its index at its next refresh/compaction, so the in-memory
tier holds at most `max_tokens` tokens (+ one separator per sequence); memory is about
(token bytes + 4..8 SA bytes) per token, ~80 MB for the 10M default with uint16 tokens.

In memory (per process): segments, each a `SuffixIndex` over whole sequences, every sequence
followed by the separator (so counts add up across segments exactly like shards do):
* the young segment holds the newest sequences and is rebuilt on every refresh (every
  `refresh_s`, ~50 ms) that finds new entries; its size is bounded by `segment_tokens` (256K
  tokens sort in ~35 ms here), after which it is sealed;
* a compactor thread merges the two adjacent sealed segments of least combined size while there
  are more than `max_segments`, and rebuilds segments that lost their oldest sequences to
  eviction. pydivsufsort releases the GIL while sorting (measured), so a multi-second merge
  delays neither drafts nor the refresher: visibility stays ~refresh_s + one young rebuild.
Segment boundaries differ between processes, but counts are sums over segments, so every
process drafts the same trees from the same set of sequences.
"""
from __future__ import annotations

import logging
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import lmdb
import numpy as np

from builder.suffix_array import suffix_array
from datastore.format import MAP_SIZE, DatastoreError
from datastore.index import SuffixIndex

log = logging.getLogger("draftstore.live")
SEQ_DB, META_DB = b"seq", b"meta"
SEGMENT_TOKENS = 1 << 18
MAX_SEGMENTS = 6
_U64 = struct.Struct(">Q")


@dataclass(frozen=True)
class LiveSettings:
    path: str  # the live LMDB directory
    fingerprint: str  # tokenizer fingerprint of the static store (a live dir belongs to one)
    separator: int  # == the store's vocab_size
    token_dtype: str = "uint32"  # the store's; the separator must fit
    max_tokens: int = 10_000_000
    refresh_s: float = 0.05
    segment_tokens: int = SEGMENT_TOKENS
    max_segments: int = MAX_SEGMENTS

    def __post_init__(self) -> None:
        if self.token_dtype not in ("uint16", "uint32"):
            raise ValueError(f"live token_dtype must be uint16 or uint32, got {self.token_dtype!r}")
        if not 0 < self.separator <= np.iinfo(np.dtype(self.token_dtype)).max:
            raise ValueError(f"live separator {self.separator} does not fit {self.token_dtype}")
        if self.max_tokens < 1:
            raise ValueError(f"live max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 < self.refresh_s <= 60:
            raise ValueError(f"live refresh_s must be in (0, 60], got {self.refresh_s}")
        if self.segment_tokens < 1 or self.max_segments < 1:
            raise ValueError("live segment_tokens and max_segments must be >= 1")


def default_live_dir(store_dir: str | Path) -> Path:
    store_dir = Path(store_dir)
    return store_dir.with_name(store_dir.name + ".live")


@dataclass(frozen=True)
class _Segment:
    keys: np.ndarray  # [m] uint64 sequence numbers, increasing
    starts: np.ndarray  # [m + 1] int64 offset of each sequence in index.tokens; last = n
    index: SuffixIndex

    @property
    def tokens(self) -> int:
        return self.index.n


def _build_segment(keys: np.ndarray, seqs: Sequence[np.ndarray], separator: int,
                   dtype: np.dtype) -> _Segment:
    """Sequences concatenated, each followed by the separator, and their suffix array."""
    assert len(keys) == len(seqs) > 0, (len(keys), len(seqs))
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))  # [m]
    starts = np.zeros(len(seqs) + 1, dtype=np.int64)  # [m + 1]
    np.cumsum(lengths + 1, out=starts[1:])
    tokens = np.full(int(starts[-1]), separator, dtype=dtype)  # [n]
    body = np.concatenate(seqs).astype(dtype, copy=False)  # [n - m]
    tokens[np.arange(body.shape[0]) + np.repeat(np.arange(len(seqs)), lengths)] = body
    return _Segment(np.asarray(keys, dtype=np.uint64), starts,
                    SuffixIndex(tokens, suffix_array(tokens), separator))


def _drop_oldest(seg: _Segment, first_key: int) -> _Segment | None:
    """The segment without its sequences older than first_key (a prefix); None if none remain."""
    keep = int(np.searchsorted(seg.keys, np.uint64(first_key)))
    if keep == 0:
        return seg
    if keep == len(seg.keys):
        return None
    tokens = np.ascontiguousarray(seg.index.tokens[seg.starts[keep]:])  # still separator-ended
    sep = seg.index.separator
    return _Segment(seg.keys[keep:], seg.starts[keep:] - seg.starts[keep],
                    SuffixIndex(tokens, suffix_array(tokens), sep))


def _merge(a: _Segment, b: _Segment) -> _Segment:
    tokens = np.concatenate([a.index.tokens, b.index.tokens])  # [na + nb]
    starts = np.concatenate([a.starts[:-1], b.starts + a.tokens])
    return _Segment(np.concatenate([a.keys, b.keys]), starts,
                    SuffixIndex(tokens, suffix_array(tokens), a.index.separator))


def _u64(txn: lmdb.Transaction, db, key: bytes) -> int:
    raw = txn.get(key, db=db)
    return 0 if raw is None else _U64.unpack(raw)[0]


class LiveTier:
    """One process's handle on the live tier: `append` (durable) and `indexes` (to draft from).

    Threads: a refresher (new entries -> young segment) and a compactor (seal merges, eviction).
    `indexes` is an immutable tuple swapped atomically, so drafting takes no lock.
    """

    def __init__(self, settings: LiveSettings, start_threads: bool = True) -> None:
        self.settings = settings
        self._dtype = np.dtype(settings.token_dtype)
        self._env = _open_env(Path(settings.path), settings.fingerprint)
        # handles opened once: open_db() later would start a write txn (and wait on writers)
        self._seq_db = self._env.open_db(SEQ_DB)
        self._meta_db = self._env.open_db(META_DB)
        self._write_lock = threading.Lock()  # one writer per process; LMDB serialises processes
        self._refresh_lock = threading.Lock()
        self._lock = threading.Lock()  # guards _sealed/_young and the published tuple
        self._sealed: list[_Segment] = []
        self._young_keys: list[int] = []
        self._young_seqs: list[np.ndarray] = []
        self._young: _Segment | None = None
        self._last_key = -1
        self._first_key = 0
        self.indexes: tuple[SuffixIndex, ...] = ()
        self.sequences = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self.refresh()  # everything acknowledged before this restart is visible before serving
        self.compact()
        if start_threads:
            self._start()

    # ---------------------------------------------------------------- writing
    def append(self, seqs: Sequence[np.ndarray]) -> tuple[int, int]:
        """Store sequences durably (fsync'd commit), evicting the oldest over the cap;
        -> (sequences stored, tokens stored). Empty sequences are skipped."""
        seqs = [np.asarray(s) for s in seqs if len(s)]
        tokens = sum(len(s) for s in seqs)
        if tokens > self.settings.max_tokens:
            raise ValueError(f"{tokens} tokens exceed the live tier's cap of "
                             f"{self.settings.max_tokens}")
        if not seqs:
            return 0, 0
        meta = self._meta_db
        with self._write_lock, self._env.begin(write=True) as txn:
            nxt, total = _u64(txn, meta, b"next"), _u64(txn, meta, b"tokens")
            count = _u64(txn, meta, b"sequences")
            for s in seqs:
                txn.put(_U64.pack(nxt), s.astype("<u4").tobytes(), db=self._seq_db, append=True)
                nxt += 1
            total, count = _evict(txn, self._seq_db, total + tokens, count + len(seqs),
                                  self.settings.max_tokens)
            for key, value in ((b"next", nxt), (b"tokens", total), (b"sequences", count)):
                txn.put(key, _U64.pack(value), db=meta)
        return len(seqs), tokens

    # ---------------------------------------------------------------- reading
    def refresh(self) -> bool:
        """Fold entries appended since the last refresh (and evictions) into the young segment;
        -> whether anything changed."""
        with self._refresh_lock:
            first, keys, seqs = self._read_new()
            evicted = first > self._first_key
            self._first_key = first
            dropped = 0
            if evicted:
                kept = [i for i, k in enumerate(self._young_keys) if k >= first]
                dropped = len(self._young_keys) - len(kept)
                self._young_keys = [self._young_keys[i] for i in kept]
                self._young_seqs = [self._young_seqs[i] for i in kept]
            if not keys and not dropped:
                return evicted  # sealed segments' evictions are the compactor's
            self._young_keys += keys
            self._young_seqs += seqs
            if keys:
                self._last_key = keys[-1]
            self._rebuild_young()
            return True

    def _read_new(self) -> tuple[int, list[int], list[np.ndarray]]:
        """(first key still stored, new keys, their token arrays) in one read transaction."""
        keys: list[int] = []
        seqs: list[np.ndarray] = []
        with self._env.begin() as txn:
            cur = txn.cursor(db=self._seq_db)
            first = _U64.unpack(cur.key())[0] if cur.first() else _u64(
                txn, self._meta_db, b"next")
            if cur.set_range(_U64.pack(self._last_key + 1)):
                for k, v in cur:
                    keys.append(_U64.unpack(k)[0])
                    seqs.append(np.frombuffer(v, dtype="<u4"))
        return first, keys, seqs

    def _rebuild_young(self) -> None:
        """Seal full segments off the young sequences, rebuild the rest, publish."""
        cap = self.settings.segment_tokens
        sealed: list[_Segment] = []
        lengths = np.fromiter((len(s) + 1 for s in self._young_seqs), dtype=np.int64,
                              count=len(self._young_seqs))
        while lengths.sum() >= cap:
            cut = int(np.searchsorted(np.cumsum(lengths), cap)) + 1  # first prefix >= cap
            sealed.append(self._segment(self._young_keys[:cut], self._young_seqs[:cut]))
            self._young_keys, self._young_seqs = self._young_keys[cut:], self._young_seqs[cut:]
            lengths = lengths[cut:]
        young = self._segment(self._young_keys, self._young_seqs) if self._young_seqs else None
        with self._lock:
            self._sealed.extend(sealed)
            self._young = young
            self._publish()

    def _segment(self, keys: list[int], seqs: list[np.ndarray]) -> _Segment:
        return _build_segment(np.asarray(keys, dtype=np.uint64), seqs, self.settings.separator,
                              self._dtype)

    def compact(self) -> None:
        """Apply evictions to sealed segments, then merge while there are too many."""
        with self._lock:
            snapshot = list(self._sealed)
        first = self._first_key
        for seg in snapshot:
            if int(seg.keys[0]) >= first:
                break
            new = _drop_oldest(seg, first)
            self._replace([seg], new)
        while True:
            with self._lock:
                segs = list(self._sealed)
            if len(segs) <= self.settings.max_segments:
                return
            sizes = [a.tokens + b.tokens for a, b in zip(segs, segs[1:])]
            i = int(np.argmin(sizes))
            self._replace(segs[i:i + 2], _merge(segs[i], segs[i + 1]))

    def _replace(self, old: list[_Segment], new: _Segment | None) -> None:
        """Swap the adjacent segments `old` for `new` (only the compactor removes segments)."""
        with self._lock:
            at = next(i for i, s in enumerate(self._sealed) if s is old[0])
            assert all(self._sealed[at + j] is s for j, s in enumerate(old))
            self._sealed[at:at + len(old)] = [] if new is None else [new]
            self._publish()

    def _publish(self) -> None:
        segs = self._sealed + ([self._young] if self._young is not None else [])
        self.indexes = tuple(s.index for s in segs)
        self.sequences = sum(len(s.keys) for s in segs)

    @property
    def tokens(self) -> int:
        """Tokens in the in-memory index, separators included (like the static `tokens`)."""
        return sum(ix.n for ix in self.indexes)

    # ---------------------------------------------------------------- threads
    def _start(self) -> None:
        for name, period, fn in (("live-refresh", self.settings.refresh_s, self.refresh),
                                 ("live-compact", self.settings.refresh_s * 4, self.compact)):
            t = threading.Thread(target=self._loop, args=(period, fn), name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _loop(self, period: float, fn) -> None:
        while not self._stop.wait(period):
            try:
                fn()
            except Exception:  # noqa: BLE001 - keep refreshing; the next round retries
                log.exception("live tier %s failed", fn.__name__)

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()
        self._threads = []
        self._env.close()

    def __enter__(self) -> "LiveTier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _evict(txn: lmdb.Transaction, db, total: int, count: int, cap: int) -> tuple[int, int]:
    """Delete the oldest sequences while total > cap; -> (total, count) after."""
    if total <= cap:
        return total, count
    cur = txn.cursor(db=db)
    cur.first()
    while total > cap:
        total -= len(cur.value()) // 4
        count -= 1
        cur.delete()  # moves to the next (older-first) entry
    return total, count


def _open_env(path: Path, fingerprint: str) -> lmdb.Environment:
    """Open (creating if needed) the live environment; DatastoreError if it is another store's."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        env = lmdb.open(str(path), map_size=MAP_SIZE, max_dbs=2, lock=True, sync=True,
                        metasync=True, readahead=False, subdir=True)
    except (OSError, lmdb.Error) as exc:
        raise DatastoreError(f"{path}: cannot open the live tier: {exc}") from exc
    try:
        env.reader_check()  # free reader slots of processes that died (SIGKILL) holding them
        meta = env.open_db(META_DB)
        env.open_db(SEQ_DB)
        with env.begin(write=True) as txn:
            mine = txn.get(b"fingerprint", db=meta)
            if mine is None:
                txn.put(b"fingerprint", fingerprint.encode(), db=meta)
            elif mine.decode() != fingerprint:
                raise DatastoreError(
                    f"{path}: this live tier belongs to a store with tokenizer fingerprint "
                    f"{mine.decode()[:16]}..., not {fingerprint[:16]}...; use another --live-dir"
                )
    except lmdb.Error as exc:
        env.close()
        raise DatastoreError(f"{path}: the live tier is unreadable: {exc}") from exc
    except BaseException:
        env.close()
        raise
    return env
