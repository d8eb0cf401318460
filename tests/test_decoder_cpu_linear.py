"""Packed oneDNN linears (decoder.cpu_linear) against the dense nn.Linear they replace."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from decoder import DecoderSettings, SpeculativeDecoder
from decoder.cpu_linear import PackedLinear, pack_linears
from decoder_util import OracleDrafter, StubTokenizer, greedy, prompts, single_thread, tiny_model  # noqa: F401

pytestmark = [
    pytest.mark.usefixtures("single_thread"),
    pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN"),
]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 64), (3, 64), (2, 5, 64), (1, 17, 64)])
def test_packed_matches_dense(shape, bias):
    torch.manual_seed(0)
    dense = nn.Linear(64, 96, bias=bias)
    x = torch.randn(*shape)
    packed = PackedLinear(dense)
    with torch.inference_mode():
        want, got = dense(x), packed(x)
    assert got.shape == want.shape == (*shape[:-1], 96)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_pack_counts_and_skips():
    model = tiny_model("llama", "sdpa", seed=1)
    linears = sum(type(m) is nn.Linear for m in model.modules())
    assert linears == 2 * 7 + 1  # q k v o gate up down per layer, lm_head
    assert pack_linears(model) == linears
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert pack_linears(model) == 0  # idempotent
    bf16 = tiny_model("llama", "sdpa", seed=1).to(torch.bfloat16)
    assert pack_linears(bf16) == 0  # bf16 packing needs AVX512-BF16/AMX: left dense everywhere


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_packed_model_decodes_exactly(kind, device):
    """Greedy generate and tree decoding, both on the packed model, agree token for token.
    On CUDA nothing is packed (oneDNN is a CPU kernel; load_model calls pack_linears on every
    device): the model stays dense there and must decode exactly all the same."""
    dense = tiny_model(kind, "sdpa", seed=5, device=device)
    model = tiny_model(kind, "sdpa", seed=5, device=device)
    if device == "cpu":
        assert pack_linears(model) > 0
    else:
        assert pack_linears(model) == 0
        assert any(type(m) is nn.Linear for m in model.modules())
    ps = prompts(4, seed=11)
    n = 20
    for p in ps:
        full = greedy(model, p, n + 8)
        assert full[:n] == greedy(dense, p, n)  # peaked random model: packing moves no argmax
        for mode in ("right", "bushy", "wrong"):
            drafter = OracleDrafter({0: p + full}, mode)
            dec = SpeculativeDecoder(model, StubTokenizer(), [drafter], DecoderSettings(budget=12))
            assert dec.generate(p, max_new_tokens=n).token_ids == full[:n]
