"""generate_batch: rows of different lengths, trees, stop points == their single decodes (per device)."""
from __future__ import annotations

import pytest

from decoder import DecoderSettings, SpeculativeDecoder
from decoder_util import OracleDrafter, SideDrafter, StubTokenizer, greedy, prompts, single_thread, tiny_model  # noqa: F401

pytestmark = pytest.mark.usefixtures("single_thread")

N = 20


@pytest.mark.parametrize("kind,attn", [("llama", "eager"), ("qwen2", "sdpa")])
@pytest.mark.parametrize("mode", ["right", "bushy", "wrong"])
def test_batch_equals_single(kind, attn, mode, device):
    model = tiny_model(kind, attn, seed=11, device=device)
    ps = prompts(6, seed=2, lo=1, hi=30)  # lengths 1..29: left padding of very different widths
    full = [greedy(model, p, N + 10) for p in ps]
    truth = {i: p + f for i, (p, f) in enumerate(zip(ps, full))}
    oracle = OracleDrafter(truth, mode)
    dec = SpeculativeDecoder(model, StubTokenizer(), [oracle, SideDrafter(3)], DecoderSettings(budget=12))
    # different max_new_tokens per row is not an API feature: rows stop at different steps through
    # their trees instead (bushy/right accept different amounts per row)
    gens = dec.generate_batch(ps, max_new_tokens=N)
    assert [g.token_ids for g in gens] == [f[:N] for f in full]
    assert [g.prompt_ids for g in gens] == ps
    assert oracle.calls["begin"] == oracle.calls["end"] == len(ps)


def test_batch_rows_finish_at_different_steps(device):
    """EOS ends some rows early; they drop out and the others continue unchanged."""
    model = tiny_model("llama", "eager", seed=11, device=device)
    ps = prompts(6, seed=4, lo=2, hi=25)
    full = [greedy(model, p, N + 10) for p in ps]
    eos = full[2][4]
    model.generation_config.eos_token_id = eos
    ref = [greedy(model, p, N, eos=eos) for p in ps]
    assert len({len(r) for r in ref}) > 1, "the EOS should end rows at different lengths"
    truth = {i: p + f for i, (p, f) in enumerate(zip(ps, full))}
    for mode in ("right", "bushy"):
        dec = SpeculativeDecoder(model, StubTokenizer(), [OracleDrafter(truth, mode)], DecoderSettings(budget=6))
        gens = dec.generate_batch(ps, max_new_tokens=N)
        assert [g.token_ids for g in gens] == ref
        singles = [dec.generate(p, max_new_tokens=N).token_ids for p in ps[:1]]
        assert singles == ref[:1]
