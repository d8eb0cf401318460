"""SuffixDecoding (Snowflake ArcticInference; NeurIPS 2025) as a `Drafter` of our decoder: the peer
column of benchmarks/bench_drafters.py.

Its C++ suffix tree is built by `make peers` (benchmarks/peers/build_suffix.py) into the package
`arctic_suffix_tree`; this module is a thin wrapper of our own over its two calls,
`SuffixTree.extend_ndarray(seq_id, tokens)` and `SuffixTree.speculate_ndarray(context,
max_spec_tokens, max_spec_factor, max_spec_offset, min_token_prob, use_tree_spec)`, doing what
ArcticInference's `SuffixDecodingCache` does in vLLM:

- one suffix tree per active row holds its prompt (+ `references`, the same inputs our reference
  drafter gets) and its response so far, extended token by token as `observe` reports them;
- one global tree holds every earlier response (its own sequence id per request; vLLM keeps it
  after `stop_request`, so do we after `end`), extended token by token too, and here also the
  datastore corpus the other drafters read (`corpus_documents`), so both sides draft from the same
  text (`CorpusTree`: the benchmark shares one per datastore between its decoder settings, each
  setting seeing only its own earlier responses);
- each step both trees speculate on the last `max_tree_depth` context tokens; the draft with the
  higher score (sum of its path probabilities) wins, the row's own tree on a tie.

vLLM's defaults (`suffix_decoding_max_tree_depth` 24, `..._max_spec_factor` 1.0,
`..._min_token_prob` 0.1, `num_speculative_tokens` = the tree depth) with ArcticInference's tree
speculation on. The suffix tree's depth bounds the matched suffix to 23 tokens, and
`max_spec_factor` 1.0 bounds the draft by the match length, so a draft has at most 23 nodes at
either of the decoder's budgets; its depth is cut to the decoder's `max_depth` (16).

Corpus size (measured on this 2-core machine, depth 24): the stdlib store's 3.43M tokens fill the
tree in 6-17 s (load-dependent) and +0.9 GB RSS (the tree's estimate_memory: 1.0 GB); the ShareGPT
store's 21.5M in 49-470 s (idle to fully loaded cores) and +5.0 GB RSS (estimate 5.6 GB); a
speculate call takes ~10-15 us on either. Both fit, so the whole corpus goes in by default (the
peer drafts from exactly the text our retrieval drafter reads); `corpus_tokens` caps it for
machines with less memory.

Probabilities -> counts: a draft node's `probs` is its path probability (the product of
count(child) / count(parent) in the suffix tree). counts = round(prob x SCALE), so the decoder's
estimate count / max(parent count, sum of sibling counts) (decoder/tree.py raw_probabilities) is
exactly the tree's conditional probability for every non-root node. Roots have no parent count
there: the decoder divides them by the sum over the root siblings, as it does for every source,
so a lone root of probability p < 1 reads as 1 (calibration then learns its real acceptance).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from datastore.tree import DraftTree
from decoder.drafters._util import SCALE
from decoder.drafters.base import Drafter

MODULE = "arctic_suffix_tree"
BUILD_HINT = "run `make peers` (benchmarks/peers/build_suffix.py) to build SuffixDecoding's suffix tree"


@dataclass(frozen=True)
class SuffixSettings:
    """vLLM's SuffixDecoding defaults; use_tree_spec is ArcticInference's tree speculation."""

    max_tree_depth: int = 24
    max_spec_tokens: int = 24  # vLLM: num_speculative_tokens, by default the tree depth
    max_spec_factor: float = 1.0
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1
    use_tree_spec: bool = True


def load_native():
    """The built `arctic_suffix_tree` module; ImportError with the build command if absent."""
    try:
        import arctic_suffix_tree  # noqa: PLC0415 - built by `make peers`, optional
    except ImportError as exc:
        raise ImportError(f"SuffixDecoding is not built ({exc}); {BUILD_HINT}") from exc
    return arctic_suffix_tree


def available() -> tuple[bool, str]:
    """(True, version) when the native module imports, else (False, why)."""
    try:
        return True, load_native().__version__
    except ImportError as exc:
        return False, str(exc)


def draft_to_tree(token_ids: Sequence[int], parents: Sequence[int], probs: Sequence[float], match_len: int,
                  max_depth: int, source: str = "suffix_decoding") -> DraftTree:
    """A SuffixDecoding draft (token_ids, parents: -1 = after the context, parents precede
    children; probs: path probabilities) as a DraftTree with counts = round(prob x SCALE), nodes
    deeper than max_depth dropped (their subtrees with them; parents re-indexed)."""
    tok = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    par = np.asarray(parents, dtype=np.int64).reshape(-1)
    prob = np.asarray(probs, dtype=np.float64).reshape(-1)
    n = tok.shape[0]
    if not (par.shape[0] == prob.shape[0] == n):
        raise ValueError(f"draft arrays differ in length: {n} tokens, {par.shape[0]} parents, {prob.shape[0]} probs")
    if n == 0 or max_depth <= 0:
        return DraftTree.empty(source)
    if np.any(par >= np.arange(n)) or np.any(par < -1):
        raise ValueError("draft parents must be -1 or an earlier node")
    depth = np.ones(n, dtype=np.int64)
    for i, p in enumerate(par.tolist()):  # n <= max_spec_tokens (24): topological order
        if p >= 0:
            depth[i] = depth[p] + 1
    keep = depth <= max_depth  # a parent is never deeper than its child: kept nodes keep their parents
    new_index = np.cumsum(keep) - 1
    par = np.where(par >= 0, new_index[np.maximum(par, 0)], -1)[keep]
    counts = np.maximum(np.rint(prob[keep] * SCALE), 1).astype(np.int64)
    return DraftTree(tok[keep], par, counts, int(match_len), source)


def corpus_documents(datastore, max_tokens: int | None = None) -> Iterator[np.ndarray]:
    """The datastore's documents in storage order ([k] int32 each, separators stripped): per shard,
    `shard/i/tokens` split at the separator, stopping once `max_tokens` (None = all) were given."""
    sep = datastore.separator
    given = 0
    for index in datastore.indexes:
        toks = index.tokens  # [n] uint16|uint32, every document followed by the separator
        ends = np.flatnonzero(toks == sep)
        start = 0
        for end in ends.tolist():
            if end > start:
                take = end - start if max_tokens is None else min(end - start, max_tokens - given)
                yield np.ascontiguousarray(toks[start:start + take], dtype=np.int32)
                given += take
                if max_tokens is not None and given >= max_tokens:
                    return
            start = end + 1


class CorpusTree:
    """A global suffix tree pre-filled with a datastore's documents, shared by several drafters
    (one per decoder setting of a benchmark) so the corpus is held once. Only the active drafter's
    responses are in it: `activate` swaps the previous owner's responses out (their tokens are
    kept) and the new owner's back in, so each setting drafts from its own earlier answers only."""

    def __init__(self, datastore=None, corpus_tokens: int | None = None, max_tree_depth: int = 24, native=None):
        """datastore: a `datastore.store.Datastore` (None = no corpus, as vLLM starts);
        corpus_tokens caps how many of its tokens go in (None = all)."""
        self.native = native if native is not None else load_native()
        self.max_tree_depth = max_tree_depth
        self.tree = self.native.SuffixTree(max_tree_depth)
        self.seqs = 0  # sequence ids 0..seqs-1 hold the corpus documents
        self.tokens = 0
        self.seconds = 0.0
        if datastore is not None:
            t0 = time.perf_counter()
            for doc in corpus_documents(datastore, corpus_tokens):
                self.tree.extend_ndarray(self.seqs, doc)
                self.seqs += 1
                self.tokens += int(doc.shape[0])
            self.seconds = time.perf_counter() - t0
        self.next_seq = self.seqs  # responses get fresh ids from here on
        self.owner = None

    def new_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def activate(self, drafter: "SuffixDecodingDrafter") -> None:
        if self.owner is drafter:
            return
        if self.owner is not None:
            self.owner._detach()
        self.owner = drafter
        drafter._attach()

    def memory_bytes(self) -> int:
        """The tree's own estimate of its memory (walks the whole tree: not for a hot loop)."""
        return int(self.tree.estimate_memory())


class SuffixDecodingDrafter(Drafter):
    """SuffixDecoding's prompt trees + global response tree (pre-filled with a datastore's corpus)."""

    name = "suffix_decoding"

    def __init__(self, datastore=None, corpus_tokens: int | None = None, settings: SuffixSettings = SuffixSettings(),
                 native=None, corpus: CorpusTree | None = None):
        """datastore/corpus_tokens: see CorpusTree; or `corpus`, a CorpusTree to share (its depth
        must be settings.max_tree_depth)."""
        self.settings = settings
        if corpus is None:
            corpus = CorpusTree(datastore, corpus_tokens, settings.max_tree_depth, native)
        elif datastore is not None:
            raise ValueError("give either datastore= or corpus=, not both")
        if corpus.max_tree_depth != settings.max_tree_depth:
            raise ValueError(f"corpus tree depth {corpus.max_tree_depth} != max_tree_depth {settings.max_tree_depth}")
        self.corpus = corpus
        self.native = corpus.native
        self._responses: dict[int, list[np.ndarray]] = {}  # seq id in the global tree -> its tokens
        self._local: dict[int, object] = {}  # row -> its prompt tree
        self._seq: dict[int, int] = {}  # row -> its response's sequence id in the global tree
        self.proposed_nodes = 0
        self.proposals = 0

    @property
    def global_tree(self):
        return self.corpus.tree

    # ------------------------------------------------------------------ Drafter hooks
    def begin(self, row: int, prompt: np.ndarray, references: Sequence[np.ndarray] = ()) -> None:
        self.corpus.activate(self)
        tree = self.native.SuffixTree(self.settings.max_tree_depth)
        tree.extend_ndarray(0, np.ascontiguousarray(prompt, dtype=np.int32))
        for i, ref in enumerate(references or ()):
            if len(ref):
                tree.extend_ndarray(1 + i, np.ascontiguousarray(ref, dtype=np.int32))
        self._local[row] = tree
        seq = self.corpus.new_seq()
        self._seq[row] = seq
        self._responses[seq] = []

    def propose(self, row: int, context: np.ndarray, budget: int, max_depth: int) -> DraftTree:
        s = self.settings
        tail = np.ascontiguousarray(np.asarray(context)[-s.max_tree_depth:], dtype=np.int32)
        limit = min(s.max_spec_tokens, int(budget))
        if limit <= 0 or max_depth <= 0 or row not in self._local:
            return DraftTree.empty(self.name)
        args = (tail, limit, s.max_spec_factor, s.max_spec_offset, s.min_token_prob, s.use_tree_spec)
        local = self._local[row].speculate_ndarray(*args)
        glob = self.global_tree.speculate_ndarray(*args)
        draft = local if local.score >= glob.score else glob
        tree = draft_to_tree(draft.token_ids, draft.parents, draft.probs, draft.match_len, max_depth, self.name)
        self.proposals += 1
        self.proposed_nodes += len(tree)
        return tree

    def observe(self, row: int, accepted: np.ndarray) -> None:
        if row not in self._local:
            return
        acc = np.ascontiguousarray(accepted, dtype=np.int32)
        self._local[row].extend_ndarray(0, acc)  # the prompt tree's sequence continues with the response
        seq = self._seq[row]
        self.global_tree.extend_ndarray(seq, acc)
        self._responses[seq].append(acc.copy())

    def end(self, row: int) -> None:
        self._local.pop(row, None)  # vLLM's stop_request: the response stays in the global tree
        self._seq.pop(row, None)

    # ------------------------------------------------------------------ shared corpus tree
    def _detach(self) -> None:
        """Take this drafter's responses out of the shared tree (their tokens are kept)."""
        for seq in self._responses:
            self.global_tree.remove(seq)

    def _attach(self) -> None:
        """Put this drafter's responses (back) into the shared tree under fresh sequence ids."""
        old, self._responses = self._responses, {}
        renamed = {}
        for seq, parts in old.items():
            new = self.corpus.new_seq()
            renamed[seq] = new
            self._responses[new] = parts
            for part in parts:
                self.global_tree.extend_ndarray(new, part)
        self._seq = {row: renamed[s] for row, s in self._seq.items()}

    def forget_responses(self) -> None:
        """Remove this drafter's responses from the global tree (the corpus stays)."""
        if self.corpus.owner is self:
            self._detach()
        self._responses.clear()
        self._local.clear()
        self._seq.clear()

    def memory_bytes(self) -> int:
        return self.corpus.memory_bytes()
