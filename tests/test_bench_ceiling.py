"""The retrieval-ceiling replay (benchmarks/bench_ceiling.py) on a real tiny datastore: what it says
a step accepts is what a verification step would accept."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.bench_ceiling import BUDGETS, accepted, analyse, replay
from builder.tokenizer import tokenizer_info
from decoder_util import StubTokenizer


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from builder.writer import write_datastore
    from datastore.store import Datastore

    path = tmp_path_factory.mktemp("ceiling") / "store"
    docs = [np.array([1, 2, 3, 4, 5, 6, 7, 8]), np.array([2, 3, 9, 9])]
    write_datastore(path, docs, tokenizer_info(StubTokenizer(), "stub"))
    with Datastore.open(path) as ds:
        yield ds


def naive_accepted(tree, future) -> int:
    """Longest prefix of future that is a root-to-node path of the tree (paths by brute force)."""
    paths = set(tree.paths())
    k = 0
    while k < len(future) and tuple(future[:k + 1]) in paths:
        k += 1
    return k


def test_accepted_is_the_longest_tree_path_on_the_future(store):
    for context, future in (([1, 2], [3, 4, 5, 9]), ([2], [3, 9, 9]), ([2], [3, 4, 1]), ([5], [8])):
        tree = store.draft(np.array(context), budget=16, max_depth=8)
        assert accepted(tree.tokens, tree.parents, future) == naive_accepted(tree, future), (context, future)


def test_replay_and_walk(store):
    prompt, output = [1, 2], [3, 4, 5, 6, 9]
    recs = replay(store, prompt, output, min_count=1)
    first = dict(zip(BUDGETS, recs[0]["accepted"]))
    assert first[0] == 0 and first[1] == 1  # B=1: the most frequent child only
    assert first[128] == 4  # 3 4 5 6 drafted; the bonus token (9) must still come from the model
    assert recs[0]["match_len"] == 2 and recs[0]["count"] == 1
    flat = analyse([recs], lambda q: 1.0)  # every forward costs the same: speed-up = tokens/step
    assert flat["fixed"][0]["tokens_per_step"] == 1.0
    assert flat["fixed"][128]["tokens_per_step"] == 5.0  # one step: 4 drafted + bonus
    assert flat["fixed"][128]["modeled_speedup"] == 5.0
    dear = analyse([recs], lambda q: float(q))  # cost grows with every token: trees never pay
    assert dear["best_fixed_budget"] == 0 and dear["adaptive_in_sample"]["modeled_speedup"] <= 1.0 + 1e-9
