"""Lossless sampling: same seed -> same output; with drafts the distribution equals plain sampling.
Every test runs once per `device` (tests/conftest.py; cuda skipped without one)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from datastore.tree import DraftTree
from decoder import DecoderSettings, SpeculativeDecoder
from decoder.drafters.base import Drafter
from decoder.verify import warp
from decoder_util import OracleDrafter, StubTokenizer, greedy, single_thread, tiny_model  # noqa: F401

pytestmark = pytest.mark.usefixtures("single_thread")
PROMPT = [5, 17, 33, 2, 60]
TEMP = 1.5


@pytest.fixture(scope="module")
def model(device):
    return tiny_model("llama", "sdpa", seed=21, device=device)


def exact(model, temperature, top_p):
    """-> p1 [V] first-token probabilities, p2 [V] second-token marginal, p2_given [V, V]."""
    with torch.no_grad():
        p1 = warp(model(torch.tensor([PROMPT], device=model.device)).logits[0, -1:], temperature, top_p)[0]
        v = p1.shape[0]
        seqs = torch.tensor([PROMPT + [t] for t in range(v)], device=model.device)
        p2_given = warp(model(seqs).logits[:, -1], temperature, top_p)  # [V, V]
    p1, p2_given = p1.cpu(), p2_given.cpu()
    return p1.double().numpy(), (p1[:, None] * p2_given).sum(0).double().numpy(), p2_given.double().numpy()


class LikelyTree(Drafter):
    """At the prompt: a tree of the 4 likeliest first tokens x their 3 likeliest successors,
    in a scrambled order. Afterwards nothing."""

    name = "likely"

    def __init__(self, p1, p2_given):
        first = np.argsort(-p1)[:4][[2, 0, 3, 1]]
        tokens, parents = [], []
        for t in first:
            tokens.append(int(t)); parents.append(-1)
            node = len(tokens) - 1
            for c in np.argsort(-p2_given[t])[:3][::-1]:
                tokens.append(int(c)); parents.append(node)
        self.tree = DraftTree(np.array(tokens), np.array(parents), np.ones(len(tokens), dtype=np.int64), 1, self.name)

    def propose(self, row, context, budget, max_depth):
        return self.tree if len(context) == len(PROMPT) else DraftTree.empty(self.name)


class EchoDrafter(Drafter):
    """Proposes the context's last 6 tokens again (a chain)."""

    name = "echo"

    def propose(self, row, context, budget, max_depth):
        tail = context[-min(6, max_depth):] if max_depth > 0 else context[:0]
        return DraftTree(tail, np.arange(-1, len(tail) - 1), np.ones(len(tail), dtype=np.int64), 1, self.name)


def chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Goodness of fit; cells expected < 5 pooled."""
    n = counts.sum()
    expect = probs * n
    small = expect < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expect[~small], expect[small].sum())
    keep = exp > 0
    stat = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64),
                                         torch.tensor(stat / 2.0, dtype=torch.float64)))


def sample(model, drafters, n, seed, temperature=TEMP, top_p=1.0):
    dec = SpeculativeDecoder(model, StubTokenizer(), drafters, DecoderSettings(budget=16))
    gens = dec.generate_batch([PROMPT] * n, max_new_tokens=2, temperature=temperature, top_p=top_p, seed=seed)
    return np.array([g.token_ids for g in gens]), gens


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_distribution_with_drafts_equals_plain(model, top_p):
    p1, p2, p2_given = exact(model, TEMP, top_p)
    v = p1.shape[0]
    drafted, gens = sample(model, [LikelyTree(p1, p2_given)], 3000, seed=1, top_p=top_p)
    assert sum(g.stats.accepted_by_source.get("likely", 0) for g in gens) > 300  # drafts were used
    plain, _ = sample(model, [], 3000, seed=2, top_p=top_p)
    for toks in (drafted, plain):
        assert chi2_pvalue(np.bincount(toks[:, 0], minlength=v), p1) > 1e-3
        assert chi2_pvalue(np.bincount(toks[:, 1], minlength=v), p2) > 1e-3
        mode = int(np.argmax(p1))  # second token given the likeliest first one
        given = toks[toks[:, 0] == mode, 1]
        assert chi2_pvalue(np.bincount(given, minlength=v), p2_given[mode]) > 1e-3
    # the test has power: the same samples against another temperature's distribution fail
    q1, _, _ = exact(model, TEMP * 0.7, top_p)
    assert chi2_pvalue(np.bincount(drafted[:, 0], minlength=v), q1) < 1e-6


def test_same_seed_same_output(model):
    p1, _, p2_given = exact(model, 1.0, 1.0)
    runs = []
    for seed in (7, 7, 8):
        dec = SpeculativeDecoder(model, StubTokenizer(), [LikelyTree(p1, p2_given), EchoDrafter()],
                                 DecoderSettings(budget=8))
        runs.append(dec.generate(PROMPT, max_new_tokens=30, temperature=1.0, seed=seed).token_ids)
    assert runs[0] == runs[1] and runs[0] != runs[2]
    assert len(runs[0]) == 30


def test_low_temperature_is_greedy(model):
    """temperature -> 0 makes sampling greedy: a sanity check of the sampling path with trees."""
    ref = greedy(model, PROMPT, 20)
    truth = {0: PROMPT + ref + [3] * 20}
    dec = SpeculativeDecoder(model, StubTokenizer(), [OracleDrafter(truth, "bushy")], DecoderSettings(budget=12))
    g = dec.generate(PROMPT, max_new_tokens=20, temperature=1e-4, seed=0)
    assert g.token_ids == ref and g.stats.tokens_per_step > 1.5


def test_bad_sampling_arguments(model):
    dec = SpeculativeDecoder(model, StubTokenizer(), [], DecoderSettings(budget=1))
    for kw in ({"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"max_new_tokens": -1}):
        with pytest.raises(ValueError):
            dec.generate(PROMPT, **kw)
    with pytest.raises(ValueError, match="empty"):
        dec.generate([])
    with pytest.raises(ValueError, match="token ids"):
        dec.generate([1, 10_000])
