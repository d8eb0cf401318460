"""The committed generated modules match the proto; the converters round-trip exactly."""
from __future__ import annotations

import filecmp

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from datastore.tree import DraftTree
from protos import convert, generate
from protos.draftstore.v1 import draftstore_pb2 as pb


def test_generated_modules_match_the_proto(tmp_path):
    fresh = generate.generate(tmp_path)
    committed = generate.REPO / "protos" / "draftstore" / "v1"
    for path in fresh:
        assert path.is_file(), f"protoc did not write {path.name}"
        assert filecmp.cmp(path, committed / path.name, shallow=False), (
            f"{path.name} differs from the proto: run `python -m protos.generate` and commit"
        )


@st.composite
def trees(draw):
    n = draw(st.integers(0, 40))
    parents = [draw(st.integers(-1, i - 1)) for i in range(n)]
    tokens = draw(st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n))
    counts = draw(st.lists(st.integers(0, 2**63 - 1), min_size=n, max_size=n))
    return DraftTree(tokens, parents, counts, draw(st.integers(0, 64)))


@settings(max_examples=150, deadline=None)
@given(trees())
def test_tree_round_trip(tree):
    wire = pb.DraftTree.FromString(convert.tree_to_proto(tree).SerializeToString())
    back = convert.tree_from_proto(wire, source="x")
    assert back.same_as(tree) and back.source == "x"
    assert back.paths() == tree.paths()


def test_tree_from_proto_rejects_a_malformed_tree():
    bad = pb.DraftTree(tokens=[1, 2], parents=[1, -1], counts=[3, 4])  # parent after child
    with pytest.raises(ValueError, match="parents"):
        convert.tree_from_proto(bad)
    with pytest.raises(ValueError, match="differ in length"):
        convert.tree_from_proto(pb.DraftTree(tokens=[1, 2], parents=[-1], counts=[3, 4]))


_param = st.one_of(st.none(), st.integers(0, 2**32 - 1))


@settings(max_examples=100, deadline=None)
@given(_param, _param, _param, _param, st.sampled_from([None, "static", "live", "both"]), _param)
def test_params_round_trip_keeps_unset_apart_from_zero(budget, depth, maxs, mins, tier, count):
    msg = convert.params_to_proto(budget, depth, maxs, mins, tier, min_count=count)
    back = convert.params_from_proto(pb.DraftParams.FromString(msg.SerializeToString()))
    assert back == dict(budget=budget, max_depth=depth, max_suffix=maxs, min_suffix=mins,
                        min_count=count, tier=tier)


def test_params_reject_unknown_tier_and_bad_ids():
    with pytest.raises(ValueError, match="tier"):
        convert.params_to_proto(tier="warm")
    with pytest.raises(ValueError, match="params.tier"):
        convert.params_from_proto(pb.DraftParams(tier=9))
    with pytest.raises(ValueError, match="token ids"):
        convert.draft_request([1, -2])
    with pytest.raises(ValueError, match="integers"):
        convert.draft_request(np.array([1.5]))


def test_draft_request_carries_context_params_and_fingerprint():
    msg = convert.draft_request(np.array([3, 1, 2], dtype=np.int64), fingerprint="ab", budget=7)
    assert list(msg.context) == [3, 1, 2] and msg.tokenizer_fingerprint == "ab"
    assert msg.params.budget == 7 and not msg.params.HasField("max_depth")
    assert not msg.params.HasField("min_count")  # unset: the server default
    assert convert.draft_request([1], min_count=5).params.min_count == 5
    assert convert.tokens_from_proto(msg.context).dtype == np.int64
