"""The gRPC service in process: real store from real text, real servers on loopback ports."""
from __future__ import annotations

import shutil
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings, strategies as st

from datastore.server import ServeSettings, serve
from datastore.store import Datastore
from protos import convert
from protos.channel import MAX_MESSAGE_BYTES
from protos.draftstore.v1 import draftstore_pb2 as pb
from server_support import build_store, make_ca_and_cert, sample_contexts, scrape, stub_for

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, smollm2_tokenizer):
    path = tmp_path_factory.mktemp("grpc") / "store"
    docs = build_store(path, smollm2_tokenizer)
    return path, docs


@pytest.fixture(scope="module")
def server(corpus):
    """Static tier only, so drafts must equal Datastore.draft exactly."""
    with serve(corpus[0], ServeSettings(live=False, metrics_port=0)) as handle:
        yield handle


@pytest.fixture(scope="module")
def store(server):
    """The server's own `Datastore` (py-lmdb opens one environment once per process), used
    in process as the reference."""
    assert isinstance(server.state.store, Datastore)
    return server.state.store


@pytest.fixture
def copy(corpus, tmp_path):
    """A private copy of the store for one more server in this process."""
    shutil.copytree(corpus[0], tmp_path / "copy")
    return tmp_path / "copy"


@pytest.fixture(scope="module")
def stub(server):
    ch, s = stub_for(server.address)
    yield s
    ch.close()


@pytest.fixture(scope="module")
def contexts(corpus, smollm2_tokenizer):
    return sample_contexts(smollm2_tokenizer, corpus[1], 120)


BIG_REPLIES = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]  # the slow batch's ~8 MB reply
SLOW_BUDGET = 16384  # 256 x 1024 nodes take the C kernel ~0.1 s here: a server allowing more


def slow_batch(store, n: int = 256, budget: int = SLOW_BUDGET) -> pb.DraftBatchRequest:
    """~1 s of work (on a server whose limit_budget allows SLOW_BUDGET): the largest trees from
    1-token suffixes (many matches each)."""
    first = store.indexes[0].tokens[:n].astype(np.int64)
    return pb.DraftBatchRequest(requests=[
        convert.draft_request([int(t) % store.vocab_size], budget=budget, max_depth=64,
                              max_suffix=1) for t in first])


def code_of(call) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


# --------------------------------------------------------------------------- equality


def test_draft_over_grpc_equals_in_process(stub, store, contexts):
    params = [dict(), dict(budget=8, max_depth=3), dict(budget=200, max_suffix=4, min_suffix=2),
              dict(budget=32, min_count=5)]
    nonempty = 0
    for i, ctx in enumerate(contexts):
        kw = params[i % len(params)]
        got = convert.tree_from_proto(stub.Draft(convert.draft_request(ctx, **kw)).tree)
        want = store.draft(ctx, **kw)
        assert got.same_as(want), (ctx, kw)
        nonempty += len(want) > 0
    assert nonempty > len(contexts) // 2  # the comparison is not between empty trees


def test_draft_batch_equals_single_calls(stub, contexts):
    reqs = [convert.draft_request(c, budget=16 + i) for i, c in enumerate(contexts[:64])]
    trees = stub.DraftBatch(pb.DraftBatchRequest(requests=reqs)).trees
    assert len(trees) == len(reqs)
    for req, tree in zip(reqs, trees):
        single = stub.Draft(req).tree
        assert convert.tree_from_proto(tree).same_as(convert.tree_from_proto(single))


def test_info_reports_the_store_and_limits(stub, store):
    info = stub.Info(pb.InfoRequest())
    assert info.tokenizer.fingerprint == store.tokenizer["fingerprint"]
    assert info.tokenizer.vocab_size == store.vocab_size
    assert (info.tokens, info.documents, info.shards) == (store.tokens, store.documents,
                                                          len(store.shards))
    assert info.shards > 1 and info.max_budget == ServeSettings().limit_budget


# --------------------------------------------------------------------------- status codes


def test_status_codes_for_bad_requests(stub, store):
    vocab, fp = store.vocab_size, store.tokenizer["fingerprint"]
    limits = ServeSettings()
    bad_argument = {
        "id == vocab_size (the separator)": convert.draft_request([1, vocab]),
        "id far out": convert.draft_request([2**32 - 1]),
        "budget 0": convert.draft_request([1], budget=0),
        "budget over": convert.draft_request([1], budget=limits.limit_budget + 1),
        "depth 0": convert.draft_request([1], max_depth=0),
        "depth over": convert.draft_request([1], max_depth=limits.limit_depth + 1),
        "min > max suffix": convert.draft_request([1], max_suffix=2, min_suffix=3),
        "min_count 0": convert.draft_request([1], min_count=0),
        "context too long": convert.draft_request([1] * (limits.limit_context + 1)),
        "unknown tier": pb.DraftRequest(context=[1], params=pb.DraftParams(tier=7)),
    }
    for what, req in bad_argument.items():
        with pytest.raises(grpc.RpcError) as err:
            stub.Draft(req)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, what
    err_text = pytest.raises(grpc.RpcError, stub.Draft, convert.draft_request([3, vocab + 5]))
    assert "context[1]" in err_text.value.details()  # names the field
    big = pb.DraftBatchRequest(requests=[convert.draft_request([1])] * (limits.limit_batch + 1))
    assert code_of(lambda: stub.DraftBatch(big)) == grpc.StatusCode.INVALID_ARGUMENT
    one_bad = pb.DraftBatchRequest(requests=[convert.draft_request([1]),
                                             convert.draft_request([vocab])])
    with pytest.raises(grpc.RpcError) as err:
        stub.DraftBatch(one_bad)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "requests[1].context[0]" in err.value.details()
    err_text = pytest.raises(grpc.RpcError, stub.Draft, convert.draft_request([1], min_count=0))
    assert "params.min_count = 0" in err_text.value.details()
    zero_count = pb.DraftBatchRequest(requests=[convert.draft_request([1]),
                                                convert.draft_request([1], min_count=0)])
    err_text = pytest.raises(grpc.RpcError, stub.DraftBatch, zero_count)
    assert err_text.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "requests[1].params.min_count" in err_text.value.details()
    # the tokenizer fingerprint: a mismatch is a precondition, the right one passes
    for call in (lambda: stub.Draft(convert.draft_request([1], fingerprint="0" * 64)),
                 lambda: stub.DraftBatch(pb.DraftBatchRequest(
                     requests=[convert.draft_request([1])], tokenizer_fingerprint="x")),
                 lambda: stub.Draft(convert.draft_request([1], tier="live"))):  # --no-live
        assert code_of(call) == grpc.StatusCode.FAILED_PRECONDITION
    assert code_of(lambda: stub.Draft(convert.draft_request([1], fingerprint=fp))) == \
        grpc.StatusCode.OK
    insert = pb.InsertRequest(sequences=[pb.TokenSequence(tokens=[1, 2])])
    assert code_of(lambda: stub.Insert(insert)) == grpc.StatusCode.FAILED_PRECONDITION


def test_empty_and_unmatched_contexts_give_empty_trees(stub):
    assert len(stub.Draft(pb.DraftRequest()).tree.tokens) == 0
    assert stub.Draft(pb.DraftRequest()).tree.match_len == 0


def test_deadline_stops_a_batch_between_items(server, stub, store):
    before = scrape(server.metrics_port).get(
        'draftstore_rpc_total{code="DEADLINE_EXCEEDED",method="DraftBatch"}', 0)
    start = time.perf_counter()
    assert code_of(lambda: stub.DraftBatch(slow_batch(store, budget=1024), timeout=0.15)) == \
        grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.perf_counter() - start < 1.0
    # the handler saw the deadline itself and stopped (else it would finish and count OK)
    key = 'draftstore_rpc_total{code="DEADLINE_EXCEEDED",method="DraftBatch"}'
    for _ in range(100):
        if scrape(server.metrics_port).get(key, 0) > before:
            break
        time.sleep(0.05)
    assert scrape(server.metrics_port).get(key, 0) == before + 1


def test_metrics_count_calls_by_code(server, stub):
    key_ok = 'draftstore_rpc_total{code="OK",method="Info"}'
    key_bad = 'draftstore_rpc_total{code="INVALID_ARGUMENT",method="Draft"}'
    before = scrape(server.metrics_port)
    for _ in range(3):
        stub.Info(pb.InfoRequest())
    code_of(lambda: stub.Draft(convert.draft_request([1], budget=0)))
    after = scrape(server.metrics_port)
    assert after[key_ok] == before.get(key_ok, 0) + 3
    assert after[key_bad] == before.get(key_bad, 0) + 1
    assert after['draftstore_rpc_latency_seconds_count{method="Info"}'] >= 3


# --------------------------------------------------------------------------- hypothesis


def expected_code(req: pb.DraftRequest, vocab: int, fp: str) -> grpc.StatusCode:
    """Naive oracle of the validation rules of DraftRequest (static-only server)."""
    s, p = ServeSettings(), req.params
    if req.HasField("tokenizer_fingerprint") and req.tokenizer_fingerprint != fp:
        return grpc.StatusCode.FAILED_PRECONDITION
    get = lambda name, default: getattr(p, name) if p.HasField(name) else default  # noqa: E731
    budget, depth = get("budget", s.budget), get("max_depth", s.max_depth)
    max_s, min_s = get("max_suffix", s.max_suffix), get("min_suffix", s.min_suffix)
    if (len(req.context) > s.limit_context or any(t >= vocab for t in req.context)
            or p.tier not in (0, 1, 2, 3) or not 1 <= budget <= s.limit_budget
            or not 1 <= depth <= s.limit_depth or not 1 <= max_s <= s.limit_context
            or not 1 <= min_s <= max_s or get("min_count", s.min_count) < 1):
        return grpc.StatusCode.INVALID_ARGUMENT
    if p.tier in (2, 3):
        return grpc.StatusCode.FAILED_PRECONDITION  # live tier disabled on this server
    return grpc.StatusCode.OK


@st.composite
def requests(draw, vocab: int, fp: str, pool: list[list[int]]):
    small = st.one_of(st.none(), st.integers(0, 80), st.integers(0, 2**32 - 1))
    if draw(st.booleans()):
        context = draw(st.sampled_from(pool))  # real text: deep trees
    else:
        context = draw(st.lists(st.one_of(st.integers(0, vocab - 1), st.integers(vocab, 2**32 - 1)),
                                max_size=30))
    if draw(st.integers(0, 30)) == 0:
        context = context * (4097 // max(len(context), 1) + 1)
    req = pb.DraftRequest(context=context, params=pb.DraftParams(
        tier=draw(st.sampled_from([0, 0, 0, 1, 2, 3, 9]))))
    for name in ("budget", "max_depth", "max_suffix", "min_suffix", "min_count"):
        value = draw(small)
        if value is not None:
            setattr(req.params, name, value)
    fingerprint = draw(st.sampled_from([None, None, fp, "nope"]))
    if fingerprint is not None:
        req.tokenizer_fingerprint = fingerprint
    return req


def test_random_requests_never_get_internal_and_trees_are_well_formed(stub, store, contexts):
    vocab, fp = store.vocab_size, store.tokenizer["fingerprint"]
    seen: set = set()

    @settings(max_examples=150, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(requests(vocab, fp, contexts))
    def check(req):
        want = expected_code(req, vocab, fp)
        try:
            tree = convert.tree_from_proto(stub.Draft(req).tree)  # raises if malformed
        except grpc.RpcError as exc:
            assert exc.code() == want, (exc.code(), exc.details())
            seen.add(want)
            return
        assert want == grpc.StatusCode.OK
        seen.add(want)
        p = convert.params_from_proto(req.params)
        kw = {k: v for k, v in p.items() if v is not None and k != "tier"}
        budget, depth = kw.get("budget", 64), kw.get("max_depth", 16)
        assert len(tree) <= budget and (len(tree) == 0 or tree.depths().max() <= depth)
        assert np.all(tree.tokens < vocab) and np.all(tree.counts > 0)
        assert tree.same_as(store.draft(list(req.context), **kw))

    check()
    assert {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.FAILED_PRECONDITION} <= seen


# --------------------------------------------------------------------------- admission, auth


def test_max_concurrent_rejects_instead_of_queueing(copy, store):
    with serve(copy, ServeSettings(live=False, max_concurrent=1, limit_budget=SLOW_BUDGET)) as handle:
        ch, s = stub_for(handle.address, options=BIG_REPLIES)
        slow = s.DraftBatch.future(slow_batch(store))
        time.sleep(0.3)  # the slow call holds the only slot
        assert not slow.done()
        with pytest.raises(grpc.RpcError) as err:
            s.Draft(convert.draft_request([1, 2]))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert len(slow.result(timeout=30).trees) == 256
        assert s.Draft(convert.draft_request([1, 2])).tree is not None  # slot free again
        ch.close()


def test_auth_none_wrong_right(copy):
    with serve(copy, ServeSettings(live=False, auth_token="s3cret")) as handle:
        ch, s = stub_for(handle.address)
        req = convert.draft_request([1, 2])
        assert code_of(lambda: s.Draft(req)) == grpc.StatusCode.UNAUTHENTICATED
        wrong = (("authorization", "Bearer s3creT"),)
        assert code_of(lambda: s.Draft(req, metadata=wrong)) == grpc.StatusCode.UNAUTHENTICATED
        right = (("authorization", "Bearer s3cret"),)
        assert code_of(lambda: s.Draft(req, metadata=right)) == grpc.StatusCode.OK
        assert code_of(lambda: s.Info(pb.InfoRequest(), metadata=right)) == grpc.StatusCode.OK
        # health stays open for load balancers
        health = health_pb2_grpc.HealthStub(ch)
        assert health.Check(health_pb2.HealthCheckRequest()).status == SERVING
        ch.close()


def test_tls_round_trip_and_client_certificates(copy, store, tmp_path):
    pem = make_ca_and_cert(tmp_path)
    ca, req = pem["ca"].read_bytes(), convert.draft_request([1, 2, 3])
    want = store.draft([1, 2, 3])
    tls = ServeSettings(live=False, tls_cert=str(pem["server"]), tls_key=str(pem["server_key"]))
    with serve(copy, tls) as handle:
        ch, s = stub_for(f"localhost:{handle.port}", grpc.ssl_channel_credentials(ca))
        assert convert.tree_from_proto(s.Draft(req, timeout=10).tree).same_as(want)
        ch.close()
        plain, s = stub_for(f"localhost:{handle.port}")
        assert code_of(lambda: s.Draft(req, timeout=2)) == grpc.StatusCode.UNAVAILABLE
        plain.close()
    mtls = ServeSettings(live=False, tls_cert=str(pem["server"]), tls_key=str(pem["server_key"]),
                         tls_client_ca=str(pem["ca"]))
    with serve(copy, mtls) as handle:
        ch, s = stub_for(f"localhost:{handle.port}", grpc.ssl_channel_credentials(ca))
        assert code_of(lambda: s.Draft(req, timeout=2)) == grpc.StatusCode.UNAVAILABLE
        ch.close()
        creds = grpc.ssl_channel_credentials(ca, pem["client_key"].read_bytes(),
                                             pem["client"].read_bytes())
        ch, s = stub_for(f"localhost:{handle.port}", creds)
        assert convert.tree_from_proto(s.Draft(req, timeout=10).tree).same_as(want)
        ch.close()


# --------------------------------------------------------------------------- health, data loss


def test_health_goes_serving_once_the_store_is_verified(copy):
    handle = serve(copy, ServeSettings(live=False), wait_ready=False)
    try:
        ch, s = stub_for(handle.address)
        health = health_pb2_grpc.HealthStub(ch)
        first = health.Check(health_pb2.HealthCheckRequest(service="draftstore.v1.DraftService"))
        assert first.status == NOT_SERVING  # the verifier child alone takes ~0.3 s
        assert code_of(lambda: s.Info(pb.InfoRequest())) == grpc.StatusCode.UNAVAILABLE
        handle.wait_ready(60)
        assert health.Check(health_pb2.HealthCheckRequest()).status == SERVING
        assert s.Info(pb.InfoRequest()).tokens > 0
        ch.close()
    finally:
        handle.stop(0)


def test_corrupt_store_stays_not_serving_and_answers_data_loss(corpus, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(corpus[0], bad)
    data = bad / "data.mdb"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])  # truncated
    with pytest.raises(Exception) as err:
        serve(bad, ServeSettings(live=False))
    assert "bad" in str(err.value)
    handle = serve(bad, ServeSettings(live=False), wait_ready=False)
    try:
        with pytest.raises(Exception):
            handle.wait_ready(60)
        ch, s = stub_for(handle.address)
        health = health_pb2_grpc.HealthStub(ch)
        assert health.Check(health_pb2.HealthCheckRequest()).status == NOT_SERVING
        with pytest.raises(grpc.RpcError) as rpc:
            s.Draft(convert.draft_request([1]))
        assert rpc.value.code() == grpc.StatusCode.DATA_LOSS and "bad" in rpc.value.details()
        ch.close()
    finally:
        handle.stop(0)


def test_settings_are_validated():
    for bad in (dict(port=70000), dict(max_concurrent=0), dict(tls_cert="x"),
                dict(budget=0), dict(min_suffix=5, max_suffix=4), dict(auth_token=" "),
                dict(min_count=0)):
        with pytest.raises(ValueError):
            ServeSettings(**bad)


def test_random_batches_get_the_first_failing_items_code(stub, store, contexts):
    vocab, fp = store.vocab_size, store.tokenizer["fingerprint"]

    @settings(max_examples=40, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(requests(vocab, fp, contexts), max_size=6))
    def check(items):
        codes = [expected_code(r, vocab, fp) for r in items]
        want = next((c for c in codes if c != grpc.StatusCode.OK), grpc.StatusCode.OK)
        try:
            trees = stub.DraftBatch(pb.DraftBatchRequest(requests=items)).trees
        except grpc.RpcError as exc:
            assert exc.code() == want, (exc.code(), exc.details())
            return
        assert want == grpc.StatusCode.OK and len(trees) == len(items)
        for req, tree in zip(items, trees):
            kw = {k: v for k, v in convert.params_from_proto(req.params).items()
                  if v is not None and k != "tier"}
            assert convert.tree_from_proto(tree).same_as(store.draft(list(req.context), **kw))

    check()


def test_reflection_lists_the_services(copy):
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    with serve(copy, ServeSettings(live=False, reflection=True)) as handle:
        ch, _ = stub_for(handle.address)
        services = set(ProtoReflectionDescriptorDatabase(ch).get_services())
        assert {"draftstore.v1.DraftService", "grpc.health.v1.Health"} <= services
        ch.close()


def test_serve_an_already_open_datastore_and_leave_it_open(store, contexts):
    with serve(store, ServeSettings(live=False)) as handle:
        ch, s = stub_for(handle.address)
        for ctx in contexts[:10]:
            tree = convert.tree_from_proto(s.Draft(convert.draft_request(ctx)).tree)
            assert tree.same_as(store.draft(ctx))
        ch.close()
    assert store.draft(contexts[0]).same_as(store.draft(contexts[0]))  # still open
