"""Building blocks against naive references: trie merge, top-T, masks, acceptance, KV gather, cost."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from datastore.tree import DraftTree
from decoder import kv
from decoder.attention import RowInput, ancestor_matrix, build_inputs, prefill_inputs
from decoder.calibration import Calibration
from decoder.cost import CostModel, monotone
from decoder.tree import merge_trees, raw_probabilities, select_top, subtree
from decoder.verify import greedy_accept, warp
from decoder_util import tiny_model


@st.composite
def draft_trees(draw, source="s"):
    n = draw(st.integers(0, 25))
    tokens, parents, counts, path_of = [], [], [], []
    for _ in range(n):
        par = draw(st.integers(-1, len(path_of) - 1))
        tok = draw(st.integers(0, 5))
        path = (path_of[par] if par >= 0 else ()) + (tok,)
        if path in path_of:  # a producer emits a trie: no duplicate paths
            continue
        path_of.append(path)
        tokens.append(tok)
        parents.append(par)
        counts.append(draw(st.integers(0, 9)))
    return DraftTree(np.asarray(tokens, dtype=np.int32), np.asarray(parents, dtype=np.int32),
                     np.asarray(counts, dtype=np.int64), 1, source)


def naive_probs(tree):
    """{path: raw conditional p} by the documented formula, node by node."""
    paths = list(tree.paths())
    cnt = {p: max(c, 0) for p, c in tree.paths().items()}
    out = {}
    for p in paths:
        sib = sum(cnt[q] for q in paths if len(q) == len(p) and q[:-1] == p[:-1])
        denom = max(cnt[p[:-1]] if len(p) > 1 else 0, sib)
        out[p] = min(cnt[p] / denom, 1.0) if denom > 0 else 0.0
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(draft_trees(), min_size=0, max_size=3), st.integers(1, 40))
def test_merge_and_select_against_naive(trees, n):
    merged = merge_trees(trees)
    # same set of paths, parents precede children, depth order
    paths = {}
    for i in range(len(merged)):
        par = merged.parents[i]
        assert par < i and (par < 0 or merged.depths[par] == merged.depths[i] - 1)
        paths[i] = (paths[par] if par >= 0 else ()) + (int(merged.tokens[i]),)
    inv = {p: i for i, p in paths.items()}
    assert len(inv) == len(paths)
    want = set().union(*[t.paths().keys() for t in trees]) if trees else set()
    assert set(inv) == want
    # per node: sources and combined probability 1 - prod(1 - p_s)
    naive = [naive_probs(t) for t in trees]
    for p, i in inv.items():
        srcs = {s for s, t in enumerate(trees) if p in naive[s]}
        assert merged.sources[i] == sum(1 << s for s in srcs)
        expect = 1 - np.prod([1 - naive[s][p] for s in srcs])
        assert merged.cond_p[i] == pytest.approx(expect)
        par_p = merged.path_p[inv[p[:-1]]] if len(p) > 1 else 1.0
        assert merged.path_p[i] == pytest.approx(par_p * merged.cond_p[i])
    # top-n: ancestor closed and no dropped node beats a kept one
    keep = select_top(merged, n)
    assert len(keep) == min(n, len(merged))
    kept = set(keep.tolist())
    for i in kept:
        assert merged.parents[i] < 0 or merged.parents[i] in kept
    if kept and len(kept) < len(merged):
        assert min(merged.path_p[list(kept)]) >= max(np.delete(merged.path_p, list(kept)))
    tok, par, dep = subtree(merged, keep)
    assert np.array_equal(tok, merged.tokens[keep]) and np.all(par < np.arange(len(keep)))


def test_raw_probabilities_normalised():
    t = DraftTree(np.array([5, 6, 7, 8]), np.array([-1, -1, 0, 0]), np.array([10, 30, 4, 5]))
    p = raw_probabilities(t)
    assert p.tolist() == pytest.approx([0.25, 0.75, 0.4, 0.5])
    assert raw_probabilities(t, smoothing=2.0).tolist() == pytest.approx([10 / 42, 30 / 42, 4 / 12, 5 / 12])


def test_smoothing_discounts_thin_evidence():
    """A chain seen once gets p = 1/(1+s) per node; a chain seen 1000 times stays near 1."""
    once = DraftTree(np.array([5, 6, 7]), np.array([-1, 0, 1]), np.array([1, 1, 1]))
    often = DraftTree(np.array([5, 6, 7]), np.array([-1, 0, 1]), np.array([1000, 1000, 1000]))
    assert merge_trees([once], smoothing=1.0).path_p.tolist() == pytest.approx([0.5, 0.25, 0.125])
    assert merge_trees([often], smoothing=1.0).path_p.min() > 0.99
    assert merge_trees([once]).path_p.tolist() == [1.0, 1.0, 1.0]


@settings(max_examples=40, deadline=None)
@given(draft_trees(), st.data())
def test_ancestor_matrix_and_greedy_accept(tree, data):
    merged = merge_trees([tree])
    n = len(merged)
    anc = ancestor_matrix(merged.parents, merged.depths)
    for i in range(n):
        chain, j = set(), i
        while j >= 0:
            chain.add(j)
            j = merged.parents[j]
        assert set(np.flatnonzero(anc[i]).tolist()) == chain
    argmax = np.asarray(data.draw(st.lists(st.integers(0, 5), min_size=n + 1, max_size=n + 1)), dtype=np.int64)
    path, toks = greedy_accept(merged.tokens, merged.parents, merged.depths, argmax)
    # naive walk from the root
    node, expect = -1, []
    while True:
        kids = [i for i in range(n) if merged.parents[i] == node and merged.tokens[i] == argmax[node + 1]]
        if not kids:
            break
        node = kids[0]
        expect.append(node)
    assert path.tolist() == expect
    assert toks.tolist() == [int(merged.tokens[i]) for i in expect] + [int(argmax[(expect[-1] if expect else -1) + 1])]


def test_build_inputs_mask_and_positions():
    from decoder.drafters.base import SideBranch

    side = SideBranch(np.array([7, 8]), np.array([1, 2]), np.array([[1, 0], [1, 1]], dtype=bool))
    rows = [
        RowInput(3, 10, np.array([4, 5, 6]), np.array([-1, 0, -1]), np.array([1, 2, 1]), side),
        RowInput(9, 4, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)),
    ]
    valid = torch.tensor([[True, True, True], [False, True, True]])
    ids, pos, mask = build_inputs(rows, valid, torch.float32, torch.device("cpu"), pad_id=0)
    assert ids.tolist() == [[3, 4, 5, 6, 7, 8], [9, 0, 0, 0, 0, 0]]
    assert pos.tolist()[0] == [10, 11, 12, 11, 11, 12] and pos.tolist()[1][0] == 4
    allowed = (mask[:, 0] == 0).numpy()
    assert allowed.shape == (2, 6, 9)
    # row 0: node 1 (token 5) sees prefix, root, node 0 and itself; not node 2 or the side branch
    assert allowed[0, 2].tolist() == [1, 1, 1, 1, 1, 1, 0, 0, 0]
    assert allowed[0, 5].tolist() == [1, 1, 1, 1, 0, 0, 0, 1, 1]  # side 2 sees side 1, not the tree
    assert allowed[1, 0].tolist() == [0, 1, 1, 1, 0, 0, 0, 0, 0]  # the hole is masked
    assert allowed[1, 3].tolist() == [0, 1, 1, 0, 0, 0, 1, 0, 0]  # padding: the valid prefix and itself only


@pytest.mark.parametrize("kind,attn", [("llama", "eager"), ("qwen2", "sdpa")])
def test_kv_gather_equals_recompute(kind, attn):
    """After a tree step, compacting the cache to a path that is NOT the first nodes gives the
    same next logits as a fresh forward over the whole sequence (crop alone would not)."""
    model = tiny_model(kind, attn, seed=5)
    rng = np.random.default_rng(0)
    prefix = rng.integers(2, 90, size=12)
    # tree: 4 roots, each with a 2-chain; the accepted path is root 2's chain (nodes 6, 7, 8)
    tokens = rng.integers(2, 90, size=12)
    parents = np.array([-1, 0, 1, -1, 3, 4, -1, 6, 7, -1, 9, 10])
    depths = np.array([1, 2, 3] * 4)
    path = np.array([6, 7, 8])
    with torch.no_grad():
        cache = kv.new_cache()
        ids, pos, mask, valid = prefill_inputs([prefix[:-1]], torch.float32, torch.device("cpu"))
        model(input_ids=ids, position_ids=pos, attention_mask=mask, cache=cache, use_cache=True)
        row = RowInput(int(prefix[-1]), len(prefix) - 1, tokens, parents, depths)
        ids, pos, mask = build_inputs([row], valid, torch.float32, torch.device("cpu"))
        old = kv.seq_length(cache)
        tree_logits = model(input_ids=ids, position_ids=pos, attention_mask=mask, cache=cache, use_cache=True).logits
        kv.keep_new(cache, old, torch.from_numpy(np.concatenate(([0], 1 + path))[None]))
        assert kv.seq_length(cache) == len(prefix) + len(path)
        nxt = 17
        step = model(input_ids=torch.tensor([[nxt]]), position_ids=torch.tensor([[len(prefix) + len(path)]]),
                     cache=cache, use_cache=True).logits[0, -1]
        seq = np.concatenate([prefix, tokens[path], [nxt]])
        full = model(torch.from_numpy(seq)[None]).logits[0]
    torch.testing.assert_close(step, full[-1], rtol=1e-4, atol=1e-4)
    # the tree logits at the path nodes equal the sequential ones too
    torch.testing.assert_close(tree_logits[0, 1 + path], full[len(prefix) : len(prefix) + 3], rtol=1e-4, atol=1e-4)


def test_cache_api_shape():
    """Fails loudly if transformers moves the DynamicCache layer API this decoder relies on."""
    model = tiny_model("llama", "eager")
    cache = kv.new_cache()
    with torch.no_grad():
        model(torch.tensor([[3, 4, 5]]), cache=cache, use_cache=True)
    layers = kv.layers(cache)
    assert len(layers) == 2 and layers[0].keys.shape[-2] == 3 and layers[0].values.shape[-2] == 3
    kv.select(cache, torch.tensor([0]), start=1)
    assert kv.seq_length(cache) == 2


def test_cost_model_choose_brute_force():
    curve = {1: 0.036, 2: 0.040, 4: 0.057, 8: 0.069, 16: 0.073, 32: 0.095, 64: 0.134, 128: 0.199}
    cm = CostModel(curve)
    assert cm.latency(3) == pytest.approx((0.040 + 0.057) / 2)
    assert cm.latency(256) > cm.latency(128)
    rng = np.random.default_rng(1)
    for _ in range(20):
        p = np.sort(rng.random(rng.integers(0, 100)) ** 3)[::-1]
        extra = int(rng.integers(0, 5))
        best = max(range(len(p) + 1), key=lambda n: ((1 + p[:n].sum()) / cm.latency(1 + n + extra), -n))
        assert cm.choose(p, extra) == best
    assert cm.choose(np.zeros(10)) == 0
    assert cm.choose(np.ones(100)) == 100
    p = np.full(8, 0.5)
    for bonus in (0.0, 0.7, 3.0):
        n, rate = cm.best(p, 6, bonus=bonus)
        rates = [(1 + bonus + p[:k].sum()) / cm.latency(1 + k + 6) for k in range(9)]
        assert n == int(np.argmax(rates)) and rate == pytest.approx(max(rates))
    with pytest.raises(ValueError):
        CostModel({})
    assert monotone({1: 1.0, 2: 9.0, 4: 2.0, 8: 3.0, 16: 2.5}) == {1: 1.0, 2: 2.0, 4: 2.0, 8: 2.5, 16: 2.5}


def test_calibration_learns_acceptance():
    """A source whose nodes are right 25% of the time gets its estimates scaled toward 0.25."""
    cal = Calibration(2)
    rng = np.random.default_rng(0)
    for _ in range(300):
        a = DraftTree(np.array([1]), np.array([-1]), np.array([1]), 1, "a")  # p = 1 claimed
        b = DraftTree(np.array([2]), np.array([-1]), np.array([1]), 1, "b")
        merged = merge_trees([a, b], cal.factors())
        nxt = 1 if rng.random() < 0.25 else (2 if rng.random() < 0.9 else 3)
        cal.update(merged, np.array([-1]), np.array([nxt]))
    f = cal.factors()  # [S, D, E]; counts of 1 rest on evidence bin 0
    assert 0.15 < f[0, 0, 0] < 0.35 and 0.55 < f[1, 0, 0] <= 1.0
    assert f[0, 5, 0] == 1.0  # untested depths stay at the prior
    assert 0.15 < f[0, 0, 3] < 0.35  # an untested evidence bin borrows its depth's pooled factor


def test_calibration_separates_evidence():
    """One source: estimates resting on 1 occurrence are right 10% of the time, on 100
    occurrences 80%; the factors learn each, the bins do not bleed into each other."""
    cal = Calibration(1)
    rng = np.random.default_rng(1)
    for i in range(400):
        count = 1 if i % 2 else 100
        t = DraftTree(np.array([7]), np.array([-1]), np.array([count]), 1, "a")  # raw p = 1
        merged = merge_trees([t], cal.factors())
        assert merged.bins[0, 0] == (0 if count == 1 else 6)
        right = rng.random() < (0.1 if count == 1 else 0.8)
        cal.update(merged, np.array([-1]), np.array([7 if right else 8]))
    f = cal.factors()
    assert 0.03 < f[0, 0, 0] < 0.2 and 0.65 < f[0, 0, 6] < 0.95


@pytest.mark.parametrize("temperature,top_p", [(0.7, 1.0), (1.3, 0.8), (1.0, 0.3)])
def test_warp_matches_transformers(temperature, top_p):
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 3
    ref = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_p < 1:
        ref = TopPLogitsWarper(top_p)(None, ref)
    torch.testing.assert_close(warp(logits, temperature, top_p), ref.softmax(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [0, 1, 4])
def test_reduce_matches_argmax_on_exact_ties(dtype, k):
    """The step's one read of the logits: its argmax is torch's argmax (first index on an exact
    tie at the top, whatever order topk returns tied values in) and its top-k is topk's."""
    from decoder.speculative import SpeculativeDecoder
    from decoder_util import StubTokenizer, tiny_model

    dec = SpeculativeDecoder(tiny_model(), StubTokenizer())
    dec._topk = k
    g = torch.Generator().manual_seed(k)
    logits = torch.randn((3, 5, 96), generator=g).to(dtype)  # [B, q, V]
    logits[0, 1, [7, 70]] = 9.0  # exact ties at the top
    logits[2, 4, [3, 50, 90]] = 8.0
    logits[1, 0, [20, 21]] = torch.tensor([9.0, 9.0 - 1e-3], dtype=dtype)  # close, not tied (or tied in bf16)
    from decoder.logits import torch_top

    results = [dec._reduce(logits)]
    if k:  # torch's paths too: packed (a GPU's one copy) and read from host memory
        results += [torch_top(logits, k, packed=True), torch_top(logits, k, packed=False)]
    for argmax, top in results:
        assert argmax.dtype == np.int64 and argmax.tolist() == logits.argmax(dim=-1).tolist()
        if k == 0:
            assert top is None
        else:  # the k largest logits, largest first (tied ids in either order)
            assert top.shape == (3, 5, k)
            picked = logits.gather(-1, torch.from_numpy(np.ascontiguousarray(top)))
            assert torch.equal(picked, logits.topk(k, dim=-1).values)


def _reference_topk(x: np.ndarray, k: int) -> np.ndarray:
    """[n, V] -> [n, k] ids by descending value, equal values by ascending id (naive sort)."""
    return np.stack([np.lexsort((np.arange(row.shape[0]), -row))[:k] for row in x])


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 4), st.integers(1, 3), st.integers(1, 200), st.integers(1, 12))
def test_host_topk_equals_a_sort(seed, b, q, v, k):
    """decoder.logits.host_topk (one C pass) against a full sort, with many ties (few distinct
    values), -0.0 and 0.0, infinities and widths around its 16-logit blocks."""
    from decoder.logits import host_topk

    rng = np.random.default_rng(seed)
    values = np.array([-np.inf, -1.5, -0.0, 0.0, 0.25, 2.0, 7.0, np.inf], dtype=np.float32)
    x = rng.choice(values, size=(b, q, v)) if rng.random() < 0.5 else rng.standard_normal((b, q, v)).astype(np.float32)
    got = host_topk(torch.from_numpy(x), k)
    if k > v:
        assert got is None
        return
    want = _reference_topk(x.reshape(b * q, v), k).reshape(b, q, k)
    assert got.dtype == np.int64 and np.array_equal(got, want)


def test_host_topk_declines_what_it_cannot_do():
    from decoder.logits import host_topk

    x = torch.randn(1, 2, 40)
    assert host_topk(x.to(torch.bfloat16), 2) is None  # not float32
    assert host_topk(x[..., ::2], 2) is None  # not contiguous
    assert host_topk(x, 65) is None  # more than the C pass keeps
    x[0, 1, 17] = float("nan")
    assert host_topk(x, 2) is None  # torch orders NaNs
