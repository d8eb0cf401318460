"""The SuffixDecoding peer (benchmarks/peers/suffix_decoding.py): its draft -> DraftTree conversion
(always; a fake native module stands in when `make peers` was not run) and, with the real suffix
tree built, lossless decoding with it in our SpeculativeDecoder (fp32, equal to plain greedy)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.peers import suffix_decoding as sd
from decoder.drafters._util import SCALE
from decoder.tree import raw_probabilities

BUILT, WHY = sd.available()
needs_native = pytest.mark.skipif(not BUILT, reason=f"SuffixDecoding not built: {WHY}")


def test_draft_to_tree_counts_reproduce_conditional_probabilities():
    # root 7 (p 1) -> {8 (0.6) -> 3 (0.3), 9 (0.3)}: path probabilities as the suffix tree gives them
    tree = sd.draft_to_tree([7, 8, 9, 3], [-1, 0, 0, 1], [1.0, 0.6, 0.3, 0.3], match_len=5, max_depth=16)
    assert tree.tokens.tolist() == [7, 8, 9, 3]
    assert tree.parents.tolist() == [-1, 0, 0, 1]
    assert tree.match_len == 5 and tree.source == "suffix_decoding"
    assert tree.counts.tolist() == [SCALE, round(0.6 * SCALE), round(0.3 * SCALE), round(0.3 * SCALE)]
    p = raw_probabilities(tree)
    np.testing.assert_allclose(p, [1.0, 0.6, 0.3, 0.5], rtol=1e-9)  # 0.3 / 0.6 = P(3 | 7 8)


def test_draft_to_tree_roots_are_normalised_over_siblings():
    tree = sd.draft_to_tree([4, 5], [-1, -1], [0.5, 0.25], match_len=1, max_depth=4)
    np.testing.assert_allclose(raw_probabilities(tree), [2 / 3, 1 / 3])


def test_draft_to_tree_cuts_depth_and_reindexes_parents():
    # a chain 1-2-3 with a branch 2 -> 9 found after 3, then 3 -> 4
    tree = sd.draft_to_tree([1, 2, 3, 9, 4], [-1, 0, 1, 1, 2], [1.0, 0.9, 0.6, 0.3, 0.6], 3, max_depth=2)
    assert tree.paths() == {(1,): SCALE, (1, 2): round(0.9 * SCALE)}
    tree = sd.draft_to_tree([1, 2, 3, 9, 4], [-1, 0, 1, 1, 2], [1.0, 0.9, 0.6, 0.3, 0.6], 3, max_depth=3)
    assert tree.tokens.tolist() == [1, 2, 3, 9] and tree.parents.tolist() == [-1, 0, 1, 1]
    assert len(sd.draft_to_tree([1], [-1], [1.0], 1, max_depth=0)) == 0
    assert len(sd.draft_to_tree([], [], [], 0, max_depth=8)) == 0
    with pytest.raises(ValueError):
        sd.draft_to_tree([1, 2], [1, -1], [1.0, 1.0], 1, max_depth=4)


class FakeTree:
    """Records calls; speculate returns a scripted draft with the given score."""

    def __init__(self, depth, score=0.0, draft=([], [], [])):
        self.depth, self.score, self.draft = depth, score, draft
        self.seqs: dict[int, list[int]] = {}
        self.calls: list[tuple] = []

    def extend_ndarray(self, seq, toks):
        assert toks.dtype == np.int32 and toks.flags["C_CONTIGUOUS"]
        self.seqs.setdefault(seq, []).extend(toks.tolist())

    def remove(self, seq):
        self.seqs.pop(seq, None)

    def speculate_ndarray(self, ctx, *args):
        self.calls.append((ctx.tolist(), *args))
        t, p, q = self.draft
        return SimpleNamespace(token_ids=t, parents=p, probs=q, score=self.score, match_len=2)


class FakeStore:
    separator = 99

    def __init__(self, tokens):
        self.indexes = [SimpleNamespace(tokens=np.asarray(tokens, dtype=np.uint16))]


def fake_native(trees):
    def make(depth):
        t = FakeTree(depth)
        trees.append(t)
        return t

    return SimpleNamespace(SuffixTree=make)


def test_drafter_lifecycle_with_a_fake_tree():
    trees: list[FakeTree] = []
    store = FakeStore([5, 6, 99, 7, 99, 8, 8, 8, 99])
    d = sd.SuffixDecodingDrafter(store, native=fake_native(trees))
    glob = trees[0]
    assert glob.seqs == {0: [5, 6], 1: [7], 2: [8, 8, 8]} and d.corpus.tokens == 6
    d.begin(0, np.array([1, 2, 3]), references=[np.array([4, 4])])
    local = trees[1]
    assert local.seqs == {0: [1, 2, 3], 1: [4, 4]}
    local.score, local.draft = 1.5, ([10, 11], [-1, 0], [1.0, 0.5])
    glob.score, glob.draft = 1.0, ([12], [-1], [1.0])
    ctx = np.arange(40)
    tree = d.propose(0, ctx, 64, 16)
    assert tree.tokens.tolist() == [10, 11] and tree.match_len == 2
    # the last 24 tokens, vLLM's defaults
    assert local.calls[-1] == (list(range(16, 40)), 24, 1.0, 0.0, 0.1, True) == glob.calls[-1]
    glob.score = 2.0
    assert d.propose(0, ctx, 64, 16).tokens.tolist() == [12]
    glob.score = 1.5  # a tie goes to the row's own tree
    assert d.propose(0, ctx, 5, 16).tokens.tolist() == [10, 11] and local.calls[-1][1] == 5
    d.observe(0, np.array([30, 31]))
    assert local.seqs[0] == [1, 2, 3, 30, 31] and glob.seqs[3] == [30, 31]  # response: next seq id
    d.end(0)
    assert len(d.propose(0, ctx, 64, 16)) == 0  # no active row
    d.begin(0, np.array([1]))
    d.observe(0, np.array([40]))
    assert glob.seqs[3] == [30, 31] and glob.seqs[4] == [40]  # the earlier response stays
    d.forget_responses()
    assert set(glob.seqs) == {0, 1, 2}


def test_drafters_sharing_a_corpus_tree_see_only_their_own_responses():
    trees: list[FakeTree] = []
    corpus = sd.CorpusTree(FakeStore([5, 6, 99]), native=fake_native(trees))
    glob = trees[0]
    a, b = sd.SuffixDecodingDrafter(corpus=corpus), sd.SuffixDecodingDrafter(corpus=corpus)
    a.begin(0, np.array([1]))
    a.observe(0, np.array([10, 11]))
    a.observe(0, np.array([12]))
    a.end(0)
    assert glob.seqs == {0: [5, 6], 1: [10, 11, 12]}
    b.begin(0, np.array([1]))  # a's answer leaves the tree, b's row gets its own sequence
    b.observe(0, np.array([20]))
    assert glob.seqs == {0: [5, 6], 2: [20]}
    a.begin(1, np.array([2]))  # back to a: its answer returns (fresh id), b's leaves
    assert glob.seqs == {0: [5, 6], 3: [10, 11, 12]}
    a.observe(1, np.array([13]))
    assert glob.seqs[4] == [13]
    with pytest.raises(ValueError):
        sd.SuffixDecodingDrafter(FakeStore([5, 99]), corpus=corpus)


def test_corpus_documents_cap():
    store = FakeStore([5, 6, 99, 7, 99, 99, 8, 8, 8, 99])
    assert [x.tolist() for x in sd.corpus_documents(store)] == [[5, 6], [7], [8, 8, 8]]
    assert [x.tolist() for x in sd.corpus_documents(store, 4)] == [[5, 6], [7], [8]]


@needs_native
def test_native_draft_shape():
    m = sd.load_native()
    t = m.SuffixTree(24)
    t.extend_ndarray(0, np.array([5, 6, 7, 8, 5, 6, 7, 9, 5, 6, 7, 8], dtype=np.int32))
    d = t.speculate_ndarray(np.array([1, 5, 6], dtype=np.int32), 24, 1.0, 0.0, 0.1, True)
    tree = sd.draft_to_tree(d.token_ids, d.parents, d.probs, d.match_len, 16)
    assert tree.tokens[0] == 7 and tree.parents[0] == -1 and d.match_len == 2
    assert len(tree) <= 2  # max_spec_factor 1.0 x match length 2


@needs_native
@pytest.mark.parametrize("kind,attn", [("llama", "eager"), ("qwen2", "sdpa")])
def test_suffix_decoding_in_our_decoder_equals_greedy(kind, attn):
    from decoder import DecoderSettings, SpeculativeDecoder
    from decoder_util import StubTokenizer, greedy, prompts, tiny_model

    n = 32
    model = tiny_model(kind, attn, seed=5)
    ps = prompts(4, seed=11, lo=6, hi=30)
    ps[0] = ps[0] + ps[0][:8]  # repeats itself: the prompt tree drafts
    full = [greedy(model, p, n) for p in ps]
    drafter = sd.SuffixDecodingDrafter()
    dec = SpeculativeDecoder(model, StubTokenizer(), [drafter], DecoderSettings(budget=64))
    accepted = 0
    for p, f in zip(ps + ps[:1], full + full[:1]):  # the last prompt again: drafts from its own answer
        g = dec.generate(p, max_new_tokens=n)
        assert g.token_ids == f
        accepted += g.stats.accepted_by_source.get("suffix_decoding", 0)
    assert accepted > 0 and drafter.proposed_nodes > 0
    gens = dec.generate_batch(ps, max_new_tokens=n)  # rows of a batch
    assert [g.token_ids for g in gens] == full
