"""Text: stop strings (no token after the stop leaks), chat prompts, str references; real tokenizer.
Every test runs once per `device` (tests/conftest.py; cuda skipped without one)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from decoder import DecoderSettings, SpeculativeDecoder
from decoder.drafters.base import Drafter
from decoder_util import OracleDrafter, single_thread, tiny_model  # noqa: F401

pytestmark = pytest.mark.usefixtures("single_thread")
N = 40
PROMPTS = ["def fibonacci(n):\n", "The quick brown fox", "import os\nimport sys\n"]


@pytest.fixture(scope="module")
def setup(smollm2_tokenizer, device):
    tok = smollm2_tokenizer
    model = tiny_model("llama", "sdpa", seed=4, vocab=len(tok), device=device)
    dec = SpeculativeDecoder(model, tok, [], DecoderSettings(budget=8))
    refs = [dec.greedy_baseline(p, N).token_ids for p in PROMPTS]
    return tok, model, refs


def naive_stop(tok, ids, stop):
    """Shortest prefix of ids whose text contains a stop string, else all of ids."""
    for j in range(1, len(ids) + 1):
        if any(s in tok.decode(ids[:j]) for s in stop):
            return ids[:j]
    return ids


def test_stop_strings(setup):
    tok, model, refs = setup
    checked = 0
    for p, ref in zip(PROMPTS, refs):
        text = tok.decode(ref)
        for cut in (5, 20, 33):  # stop strings taken from inside the model's own output
            stop = text[cut : cut + 3]
            if not stop.strip():
                continue
            ids = tok(p)["input_ids"]
            truth = {0: ids + ref}
            dec = SpeculativeDecoder(model, tok, [OracleDrafter(truth, "right")], DecoderSettings(budget=16))
            g = dec.generate(p, max_new_tokens=N, stop=[stop, "\x00never"])
            want = naive_stop(tok, ref, [stop])
            assert g.token_ids == want and len(want) < len(ref)
            assert g.text.endswith(stop) and stop not in g.text[:-1]
            assert g.stats.stop_reason == "stop"
            checked += 1
    assert checked >= 5


def test_no_stop_found_runs_to_length(setup):
    tok, model, refs = setup
    g = SpeculativeDecoder(model, tok, [], DecoderSettings(budget=4)).generate(PROMPTS[0], N, stop=["\x00"])
    assert g.token_ids == refs[0] and g.stats.stop_reason == "length"
    assert g.text == tok.decode(refs[0], skip_special_tokens=True)


def test_chat_prompt_uses_template(setup):
    tok, model, _ = setup
    dec = SpeculativeDecoder(model, tok, [], DecoderSettings(budget=4))
    ids = dec.encode("hello there", chat=True)
    rendered = tok.apply_chat_template([{"role": "user", "content": "hello there"}], tokenize=False,
                                       add_generation_prompt=True)
    assert ids.tolist() == tok(rendered, add_special_tokens=False)["input_ids"]
    g = dec.generate("hello there", max_new_tokens=8, chat=True)
    assert g.prompt_ids == ids.tolist()
    assert g.token_ids == dec.greedy_baseline("hello there", 8, chat=True).token_ids


class RefCopy(Drafter):
    """Records the references it was given."""

    name = "refs"

    def __init__(self):
        self.got = {}

    def begin(self, row, prompt, references=()):
        self.got[row] = [r.tolist() for r in references]


def test_references_reach_drafters(setup):
    tok, model, _ = setup
    d = RefCopy()
    dec = SpeculativeDecoder(model, tok, [d], DecoderSettings(budget=4))
    dec.generate_batch(PROMPTS[:2], max_new_tokens=2, references=["some text", [5, 6, 7]])
    want = [tok("some text", add_special_tokens=False)["input_ids"], [5, 6, 7]]
    assert d.got == {0: want, 1: want}
    dec.generate_batch(PROMPTS[:2], max_new_tokens=2, references=[["a b"], [[9, 9]]])
    assert d.got == {0: [tok("a b", add_special_tokens=False)["input_ids"]], 1: [[9, 9]]}
