"""`datastore-info DIR [--json]`: what a datastore holds, after verifying it like a server would."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from datastore.format import DatastoreError
from datastore.store import Datastore


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="datastore-info",
        description="Verify a draftstore datastore (sizes and sha256 checksums against its meta) and "
                    "describe it: tokens, documents, shards, tokenizer, sources. Exit code 2 when the "
                    "directory is missing, foreign, truncated or corrupt.")
    p.add_argument("dir", metavar="DIR", help="datastore directory (what datastore-build --out wrote)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the checksum pass (sizes and meta are still checked)")
    return p


def describe(store: Datastore) -> dict:
    """The JSON document of `datastore-info --json`."""
    meta = store.meta
    return {
        "path": str(store.path),
        "format_version": meta["format_version"],
        "tokens": store.tokens,
        "documents": store.documents,
        "shards": len(store.shards),
        "token_dtype": meta["token_dtype"],
        "separator": store.separator,
        "bytes": store.used_bytes,
        "bytes_per_token": round(store.used_bytes / max(store.tokens, 1), 3),
        "tokenizer": {k: meta["tokenizer"][k] for k in ("name", "fingerprint", "vocab_size")},
        "sources": [_source(s) for s in store.sources],
        "shard_list": [{k: s.get(k) for k in ("id", "tokens", "documents", "sa_dtype", "sha256")}
                       for s in store.shards],
        "build": meta.get("build", {}),
        "created": meta.get("created"),
        "lmdb_version": meta.get("lmdb_version"),
    }


def _source(src: dict) -> dict:
    out = dict(src)
    out.setdefault("path", None)
    out.setdefault("records", None)
    out.setdefault("skipped", {})
    return out


def _table(info: dict) -> str:
    tok = info["tokenizer"]
    rows = [
        ("path", info["path"]),
        ("format_version", info["format_version"]),
        ("tokens", f"{info['tokens']:,}"),
        ("documents", f"{info['documents']:,}"),
        ("shards", info["shards"]),
        ("token_dtype", f"{info['token_dtype']} (separator {info['separator']})"),
        ("bytes", f"{info['bytes']:,} ({info['bytes_per_token']} per token)"),
        ("tokenizer", f"{tok['name']} vocab {tok['vocab_size']:,} fingerprint {tok['fingerprint'][:16]}…"),
        ("created", info["created"]),
    ]
    lines = [f"{k:<15} {v}" for k, v in rows]
    lines.append("sources:")
    for s in info["sources"]:
        skipped = s.get("skipped") or {}
        n_skipped = sum(skipped.values()) if isinstance(skipped, dict) else skipped
        lines.append(f"  {s['path']}: {s['records']} records, {n_skipped} skipped"
                     + (f" {skipped}" if n_skipped else ""))
    lines.append("shards:")
    for s in info["shard_list"]:
        lines.append(f"  {s['id']:>4}  {s['tokens']:>13,} tokens  {s['documents']:>9,} documents  "
                     f"sa {s['sa_dtype']}  sha256 {str(s['sha256'])[:16]}…")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        with Datastore.open(Path(args.dir), verify=not args.no_verify) as store:
            info = describe(store)
    except DatastoreError as exc:
        print(f"datastore-info: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(info, indent=2) if args.json else _table(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
