"""The longest-match source: the datastore kernel's spec_factor depth cap against draft_batch with
that depth given outright, LongestMatchDrafter single == batch, the remote (post-hoc) cap, one
opened store shared by both store drafters, and exact decoding with it on."""
from __future__ import annotations

import numpy as np
import pytest

from datastore.tree import DraftTree
from decoder import DecoderSettings, SpeculativeDecoder
from decoder.drafters.registry import make_drafters
from decoder.drafters.retrieval import LongestMatchDrafter, cap_depth
from decoder.tree import depths_of
from decoder_util import StubTokenizer, greedy_store, single_thread, tiny_model  # noqa: F401

pytestmark = pytest.mark.usefixtures("single_thread")
N = 24


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from datastore.store import Datastore

    model = tiny_model("llama", "sdpa", seed=4)
    rng = np.random.default_rng(0)
    repeats = [rng.integers(2, 20, size=200) for _ in range(4)]  # small alphabet: many repeats
    path = tmp_path_factory.mktemp("ds") / "store"
    ps, outs = greedy_store(model, path, seed=21, n_new=N + 8, extra=repeats)
    with Datastore.open(path) as store:
        yield model, ps, outs, path, store


@pytest.fixture
def other_path(world, tmp_path):
    """A copy of the world's store that nothing has open yet (LMDB opens an environment once per
    process)."""
    import shutil

    return shutil.copytree(world[3], tmp_path / "copy")


def depth(tree: DraftTree) -> int:
    return int(depths_of(tree.parents.astype(np.int64)).max()) if len(tree) else 0


@pytest.mark.parametrize("factor", [0.5, 1.0, 2.5])
def test_spec_factor_equals_the_depth_it_implies(world, factor):
    store = world[4]
    rng = np.random.default_rng(1)
    contexts = [rng.integers(2, 20, size=int(rng.integers(1, 30))) for _ in range(60)]
    free = store.draft_batch(contexts, budget=40, max_depth=12, min_count=1)
    capped = store.draft_batch(contexts, budget=40, max_depth=12, min_count=1, spec_factor=factor)
    deeper = 0
    for ctx, f, c in zip(contexts, free, capped):
        assert c.match_len == f.match_len
        want = store.draft(ctx, budget=40, max_depth=min(12, max(1, int(factor * f.match_len))), min_count=1)
        assert c.same_as(want)
        deeper += depth(f) > depth(c)
    assert deeper > 0  # the cap did cut some trees


def test_spec_factor_must_be_non_negative(world):
    with pytest.raises(ValueError, match="spec_factor"):
        world[4].draft_batch([[3, 4]], spec_factor=-1.0)
    with pytest.raises(ValueError, match="spec_factor"):
        LongestMatchDrafter(world[4], spec_factor=float("nan"))


def test_longest_drafter_single_equals_batch_and_caps_depth(world):
    store = world[4]
    d = LongestMatchDrafter(store)
    rng = np.random.default_rng(2)
    contexts = [rng.integers(2, 20, size=int(rng.integers(2, 30))) for _ in range(20)]
    trees = d.propose_batch(list(range(20)), contexts, 32, [16] * 20)
    for i, (ctx, t) in enumerate(zip(contexts, trees)):
        assert t.source == "longest" and t.same_as(d.propose(i, ctx, 32, 16))
        assert depth(t) <= max(1, t.match_len)


def test_cap_depth_is_ancestor_closed():
    tree = DraftTree(np.array([5, 6, 7, 8, 9]), np.array([-1, 0, 1, -1, 3]), np.array([9, 5, 3, 4, 2]), 2, "x")
    cut = cap_depth(tree, 1)
    assert cut.tokens.tolist() == [5, 8] and cut.parents.tolist() == [-1, -1] and cut.match_len == 2
    two = cap_depth(tree, 2)
    assert two.tokens.tolist() == [5, 6, 8, 9] and two.parents.tolist() == [-1, 0, -1, 2]
    assert cap_depth(tree, 3) is tree


def test_both_store_drafters_share_one_opened_store(other_path):
    made = make_drafters(["retrieval", "longest"], datastore=str(other_path), tokenizer=StubTokenizer())
    assert [d.name for d in made] == ["retrieval", "longest"] and made[0].source is made[1].source
    with pytest.raises(ValueError, match="'longest' needs a datastore"):
        make_drafters(["longest"], tokenizer=StubTokenizer())


def test_decode_with_longest_equals_greedy(world):
    model, ps, outs, _, store = world
    drafters = make_drafters(["retrieval", "longest", "ngram"], datastore=store, tokenizer=StubTokenizer())
    dec = SpeculativeDecoder(model, StubTokenizer(), drafters, DecoderSettings(budget=16))
    gens = dec.generate_batch(ps, max_new_tokens=N)
    assert [g.token_ids for g in gens] == [o[:N] for o in outs]
    assert sum(g.stats.accepted_by_source.get("longest", 0) for g in gens) > N
