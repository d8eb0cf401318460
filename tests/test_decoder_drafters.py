"""The decoder driving every real local drafter (all hooks: side branches, top-k) stays exact."""
from __future__ import annotations

import pytest

from decoder import DecoderSettings, SpeculativeDecoder
from decoder.drafters.registry import LOCAL, make_drafters
from decoder_util import StubTokenizer, greedy, prompts, single_thread, tiny_model  # noqa: F401

pytestmark = pytest.mark.usefixtures("single_thread")
N = 40


@pytest.mark.parametrize("kind,attn,budget", [("llama", "sdpa", 24), ("qwen2", "eager", "auto")])
def test_all_local_drafters_exact(kind, attn, budget):
    model = tiny_model(kind, attn, seed=13)
    ps = prompts(3, seed=5, lo=3, hi=25)
    # repetitive prompts give the n-gram / copy drafters something to find
    ps = [p + p[:6] + p for p in ps]
    ref = [greedy(model, p, N) for p in ps]
    drafters = make_drafters(list(LOCAL))
    assert {d.name for d in drafters} == set(LOCAL)
    dec = SpeculativeDecoder(model, StubTokenizer(), drafters, DecoderSettings(budget=budget, warmup_repeats=1))
    singles = [dec.generate(p, max_new_tokens=N, references=[p[::-1]]) for p in ps]
    assert [g.token_ids for g in singles] == ref
    batch = dec.generate_batch(ps, max_new_tokens=N, references=[ps[0]])
    assert [g.token_ids for g in batch] == ref
    used = set().union(*[g.stats.accepted_by_source for g in singles + batch])
    assert used, "no drafter ever got a token accepted"
    assert sum(g.stats.steps for g in singles) < len(ps) * N
