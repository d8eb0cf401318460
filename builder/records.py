"""What corpus readers yield: a record (one or more document texts) or a skip with its reason."""
from __future__ import annotations

from dataclasses import dataclass

# Skip reasons, counted per source in meta["sources"][i]["skipped"].
MALFORMED_JSON = "malformed JSON"
MISSING_FIELD = "missing field"
NON_UTF8 = "non-UTF-8"
EMPTY = "empty document"
TRUNCATED = "truncated record"
UNREADABLE = "unreadable file"
REASONS = (MALFORMED_JSON, MISSING_FIELD, NON_UTF8, EMPTY, TRUNCATED, UNREADABLE)


@dataclass(frozen=True)
class Record:
    origin: str  # "file:line" where the record starts
    texts: tuple[str, ...]  # the documents of this record (a ShareGPT conversation has several)
    id: str | None = None  # the record's own id where the format has one (ShareGPT)


@dataclass(frozen=True)
class Skip:
    origin: str
    reason: str  # one of REASONS
    detail: str = ""

    def message(self) -> str:
        return f"{self.origin}: {self.reason}" + (f" ({self.detail})" if self.detail else "")


def text_or_skip(origin: str, text: str, record_id: str | None = None) -> Record | Skip:
    return Record(origin, (text,), record_id) if text.strip() else Skip(origin, EMPTY)
