"""Walk the --corpus paths: document texts out, per-source counts and skip reports kept on the side."""
from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from builder.errors import BuildError
from builder.readers import ReaderOptions, check_corpus_path, corpus_files, read_file
from builder.records import Skip


class SourceStats(Mapping):
    """Counts of one --corpus path; a Mapping, so the writer records its final values in meta."""

    def __init__(self, path: str, fmt: str):
        self.path, self.format = path, fmt
        self.files = self.records = self.documents = self.tokens = 0
        self.skipped: Counter[str] = Counter()
        self._lock = threading.Lock()  # the reader thread and the writer's thread both skip

    def skip(self, reason: str) -> None:
        with self._lock:
            self.skipped[reason] += 1

    def to_dict(self) -> dict:
        return {"path": self.path, "format": self.format, "files": self.files, "records": self.records,
                "documents": self.documents, "tokens": self.tokens, "skipped": dict(self.skipped)}

    def __getitem__(self, key):
        return self.to_dict()[key]

    def __iter__(self):
        return iter(self.to_dict())

    def __len__(self):
        return len(self.to_dict())


class SkipReporter:
    """Counts skips per source; reports the first few on stderr; with on_error="fail" raises."""

    def __init__(self, on_error: str, shown: int = 5, stream: TextIO | None = None):
        self.on_error, self.shown, self.stream = on_error, shown, stream
        self.total = 0

    def __call__(self, skip: Skip, stats: SourceStats) -> None:
        stats.skip(skip.reason)
        self.total += 1
        if self.on_error == "fail":
            raise BuildError(f"{skip.message()} (--on-error fail)")
        if self.total <= self.shown:
            print(f"skipped {skip.message()}", file=self.stream or sys.stderr)

    def close(self) -> None:
        if self.total > self.shown:
            print(f"... and {self.total - self.shown} more skipped (counted per reason in meta 'sources')",
                  file=self.stream or sys.stderr)


def iter_corpus(paths: Sequence[str], fmt: str, options: ReaderOptions, stats: list[SourceStats],
                report: SkipReporter) -> Iterator[tuple[int, str]]:
    """Yield (source index, document text) over every path; appends one SourceStats per path."""
    for path in paths:
        check_corpus_path(Path(path))
    for index, path in enumerate(paths):
        source = SourceStats(str(path), fmt)
        stats.append(source)
        for file in corpus_files(Path(path), options.glob, options.exclude):
            if isinstance(file, Skip):
                report(file, source)
                continue
            source.files += 1
            for item in read_file(file, fmt, options, sniff=file == Path(path)):
                source.records += 1
                if isinstance(item, Skip):
                    report(item, source)
                else:
                    for text in item.texts:
                        yield index, text

