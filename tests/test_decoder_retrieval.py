"""RetrievalDrafter over a real LMDB datastore; fingerprint check; remote failures; make_drafters.
The decodes compared with greedy run once per `device` (tests/conftest.py; cuda skipped without one)."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from builder.tokenizer import tokenizer_info
from datastore.tree import DraftTree
from decoder import DecoderSettings, SpeculativeDecoder
from decoder.drafters.registry import make_drafters
from decoder.drafters.retrieval import RetrievalDrafter, TokenizerMismatchError
from decoder_util import StubTokenizer, greedy, greedy_store, single_thread, tiny_model  # noqa: F401

pytestmark = pytest.mark.usefixtures("single_thread")
N = 24


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny model and a real datastore holding its greedy continuations of some prompts."""
    model = tiny_model("qwen2", "sdpa", seed=8)
    path = tmp_path_factory.mktemp("ds") / "store"
    ps, outs = greedy_store(model, path, seed=9, n_new=N + 8)  # 2 prompts unseen
    return model, ps, outs, path


@pytest.fixture(scope="module")
def on_device(world, device):
    """`world` with the model on `device` and its greedy references taken there (the datastore
    is the CPU world's: the same continuations for this peaked fp32 model)."""
    model, ps, outs, path = world
    if device == "cpu":
        return world
    moved = copy.deepcopy(model).to(device)
    return moved, ps, [greedy(moved, p, N + 8) for p in ps], path


def test_decode_with_real_datastore(on_device):
    model, ps, outs, path = on_device
    dec = SpeculativeDecoder(model, StubTokenizer(),
                             make_drafters(["retrieval"], datastore=str(path), tokenizer=StubTokenizer()),
                             DecoderSettings(budget=24))
    gens = [dec.generate(p, max_new_tokens=N) for p in ps]
    assert [g.token_ids for g in gens] == [o[:N] for o in outs]
    seen = np.mean([g.stats.tokens_per_step for g in gens[:6]])
    assert seen > 4, seen  # the datastore holds these continuations
    assert gens[0].stats.accepted_by_source["retrieval"] > N // 2
    batch = dec.generate_batch(ps, max_new_tokens=N)
    assert [g.token_ids for g in batch] == [o[:N] for o in outs]


def test_fingerprint_mismatch_names_both(world):
    _, _, _, path = world
    from datastore.store import Datastore

    with Datastore.open(path) as ds:
        with pytest.raises(TokenizerMismatchError) as err:
            RetrievalDrafter(ds, tokenizer_fingerprint="f" * 64)
        assert "f" * 64 in str(err.value) and ds.tokenizer["fingerprint"] in str(err.value)
        RetrievalDrafter(ds, tokenizer_fingerprint=ds.tokenizer["fingerprint"])  # the right one passes


class FlakyRemote:
    """Stands in for client.DraftClient: works for `good` calls, then the server is 'killed':
    like the real client it returns an empty tree and counts the failure (or raises, mode='raise')."""

    def __init__(self, store, good: int, mode: str = "empty"):
        self.store, self.good, self.mode, self.failures, self.calls = store, good, mode, 0, 0

    def info(self):
        return {"tokenizer": self.store.tokenizer}

    def draft(self, context, budget, max_depth, max_suffix, min_suffix, min_count):
        self.calls += 1
        if self.calls <= self.good:
            return self.store.draft(context, budget, max_depth, max_suffix, min_suffix, min_count=min_count)
        if self.mode == "raise":
            raise ConnectionError("server gone")
        self.failures += 1
        return DraftTree.empty()


@pytest.mark.parametrize("mode", ["empty", "raise"])
def test_remote_dies_mid_generation(on_device, mode):
    model, ps, outs, path = on_device
    from datastore.store import Datastore

    with Datastore.open(path) as ds:
        remote = FlakyRemote(ds, good=2, mode=mode)
        fp = tokenizer_info(StubTokenizer(), "x")["fingerprint"]
        dec = SpeculativeDecoder(model, StubTokenizer(), [RetrievalDrafter(remote, tokenizer_fingerprint=fp)],
                                 DecoderSettings(budget=8))
        g = dec.generate(ps[0], max_new_tokens=N)
    assert g.token_ids == outs[0][:N]
    assert g.stats.datastore_failures == remote.calls - 2 > 0
    assert g.stats.accepted_by_source.get("retrieval", 0) > 0  # the first two steps drafted


def test_make_drafters_errors(world):
    _, _, _, path = world
    with pytest.raises(ValueError, match="unknown drafter 'nope'"):
        make_drafters(["nope"])
    with pytest.raises(ValueError, match="needs a datastore"):
        make_drafters(["retrieval"])
    with pytest.raises(ValueError, match="not both"):
        make_drafters(["retrieval"], datastore=str(path), address="127.0.0.1:1")
    (d,) = make_drafters("retrieval", datastore=str(path), retrieval={"max_suffix": 8})
    assert isinstance(d, RetrievalDrafter) and d.max_suffix == 8


def test_min_count_reaches_the_datastore_and_decoding_stays_exact(on_device):
    """The drafter's min_count is the datastore's: its trees are Datastore.draft(min_count=k)'s, and
    they differ from the longest match's on some context of this store; every decode is exact."""
    model, ps, outs, path = on_device
    from datastore.store import Datastore

    with Datastore.open(path) as ds:
        contexts = [np.asarray(p + o[:j], dtype=np.int64) for p, o in zip(ps, outs) for j in (0, 3, 9)]
        for k in (1, 3):
            d = RetrievalDrafter(ds, min_count=k)
            got = [d.propose(0, c, 16, 6) for c in contexts]
            assert all(g.same_as(ds.draft(c[-16:], 16, 6, min_count=k)) for g, c in zip(got, contexts))
        rare = RetrievalDrafter(ds, min_count=1)
        backed = RetrievalDrafter(ds, min_count=3)
        assert any(backed.propose(0, c, 16, 6).match_len < rare.propose(0, c, 16, 6).match_len for c in contexts)
        dec = SpeculativeDecoder(model, StubTokenizer(), [backed], DecoderSettings(budget=12))
        assert [dec.generate(p, max_new_tokens=N).token_ids for p in ps] == [o[:N] for o in outs]
    with pytest.raises(ValueError, match="min_count"):
        RetrievalDrafter(None, min_count=0)


def test_settings_validation():
    for bad in ({"budget": 0}, {"budget": "big"}, {"max_depth": 0}, {"max_tree": -1},
                {"calibration_decay": 0.0}, {"dtype": "int8"}, {"eos_token_ids": (-1,)},
                {"count_smoothing": -1.0}, {"count_smoothing": float("nan")}):
        with pytest.raises(ValueError):
            DecoderSettings(**bad)
    assert DecoderSettings(budget=5, eos_token_ids=[3]).eos_token_ids == (3,)


def test_grpc_server_killed_mid_generation(on_device, tmp_path):
    """A real server on a loopback port, stopped after a few steps: same tokens, failures counted."""
    from builder.writer import write_datastore
    from client import DraftClient
    from datastore.serve_settings import ServeSettings
    from datastore.server import serve

    model, ps, outs, _ = on_device
    path = tmp_path / "served"  # its own copy: LMDB opens a path once per process
    docs = [np.asarray(p + o, dtype=np.int64) for p, o in zip(ps, outs)]
    write_datastore(path, docs, tokenizer_info(StubTokenizer(), "stub"))
    server = serve(path, ServeSettings(live=False))
    try:
        client = DraftClient(server.address, timeout=2.0)
        (drafter,) = make_drafters(["retrieval"], datastore=client, tokenizer=StubTokenizer())
        calls = {"n": 0}
        propose_batch = drafter.propose_batch  # the decoder drafts every step through it

        def killing_propose_batch(rows, contexts, budget, max_depths):
            calls["n"] += 1
            if calls["n"] == 3:
                server.stop(0)
            return propose_batch(rows, contexts, budget, max_depths)

        drafter.propose_batch = killing_propose_batch
        dec = SpeculativeDecoder(model, StubTokenizer(), [drafter], DecoderSettings(budget=4))
        g = dec.generate(ps[0], max_new_tokens=N)
    finally:
        server.stop(0)
    assert g.token_ids == outs[0][:N]
    assert g.stats.accepted_by_source.get("retrieval", 0) >= 4  # the two steps before the kill drafted
    assert g.stats.datastore_failures > 0 and g.stats.steps > 3


class BatchRemote(FlakyRemote):
    """A remote source with draft_batch (as client.DraftClient): one scalar max_depth per call;
    fails (raises) on call number `bad`."""

    def __init__(self, store, bad: int = 0):
        super().__init__(store, good=10**9)
        self.batches, self.bad = [], bad

    def draft_batch(self, contexts, budget, max_depth, max_suffix, min_suffix, min_count):
        assert isinstance(max_depth, int)
        self.batches.append((len(contexts), max_depth))
        if len(self.batches) == self.bad:
            raise ConnectionError("server gone")
        return [self.store.draft(c, budget, max_depth, max_suffix, min_suffix, min_count=min_count)
                for c in contexts]


def test_propose_batch_is_propose_row_by_row(world):
    """In process: one draft_batch call with per-row depths; remote: one call per distinct depth,
    and a failed call gives its rows empty trees, counted; the same trees as propose otherwise."""
    _, ps, outs, path = world
    from datastore.store import Datastore

    with Datastore.open(path) as ds:
        contexts = [np.asarray(p + o[:j], dtype=np.int64) for p, o in zip(ps, outs) for j in (0, 2, 7)]
        rows = list(range(len(contexts)))
        depths = [1 + i % 4 for i in rows]
        for drafter in (RetrievalDrafter(ds, min_count=3), RetrievalDrafter(ds, budget=5, max_depth=2)):
            want = [drafter.propose(r, c, 12, d) for r, c, d in zip(rows, contexts, depths)]
            calls = []
            real = ds.draft_batch
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(ds, "draft_batch", lambda *a, **k: calls.append(k) or real(*a, **k))
                got = drafter.propose_batch(rows, contexts, 12, depths)
            assert len(calls) == 1 and all(g.same_as(w) and g.source == "retrieval" for g, w in zip(got, want))
            assert sum(len(t) for t in got) > 20
        assert RetrievalDrafter(ds).propose_batch([], [], 8, []) == []
        remote = BatchRemote(ds, bad=2)
        drafter = RetrievalDrafter(remote)
        assert drafter.remote
        got = drafter.propose_batch(rows, contexts, 12, depths)
        assert sorted(d for _, d in remote.batches) == [1, 2, 3, 4]
        failed = {i for i in rows if depths[i] == 2}
        for i, tree in enumerate(got):
            if i in failed:
                assert len(tree) == 0 and tree.source == "retrieval"
            else:
                assert tree.same_as(RetrievalDrafter(ds).propose(i, contexts[i], 12, depths[i]))
        assert drafter.failures == len(failed)
        plain = FlakyRemote(ds, good=10**9)  # no draft_batch: the per-row loop of propose
        looped = RetrievalDrafter(plain).propose_batch(rows, contexts, 12, depths)
        assert plain.calls == len(rows)
        assert all(t.same_as(RetrievalDrafter(ds).propose(i, c, 12, d))
                   for i, (t, c, d) in enumerate(zip(looped, contexts, depths)))
