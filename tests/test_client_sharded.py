"""ShardedClient over two real servers, each serving one half of a corpus, against one datastore
of the whole corpus."""
from __future__ import annotations

import shutil
import time

import pytest

from builder.tokenizer import tokenizer_info
from builder.writer import write_datastore
from client import DraftClient, DraftServiceError, ShardedClient
from client.sharded import merge_shards, shard_for
from datastore.server import ServeSettings, serve
from datastore.store import Datastore
from server_support import build_store, sample_contexts
from client_support import slow_server

MODULES = ("textwrap.py", "shlex.py", "fnmatch.py")  # small: shard trees can be complete
SHARD_BUDGET = 1024  # the server's limit; a shard tree below it is complete
BUDGET, DEPTH = 24, 6


@pytest.fixture(scope="module")
def stores(tmp_path_factory, smollm2_tokenizer):
    root = tmp_path_factory.mktemp("sharded")
    docs = build_store(root / "whole", smollm2_tokenizer, modules=MODULES)
    info = tokenizer_info(smollm2_tokenizer, "smollm2")
    half = len(docs) // 2
    write_datastore(root / "a", docs[:half], info, shard_tokens=20_000)
    write_datastore(root / "b", docs[half:], info, shard_tokens=20_000)
    return root, docs


@pytest.fixture(scope="module")
def servers(stores):
    root, _ = stores
    with serve(root / "a", ServeSettings(live=False)) as a, \
            serve(root / "b", ServeSettings(live=False)) as b:
        yield a, b


@pytest.fixture(scope="module")
def whole(stores):
    with Datastore.open(stores[0] / "whole") as ds:
        yield ds


@pytest.fixture(scope="module")
def contexts(stores, smollm2_tokenizer):
    return sample_contexts(smollm2_tokenizer, stores[1], 80, seed=7)


def complete(servers, ctx) -> bool:
    """Both shards' trees hold every node up to DEPTH (so no count can be cut off)."""
    return all(len(s.state.store.draft(ctx, SHARD_BUDGET, DEPTH)) < SHARD_BUDGET for s in servers)


def test_two_shards_give_the_trees_of_one_whole_datastore(servers, whole, contexts):
    usable = [c for c in contexts if complete(servers, c)]
    assert len(usable) >= len(contexts) // 2, len(usable)
    targets = [s.address for s in servers]
    with ShardedClient(targets, timeout=5.0, overfetch=SHARD_BUDGET // BUDGET) as sc:
        for ctx in usable:
            got = sc.draft(ctx, budget=BUDGET, max_depth=DEPTH)
            want = whole.draft(ctx, BUDGET, DEPTH)
            assert got.same_as(want), ctx
        batch = sc.draft_batch(usable, budget=BUDGET, max_depth=DEPTH)
        assert all(t.same_as(whole.draft(c, BUDGET, DEPTH)) for t, c in zip(batch, usable))
        assert sc.failures == 0, sc.failures_by_code
    nonempty = sum(len(whole.draft(c, BUDGET, DEPTH)) > 0 for c in usable)
    assert nonempty >= len(usable) // 3  # the comparison is not between empty trees
    # and both shards contribute: neither half alone gives the whole's trees everywhere
    for s in servers:
        alone = [s.state.store.draft(c, BUDGET, DEPTH) for c in usable]
        assert not all(a.same_as(whole.draft(c, BUDGET, DEPTH)) for a, c in zip(alone, usable))


def test_min_count_reaches_every_shard(servers, contexts):
    """Each shard backs off on its own counts (module docstring): the sharded tree is the merge
    of the shards' own min_count trees, and differs from the min_count=1 one somewhere."""
    k, b = 3, SHARD_BUDGET
    with ShardedClient([s.address for s in servers], timeout=5.0,
                       overfetch=SHARD_BUDGET // BUDGET) as sc:
        got = [sc.draft(c, budget=BUDGET, max_depth=DEPTH, min_count=k) for c in contexts]
        batch = sc.draft_batch(contexts, budget=BUDGET, max_depth=DEPTH, min_count=k)
        plain = sc.draft_batch(contexts, budget=BUDGET, max_depth=DEPTH)
        assert sc.failures == 0, sc.failures_by_code
    for ctx, g, t in zip(contexts, got, batch):
        shards = [s.state.store.draft(ctx, b, DEPTH, min_count=k) for s in servers]
        want = merge_shards(shards, BUDGET, DEPTH)
        assert g.same_as(want) and t.same_as(want), ctx
    assert any(not g.same_as(p) for g, p in zip(got, plain))


def test_info_is_aggregated(servers, whole):
    with ShardedClient([s.address for s in servers], timeout=5.0) as sc:
        info = sc.info()
    assert info.tokens == whole.tokens and info.documents == whole.documents
    assert info.fingerprint == whole.tokenizer["fingerprint"]
    assert info.targets == tuple(s.address for s in servers)


def test_a_missing_shard_is_tolerated_and_counted(servers, contexts, free_port):
    a = servers[0]
    dead = f"127.0.0.1:{free_port}"
    with ShardedClient([a.address, dead], timeout=1.0, overfetch=8) as sc, \
            DraftClient(a.address, timeout=5.0) as one:
        start = time.monotonic()
        for ctx in contexts[:20]:
            got = sc.draft(ctx, budget=BUDGET, max_depth=DEPTH)
            # the live shard's tree alone, re-selected: what one shard's server gives
            assert got.same_as(one.draft(ctx, budget=BUDGET, max_depth=DEPTH)), ctx
        assert time.monotonic() - start < 20 * 0.2  # the dead shard costs nothing per call
        batch = sc.draft_batch(contexts[:5], budget=BUDGET, max_depth=DEPTH)
        assert len(batch) == 5
        assert sc.failures == 21 and sc.failures_by_target[dead] == 21
        assert sc.failures_by_target[a.address] == 0
        with pytest.raises(DraftServiceError):
            sc.info(timeout=1.0)


def test_all_shards_missing_gives_empty_trees(free_port):
    with ShardedClient([f"127.0.0.1:{free_port}", f"127.0.0.1:{free_port + 1}"],
                       timeout=0.2) as sc:
        assert len(sc.draft([1, 2, 3])) == 0
        assert [len(t) for t in sc.draft_batch([[1], [2]])] == [0, 0]
        assert sc.failures == 4


def test_repeated_targets_are_refused():
    with pytest.raises(ValueError, match="repeat"):
        ShardedClient(["127.0.0.1:1", "127.0.0.1:1"])


def test_insert_goes_to_the_hashed_shard(stores, tmp_path):
    root, _ = stores
    for name in ("a", "b"):
        shutil.copytree(root / name, tmp_path / name)
    with serve(tmp_path / "a", ServeSettings(live=True)) as a, \
            serve(tmp_path / "b", ServeSettings(live=True)) as b, \
            ShardedClient([a.address, b.address], timeout=5.0) as sc:
        batches = [[[40100 + i, 40200, 40300 + i]] for i in range(6)]
        for seqs in batches:
            assert sc.insert(seqs) == 1
        live = [s.state.live.sequences for s in (a, b)]
        expected = [sum(shard_for(q, 2) == k for q in batches) for k in (0, 1)]
        assert live == expected and sum(live) == 6
        # every insert is drafted through the sharded client, whichever shard holds it
        for i in range(6):
            tree = sc.draft([40100 + i, 40200], budget=4)
            assert tree.paths() == {(40300 + i,): 1}, i


def test_round_robin_spreads_calls_over_replicas(stores, tmp_path):
    """Two replicas of one shard behind one target; pick_first would send everything to one."""
    root, _ = stores
    for name in ("r1", "r2"):
        shutil.copytree(root / "a", tmp_path / name)
    with serve(tmp_path / "r1", ServeSettings(live=True)) as r1, \
            serve(tmp_path / "r2", ServeSettings(live=True)) as r2:
        target = f"ipv4:127.0.0.1:{r1.port},127.0.0.1:{r2.port}"
        for policy, spread in (("round_robin", True), ("pick_first", False)):
            before = [r.state.live.sequences for r in (r1, r2)]
            with DraftClient(target, timeout=5.0, load_balancing=policy) as c:
                c.info()
                time.sleep(0.3)  # round_robin connects every address; let both be READY
                for i in range(8):
                    assert c.insert([[40500 + i, 40600]]) == 1
            got = [r.state.live.sequences - b for r, b in zip((r1, r2), before)]
            assert sum(got) == 8
            assert (min(got) > 0) == spread, (policy, got)


@pytest.fixture
def slow_shard():
    with slow_server() as address:
        yield address


def test_one_deadline_over_all_shards(servers, slow_shard, contexts):
    """A late shard costs the call its deadline, not more; the others' trees still merge."""
    a = servers[0]
    with ShardedClient([a.address, slow_shard], timeout=0.1, overfetch=8) as sc, \
            DraftClient(a.address, timeout=5.0) as one:
        for ctx in contexts[:5]:
            start = time.monotonic()
            got = sc.draft(ctx, budget=BUDGET, max_depth=DEPTH)
            took = time.monotonic() - start
            assert took < 0.1 + 0.1, took
            assert got.same_as(one.draft(ctx, budget=BUDGET, max_depth=DEPTH))
        start = time.monotonic()
        batch = sc.draft_batch(contexts[:5], budget=BUDGET, max_depth=DEPTH)
        assert time.monotonic() - start < 0.1 + 0.1
        assert all(t.same_as(one.draft(c, budget=BUDGET, max_depth=DEPTH))
                   for t, c in zip(batch, contexts[:5]))
        assert sc.failures_by_target == {a.address: 0, slow_shard: 6}
        assert set(sc.failures_by_code) <= {"DEADLINE_EXCEEDED", "CIRCUIT_OPEN"}
