"""Client pieces without a server: settings, service config, breaker, the shard merge against
one index of the whole corpus, the insert hash, the query CLI's tree rendering."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from client.failures import Breaker, CallGuard, code_of
from client.messages import batch_request, chunks, draft_request, insert_request, DraftArgs
from client.query_cli import render_tree
from client.settings import ClientSettings, TlsConfig, channel_options, service_config
from client.sharded import ShardedSettings, merge_shards, shard_for
from datastore.index import draft_from
from datastore.tree import DraftTree
from datastore_naive import make_index

SEP = 50  # token ids below; the separator is outside them


# ------------------------------------------------------------------------- settings


def test_service_config_retries_only_unavailable_and_sets_round_robin_on_request():
    plain = service_config(ClientSettings())
    policy = plain["methodConfig"][0]["retryPolicy"]
    assert policy["retryableStatusCodes"] == ["UNAVAILABLE"]
    assert policy["maxAttempts"] == 3 and plain["methodConfig"][0]["waitForReady"] is False
    assert "loadBalancingConfig" not in plain
    rr = service_config(ClientSettings(load_balancing="round_robin"))
    assert rr["loadBalancingConfig"] == [{"round_robin": {}}]
    assert "retryPolicy" not in service_config(ClientSettings(retry_attempts=1))["methodConfig"][0]
    opts = dict(channel_options(ClientSettings(load_balancing="round_robin")))
    assert opts["grpc.enable_retries"] == 1
    assert json.loads(opts["grpc.service_config"]) == rr
    assert opts["grpc.max_reconnect_backoff_ms"] == 1000


def test_keepalive_agrees_with_the_server():
    from protos import channel

    client = dict(channel_options(ClientSettings()))
    server = dict(channel.server_options())
    # the server must permit pings at least as often as the client sends them
    permitted = server["grpc.http2.min_recv_ping_interval_without_data_ms"]
    assert client["grpc.keepalive_time_ms"] >= permitted
    key = "grpc.keepalive_permit_without_calls"
    assert client[key] == server[key]


@pytest.mark.parametrize("kw, field", [
    ({"timeout": 0}, "timeout"), ({"retry_attempts": 6}, "retry_attempts"),
    ({"load_balancing": "random"}, "load_balancing"), ({"tier": "cold"}, "tier"),
    ({"auth_token": "  "}, "auth_token"), ({"max_batch": 0}, "max_batch"),
    ({"breaker_failures": 0}, "breaker_failures"),
    ({"retry_initial_backoff_s": 1, "retry_max_backoff_s": 0.5}, "retry_max_backoff_s"),
])
def test_bad_settings_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        ClientSettings(**kw)


def test_tls_config_checks_files(tmp_path):
    with pytest.raises(ValueError, match="client_cert and client_key"):
        TlsConfig(client_cert="a.pem")
    with pytest.raises(ValueError, match="root_cert.*cannot read"):
        TlsConfig(root_cert=tmp_path / "missing.pem").credentials()
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ValueError, match="root_cert.*not a PEM"):
        TlsConfig(root_cert=tmp_path / "junk.pem").credentials()


def test_sharded_settings_cap_the_per_shard_budget():
    s = ShardedSettings(overfetch=8)
    assert s.shard_budget(64) == 512 and s.shard_budget(200) == 1024
    assert ShardedSettings(overfetch=1).shard_budget(64) == 64
    with pytest.raises(ValueError, match="overfetch"):
        ShardedSettings(overfetch=0)


# ------------------------------------------------------------------------- requests


def test_requests_carry_only_the_tail_and_the_fingerprint():
    s = ClientSettings(tokenizer_fingerprint="abc", tier="static")
    msg = draft_request(list(range(100)), DraftArgs(8, 4, 16, 2), s)
    assert list(msg.context) == list(range(84, 100))
    assert msg.tokenizer_fingerprint == "abc" and msg.params.budget == 8
    assert msg.params.min_suffix == 2 and msg.params.tier == 1
    ins = insert_request([[1, 2], np.array([3], dtype=np.int64)], s)
    assert [list(q.tokens) for q in ins.sequences] == [[1, 2], [3]]
    assert msg.params.HasField("min_count") and msg.params.min_count == 1  # sent, not defaulted
    counted = draft_request([1, 2], DraftArgs(min_count=5), s)
    assert counted.params.min_count == 5
    with pytest.raises(ValueError):
        draft_request([[1, 2]], DraftArgs(), s)
    with pytest.raises(ValueError):
        insert_request([[-1]], s)
    assert [len(c) for c in chunks(list(range(10)), 4)] == [4, 4, 2]


@pytest.mark.parametrize("kw", [dict(min_count=0), dict(min_count=-3)])
def test_draft_args_need_min_count_at_least_one(kw):
    with pytest.raises(ValueError, match="min_count"):
        DraftArgs(**kw)


def test_batch_requests_carry_min_count_in_every_item():
    msg = batch_request([[1], [2, 3]], DraftArgs(min_count=7), ClientSettings())
    assert [r.params.min_count for r in msg.requests] == [7, 7]


# ------------------------------------------------------------------------- breaker


def test_breaker_opens_after_consecutive_down_answers_and_probes_after_cooldown():
    b = Breaker(threshold=2, cooldown=0.05)
    b.record("UNAVAILABLE")
    assert b.allow()
    b.record("INVALID_ARGUMENT")  # a real answer: the server is there
    b.record("UNAVAILABLE")
    assert b.allow()
    b.record("DEADLINE_EXCEEDED")
    assert not b.allow() and b.is_open
    time.sleep(0.06)
    assert b.allow()  # the probe
    assert not b.allow()  # others wait while it is out
    b.record(None)
    assert b.allow() and not b.is_open


def test_call_guard_counts_skipped_calls():
    g = CallGuard("t", threshold=1, cooldown=10)
    g.failed_code("Draft", "UNAVAILABLE", "down")
    assert not g.admit("Draft")
    assert g.stats.failures == 2
    assert g.stats.snapshot() == {"UNAVAILABLE": 1, "CIRCUIT_OPEN": 1}
    g2 = CallGuard("t", threshold=1, cooldown=10)
    g2.failed("Draft", ValueError("bad context"))  # a client-side error says nothing of the server
    assert g2.admit("Draft") and g2.stats.snapshot() == {"CLIENT_ERROR": 1}
    assert code_of(RuntimeError("x"))[0] == "UNKNOWN"


# ------------------------------------------------------------------------- shard merge


def split_docs(docs, cut):
    return docs[:cut], docs[cut:]


@settings(max_examples=60, deadline=None)
@given(
    docs=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=30), min_size=2, max_size=12),
    cut=st.integers(0, 12),
    context=st.lists(st.integers(0, 5), min_size=0, max_size=6),
    budget=st.integers(1, 24),
    max_depth=st.integers(1, 6),
    min_suffix=st.integers(1, 3),
)
def test_merged_shards_equal_one_index_of_the_whole_corpus(docs, cut, context, budget,
                                                           max_depth, min_suffix):
    """With shard trees complete (a budget covering every node), the merge is exact."""
    cut = min(cut, len(docs))
    whole = draft_from([make_index(docs, SEP)], context, budget, max_depth, 4, min_suffix)
    parts = [make_index(part, SEP) for part in split_docs(docs, cut) if part]
    complete = 30 * 12  # more nodes than a shard can have
    trees = [draft_from([ix], context, complete, max_depth, 4, min_suffix) for ix in parts]
    merged = merge_shards(trees, budget, max_depth)
    assert merged.same_as(whole), (merged, whole)


def test_merge_keeps_an_empty_longest_match():
    """A shard that matched longer but has no continuation wins over a shorter match."""
    longer = DraftTree.empty()
    longer = DraftTree(longer.tokens, longer.parents, longer.counts, 3)
    shorter = DraftTree([7], [-1], [2], 1)
    out = merge_shards([longer, shorter], 8, 4)
    assert len(out) == 0 and out.match_len == 3
    assert merge_shards([], 8, 4).match_len == 0
    assert merge_shards([shorter, DraftTree([7, 8], [-1, 0], [1, 1], 1)], 8, 4).paths() == {
        (7,): 3, (7, 8): 1}


def test_shard_for_is_stable_and_spreads():
    seqs = [[[i, i + 1, i * 7]] for i in range(200)]
    first = [shard_for(s, 3) for s in seqs]
    assert first == [shard_for([np.asarray(s[0], dtype=np.int32)], 3) for s in seqs]
    assert set(first) == {0, 1, 2}


# ------------------------------------------------------------------------- CLI rendering


def test_render_tree_is_an_indented_trie_in_tree_order():
    tree = DraftTree([5, 6, 9, 7], [-1, 0, -1, 1], [4, 3, 1, 2], 2)
    lines = render_tree(tree, None)
    assert [line.split("[")[1].split("]")[0] for line in lines] == ["5", "6", "7", "9"]
    indent = [len(line) - len(line.lstrip()) for line in lines]
    assert indent == [0, 2, 4, 0]
    assert "count=2" in lines[2] and "depth=3" in lines[2]
