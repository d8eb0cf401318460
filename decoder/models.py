"""Load a causal LM and its tokenizer from a local spec (see builder.tokenizer.resolve_spec).

A GGUF is dequantised by transformers (~20 s for SmolLM2); the result is cached as safetensors
under the draftstore cache so later loads take ~1 s. Never downloads anything.
"""
from __future__ import annotations

import torch

from builder.tokenizer import (
    TokenizerSpecError, cache_dir, gguf_cache_key, load_tokenizer, publish_dir, resolve_spec,
)
from decoder.cpu_linear import pack_linears

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _save_dequantised(model, folder) -> None:
    """save_pretrained refuses a model loaded from GGUF; its weights are plain tensors by now."""
    from safetensors.torch import save_model

    folder.mkdir(parents=True)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    save_model(model, str(folder / "model.safetensors"))  # handles the tied embedding


def load_model(spec: str = "smollm2", gguf_file: str | None = None, dtype=None, device=None, pack: bool = True):
    """-> (model in eval mode on `device`, tokenizer).

    pack: float32 linears on the CPU get their weights pre-packed for oneDNN (decoder.cpu_linear).
    """
    from transformers import AutoModelForCausalLM

    folder, gguf = resolve_spec(spec, gguf_file)
    dtype = parse_dtype(dtype)
    device = torch.device(device) if device is not None else default_device()
    if device.type == "cuda" and not torch.cuda.is_available():  # before minutes of loading, not after
        raise ValueError(f"device {device} was asked for, but torch.cuda.is_available() is False "
                         f"(torch {torch.__version__}, CUDA build: {torch.version.cuda})")
    tokenizer = load_tokenizer(spec, gguf_file)
    source, kwargs = folder, {}
    if gguf is not None:
        cached = cache_dir() / "models" / gguf_cache_key(folder / gguf)
        if not (cached / "config.json").is_file():
            model = AutoModelForCausalLM.from_pretrained(
                folder, gguf_file=gguf, dtype=torch.float32, local_files_only=True
            )
            publish_dir(cached, lambda tmp: _save_dequantised(model, tmp))
        source = cached
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, local_files_only=True, **kwargs
        )
    except OSError as exc:
        raise TokenizerSpecError(f"cannot load a model from {spec!r}: {exc}") from exc
    model = model.to(device).eval()
    if pack:
        pack_linears(model)
    return model, tokenizer
