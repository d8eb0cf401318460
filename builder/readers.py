"""Corpus readers: each turns one file into Records (document texts with their "file:line" origin)
or Skips (a reason from builder.records). `.gz` is accepted everywhere.

Formats: jsonl (a string field per line), text (the whole file is one document), files (a directory
walk, one document per file matching a glob), sharegpt (a JSON array of {"conversations": [{"from",
"value"}]}, truncated arrays recovered), auto (decided by extension, then by content).
"""
from __future__ import annotations

import fnmatch
import gzip
import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from builder.errors import BuildError
from builder.json_stream import iter_json_values
from builder.records import (
    EMPTY, MALFORMED_JSON, MISSING_FIELD, NON_UTF8, UNREADABLE, Record, Skip, text_or_skip,
)

FORMATS = ("auto", "jsonl", "text", "sharegpt", "files")
DEFAULT_ROLES = ("gpt", "assistant")
_SNIFF_BYTES = 1 << 16


@dataclass(frozen=True)
class ReaderOptions:
    field: str = "text"  # jsonl: the string field holding the document
    glob: str = "*"  # directories: file names (or relative paths, when it has a '/') to index
    roles: tuple[str, ...] = DEFAULT_ROLES  # sharegpt: the turns to index
    exclude: tuple[str, ...] = ()  # directories: names or relative paths (globs) to leave out

    def __post_init__(self):
        if not self.field:
            raise BuildError("--field must not be empty")
        if not self.glob:
            raise BuildError("--glob must not be empty")
        if not self.roles or not all(self.roles):
            raise BuildError(f"--roles needs at least one non-empty role, got {self.roles!r}")


def open_binary(path: Path):
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")


def check_corpus_path(path: Path) -> None:
    """A --corpus path must exist and be readable (BuildError otherwise)."""
    if not path.exists():
        raise BuildError(f"{path}: no such file or directory")
    if not os.access(path, os.R_OK | (os.X_OK if path.is_dir() else 0)):
        raise BuildError(f"{path}: permission denied")
    if not (path.is_file() or path.is_dir()):
        raise BuildError(f"{path}: not a regular file or directory")


def corpus_files(root: Path, glob: str, exclude: tuple[str, ...] = ()) -> Iterator[Path | Skip]:
    """root itself if it is a file; else every file below it matching glob and no exclude pattern
    (a pattern matches a file or directory name, or a path relative to root), in sorted order."""
    if root.is_file():
        yield root
        return
    errors: list[OSError] = []
    found = []
    for folder, dirs, names in os.walk(root, onerror=errors.append):
        dirs[:] = sorted(d for d in dirs if not _excluded(Path(folder, d), root, exclude))
        for name in names:
            path = Path(folder, name)
            rel = path.relative_to(root).as_posix()
            if (fnmatch.fnmatchcase(rel if "/" in glob else name, glob) and path.is_file()
                    and not _excluded(path, root, exclude)):
                found.append(rel)
    for err in errors:
        yield Skip(str(err.filename), UNREADABLE, err.strerror or str(err))
    for rel in sorted(found):
        yield root / rel


def _excluded(path: Path, root: Path, exclude: tuple[str, ...]) -> bool:
    rel = path.relative_to(root).as_posix()
    return any(fnmatch.fnmatchcase(rel if "/" in pat else path.name, pat) for pat in exclude)


def read_file(path: Path, fmt: str, options: ReaderOptions, sniff: bool = True
              ) -> Iterator[Record | Skip]:
    """Records of one file; a file that cannot be read or decompressed gives one Skip.
    sniff: with fmt "auto", may the content decide (see detect_format)?"""
    try:
        fmt = detect_format(path, sniff) if fmt == "auto" else fmt
        reader = {"jsonl": read_jsonl, "text": read_text, "files": read_text,
                  "sharegpt": read_sharegpt}[fmt]
        yield from reader(path, options)
    except (OSError, EOFError, zlib.error) as exc:
        yield Skip(str(path), UNREADABLE, str(exc))


def detect_format(path: Path, sniff: bool = True) -> str:
    """By extension (.jsonl/.ndjson; .json is sharegpt or jsonl by its first character), else by
    content when sniff (a lone file; inside directories only extensions count, so a '*.py' tree is
    never taken for JSON); anything else is text."""
    name = path.name.removesuffix(".gz").lower()
    if name.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    if not sniff and not name.endswith(".json"):
        return "text"
    with open_binary(path) as f:
        head = f.read(_SNIFF_BYTES).decode("utf-8", errors="replace").lstrip()
    if head.startswith("["):
        return "sharegpt"
    if head.startswith("{"):
        first, newline, _ = head.partition("\n")
        try:
            json.loads(first)
            return "jsonl"
        except json.JSONDecodeError:
            pass
        if '"conversations"' in head or '"messages"' in head:
            return "sharegpt"  # pretty-printed objects one after another
        return "jsonl" if not newline or name.endswith(".json") else "text"
    return "text"


def read_jsonl(path: Path, options: ReaderOptions) -> Iterator[Record | Skip]:
    with open_binary(path) as f:
        for lineno, raw in enumerate(f, 1):
            if raw.strip():
                yield _jsonl_line(f"{path}:{lineno}", raw, options.field)


def _jsonl_line(origin: str, raw: bytes, field: str) -> Record | Skip:
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return Skip(origin, NON_UTF8, f"byte {exc.start} of the line")
    except json.JSONDecodeError as exc:
        return Skip(origin, MALFORMED_JSON, f"{exc.msg} at column {exc.colno}")
    value = obj.get(field) if isinstance(obj, dict) else None
    if not isinstance(value, str):
        return Skip(origin, MISSING_FIELD, f"no string field {field!r}")
    record_id = obj.get("id")
    return checked_text(origin, value, None if record_id is None else str(record_id))


def read_text(path: Path, options: ReaderOptions) -> Iterator[Record | Skip]:
    with open_binary(path) as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        yield Skip(f"{path}:{line}", NON_UTF8, f"byte {exc.start}")
        return
    yield checked_text(f"{path}:1", text)


def read_sharegpt(path: Path, options: ReaderOptions) -> Iterator[Record | Skip]:
    """One Record per conversation: its turns whose role is in options.roles, in order."""
    with open_binary(path) as f:
        for item in iter_json_values(f, str(path)):
            if isinstance(item, Skip):
                yield item
            else:
                line, value = item
                yield sharegpt_record(f"{path}:{line}", value, options.roles)


def sharegpt_record(origin: str, value, roles: tuple[str, ...]) -> Record | Skip:
    """Accepts {"conversations": [{"from", "value"}]} and the {"messages": [{"role", "content"}]} variant."""
    turns = value.get("conversations", value.get("messages")) if isinstance(value, dict) else None
    if not isinstance(turns, list):
        return Skip(origin, MISSING_FIELD, "no 'conversations' list")
    texts = []
    for turn in turns:
        if isinstance(turn, dict) and turn.get("from", turn.get("role")) in roles:
            text = turn.get("value", turn.get("content"))
            if isinstance(text, str) and text.strip():
                texts.append(text)
    if not texts:
        return Skip(origin, EMPTY, f"no non-empty turn with role in {list(roles)}")
    if not all(_is_utf8(t) for t in texts):
        return Skip(origin, NON_UTF8, "invalid bytes or lone surrogates")
    record_id = value.get("id")
    return Record(origin, tuple(texts), None if record_id is None else str(record_id))


def checked_text(origin: str, text: str, record_id: str | None = None) -> Record | Skip:
    """A text that is empty or not valid Unicode (lone surrogates from JSON escapes) is skipped."""
    if not _is_utf8(text):
        return Skip(origin, NON_UTF8, "lone surrogates")
    return text_or_skip(origin, text, record_id)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True

