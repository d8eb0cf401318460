"""The live tier: durable appends, segments/merges/eviction against a one-index reference,
restart, and static + live drafts through the server against a store built from both."""
from __future__ import annotations

import shutil
import time

import grpc
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from builder.suffix_array import suffix_array
from builder.tokenizer import tokenizer_info
from builder.writer import write_datastore
from datastore.format import DatastoreError
from datastore.index import SuffixIndex, count_in, draft_from
from datastore.live import LiveSettings, LiveTier
from datastore.server import ServeSettings, serve
from datastore.store import Datastore
from protos import convert
from protos.draftstore.v1 import draftstore_pb2 as pb
from server_support import build_store, encode, sample_contexts, stdlib, stub_for

VOCAB = 12  # tiny, so sequences repeat each other and trees are deep


def live_settings(path, **kw) -> LiveSettings:
    base = dict(path=str(path), fingerprint="f" * 64, separator=VOCAB, token_dtype="uint16")
    return LiveSettings(**(base | kw))


def reference(seqs: list[np.ndarray]) -> SuffixIndex:
    """One index over all sequences, each followed by the separator: what the segments must add
    up to."""
    parts = [np.append(np.asarray(s, dtype=np.uint16), np.uint16(VOCAB)) for s in seqs]
    tokens = np.concatenate(parts) if parts else np.zeros(0, np.uint16)
    return SuffixIndex(tokens, suffix_array(tokens), VOCAB)


def brute_count(seqs, pattern) -> int:
    m = len(pattern)
    return sum(1 for s in seqs for i in range(len(s) - m + 1) if list(s[i:i + m]) == pattern)


def random_seqs(rng, n, lo=1, hi=30):
    return [rng.integers(0, VOCAB, rng.integers(lo, hi)) for _ in range(n)]


def assert_same_drafts(live: LiveTier, seqs, rng, n=60):
    ref = [reference(seqs)]
    for _ in range(n):
        src = seqs[rng.integers(len(seqs))]
        ctx = src[: rng.integers(1, len(src) + 1)].tolist()
        got = draft_from(live.indexes, ctx, budget=40, max_depth=8, separator=VOCAB)
        want = draft_from(ref, ctx, budget=40, max_depth=8, separator=VOCAB)
        assert got.same_as(want), ctx
    for _ in range(20):
        pat = rng.integers(0, VOCAB, rng.integers(1, 4)).tolist()
        assert count_in(live.indexes, pat, VOCAB) == brute_count(seqs, pat)


def test_segments_and_merges_add_up_to_one_index(tmp_path):
    rng = np.random.default_rng(1)
    s = live_settings(tmp_path / "live", segment_tokens=200, max_segments=3)
    seqs: list[np.ndarray] = []
    with LiveTier(s, start_threads=False) as live:
        for _ in range(15):
            batch = random_seqs(rng, int(rng.integers(1, 8)))
            assert live.append(batch) == (len(batch), sum(len(b) for b in batch))
            seqs += batch
            live.refresh()
            live.compact()
        assert len(live.indexes) > 1  # really several segments
        assert len(live.indexes) <= 3 + 1  # max_segments sealed + the young one
        assert live.sequences == len(seqs)
        assert live.tokens == sum(len(x) + 1 for x in seqs)
        assert_same_drafts(live, seqs, rng)


def test_restart_keeps_everything_acknowledged(tmp_path):
    rng = np.random.default_rng(2)
    s = live_settings(tmp_path / "live", segment_tokens=100)
    seqs = random_seqs(rng, 40)
    with LiveTier(s, start_threads=False) as live:
        for i in range(0, 40, 10):
            live.append(seqs[i:i + 10])
    with LiveTier(s, start_threads=False) as again:  # loads everything before returning
        assert again.sequences == 40
        assert_same_drafts(again, seqs, rng)
        more = random_seqs(rng, 3)
        again.append(more)
        again.refresh()
        assert_same_drafts(again, seqs + more, rng)


def test_eviction_keeps_the_newest_sequences_under_the_cap(tmp_path):
    rng = np.random.default_rng(3)
    cap = 300
    s = live_settings(tmp_path / "live", max_tokens=cap, segment_tokens=60, max_segments=2)
    seqs: list[np.ndarray] = []
    with LiveTier(s, start_threads=False) as live:
        for _ in range(30):
            batch = random_seqs(rng, 3)
            live.append(batch)
            seqs += batch
            live.refresh()
            live.compact()
        # the survivors: the longest suffix of the insertion order that fits the cap
        kept, total = [], 0
        for seq in reversed(seqs):
            if total + len(seq) > cap:
                break
            kept.insert(0, seq)
            total += len(seq)
        assert live.sequences == len(kept)
        assert live.tokens - live.sequences <= cap
        assert_same_drafts(live, kept, rng)
        with pytest.raises(ValueError, match="cap"):
            live.append([np.zeros(cap + 1, np.int64)])
    with LiveTier(s, start_threads=False) as again:
        assert again.sequences == len(kept)


def test_background_threads_make_appends_visible(tmp_path):
    rng = np.random.default_rng(4)
    with LiveTier(live_settings(tmp_path / "live", refresh_s=0.02)) as live:
        seqs = random_seqs(rng, 5)
        live.append(seqs)  # no explicit refresh: the refresher thread picks it up
        for _ in range(250):
            if live.sequences == 5:
                break
            time.sleep(0.02)
        assert live.sequences == 5
        assert_same_drafts(live, seqs, rng, n=10)


def test_a_live_dir_of_another_store_is_refused(tmp_path):
    with LiveTier(live_settings(tmp_path / "live"), start_threads=False):
        pass
    with pytest.raises(DatastoreError, match="fingerprint"):
        LiveTier(live_settings(tmp_path / "live", fingerprint="0" * 64), start_threads=False)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=0, max_size=12), min_size=1,
                max_size=25), st.integers(1, 80), st.integers(1, 4))
def test_property_live_equals_reference(tmp_path_factory, seqs, segment_tokens, max_segments):
    folder = tmp_path_factory.mktemp("prop")
    s = live_settings(folder / "live", segment_tokens=segment_tokens, max_segments=max_segments)
    arrays = [np.asarray(x, dtype=np.int64) for x in seqs]
    with LiveTier(s, start_threads=False) as live:
        for i in range(0, len(arrays), 4):
            live.append(arrays[i:i + 4])
            live.refresh()
            live.compact()
        nonempty = [a for a in arrays if len(a)]
        assert live.sequences == len(nonempty)
        if nonempty:
            assert_same_drafts(live, nonempty, np.random.default_rng(0), n=15)


# ------------------------------------------------------------------------ through the server


def test_server_merges_static_and_live_counts(tmp_path, smollm2_tokenizer):
    docs = build_store(tmp_path / "store", smollm2_tokenizer, modules=("textwrap.py", "glob.py"))
    text = stdlib("shlex.py")
    inserted = [encode(smollm2_tokenizer, text[i:i + 1500]) for i in range(0, len(text), 1500)]
    inserted.append(docs[0])  # also repeats a static document: counts must add up
    write_datastore(tmp_path / "both", docs + inserted, tokenizer_info(smollm2_tokenizer, "x"))
    write_datastore(tmp_path / "live", inserted, tokenizer_info(smollm2_tokenizer, "x"))
    contexts = sample_contexts(smollm2_tokenizer, docs + inserted, 60, seed=5)
    with serve(tmp_path / "store", ServeSettings()) as handle:
        ch, stub = stub_for(handle.address)
        reply = stub.Insert(pb.InsertRequest(sequences=[pb.TokenSequence(tokens=s.tolist())
                                                        for s in inserted]))
        assert (reply.sequences, reply.tokens) == (len(inserted), sum(map(len, inserted)))
        info = stub.Info(pb.InfoRequest())
        assert info.live_sequences == len(inserted)
        changed: set[str] = set()
        with Datastore.open(tmp_path / "both") as both, \
                Datastore.open(tmp_path / "live") as live_only:
            for ctx in contexts:
                got = convert.tree_from_proto(stub.Draft(convert.draft_request(ctx)).tree)
                assert got.same_as(both.draft(ctx)), ctx
                static = stub.Draft(convert.draft_request(ctx, tier="static")).tree
                assert convert.tree_from_proto(static).same_as(handle.state.store.draft(ctx))
                changed |= check_min_count_per_tier(stub, ctx, both, handle.state.store,
                                                    live_only)
        assert changed == {"both", "static", "live"}
        # Insert validation
        vocab = handle.state.store.vocab_size
        bad = pb.InsertRequest(sequences=[pb.TokenSequence(tokens=[1]),
                                          pb.TokenSequence(tokens=[2, vocab])])
        with pytest.raises(grpc.RpcError) as err:
            stub.Insert(bad)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "sequences[1].tokens[1]" in err.value.details()
        huge = pb.InsertRequest(sequences=[pb.TokenSequence(tokens=[1] * 1_000_001)])
        with pytest.raises(grpc.RpcError) as err:
            stub.Insert(huge)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        wrong = pb.InsertRequest(sequences=[pb.TokenSequence(tokens=[1])],
                                 tokenizer_fingerprint="0" * 64)
        with pytest.raises(grpc.RpcError) as err:
            stub.Insert(wrong)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert stub.Info(pb.InfoRequest()).live_sequences == len(inserted)  # nothing half-done
        check_random_inserts(stub, vocab, len(inserted))
        ch.close()
    # restart: everything acknowledged is still there
    shutil.rmtree(tmp_path / "both")
    with serve(tmp_path / "store", ServeSettings()) as handle:
        ch, stub = stub_for(handle.address)
        assert stub.Info(pb.InfoRequest()).live_sequences == stored[0]
        ch.close()


stored = [0]  # sequences acknowledged by test_server_merges_static_and_live_counts


def check_min_count_per_tier(stub, ctx, both, static, live_only, k: int = 3) -> set[str]:
    """min_count counts over exactly the tiers a draft reads: each tier's tree equals the
    in-process one of a store holding just those tokens. -> the tiers where backing off changed
    the tree (so the comparison shows min_count arrived)."""
    changed = set()
    for tier, reference in (("both", both), ("static", static), ("live", live_only)):
        reply = stub.Draft(convert.draft_request(ctx, tier=tier, budget=32, min_count=k))
        got = convert.tree_from_proto(reply.tree)
        assert got.same_as(reference.draft(ctx, budget=32, min_count=k)), (tier, ctx)
        if not got.same_as(reference.draft(ctx, budget=32)):
            changed.add(tier)
    return changed


def check_random_inserts(stub, vocab: int, already: int) -> None:
    """Hypothesis Inserts: OK exactly when every id is in the vocabulary, never INTERNAL, and
    live_sequences counts exactly the acknowledged non-empty sequences."""
    stored[0] = already

    @settings(max_examples=40, deadline=None)
    @given(st.lists(st.lists(st.one_of(st.integers(0, vocab - 1), st.integers(vocab, 2**32 - 1)),
                             max_size=20), max_size=5))
    def check(seqs):
        req = pb.InsertRequest(sequences=[pb.TokenSequence(tokens=s) for s in seqs])
        ok = all(t < vocab for s in seqs for t in s)
        try:
            reply = stub.Insert(req)
        except grpc.RpcError as exc:
            assert not ok and exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.details()
        else:
            assert ok and reply.sequences == sum(1 for s in seqs if s)
            stored[0] += reply.sequences
        assert stub.Info(pb.InfoRequest()).live_sequences == stored[0]

    check()
