"""`datastore-query`: show the draft tree a datastore gives for a context, in process or over gRPC.

    datastore-query --datastore store/ --text "def main("
    datastore-query --address 127.0.0.1:50051 --tokens 1,2,3 --json

The tree prints as an indented trie: each node's token (repr, so whitespace shows), id, count and
depth, best-first among siblings; above it the match length and the matched suffix text.
Exit 2 with a clear message for bad input: a directory that is not a datastore, an unreachable
address, unreadable token/TLS files, bad token ids, a tokenizer other than the datastore's.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass

import numpy as np

from datastore.tree import DraftTree
from protos.channel import read_token_file

EXIT_BAD_INPUT = 2


class CliError(Exception):
    """Printed as `datastore-query: error: ...`, exit 2."""


@dataclass(frozen=True)
class QuerySettings:
    datastore: str | None = None
    address: str | None = None
    text: str | None = None
    tokens: str | None = None
    tokenizer: str | None = None  # default: the name the datastore records
    budget: int = 64
    max_depth: int = 16
    max_suffix: int = 16
    min_suffix: int = 1
    min_count: int = 1
    timeout: float = 10.0
    auth_token_file: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    json: bool = False

    def __post_init__(self) -> None:
        if (self.datastore is None) == (self.address is None):
            raise CliError("give exactly one of --datastore DIR or --address HOST:PORT")
        if (self.text is None) == (self.tokens is None):
            raise CliError("give exactly one of --text or --tokens")
        if self.budget < 1 or self.max_depth < 1 or not 1 <= self.min_suffix <= self.max_suffix:
            raise CliError("need --budget >= 1, --max-depth >= 1, "
                           "1 <= --min-suffix <= --max-suffix")
        if self.min_count < 1:
            raise CliError(f"--min-count must be >= 1, got {self.min_count}")
        if self.timeout <= 0:
            raise CliError("--timeout must be > 0")
        if self.datastore is not None and (self.auth_token_file or self.tls_ca or self.tls_cert):
            raise CliError("--auth-token-file and --tls-* only apply with --address")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise CliError("--tls-cert and --tls-key go together")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="datastore-query", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_argument_group("where the datastore is (one of)")
    src.add_argument("--datastore", metavar="DIR", help="a datastore directory, opened in process")
    src.add_argument("--address", metavar="HOST:PORT", help="a datastore-serve server")
    ctx = p.add_argument_group("the context (one of)")
    ctx.add_argument("--text", help="text, encoded with the tokenizer (no special tokens)")
    ctx.add_argument("--tokens", metavar="ID,ID,...", help="token ids, comma separated")
    p.add_argument("--tokenizer", default=None,
                   help="smollm2 | HF dir | .gguf (default: the one the datastore records)")
    p.add_argument("--budget", type=int, default=64, help="nodes in the tree (default 64)")
    p.add_argument("--max-depth", type=int, default=16, help="deepest node (default 16)")
    p.add_argument("--max-suffix", type=int, default=16,
                   help="longest context suffix tried (default 16)")
    p.add_argument("--min-suffix", type=int, default=1, help="shortest suffix tried (default 1)")
    p.add_argument("--min-count", type=int, default=1, metavar="N",
                   help="grow the trie from the longest context suffix seen at least N times "
                        "(default 1: the longest that occurs at all; a match of the whole "
                        "--max-suffix window is always kept); backing off from rare matches "
                        "drafts better continuations")
    p.add_argument("--timeout", type=float, default=10.0,
                   help="seconds per call with --address (default 10)")
    p.add_argument("--auth-token-file", help="file holding the server's bearer token")
    p.add_argument("--tls-ca", help="PEM CA that signed the server certificate (enables TLS)")
    p.add_argument("--tls-cert", help="PEM client certificate, for servers requiring mutual TLS")
    p.add_argument("--tls-key", help="PEM key of --tls-cert")
    p.add_argument("--json", action="store_true",
                   help="print JSON: match_len, matched suffix and the tree's arrays")
    return p


# ------------------------------------------------------------------------------ sources


def parse_tokens(text: str) -> np.ndarray:
    try:
        ids = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError as exc:
        raise CliError(f"--tokens: expected comma-separated integers, got {text!r}") from exc
    if not ids or min(ids) < 0:
        raise CliError(f"--tokens: expected non-negative token ids, got {text!r}")
    return np.asarray(ids, dtype=np.int64)  # [n]


def read_token(path: str) -> str:
    try:
        return read_token_file(path)
    except ValueError as exc:
        raise CliError(str(exc)) from exc


class LocalSource:
    """--datastore: a Datastore opened in this process."""

    def __init__(self, path: str) -> None:
        from datastore.format import DatastoreError
        from datastore.store import Datastore

        try:
            self.store = Datastore.open(path)
        except DatastoreError as exc:
            raise CliError(str(exc)) from exc
        self.tokenizer_meta = dict(self.store.tokenizer)

    def draft(self, context: np.ndarray, s: QuerySettings) -> DraftTree:
        return self.store.draft(context, s.budget, s.max_depth, s.max_suffix, s.min_suffix,
                                min_count=s.min_count)

    def close(self) -> None:
        self.store.close()


class RemoteSource:
    """--address: a DraftClient; Info first, so an unreachable server is an error, not a
    silently empty tree."""

    def __init__(self, s: QuerySettings) -> None:
        from client.draft_client import DraftClient
        from client.failures import DraftServiceError
        from client.settings import TlsConfig

        token = read_token(s.auth_token_file) if s.auth_token_file else None
        tls = None
        if s.tls_ca or s.tls_cert:
            tls = TlsConfig(root_cert=s.tls_ca, client_cert=s.tls_cert, client_key=s.tls_key)
        try:
            self.client = DraftClient(s.address, timeout=s.timeout, auth_token=token, tls=tls,
                                      admin_timeout=s.timeout)
        except ValueError as exc:
            raise CliError(str(exc)) from exc
        try:
            info = self.client.info()
        except DraftServiceError as exc:
            self.client.close()
            raise CliError(f"cannot query {s.address}: {exc.code}: {exc.details}") from exc
        self.tokenizer_meta = dict(info.tokenizer)

    def draft(self, context: np.ndarray, s: QuerySettings) -> DraftTree:
        tree = self.client.draft(context, s.budget, s.max_depth, s.max_suffix, s.min_suffix,
                                 s.min_count)
        if self.client.failures:
            raise CliError(f"{s.address}: {self.client.last_error}")
        return tree

    def close(self) -> None:
        self.client.close()


def load_tokenizer_for(s: QuerySettings, meta: dict, required: bool):
    """The tokenizer to encode --text and show tokens; None when not required and unavailable.
    A tokenizer whose fingerprint differs from the datastore's is an error."""
    from builder.tokenizer import load_tokenizer, tokenizer_info

    spec = s.tokenizer or meta.get("name")
    try:
        tok = load_tokenizer(spec)
    except Exception as exc:  # noqa: BLE001 - TokenizerSpecError or anything a spec can raise
        if required:
            raise CliError(f"cannot load tokenizer {spec!r} (give --tokenizer): {exc}") from exc
        print(f"datastore-query: note: no tokenizer ({exc}); showing ids only", file=sys.stderr)
        return None
    fp = tokenizer_info(tok, str(spec))["fingerprint"]
    if fp != meta.get("fingerprint"):
        raise CliError(f"tokenizer {spec!r} has fingerprint {fp[:16]}..., the datastore's is "
                       f"{str(meta.get('fingerprint'))[:16]}...: the datastore was built with "
                       "another vocabulary")
    return tok


# ------------------------------------------------------------------------------ output


def token_text(tok, token_id: int) -> str:
    return repr(tok.decode([int(token_id)])) if tok is not None else "?"


def children_lists(tree: DraftTree) -> list[list[int]]:
    """children[parent + 1] = node indices in tree order (best first); slot 0 = the roots."""
    kids: list[list[int]] = [[] for _ in range(len(tree) + 1)]
    for i, p in enumerate(tree.parents.tolist()):
        kids[p + 1].append(i)
    return kids


def render_tree(tree: DraftTree, tok) -> list[str]:
    """An indented trie, depth first; siblings in the tree's best-first order."""
    kids = children_lists(tree)
    depths = tree.depths()  # [n] int32
    lines: list[str] = []
    stack = list(reversed(kids[0]))
    while stack:
        i = stack.pop()
        lines.append(f"{'  ' * (int(depths[i]) - 1)}{token_text(tok, tree.tokens[i])} "
                     f"[{int(tree.tokens[i])}]  count={int(tree.counts[i])}  "
                     f"depth={int(depths[i])}")
        stack.extend(reversed(kids[i + 1]))
    return lines


def report(context: np.ndarray, tree: DraftTree, tok) -> str:
    matched = context[len(context) - tree.match_len:] if tree.match_len else context[:0]
    text = repr(tok.decode(matched.tolist())) if tok is not None else "?"
    head = [f"context: {len(context)} tokens",
            f"match_len: {tree.match_len}  matched suffix: {text} {matched.tolist()}",
            f"tree: {len(tree)} nodes, max depth {int(tree.depths().max()) if len(tree) else 0}"]
    if not len(tree):
        head.append("(no drafts: the context's suffix does not occur in the datastore)")
    return "\n".join(head + render_tree(tree, tok))


def as_json(context: np.ndarray, tree: DraftTree, tok) -> str:
    matched = context[len(context) - tree.match_len:] if tree.match_len else context[:0]
    out = {
        "context": context.tolist(), "match_len": tree.match_len,
        "matched_suffix": matched.tolist(),
        "matched_text": tok.decode(matched.tolist()) if tok is not None else None,
        "tokens": tree.tokens.tolist(), "parents": tree.parents.tolist(),
        "counts": tree.counts.tolist(), "depths": tree.depths().tolist(),
        "texts": [tok.decode([t]) for t in tree.tokens.tolist()] if tok is not None else None,
    }
    return json.dumps(out)


# ------------------------------------------------------------------------------ main


def run(s: QuerySettings) -> str:
    source = LocalSource(s.datastore) if s.datastore else RemoteSource(s)
    try:
        tok = load_tokenizer_for(s, source.tokenizer_meta, required=s.text is not None)
        if s.text is not None:
            context = np.asarray(tok(s.text, add_special_tokens=False)["input_ids"],
                                 dtype=np.int64)  # [n]
            if not len(context):
                raise CliError("--text encodes to no tokens")
        else:
            context = parse_tokens(s.tokens)
        vocab = int(source.tokenizer_meta.get("vocab_size", 0))
        if vocab and int(context.max()) >= vocab:
            raise CliError(f"--tokens: id {int(context.max())} is outside the vocabulary "
                           f"[0, {vocab})")
        tree = source.draft(context, s)
    finally:
        source.close()
    return as_json(context, tree, tok) if s.json else report(context, tree, tok)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.getLogger("draftstore.client").setLevel(logging.ERROR)  # failures become CliError
    try:
        settings = QuerySettings(**vars(args))
        print(run(settings))
    except CliError as exc:
        print(f"datastore-query: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
