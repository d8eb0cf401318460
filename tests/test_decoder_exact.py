"""Token-for-token equality with model.generate(do_sample=False), fp32, tiny random Llama/Qwen2,
on the CPU and (when present) CUDA: every test runs once per `device` (tests/conftest.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from decoder import DecoderSettings, SpeculativeDecoder
from decoder_util import (
    OracleDrafter, SideDrafter, StubTokenizer, TopkDrafter, greedy, prompts, single_thread, tiny_model,  # noqa: F401
)

pytestmark = pytest.mark.usefixtures("single_thread")

N = 24
ARCHS = [("llama", "eager"), ("llama", "sdpa"), ("qwen2", "eager"), ("qwen2", "sdpa")]


@pytest.fixture(scope="module", params=ARCHS, ids=lambda a: "-".join(a))
def case(request, device):
    kind, attn = request.param
    model = tiny_model(kind, attn, seed=3, device=device)
    ps = prompts(3, seed=7)
    full = [greedy(model, p, N + 12) for p in ps]  # longer than the decode: drafts run past the end
    return model, ps, full


def decode_each(model, ps, truth, mode, n=N, budget=16, **kw):
    out = []
    for p, t in zip(ps, truth):
        drafter = OracleDrafter({0: t}, mode)
        dec = SpeculativeDecoder(model, StubTokenizer(), [drafter], DecoderSettings(budget=budget, **kw))
        g = dec.generate(p, max_new_tokens=n)
        assert drafter.calls["begin"] == drafter.calls["end"] == 1
        assert drafter.calls["observe"] == g.stats.steps
        out.append(g)
    return out


@pytest.mark.parametrize("mode", ["right", "wrong", "bushy", "empty", "extra"])
def test_equals_greedy(case, mode):
    model, ps, full = case
    gens = decode_each(model, ps, [p + f for p, f in zip(ps, full)], mode)
    for g, f in zip(gens, full):
        assert g.token_ids == f[:N]
        assert g.stats.new_tokens == N and g.stats.stop_reason == "length"
    tps = np.mean([g.stats.tokens_per_step for g in gens])
    if mode in ("right", "extra"):
        assert tps > 8  # 16-node chain: 17 tokens a step but for the max_new_tokens cut
    elif mode in ("wrong", "empty"):
        assert tps == 1.0
    else:
        assert 2 < tps < 8


@pytest.mark.parametrize("n", [1, 2, 5])
def test_short_outputs_and_deep_drafts(case, n):
    model, ps, full = case
    gens = decode_each(model, ps, [p + f for p, f in zip(ps, full)], "extra", n=n, budget=40)
    assert [g.token_ids for g in gens] == [f[:n] for f in full]


def test_zero_new_tokens(case):
    model, ps, _ = case
    g = SpeculativeDecoder(model, StubTokenizer(), [], DecoderSettings(budget=4)).generate(ps[0], max_new_tokens=0)
    assert g.token_ids == [] and g.stats.steps == 0


def test_one_token_prompt(case):
    model, _, _ = case
    p = [5]
    ref = greedy(model, p, N)
    dec = SpeculativeDecoder(model, StubTokenizer(), [OracleDrafter({0: p + ref}, "bushy")], DecoderSettings(budget=8))
    assert dec.generate(p, max_new_tokens=N).token_ids == ref


def test_auto_budget(case):
    model, ps, full = case
    gens = decode_each(model, ps[:2], [p + f for p, f in zip(ps, full)], "bushy", budget="auto", warmup_repeats=1)
    assert [g.token_ids for g in gens] == [f[:N] for f in full[:2]]
    assert gens[0].stats.latency_curve and min(gens[0].stats.latency_curve) == 1


def test_eos_crossing(case):
    """Drafts continue past an EOS the model produces: output stops at (and includes) the EOS."""
    model, ps, full = case
    eos = full[0][9]  # a token the model produces at step 10 of prompt 0
    ref = [greedy(model, p, N, eos=eos) for p in ps]
    assert len(ref[0]) <= 10 and ref[0][-1] == eos
    old = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = eos
    try:
        gens = decode_each(model, ps, [p + f for p, f in zip(ps, full)], "right")
        assert [g.token_ids for g in gens] == ref
        assert gens[0].stats.stop_reason == "eos"
    finally:
        model.generation_config.eos_token_id = old


def test_side_branch_unchanged_and_correct(case):
    """A side branch rides in the forward: output unchanged; its argmax is the model's own."""
    model, ps, full = case
    p = ps[1]
    side = SideDrafter(m=4)
    contexts = []

    class Recording(OracleDrafter):
        def propose(self, row, context, budget, max_depth):
            contexts.append(context.copy())
            return super().propose(row, context, budget, max_depth)

    oracle = Recording({0: p + full[1]}, "bushy")
    topk = TopkDrafter()
    dec = SpeculativeDecoder(model, StubTokenizer(), [oracle, side, topk], DecoderSettings(budget=10))
    g = dec.generate(p, max_new_tokens=N)
    assert g.token_ids == full[1][:N]
    assert len(side.results) == g.stats.steps == len(contexts) == len(topk.seen)
    # side token i sees the context and side tokens 0..i: compare with a plain forward
    for step in (0, len(contexts) // 2):
        ctx = contexts[step]
        toks = side.sent[step]
        x = torch.tensor([ctx.tolist() + toks.tolist()], device=model.device)
        with torch.no_grad():
            ref = model(x).logits[0, len(ctx):].argmax(-1).cpu().numpy()
        assert np.array_equal(side.results[step], ref)
    # top-k: the first row of each step is the last committed token, its top-1 is the next token
    tokens, top = topk.seen[0]
    assert tokens[0] == p[-1] and top[0, 0] == full[1][0]


def test_unprofitable_side_branch_rides_only_to_explore(case):
    """budget=auto: a side branch whose harvest never pays is left out of the forward but for
    exploration steps, ever rarer; outputs stay exact and side results match what rode."""
    from decoder.cost import CostModel
    from decoder.speculative import SIDE_EXPLORE

    model, ps, full = case
    side = SideDrafter(m=6)
    n = 40
    want = greedy(model, ps[0], n + 8)
    oracle = OracleDrafter({0: ps[0] + want}, "wrong")  # one token a step: many steps
    dec = SpeculativeDecoder(model, StubTokenizer(), [oracle, side], DecoderSettings(budget="auto"))
    dec.cost = CostModel({1: 1.0, 2: 1.5, 4: 2.5, 8: 4.5, 16: 8.5})  # every extra token dear
    g = dec.generate(ps[0], max_new_tokens=n)
    assert g.token_ids == want[:n]
    sizes = g.stats.side_tokens
    rode = [i for i, m in enumerate(sizes) if m]
    assert len(sizes) == g.stats.steps == n
    assert len(side.results) == len(rode) and {sizes[i] for i in rode} == {6}
    first = SIDE_EXPLORE[0]
    assert rode == [first, 2 * first + first + 1]  # 8 skipped, rides; 16 skipped, rides


def test_a_row_whose_drafts_keep_failing_stops_paying_for_trees(case, monkeypatch):
    """budget=auto with calibration off: a row's own record (accepted vs expected draft tokens)
    scales its probabilities, so always-wrong drafts soon get no nodes, but for occasional retries
    as that record decays; without it every step keeps a node. Outputs stay exact."""
    import decoder.speculative as spec
    from decoder.cost import CostModel

    model, ps, full = case
    n = 40
    want = greedy(model, ps[0], n + 8)

    def budgets():
        dec = SpeculativeDecoder(model, StubTokenizer(), [OracleDrafter({0: ps[0] + want}, "wrong")],
                                 DecoderSettings(budget="auto", calibrate=False))
        dec.cost = CostModel({1: 1.0, 2: 1.2, 4: 1.6, 8: 2.4, 16: 4.0})
        g = dec.generate(ps[0], max_new_tokens=n)
        assert g.token_ids == want[:n]
        return g.stats.budgets

    with_trust = budgets()
    assert with_trust[0] >= 1 and sum(b == 0 for b in with_trust) >= n // 4, with_trust
    assert any(b > 0 for b in with_trust[n // 2:]), with_trust  # retried as the record decays
    monkeypatch.setattr(spec, "TRUST_PRIOR", 1e9)  # trust pinned at 1: calibration alone decides
    pinned = budgets()
    assert sum(b == 0 for b in pinned) <= 1, pinned  # the last step has no room for a draft
