"""The C step kernel (decoder/_step.c) against the numpy implementations it replaced
(tests/decoder_step_reference.py): exact equality, floats bit for bit, on random forests (several
rows and sources, duplicate paths across sources, empty rows, max_depths cutting trees) by
hypothesis and by a seeded sweep."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import decoder_step_reference as ref
from datastore.tree import DraftTree
from decoder import _step
from decoder.attention import TreeSlots, build_batch
from decoder.calibration import Calibration, CalibrationSettings
from decoder.drafters.base import SideBranch
from decoder.rows import commit_lengths
from decoder.tree import kept_nodes, merge_rows, path_products, ranked, select_rows
from decoder.verify import greedy_accept_rows


def random_tree(rng: np.random.Generator, n: int, vocab: int, deep: float, source: str = "s") -> DraftTree:
    """A trie of <= n nodes over `vocab` tokens; `deep` = chance a node extends the newest one."""
    tokens, parents, counts, paths = [], [], [], {}
    for _ in range(n):
        if tokens and rng.random() < deep:
            par = len(tokens) - 1
        else:
            par = int(rng.integers(-1, len(tokens)))
        tok = int(rng.integers(0, vocab))
        path = (paths[par] if par >= 0 else ()) + (tok,)
        if path in paths.values():
            continue
        paths[len(tokens)] = path
        tokens.append(tok)
        parents.append(par)
        counts.append(int(rng.integers(-1, 40)) if rng.random() < 0.9 else int(rng.integers(0, 5000)))
    return DraftTree(np.asarray(tokens, dtype=np.int32), np.asarray(parents, dtype=np.int32),
                     np.asarray(counts, dtype=np.int64), 1, source)


def random_forest(rng: np.random.Generator, rows: int, sources: int, max_n: int, vocab: int):
    """trees[r][s]; a row is sometimes empty, a source sometimes silent, and sources often share
    paths (small vocab, a common chain)."""
    trees = []
    for _ in range(rows):
        if rng.random() < 0.15:
            trees.append([DraftTree.empty() for _ in range(sources)])
            continue
        deep = float(rng.choice([0.0, 0.5, 0.9]))
        row = []
        for _ in range(sources):
            if row and len(row[-1]) and rng.random() < 0.4:  # a prefix of another source's trie
                other = row[int(rng.integers(0, len(row)))]
                cut = int(rng.integers(0, len(other) + 1))
                row.append(DraftTree(other.tokens[:cut], other.parents[:cut],
                                     rng.integers(-1, 40, size=cut), 1, "s"))
                continue
            n = 0 if rng.random() < 0.2 else int(rng.integers(1, max_n + 1))
            row.append(random_tree(rng, n, vocab, deep))
        trees.append(row)
    return trees


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal shapes, dtypes and values; floats bit for bit."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind == "f":
        return bool(np.array_equal(a.view(np.int64), b.view(np.int64)))
    return bool(np.array_equal(a, b))


def check_forest(rng: np.random.Generator, trees, sources: int, max_depths: np.ndarray, smoothing: float,
                 with_factors: bool) -> None:
    factors = None
    if with_factors:
        shape = (sources + int(rng.integers(0, 2)), int(rng.integers(1, 6)), int(rng.integers(1, 9)))
        factors = rng.uniform(0.0, 1.6, shape)
    got = merge_rows(trees, factors, max_depths, smoothing, n_sources=sources)
    want = ref.merge_rows(trees, factors, max_depths, smoothing, n_sources=sources)
    for field in ("tokens", "parents", "depths", "sources", "raw_p", "bins", "cond_p", "path_p", "starts"):
        assert same(getattr(got, field), getattr(want, field)), field
    assert same(path_products(want.cond_p, want.parents, want.depths), want.path_p)
    # ranking and top-T per row, with and without the caller's order
    assert same(ranked(got), ref.ranked(want))
    b = len(trees)
    n = rng.integers(-1, 12, size=b).astype(np.int64)
    order = ranked(got) if rng.random() < 0.5 else None
    keep = select_rows(got, n, order)
    assert same(keep, ref.select_rows(want, n))
    k, kw = kept_nodes(got, keep), ref.kept_nodes(want, ref.select_rows(want, n))
    for field in ("tokens", "parents", "local", "depths", "row", "starts", "merged"):
        assert same(getattr(k, field), getattr(kw, field)), field
    slots = TreeSlots(k.tokens, k.parents, k.depths, k.row, k.starts)
    # verification inputs: ids, positions, the 4D mask; some rows carry a side branch
    roots = rng.integers(0, 50, size=b).astype(np.int64)
    bases = rng.integers(0, 30, size=b).astype(np.int64)
    sides = []
    for _ in range(b):
        if rng.random() < 0.3:
            m = int(rng.integers(1, 4))
            mask = np.tril(rng.random((m, m)) < 0.7) | np.eye(m, dtype=bool)
            sides.append(SideBranch(rng.integers(0, 50, size=m), rng.integers(1, 4, size=m), mask))
        else:
            sides.append(None)
    valid = torch.from_numpy(rng.random((b, int(rng.integers(0, 6)))) < 0.7)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        w = ref.build_batch(roots, bases, slots, sides, valid, dtype, torch.device("cpu"), pad_id=3)
        for full in (True, False):  # the whole mask on the host (CPU), or broadcast on the device
            g = build_batch(roots, bases, slots, sides, valid, dtype, torch.device("cpu"), pad_id=3, full=full)
            for x, y in zip(g[:3], w[:3]):
                assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
            assert same(g[3], w[3])
    # greedy acceptance: an argmax that often agrees with a child
    q = 1 + int(np.diff(k.starts).max(initial=0)) + int(rng.integers(0, 3))
    argmax = rng.integers(0, 4, size=(b, q)).astype(np.int64)
    for i in range(k.tokens.shape[0]):
        if rng.random() < 0.6:
            parent_slot = 0 if k.parents[i] < 0 else 1 + k.local[k.parents[i]]
            argmax[k.row[i], parent_slot] = k.tokens[i]
    accepted = greedy_accept_rows(slots, argmax)
    for x, y in zip(accepted, ref.greedy_accept_rows(slots, argmax)):
        assert same(x, y)
    check_after_forward(rng, got, k, accepted, sources)
    check_settle(rng, got, k, argmax, sources)


def check_settle(rng: np.random.Generator, merged, kept, argmax, sources: int) -> None:
    """_step.settle (one call) equals acceptance, cut, compaction and calibration done one by one."""
    b = argmax.shape[0]
    path, length, tokens = greedy_accept_rows(TreeSlots(kept.tokens, kept.parents, kept.depths, kept.row,
                                                        kept.starts), argmax)
    w = path.shape[1]
    wa = w + int(rng.integers(0, 3))  # the caller's width: any bound on the paths
    remaining = rng.integers(1, 6, size=b).astype(np.int64)
    eos = rng.choice(np.arange(4), size=int(rng.integers(0, 3)), replace=False).astype(np.int64)
    settings = CalibrationSettings(depths=int(rng.integers(1, 6)), decay=0.9)
    one, fused = Calibration(sources, settings), Calibration(sources, settings)
    one.predicted[:] = rng.uniform(0, 3, one.predicted.shape)
    one.hits[:] = one.predicted * rng.uniform(0, 1.2, one.predicted.shape)
    fused.predicted[:], fused.hits[:] = one.predicted, one.hits
    out = dict(path=np.empty((b, wa), np.int64), tokens=np.empty((b, wa + 1), np.int64),
               length=np.empty(b, np.int64), cut=np.empty(b, np.int64), reason=np.empty(b, np.int64),
               idx=np.empty((b, wa + 1), np.int64), valid=np.empty((b, wa + 1), bool))
    cal = (merged.tokens, merged.parents, merged.depths, merged.starts, merged.raw_p, merged.bins,
           settings.decay, fused.predicted, fused.hits) if len(merged) else None
    got_w, crop, updated = _step.settle(kept.tokens, kept.parents, kept.depths, kept.starts, kept.local,
                                        kept.merged, argmax, remaining, eos, cal, *out.values())
    assert got_w == w and same(out["length"], length)
    assert same(out["path"][:, :w], path) and (out["path"][:, w:] == -1).all()
    assert same(out["tokens"][:, : w + 1], tokens) and (out["tokens"][:, w + 1:] == 0).all()
    n, why = commit_lengths(tokens, length, remaining, eos)
    assert same(out["cut"], n) and [("", "length", "eos")[i] for i in out["reason"].tolist()] == why
    idx, valid = ref.compact(kept.local, path, length)
    assert same(out["idx"][:, : w + 1], idx) and same(out["valid"][:, : w + 1], valid)
    assert not out["valid"][:, w + 1:].any() and crop == bool((idx == np.arange(w + 1)).all())
    if len(merged):
        after = np.empty(len(merged), dtype=np.int64)
        _step.after(merged.parents, merged.starts, kept.merged, path, tokens, after)
        one.update_rows(merged, after)
        assert updated == int(sum(bool((after[lo:hi] >= 0).any())
                                  for lo, hi in zip(merged.starts[:-1], merged.starts[1:])))
    assert same(fused.predicted, one.predicted) and same(fused.hits, one.hits)


def check_after_forward(rng: np.random.Generator, merged, kept, accepted, sources: int) -> None:
    """commit cut, credit, calibration and compaction indices against their numpy versions."""
    path, length, tokens = accepted
    b = length.shape[0]
    remaining = rng.integers(1, 6, size=b).astype(np.int64)
    eos = rng.choice(np.arange(4), size=int(rng.integers(0, 3)), replace=False).astype(np.int64)
    n, why = commit_lengths(tokens, length, remaining, eos)
    n_ref, why_ref = ref.commit_lengths(tokens, length, remaining, eos)
    assert same(n, n_ref) and why == why_ref
    side_bits = int(rng.integers(0, 1 << sources))
    credited = np.minimum(n, length)
    hits = np.zeros((b, sources), dtype=np.int64)
    only_side = np.empty(b)
    _step.credit(merged.sources, kept.merged, path, credited, side_bits, hits, only_side)
    for x, y in zip((hits, only_side), ref.credit(merged.sources, kept.merged, path, credited, side_bits, sources)):
        assert same(x, y)
    idx, valid = np.empty((b, 1 + path.shape[1]), dtype=np.int64), np.empty((b, 1 + path.shape[1]), dtype=bool)
    crop = _step.compact(kept.local, path, length, idx, valid)
    idx_ref, valid_ref = ref.compact(kept.local, path, length)
    assert same(idx, idx_ref) and same(valid, valid_ref)
    assert crop == bool((idx_ref == np.arange(idx.shape[1])).all())
    if not len(merged):
        return
    after = np.empty(len(merged), dtype=np.int64)
    _step.after(merged.parents, merged.starts, kept.merged, path, tokens, after)
    assert same(after, ref.after(merged, kept.merged, path, tokens))
    cal = Calibration(sources, CalibrationSettings(depths=int(rng.integers(1, 6)), decay=0.9))
    cal.predicted[:] = rng.uniform(0, 3, cal.predicted.shape)
    cal.hits[:] = cal.predicted * rng.uniform(0, 1.2, cal.predicted.shape)
    predicted, hits_sum = cal.predicted.copy(), cal.hits.copy()
    assert same(cal.factors(), ref.factors(hits_sum, predicted, cal.settings.prior, cal.settings.max_factor))
    cal.update_rows(merged, after)
    ref.calibrate(predicted, hits_sum, cal.settings.depths, cal.settings.decay, merged, after)
    assert same(cal.predicted, predicted) and same(cal.hits, hits_sum)
    assert same(cal.factors(), ref.factors(hits_sum, predicted, cal.settings.prior, cal.settings.max_factor))


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 5), st.integers(1, 4), st.integers(1, 30),
       st.integers(1, 6), st.booleans(), st.sampled_from([0.0, 0.5, 1.0]))
def test_kernel_equals_numpy(seed, rows, sources, max_n, vocab, with_factors, smoothing):
    rng = np.random.default_rng(seed)
    trees = random_forest(rng, rows, sources, max_n, vocab)
    max_depths = rng.integers(0, 12, size=rows).astype(np.int64)
    if rng.random() < 0.5:
        max_depths[:] = 1 << 30
    check_forest(rng, trees, sources, max_depths, smoothing, with_factors)


@pytest.mark.parametrize("seed", range(12))
def test_kernel_sweep(seed):
    """Bigger forests: up to 32 rows x 4 sources x 64 nodes, depth up to 16 and beyond."""
    rng = np.random.default_rng(1000 + seed)
    rows = int(rng.choice([1, 3, 8, 32]))
    sources = int(rng.integers(1, 5))
    trees = random_forest(rng, rows, sources, 64, int(rng.choice([2, 5, 50])))
    max_depths = rng.integers(0, 20, size=rows).astype(np.int64)
    check_forest(rng, trees, sources, max_depths, float(rng.choice([0.0, 1.0])), bool(seed % 2))


def test_kernel_rejects_bad_input():
    tree = DraftTree(np.array([1, 2]), np.array([-1, 0]), np.array([3, 4]))
    with pytest.raises(IndexError):  # a source beyond n_sources
        merge_rows([[tree, tree]], None, np.array([5]), n_sources=1)
    merged = merge_rows([[tree]], None, np.array([5]))
    with pytest.raises(ValueError):  # kept indices not ascending
        kept_nodes(merged, np.array([1, 0]))
    with pytest.raises(AssertionError):  # a child without its parent
        select_rows(merged, np.array([1]), np.array([1, 0]))
    i64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
    with pytest.raises(ValueError):  # tokens [B, W + 1] narrower than length + 1
        _step.cut(i64(1, 2)[None], i64(2), i64(5), i64(), np.empty(1, np.int64), np.empty(1, np.int64))
    with pytest.raises(IndexError):  # a path node beyond the kept nodes
        _step.compact(i64(0), i64(3)[None], i64(1), np.empty((1, 2), np.int64), np.empty((1, 2), bool))
    with pytest.raises(TypeError):  # a float array where int64 belongs
        _step.credit(np.zeros(2), i64(0), i64(0)[None], i64(1), 0, np.zeros((1, 1), np.int64), np.empty(1))
    with pytest.raises(ValueError):  # an accepted path longer than the caller's width (0 here)
        _step.settle(i64(5), i64(-1), i64(1), i64(0, 1), i64(0), i64(0), i64(5, 7)[None], i64(3), i64(), None,
                     np.empty((1, 0), np.int64), np.empty((1, 1), np.int64), *(np.empty(1, np.int64),) * 3,
                     np.empty((1, 1), np.int64), np.empty((1, 1), bool))
    bins = np.full((2, 1), 8, dtype=np.int64)  # an evidence bin out of range
    with pytest.raises(IndexError):
        _step.calibrate(i64(1, 2), i64(1, 2), i64(0, 2), np.ones((2, 1)), bins, i64(1, 1), 0.9,
                        np.zeros((1, 2, 8)), np.zeros((1, 2, 8)))


@pytest.mark.parametrize("seed", range(6))
def test_ranked_ties_zeros_nan(seed):
    """ranked orders like numpy's lexsort: ties by index, -0.0 == 0.0, NaN last."""
    from decoder.tree import MergedTree

    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 80, size=int(rng.integers(1, 6)))
    n = int(sizes.sum())
    path_p = rng.choice(np.array([0.0, -0.0, 0.25, 0.5, 1.0, np.nan, 1e-300]), size=n)
    z = np.zeros(n, dtype=np.int64)
    tree = MergedTree(z, z - 1, z + 1, z, np.zeros((n, 1)), np.zeros((n, 1), dtype=np.int64), path_p, path_p,
                      np.concatenate(([0], np.cumsum(sizes))).astype(np.int64))
    assert same(ranked(tree), ref.ranked(tree))
