"""DraftClient and AsyncDraftClient against real in-process servers over loopback: equality with
Datastore.draft, batches, the async twin, auth, TLS, fingerprints, deadlines, inserts, and the
never-raise policy."""
from __future__ import annotations

import asyncio
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from client import AsyncDraftClient, DraftClient, DraftServiceError, TlsConfig
from datastore.server import ServeSettings, serve
from server_support import build_store, make_ca_and_cert, sample_contexts
from client_support import flaky_server, slow_server

SLACK_S = 0.25  # scheduling slack on this shared 2-core machine


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, smollm2_tokenizer):
    path = tmp_path_factory.mktemp("client") / "store"
    docs = build_store(path, smollm2_tokenizer)
    return path, docs


@pytest.fixture(scope="module")
def server(corpus):
    """Static tier only, so drafts must equal Datastore.draft exactly."""
    with serve(corpus[0], ServeSettings(live=False)) as handle:
        yield handle


@pytest.fixture(scope="module")
def store(server):
    return server.state.store  # the server's own Datastore: the in-process reference


@pytest.fixture(scope="module")
def contexts(corpus, smollm2_tokenizer):
    return sample_contexts(smollm2_tokenizer, corpus[1], 80, seed=3)


@pytest.fixture(scope="module")
def client(server):
    with DraftClient(server.address, timeout=5.0) as c:
        yield c


PARAMS = [dict(), dict(budget=8, max_depth=3), dict(budget=200, max_depth=32, max_suffix=24),
          dict(budget=16, max_suffix=4, min_suffix=2)]


@pytest.mark.parametrize("params", PARAMS)
def test_draft_equals_datastore_draft(client, store, contexts, params):
    for ctx in contexts:
        got = client.draft(ctx, **params)
        want = store.draft(ctx, **params)
        assert got.same_as(want), (ctx, params)
        assert got.source == want.source
    assert client.failures == 0, client.failures_by_code
    assert sum(len(client.draft(c)) > 0 for c in contexts) > len(contexts) // 2  # not all empty


def test_draft_accepts_numpy_and_torch_contexts(client, store, contexts):
    ctx = contexts[0]
    want = store.draft(ctx)
    assert client.draft(np.asarray(ctx, dtype=np.int32)).same_as(want)
    assert client.draft(torch.tensor(ctx)).same_as(want)


def test_draft_batch_equals_single_calls(client, contexts):
    singles = [client.draft(c, budget=32) for c in contexts]
    batch = client.draft_batch(contexts, budget=32)
    assert len(batch) == len(contexts)
    assert all(a.same_as(b) for a, b in zip(batch, singles))
    assert client.draft_batch([]) == []


def test_draft_batch_is_split_into_server_sized_calls(server, store, contexts):
    with DraftClient(server.address, timeout=5.0, max_batch=7) as c:
        batch = c.draft_batch(contexts[:30])
        assert all(a.same_as(store.draft(x)) for a, x in zip(batch, contexts[:30]))
        assert c.calls == 5 and c.failures == 0


def test_async_twin_equals_sync(server, client, contexts):
    async def run():
        async with AsyncDraftClient(server.address, timeout=5.0) as ac:
            info = await ac.info()
            singles = await asyncio.gather(*(ac.draft(c, budget=24) for c in contexts))
            batch = await ac.draft_batch(contexts, budget=24)
            return info, singles, batch, ac.failures

    info, singles, batch, failures = asyncio.run(run())
    assert failures == 0
    assert info == client.info()
    sync = [client.draft(c, budget=24) for c in contexts]
    assert all(a.same_as(b) for a, b in zip(singles, sync))
    assert all(a.same_as(b) for a, b in zip(batch, sync))


@pytest.mark.parametrize("k", [1, 2, 5])
def test_min_count_travels_and_equals_datastore_draft(server, client, store, contexts, k):
    """Drafts, batches and the async twin with min_count=k equal Datastore.draft(min_count=k);
    for k > 1 some trees differ from k = 1, so the parameter demonstrably reaches the server."""
    want = [store.draft(c, budget=32, min_count=k) for c in contexts]
    singles = [client.draft(c, budget=32, min_count=k) for c in contexts]
    batch = client.draft_batch(contexts, budget=32, min_count=k)
    for ctx, w, s, b in zip(contexts, want, singles, batch):
        assert s.same_as(w) and b.same_as(w), (ctx, k)

    async def run():
        async with AsyncDraftClient(server.address, timeout=5.0) as ac:
            return (await asyncio.gather(*(ac.draft(c, budget=32, min_count=k)
                                           for c in contexts[:20])),
                    await ac.draft_batch(contexts[:20], budget=32, min_count=k))

    async_singles, async_batch = asyncio.run(run())
    assert all(a.same_as(w) and b.same_as(w)
               for a, b, w in zip(async_singles, async_batch, want[:20]))
    assert client.failures == 0, client.failures_by_code
    plain = [client.draft(c, budget=32) for c in contexts]
    backed_off = sum(w.match_len < p.match_len for w, p in zip(want, plain))
    assert backed_off == 0 if k == 1 else backed_off >= 3, (backed_off, len(contexts))
    assert sum(len(w) > 0 for w in want) > len(contexts) // 2  # not all empty


def test_min_count_below_one_is_never_sent(server):
    with DraftClient(server.address, timeout=5.0) as c:
        assert len(c.draft([1, 2], min_count=0)) == 0
        assert [len(t) for t in c.draft_batch([[1], [2]], min_count=0)] == [0, 0]
        assert c.failures_by_code == {"CLIENT_ERROR": 2} and "min_count" in c.last_error


def test_info_reports_the_store(client, store):
    info = client.info()
    assert info.fingerprint == store.tokenizer["fingerprint"]
    assert info.tokens == store.tokens and info.documents == store.documents
    assert info.shards == len(store.shards) and info.max_budget >= 64


def test_bad_requests_give_empty_trees_and_counted_failures(server):
    with DraftClient(server.address, timeout=5.0) as c:
        assert len(c.draft([10**9])) == 0  # outside the vocabulary: INVALID_ARGUMENT
        assert len(c.draft([[1, 2]])) == 0  # 2-D: never sent
        assert len(c.draft([1, 2], budget=10**6)) == 0  # over the server's limit
        assert [len(t) for t in c.draft_batch([[1], [10**9]])] == [0, 0]
        assert c.failures == 4
        assert c.failures_by_code == {"INVALID_ARGUMENT": 3, "CLIENT_ERROR": 1}
        assert "outside the vocabulary" in c.last_error
        assert len(c.draft([1, 2], budget=0)) == 0 and c.failures == 4  # nothing asked


def test_fingerprint_mismatch_is_failed_precondition(server, store, contexts):
    with DraftClient(server.address, timeout=5.0, tokenizer_fingerprint="0" * 64) as c:
        assert len(c.draft(contexts[0])) == 0
        assert c.failures_by_code == {"FAILED_PRECONDITION": 1}
        with pytest.raises(DraftServiceError) as err:
            c.insert([[1, 2, 3]])
        assert err.value.code == "FAILED_PRECONDITION"
    good = store.tokenizer["fingerprint"]
    with DraftClient(server.address, timeout=5.0, tokenizer_fingerprint=good) as c:
        assert c.draft(contexts[0]).same_as(store.draft(contexts[0])) and c.failures == 0


def test_deadline_is_kept_and_counted():
    """A server that answers after 1 s, asked with a 30 ms deadline."""
    with slow_server() as address, DraftClient(address, timeout=0.03) as c:
        c.info()  # connect first: the deadline under test is the call's, not the handshake's
        for call in (lambda: [c.draft([1, 2])], lambda: c.draft_batch([[1], [2], [3]])):
            start = time.monotonic()
            trees = call()
            took = time.monotonic() - start
            assert took < 0.03 + SLACK_S, took
            assert trees and all(len(t) == 0 for t in trees)
        assert c.failures_by_code == {"DEADLINE_EXCEEDED": 2}


@pytest.mark.parametrize("code, fail, attempts, ok", [
    (grpc.StatusCode.UNAVAILABLE, 2, 3, True),  # retried inside the deadline, then answered
    (grpc.StatusCode.UNAVAILABLE, 5, 3, False),  # maxAttempts 3, then given up
    (grpc.StatusCode.RESOURCE_EXHAUSTED, 1, 1, False),  # a real answer: never retried
    (grpc.StatusCode.INTERNAL, 1, 1, False),
])
def test_only_unavailable_is_retried(code, fail, attempts, ok):
    with flaky_server(code, fail) as (address, service), \
            DraftClient(address, timeout=2.0) as c:
        tree = c.draft([1, 2])
        assert service.attempts == attempts
        assert (len(tree) == 1) == ok
        assert c.failures_by_code == ({} if ok else {code.name: 1})


def test_server_not_there_fails_fast_and_never_raises(free_port):
    with DraftClient(f"127.0.0.1:{free_port}", timeout=0.5, breaker_cooldown_s=5) as c:
        start = time.monotonic()
        for _ in range(20):
            assert len(c.draft([1, 2, 3])) == 0
        took = time.monotonic() - start
        # UNAVAILABLE comes back at once (connection refused), and after 3 the breaker skips
        assert took < 0.5, took
        assert c.failures == 20
        codes = c.failures_by_code
        assert codes["UNAVAILABLE"] == 3 and codes["CIRCUIT_OPEN"] == 17, codes
        with pytest.raises(DraftServiceError) as err:
            c.info(timeout=1)
        assert err.value.code == "UNAVAILABLE" and str(free_port) in str(err.value)
        assert c.insert([[1, 2]], raise_on_error=False) == 0


# ------------------------------------------------------------------------- live tier


@pytest.fixture
def live_server(corpus, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(corpus[0], store)
    with serve(store, ServeSettings(live=True)) as handle:
        yield handle


def test_insert_is_drafted_from(live_server):
    novel = [[40001, 40002, 40003, 40004, 40005]] * 3
    with DraftClient(live_server.address, timeout=5.0) as c:
        before = c.draft([40001, 40002], budget=8)
        assert c.insert(novel) == 3
        after = c.draft([40001, 40002], budget=8)
        assert c.info().live_sequences == 3
    assert len(before) == 0
    assert after.paths()[(40003,)] == 3 and after.match_len == 2
    assert after.paths()[(40003, 40004, 40005)] == 3


def test_async_insert(live_server):
    async def run():
        async with AsyncDraftClient(live_server.address, timeout=5.0) as ac:
            n = await ac.insert([[40011, 40012, 40013]])
            tree = await ac.draft([40011, 40012], budget=4)
            with pytest.raises(DraftServiceError):
                await ac.insert([[10**9]])
            return n, tree, await ac.insert([[10**9]], raise_on_error=False)

    n, tree, bad = asyncio.run(run())
    assert n == 1 and tree.paths() == {(40013,): 1} and bad == 0


# ------------------------------------------------------------------------- auth and TLS


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_ca_and_cert(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure_server(corpus, certs, tmp_path_factory):
    store = tmp_path_factory.mktemp("secure") / "store"
    shutil.copytree(corpus[0], store)
    s = ServeSettings(live=False, auth_token="s3cret", tls_cert=str(certs["server"]),
                      tls_key=str(certs["server_key"]), tls_client_ca=str(certs["ca"]))
    with serve(store, s) as handle:
        yield handle


def tls(certs, client_cert: bool = True) -> TlsConfig:
    if not client_cert:
        return TlsConfig(root_cert=certs["ca"])
    return TlsConfig(root_cert=certs["ca"], client_cert=certs["client"],
                     client_key=certs["client_key"])


def test_tls_and_auth_round_trip(secure_server, store, contexts, certs):
    with DraftClient(secure_server.address, timeout=5.0, auth_token="s3cret",
                     tls=tls(certs)) as c:
        assert all(c.draft(x).same_as(store.draft(x)) for x in contexts[:10])
        assert c.info().tokens == store.tokens and c.failures == 0


@pytest.mark.parametrize("token, code", [(None, "UNAUTHENTICATED"), ("wrong", "UNAUTHENTICATED")])
def test_missing_or_wrong_token(secure_server, certs, contexts, token, code):
    with DraftClient(secure_server.address, timeout=5.0, auth_token=token, tls=tls(certs)) as c:
        assert len(c.draft(contexts[0])) == 0
        assert c.failures_by_code == {code: 1}
        with pytest.raises(DraftServiceError) as err:
            c.info()
        assert err.value.code == code


def test_tls_without_client_cert_or_plaintext_fails_cleanly(secure_server, certs, contexts):
    with DraftClient(secure_server.address, timeout=2.0, auth_token="s3cret",
                     tls=tls(certs, client_cert=False)) as c:
        assert len(c.draft(contexts[0])) == 0 and c.failures == 1
    with DraftClient(secure_server.address, timeout=2.0, auth_token="s3cret") as c:
        assert len(c.draft(contexts[0])) == 0 and c.failures == 1


def test_dns_target_with_round_robin(server, store, contexts):
    """The replica form of a target (README): dns:///name:port plus round_robin."""
    with DraftClient(f"dns:///localhost:{server.port}", timeout=5.0,
                     load_balancing="round_robin") as c:
        assert all(c.draft(x).same_as(store.draft(x)) for x in contexts[:10])
        assert c.failures == 0, c.failures_by_code


# ------------------------------------------------------------------------- properties


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    context=st.lists(st.integers(0, 49_151), min_size=0, max_size=20),
    budget=st.integers(1, 80), max_depth=st.integers(1, 20),
    min_suffix=st.integers(1, 4), extra=st.integers(0, 8),
    foreign=st.booleans(),
)
def test_any_context_gives_the_datastore_tree_or_a_counted_empty_one(
        client, store, context, budget, max_depth, min_suffix, extra, foreign):
    """Random ids (some outside the vocabulary): equal to Datastore.draft when valid, else an
    empty tree and exactly one more failure, never an exception."""
    if foreign:
        context = context + [store.vocab_size + extra]
    before = client.failures
    got = client.draft(context, budget, max_depth, min_suffix + extra, min_suffix)
    if foreign:
        assert len(got) == 0 and client.failures == before + 1
        assert client.failures_by_code.get("INVALID_ARGUMENT", 0) >= 1
    else:
        assert got.same_as(store.draft(context, budget, max_depth, min_suffix + extra, min_suffix))
        assert client.failures == before


def test_one_client_shared_by_threads(client, store, contexts):
    def work(i: int) -> bool:
        return all(client.draft(c, budget=16).same_as(store.draft(c, budget=16))
                   for c in contexts[i::4])

    before = client.failures
    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(work, range(4)))
    assert client.failures == before


def test_retrieval_drafter_takes_a_client(server, store, contexts):
    """The decoder's RetrievalDrafter checks the fingerprint through info() and drafts remotely."""
    from decoder.drafters.retrieval import RetrievalDrafter, TokenizerMismatchError

    fp = store.tokenizer["fingerprint"]
    with DraftClient(server.address, timeout=5.0) as c:
        drafter = RetrievalDrafter(c, tokenizer_fingerprint=fp)
        ctx = np.asarray(contexts[0], dtype=np.int64)
        tree = drafter.propose(0, ctx, 32, 8)
        want = store.draft(ctx, 32, 8, min_count=drafter.min_count)  # its back-off travels too
        assert np.array_equal(tree.tokens, want.tokens)
        assert np.array_equal(tree.counts, want.counts)
        with pytest.raises(TokenizerMismatchError):
            RetrievalDrafter(c, tokenizer_fingerprint="f" * 64)


def test_async_client_with_the_server_down_never_raises(free_port):
    async def run():
        async with AsyncDraftClient(f"127.0.0.1:{free_port}", timeout=0.5) as ac:
            start = time.monotonic()
            trees = [await ac.draft([1, 2, 3]) for _ in range(10)]
            batch = await ac.draft_batch([[1], [2]])
            took = time.monotonic() - start
            with pytest.raises(DraftServiceError) as err:
                await ac.info(timeout=1)
            return trees, batch, took, ac.failures_by_code, err.value.code

    trees, batch, took, codes, info_code = asyncio.run(run())
    assert all(len(t) == 0 for t in trees + batch) and took < 0.5, took
    assert codes == {"UNAVAILABLE": 3 + 1, "CIRCUIT_OPEN": 8}, codes  # + 1: info()
    assert info_code == "UNAVAILABLE"
