"""Helpers for the decoder tests: tiny random models, a stub tokenizer, scripted drafters."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from datastore.tree import DraftTree
from decoder.drafters.base import Drafter, SideBranch

VOCAB = 96


def tiny_model(kind: str = "llama", attn: str = "eager", seed: int = 0, vocab: int = VOCAB, eos: int | None = None,
               device: str | torch.device = "cpu"):
    """A 2-layer random model in fp32 on `device`; peaked init so greedy has no near-ties. The
    weights come from the CPU generator, so every device gets the same model for a seed."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  initializer_range=0.2, bos_token_id=1, pad_token_id=0, eos_token_id=eos,
                  tie_word_embeddings=False)
    if kind == "llama":
        model = LlamaForCausalLM._from_config(LlamaConfig(**common), attn_implementation=attn)
    elif kind == "qwen2":
        model = Qwen2ForCausalLM._from_config(Qwen2Config(**common), attn_implementation=attn)
    else:
        raise ValueError(kind)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = 0
    return model.eval().float().to(device)


class StubTokenizer:
    """Token ids as text ('t5 t17 '); enough where text does not matter."""

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [int(t[1:]) for t in text.split()]}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(f"t{int(i)} " for i in ids)

    def get_vocab(self):
        return {f"t{i}": i for i in range(VOCAB)}

    def __len__(self):
        return VOCAB


def greedy(model, prompt, n, eos=None) -> list[int]:
    """model.generate(do_sample=False) on the model's own device: the reference of every test."""
    x = torch.tensor([list(prompt)], device=model.device)
    kw = {} if eos is None else {"eos_token_id": eos}
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                             pad_token_id=0, **kw)
    return out[0, len(prompt):].tolist()


def prompts(n: int, seed: int = 1, lo: int = 3, hi: int = 20, vocab: int = VOCAB) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(2, vocab, size=int(rng.integers(lo, hi))).tolist() for _ in range(n)]


def greedy_store(model, path, seed: int, n_new: int, extra=()) -> tuple[list[list[int]], list[list[int]]]:
    """8 prompts of 4-12 tokens (`seed`), the model's greedy continuations of n_new tokens, and a
    real datastore at `path` (stub tokenizer) holding the first 6 prompts with their continuations
    (2 stay unseen) and the `extra` documents. -> (prompts, continuations)."""
    from builder.tokenizer import tokenizer_info
    from builder.writer import write_datastore

    ps = prompts(8, seed=seed, lo=4, hi=12)
    outs = [greedy(model, p, n_new) for p in ps]
    docs = [np.asarray(p + o, dtype=np.int64) for p, o in zip(ps[:6], outs[:6])] + list(extra)
    write_datastore(path, docs, tokenizer_info(StubTokenizer(), "stub"))
    return ps, outs


def chain(tokens, source="oracle") -> DraftTree:
    n = len(tokens)
    return DraftTree(np.asarray(tokens, dtype=np.int32), np.arange(-1, n - 1, dtype=np.int32),
                     np.full(n, 1, dtype=np.int64), 1, source)


class OracleDrafter(Drafter):
    """Knows each row's true continuation (truth[row] = prompt + greedy output, maybe longer than
    the decode). mode: right | wrong | bushy | empty | extra (right, ignoring max_depth)."""

    def __init__(self, truth: dict[int, list[int]], mode: str = "right", seed: int = 0, name: str = "oracle"):
        self.truth, self.mode, self.name = truth, mode, name
        self.rng = np.random.default_rng(seed)
        self.calls = {"begin": 0, "propose": 0, "observe": 0, "end": 0}

    def begin(self, row, prompt, references=()):
        self.calls["begin"] += 1

    def observe(self, row, accepted):
        assert accepted.shape[0] >= 1
        self.calls["observe"] += 1

    def end(self, row):
        self.calls["end"] += 1

    def propose(self, row, context, budget, max_depth):
        self.calls["propose"] += 1
        full = self.truth[row]
        c = len(context)
        assert list(context) == full[:c], "context diverged from the truth: the decode is not lossless"
        depth = max_depth if self.mode != "extra" else max_depth + 8
        right = full[c : c + depth]
        if self.mode == "empty" or not right:
            return DraftTree.empty(self.name)
        if self.mode == "wrong":
            return chain([self._wrong(t) for t in right], self.name)
        if self.mode == "bushy":
            return bushy(right, self.rng, self.name)
        return chain(right, self.name)

    def _wrong(self, t):
        w = int(self.rng.integers(2, VOCAB))
        return w if w != t else (t + 1) % VOCAB


def bushy(right, rng, source) -> DraftTree:
    """Each level: 2 wrong siblings before the right child (with a wrong grandchild each)."""
    tokens, parents, counts = [], [], []
    parent = -1
    for t in right:
        wrongs = [int(w) for w in rng.choice([v for v in range(2, VOCAB) if v != t], size=2, replace=False)]
        for w in wrongs:
            tokens.append(w); parents.append(parent); counts.append(5)
            tokens.append(int(rng.integers(2, VOCAB))); parents.append(len(tokens) - 2); counts.append(4)
        tokens.append(t); parents.append(parent); counts.append(2)
        parent = len(tokens) - 1
    return DraftTree(np.asarray(tokens), np.asarray(parents), np.asarray(counts), 1, source)


class SideDrafter(Drafter):
    """Returns a side branch of random tokens every step; records side results."""

    name = "side"

    def __init__(self, m: int = 5, seed: int = 0):
        self.m, self.rng, self.results, self.sent = m, np.random.default_rng(seed), [], []

    def side_branch(self, row):
        tokens = self.rng.integers(2, VOCAB, size=self.m).astype(np.int64)
        self.sent.append(tokens)
        depths = np.arange(1, self.m + 1, dtype=np.int64)
        return SideBranch(tokens, depths, np.tril(np.ones((self.m, self.m), dtype=bool)))

    def side_result(self, row, argmax):
        assert argmax.shape == (self.m,)
        self.results.append(argmax)


class TopkDrafter(Drafter):
    name = "topk"
    topk = 3

    def __init__(self):
        self.seen = []

    def observe_topk(self, tokens, topk):
        assert topk.shape == (tokens.shape[0], 3)
        self.seen.append((tokens, topk))


@pytest.fixture(autouse=False)
def single_thread():
    """Tiny models run faster on one thread, and the machine is shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
