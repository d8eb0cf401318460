"""The lean local drafters (issue 10, item 2) draft exactly what they drafted before.

tests/drafters_reference_impl.py is a verbatim snapshot of reference, ngram, recycle and
lookahead before the rewrite. Here both run side by side over many seeded random decodes (batch
and single rows, propose_batch against per-row propose, observe / observe_topk / side_result in
between) and every tree must be identical: tokens, parents, counts and match_len, node order
included. Every new tree must also pass DraftTree's own validation (the drafters build theirs
without it).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import drafters_reference_impl as old
from datastore.tree import DraftTree
from decoder.drafters import reference as reference_mod
from decoder.drafters._util import trie_arrays, trie_from_rows, trie_lists
from decoder.drafters.lookahead import LookaheadDrafter
from decoder.drafters.ngram import NGramDrafter
from decoder.drafters.recycle import RecycleDrafter
from decoder.drafters.reference import ReferenceDrafter


def same(new: DraftTree, ref: DraftTree, where: str) -> None:
    DraftTree(new.tokens, new.parents, new.counts, new.match_len, new.source)  # validates
    assert new.source == ref.source, where
    assert new.tokens.dtype == np.int32 and new.parents.dtype == np.int32 and new.counts.dtype == np.int64
    assert new.same_as(ref), (
        f"{where}: new {new.tokens.tolist()} {new.parents.tolist()} {new.counts.tolist()} m={new.match_len}"
        f" != old {ref.tokens.tolist()} {ref.parents.tolist()} {ref.counts.tolist()} m={ref.match_len}")


def text(rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
    """Repetitive token text: random runs copied from earlier in the text, and fresh tokens."""
    out: list[int] = []
    while len(out) < n:
        if out and rng.random() < 0.6:
            s = int(rng.integers(0, len(out)))
            out += out[s : s + int(rng.integers(1, 12))]
        else:
            out += rng.integers(0, vocab, int(rng.integers(1, 4))).tolist()
    return np.array(out[:n], dtype=np.int64)


def accepted_from(rng: np.random.Generator, tree: DraftTree, truth: np.ndarray) -> np.ndarray:
    """Half the time follow the tree for a few nodes (so adaptive state sees hits), else truth."""
    if len(tree) and rng.random() < 0.5:
        node, path = -1, []
        for _ in range(int(rng.integers(1, 6))):
            kids = np.flatnonzero(tree.parents == node)
            if not kids.shape[0]:
                break
            node = int(kids[int(rng.integers(0, kids.shape[0]))])
            path.append(int(tree.tokens[node]))
        return np.array(path + [int(truth[0])], dtype=np.int64)
    return truth[: int(rng.integers(1, 5))].copy()


def drive(make_new, make_old, seed: int, batch: int, steps: int, vocab: int, refs: bool = False,
          topk: bool = False, side: bool = False, single: bool = False) -> None:
    """Run both drafters over the same random decode and compare every proposal."""
    rng = np.random.default_rng(seed)
    new, ref = make_new(), make_old()
    rows = list(range(batch))
    ctx, truth = {}, {}
    for r in rows:
        full = text(rng, int(rng.integers(1, 120)) + 200, vocab)
        p = int(rng.integers(1, 60))
        ctx[r], truth[r] = full[:p].copy(), full[p:]
        references = [text(rng, int(rng.integers(0, 80)), vocab) for _ in range(int(rng.integers(0, 3)))] if refs else []
        new.begin(r, ctx[r].copy(), references)
        ref.begin(r, ctx[r].copy(), references)
    for step in range(steps):
        budget = int(rng.choice([1, 2, 3, 5, 8, 16, 33, 64]))
        depths = [int(rng.integers(1, 18)) for _ in rows]
        contexts = [ctx[r] for r in rows]
        if single or batch == 1 and rng.random() < 0.5:
            got = [new.propose(r, c, budget, d) for r, c, d in zip(rows, contexts, depths)]
        else:
            got = new.propose_batch(rows, contexts, budget, depths)
        want = [ref.propose(r, c, budget, d) for r, c, d in zip(rows, contexts, depths)]
        for r, g, w in zip(rows, got, want):
            same(g, w, f"seed {seed} step {step} row {r} budget {budget} depth {depths[r]}")
        if side:
            for r in rows:
                sn, so = new.side_branch(r), ref.side_branch(r)
                assert (sn is None) == (so is None)
                if sn is not None:
                    assert np.array_equal(sn.tokens, so.tokens) and np.array_equal(sn.depths, so.depths)
                    assert np.array_equal(sn.mask, so.mask)
                    argmax = rng.integers(0, vocab, sn.tokens.shape[0])
                    new.side_result(r, argmax.copy())
                    ref.side_result(r, argmax.copy())
        acc = []
        for r, tree in zip(rows, want):
            a = accepted_from(rng, tree, truth[r])
            acc.append(a)
        if topk:
            k = int(rng.integers(1, 10))
            toks = np.concatenate([np.concatenate(([c[-1]], t.tokens.astype(np.int64))) for c, t in zip(contexts, want)])
            if rng.random() < 0.2:
                toks = np.append(toks, -1)
            top = rng.integers(0, vocab + 3, (toks.shape[0], k))
            new.observe_topk(toks.copy(), top.copy())
            ref.observe_topk(toks.copy(), top.copy())
        if rng.random() < 0.9:  # sometimes a caller only proposes: drafters catch up from the context
            if single or rng.random() < 0.5:
                for r, a in zip(rows, acc):
                    new.observe(r, a.copy())
            else:
                new.observe_batch(rows, [a.copy() for a in acc])
            for r, a in zip(rows, acc):
                ref.observe(r, a.copy())
        for r, a in zip(rows, acc):
            ctx[r] = np.concatenate([ctx[r], a])
            truth[r] = np.concatenate([truth[r][a.shape[0]:], text(rng, a.shape[0], vocab)])
        if rng.random() < 0.05:  # a row finishes and a new request takes its place
            r = int(rng.integers(0, batch))
            new.end(r)
            ref.end(r)
            ctx[r] = text(rng, int(rng.integers(1, 40)), vocab)
            new.begin(r, ctx[r].copy(), [])
            ref.begin(r, ctx[r].copy(), [])
    if side:
        for r in rows:
            assert new.pool_of(r) == ref.pool_of(r)
            assert np.array_equal(new.window_of(r), ref.window_of(r))
    if topk:
        assert np.array_equal(new.table, ref.table)


SEEDS = range(12)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("batch", [1, 5])
def test_reference_same_trees(seed, batch):
    rng = np.random.default_rng(1000 + seed)
    kw = dict(min_match=int(rng.integers(1, 4)), max_match=int(rng.integers(3, 17)),
              min_copy=1, start_copy=int(rng.integers(1, 9)), max_copy=int(rng.integers(9, 33)),
              max_occurrences=int(rng.choice([2, 5, 1024])), adaptive=bool(rng.random() < 0.8))
    kw["max_match"] = max(kw["max_match"], kw["min_match"])
    drive(lambda: ReferenceDrafter(**kw), lambda: old.ReferenceDrafter(**kw), seed, batch, 40,
          vocab=int(rng.choice([3, 6, 50])), refs=True)


@pytest.mark.parametrize("seed", range(6))
def test_reference_many_occurrences_path(seed, monkeypatch):
    """The numpy path for many occurrences (match lengths and trie) agrees as well."""
    monkeypatch.setattr(reference_mod, "MANY", 1)
    drive(lambda: ReferenceDrafter(), lambda: old.ReferenceDrafter(), seed, 3, 40, vocab=4, refs=True)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("batch", [1, 5])
def test_ngram_same_trees(seed, batch):
    rng = np.random.default_rng(2000 + seed)
    lo = int(rng.integers(2, 4))
    kw = dict(max_order=int(rng.integers(lo, 7)), min_order=lo, max_children=int(rng.integers(1, 6)),
              min_count=int(rng.choice([1, 1, 2])))
    drive(lambda: NGramDrafter(**kw), lambda: old.NGramDrafter(**kw), seed, batch, 40,
          vocab=int(rng.choice([3, 8, 40])))


def test_ngram_orders_used_stats_agree():
    new, ref = NGramDrafter(), old.NGramDrafter()
    seq = text(np.random.default_rng(5), 300, 6)
    new.begin(0, seq[:50])
    ref.begin(0, seq[:50])
    for i in range(50, 300, 3):
        same(new.propose(0, seq[:i], 16, 8), ref.propose(0, seq[:i], 16, 8), f"at {i}")
    assert new.orders_used == ref.orders_used


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("batch", [1, 6])
def test_recycle_same_trees(seed, batch):
    rng = np.random.default_rng(3000 + seed)
    vocab = int(rng.choice([5, 30, 200]))
    k = int(rng.integers(1, 9))
    kw = dict(k=k, vocab_size=int(rng.choice([0, vocab])), max_depth=int(rng.integers(1, 9)))
    drive(lambda: RecycleDrafter(**kw), lambda: old.RecycleDrafter(**kw), seed, batch, 30, vocab=vocab,
          topk=True)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("batch", [1, 4])
def test_lookahead_same_trees_windows_and_pools(seed, batch):
    rng = np.random.default_rng(4000 + seed)
    kw = dict(window=int(rng.integers(1, 7)), ngram=int(rng.integers(2, 6)), pool=int(rng.integers(1, 6)),
              seed=seed, every=int(rng.choice([1, 1, 2])))
    drive(lambda: LookaheadDrafter(**kw), lambda: old.LookaheadDrafter(**kw), seed, batch, 40,
          vocab=int(rng.choice([3, 10])), side=True)


def test_recycle_table_is_read_only_and_reset_forgets():
    d = RecycleDrafter(k=2)
    d.observe_topk(np.array([1, 2]), np.array([[2, 3], [1, 4]]))
    with pytest.raises(ValueError):
        d.table[1, 0] = 7
    assert len(d.propose(0, np.array([1]), 8, 4))
    d.reset()
    assert not len(d.propose(0, np.array([1]), 8, 4)) and d.table.max() == -1


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(st.lists(st.integers(-1, 4), min_size=5, max_size=5), min_size=1, max_size=30),
       budget=st.integers(1, 40), depth=st.integers(1, 6))
def test_trie_helpers_match_trie_from_rows(rows, budget, depth):
    arr = np.array(rows, dtype=np.int64)
    arr = np.where(np.cumprod(arr != -1, axis=1).astype(bool), arr, -1)  # PAD to the end, as continuations
    want = trie_from_rows(arr, budget, depth, "x", match_len=2)
    cap = min(arr.shape[1], depth)
    for t, p, c, d in (trie_lists(arr.tolist(), budget, cap), trie_arrays(arr, budget, cap)):
        assert t == want.tokens.tolist() and p == want.parents.tolist() and c == want.counts.tolist()
        assert d == (want.depths().tolist() if len(want) else [])


@pytest.mark.parametrize("seed", range(4))
def test_ngram_tuple_heap_fallback(seed, monkeypatch):
    """Token ids too large to pack into one heap int take the tuple heap: same trees."""
    from decoder.drafters import ngram as ngram_mod

    monkeypatch.setattr(ngram_mod, "TOKEN_BITS", 3)
    drive(lambda: NGramDrafter(), lambda: old.NGramDrafter(), seed, 3, 30, vocab=int([5, 40][seed % 2]))


@pytest.mark.parametrize("cls, old_cls", [(ReferenceDrafter, old.ReferenceDrafter), (NGramDrafter, old.NGramDrafter),
                                          (RecycleDrafter, old.RecycleDrafter)])
def test_list_contexts_are_accepted_as_before(cls, old_cls):
    new, ref = cls(), old_cls()
    seq = text(np.random.default_rng(9), 80, 5)
    if cls is RecycleDrafter:
        top = np.stack([np.roll(seq, -1), np.roll(seq, -2)], axis=1)
        new.observe_topk(seq, top)
        ref.observe_topk(seq, top)
    new.begin(0, seq[:40])
    ref.begin(0, seq[:40])
    same(new.propose(0, seq[:60].tolist(), 16, 8), ref.propose(0, seq[:60].tolist(), 16, 8), "list context")


class _AlwaysOneStage(RecycleDrafter):
    def _fill_rows(self, *args):
        self._sparse = True
        return super()._fill_rows(*args)


class _AlwaysTwoStages(RecycleDrafter):
    def _fill_rows(self, *args):
        self._sparse = False
        return super()._fill_rows(*args)


@pytest.mark.parametrize("cls", [_AlwaysOneStage, _AlwaysTwoStages])
@pytest.mark.parametrize("seed", range(4))
def test_recycle_fill_stages_do_not_change_trees(cls, seed):
    drive(lambda: cls(k=3), lambda: old.RecycleDrafter(k=3), seed, 4, 25, vocab=[6, 60][seed % 2], topk=True)
