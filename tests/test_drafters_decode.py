"""Lossless decoding with every local drafter on: token-for-token equal to
model.generate(do_sample=False) in fp32, for tiny random Llama/Qwen2 (and SmolLM2 under -m slow),
single rows and batches, with and without references; on the CPU and (when present) CUDA."""
from __future__ import annotations

import numpy as np
import pytest

from decoder import DecoderSettings, SpeculativeDecoder
from decoder.drafters.lookahead import LookaheadDrafter
from decoder.drafters.ngram import NGramDrafter
from decoder.drafters.recycle import RecycleDrafter
from decoder.drafters.reference import ReferenceDrafter
from decoder.drafters.registry import make_drafters
from decoder_util import StubTokenizer, greedy, prompts, tiny_model

N = 32
ARCHS = [("llama", "eager"), ("qwen2", "sdpa")]


class SpyLookahead(LookaheadDrafter):
    """Counts the Jacobi steps and harvested n-grams the decoder drove."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.steps = 0
        self.harvested = 0

    def side_result(self, row, argmax):
        super().side_result(row, argmax)
        self.steps += 1
        self.harvested = max(self.harvested, sum(len(v) for v in self._rows[row].pool.values()))


def local_drafters(**lookahead):
    return [ReferenceDrafter(), NGramDrafter(), RecycleDrafter(), SpyLookahead(**lookahead)]


def make_case(kind: str, attn: str, device: str = "cpu"):
    model = tiny_model(kind, attn, seed=5, device=device)
    ps = prompts(4, seed=11, lo=6, hi=30)
    ps[0] = ps[0] + ps[0][:8]  # a prompt that repeats itself: the copy sources fire
    full = [greedy(model, p, N) for p in ps]
    return model, ps, full


@pytest.fixture(scope="module", params=ARCHS, ids=lambda a: "-".join(a))
def case(request, device):
    return make_case(*request.param, device=device)


@pytest.fixture(scope="module")
def one(device):
    """One architecture for the tests whose point is not the architecture."""
    return make_case("llama", "sdpa", device=device)


def test_all_local_drafters_equal_greedy(case):
    model, ps, full = case
    drafters = local_drafters()
    dec = SpeculativeDecoder(model, StubTokenizer(), drafters, DecoderSettings(budget=12))
    steps = 0
    for p, f in zip(ps, full):
        g = dec.generate(p, max_new_tokens=N)
        assert g.token_ids == f
        steps += g.stats.steps
    spy = drafters[-1]
    assert spy.steps == steps  # the window rode in every forward
    assert spy.harvested > 0
    assert drafters[2].table.max() >= 0  # the decoder fed the recycle table


def test_all_local_drafters_equal_greedy_in_a_batch_with_references(case):
    model, ps, full = case
    refs = [[np.array(p + f[: N // 2])] for p, f in zip(ps, full)]  # half of each answer to copy
    dec = SpeculativeDecoder(model, StubTokenizer(), local_drafters(window=3, ngram=3), DecoderSettings(budget=16))
    gens = dec.generate_batch(ps, max_new_tokens=N, references=refs)
    assert [g.token_ids for g in gens] == full
    assert sum(g.stats.accepted_by_source.get("reference", 0) for g in gens) >= len(ps) * (N // 4)


def test_reference_copy_speeds_up_a_known_answer(one):
    model, ps, full = one
    p, f = ps[1], full[1]
    plain = SpeculativeDecoder(model, StubTokenizer(), [], DecoderSettings(budget=16)).generate(p, max_new_tokens=N)
    dec = SpeculativeDecoder(model, StubTokenizer(), [ReferenceDrafter()], DecoderSettings(budget=16))
    g = dec.generate(p, max_new_tokens=N, references=[np.array(p + f)])
    assert g.token_ids == plain.token_ids == f
    assert plain.stats.tokens_per_step == 1.0
    assert g.stats.tokens_per_step > 4  # copy length adapts upward: 8, 16, 32 tokens
    assert g.stats.accepted_by_source["reference"] >= N - g.stats.steps


@pytest.mark.parametrize("names", [["reference"], ["ngram"], ["recycle"], ["lookahead"]])
def test_each_source_alone_through_the_registry(one, names):
    model, ps, full = one
    dec = SpeculativeDecoder(model, StubTokenizer(), make_drafters(names), DecoderSettings(budget=8))
    gens = dec.generate_batch(ps[:2], max_new_tokens=N)
    assert [g.token_ids for g in gens] == full[:2]


def test_recycle_table_outlives_requests(one):
    model, ps, full = one
    recycle = RecycleDrafter()
    dec = SpeculativeDecoder(model, StubTokenizer(), [recycle], DecoderSettings(budget=16))
    first = dec.generate(ps[2], max_new_tokens=N)
    again = dec.generate(ps[2], max_new_tokens=N)  # same request: the table already knows it
    assert first.token_ids == again.token_ids == full[2]
    assert again.stats.steps < first.stats.steps


def test_auto_budget_with_all_sources(one):
    model, ps, full = one
    dec = SpeculativeDecoder(model, StubTokenizer(), local_drafters(),
                             DecoderSettings(budget="auto", warmup_repeats=1, warmup_context=64))
    gens = dec.generate_batch(ps[:3], max_new_tokens=N)
    assert [g.token_ids for g in gens] == full[:3]


@pytest.mark.slow
def test_smollm2_all_sources_equal_greedy(device):
    import torch

    from decoder.models import load_model

    model, tok = load_model("smollm2", dtype="float32", device=device)
    texts = [
        'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
        "The quick brown fox jumps over the lazy dog. The quick brown fox",
        "import os\nimport sys\n\n\ndef main():\n    for path in sys.argv[1:]:\n",
    ]
    ps = [tok(t)["input_ids"] for t in texts]
    n = 32
    full = []
    for p in ps:
        x = torch.tensor([p], device=model.device)
        with torch.no_grad():
            out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                                 pad_token_id=tok.pad_token_id or 0)
        full.append(out[0, len(p):].tolist())
    dec = SpeculativeDecoder(model, tok, local_drafters(), DecoderSettings(budget=16))
    for p, f in zip(ps, full):  # single rows (generate stops at EOS like the baseline)
        assert dec.generate(p, max_new_tokens=n).token_ids == f
    gens = dec.generate_batch(ps, max_new_tokens=n, references=[texts[0] + "    if n < 2:\n        return n\n"])
    assert [g.token_ids for g in gens] == full
