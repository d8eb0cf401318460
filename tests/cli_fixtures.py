"""Shared by tests/test_cli_*.py and tests/test_integration_*.py: a tiny random Llama saved as a
Hugging Face directory with the real SmolLM2 tokenizer beside it, and a datastore that holds the
model's own greedy continuations of a few prompts (so retrieval drafts are right there, and the
decoder has something to accept) plus unrelated text (so some drafts are wrong)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

PROMPTS = (
    "def fibonacci(n):\n    ",
    "import os\nimport sys\n\n",
    "The quick brown fox",
    "class Stack:\n    def __init__(self):",
)
UNSEEN_PROMPT = "Once upon a time, in a land far away,"
FILLER = (
    "for i in range(10):\n    print(i)\n",
    "def add(a, b):\n    return a + b\n",
    "The quick brown dog sleeps all day long.",
)
STORED_NEW_TOKENS = 48


@dataclass(frozen=True)
class TinySetup:
    model_dir: Path
    store: Path
    greedy: dict  # prompt -> greedy new-token ids (list[int]) of STORED_NEW_TOKENS


def tiny_llama(vocab_size: int, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        bos_token_id=None, eos_token_id=None, tie_word_embeddings=False,  # tied: repeats its input
    )
    return LlamaForCausalLM(config).eval()


def greedy_ids(model, tokenizer, prompt: str, n: int) -> list[int]:
    ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])  # [1, p] int64
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                             min_new_tokens=n, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


def make_setup(root: Path, tokenizer) -> TinySetup:
    from builder.tokenizer import tokenizer_info
    from builder.writer import write_datastore

    model_dir = root / "tiny-llama"
    model = tiny_llama(len(tokenizer))
    # EOS stays the tokenizer's (<|im_end|>); a random model rarely emits it, min_new_tokens above
    # keeps the stored continuations full length either way.
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.eos_token_id
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    greedy = {p: greedy_ids(model, tokenizer, p, STORED_NEW_TOKENS) for p in PROMPTS}
    docs = [np.asarray(tokenizer.encode(p, add_special_tokens=False) + g, dtype=np.int64)
            for p, g in greedy.items()]
    docs += [np.asarray(tokenizer.encode(t, add_special_tokens=False), dtype=np.int64) for t in FILLER]
    store = root / "store"
    write_datastore(store, docs, tokenizer_info(tokenizer, "smollm2"))
    return TinySetup(model_dir, store, greedy)


def foreign_store(root: Path, tokenizer) -> Path:
    """A datastore whose meta names another tokenizer (same vocabulary size, other fingerprint)."""
    from builder.tokenizer import tokenizer_info
    from builder.writer import write_datastore

    info = dict(tokenizer_info(tokenizer, "other"), fingerprint="0" * 64)
    out = root / "foreign-store"
    write_datastore(out, [np.arange(1, 50, dtype=np.int64)], info)
    return out
