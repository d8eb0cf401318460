"""`builder.build(settings)`: read the corpus, tokenize, write the datastore; -> its meta."""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from builder.errors import BuildError, EmptyCorpusError
from builder.readers import DEFAULT_ROLES, FORMATS, ReaderOptions, check_corpus_path
from builder.records import EMPTY
from builder.sources import SkipReporter, SourceStats, iter_corpus
from builder.tokenize import tokenize_stream
from builder.tokenizer import load_tokenizer, tokenizer_info
from builder.writer import DEFAULT_SHARD_TOKENS, write_datastore

ON_ERROR = ("skip", "fail")


@dataclass(frozen=True)
class BuildSettings:
    corpus: tuple[str, ...]  # files or directories
    out: str
    format: str = "auto"
    glob: str = "*"
    field: str = "text"
    roles: tuple[str, ...] = DEFAULT_ROLES
    exclude: tuple[str, ...] = ()  # Python API only: names/relative paths to leave out of directories
    tokenizer: str = "smollm2"
    shard_tokens: int = DEFAULT_SHARD_TOKENS
    workers: int = 1
    append: bool = False
    on_error: str = "skip"
    progress: bool = False

    def __post_init__(self):
        corpus = (self.corpus,) if isinstance(self.corpus, str) else tuple(map(str, self.corpus))
        object.__setattr__(self, "corpus", corpus)
        object.__setattr__(self, "out", str(self.out))
        for name in ("roles", "exclude"):
            value = getattr(self, name)
            object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value))
        if not corpus:
            raise BuildError("at least one --corpus path is needed")
        if not self.out:
            raise BuildError("--out must not be empty")
        if self.format not in FORMATS:
            raise BuildError(f"--format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.on_error not in ON_ERROR:
            raise BuildError(f"--on-error must be skip or fail, got {self.on_error!r}")
        if not isinstance(self.shard_tokens, int) or self.shard_tokens < 2:
            raise BuildError(f"--shard-tokens must be an integer >= 2, got {self.shard_tokens!r}")
        if not isinstance(self.workers, int) or self.workers < 1:
            raise BuildError(f"--workers must be an integer >= 1, got {self.workers!r}")
        self.reader_options()  # validates field, glob and roles

    def reader_options(self) -> ReaderOptions:
        return ReaderOptions(field=self.field, glob=self.glob, roles=self.roles, exclude=self.exclude)


@dataclass
class BuildReport:
    meta: dict
    documents: int
    tokens: int
    skipped: int
    seconds: float
    sources: list = field(default_factory=list)

    def summary(self, out: str) -> str:
        shards = len(self.meta["shards"])
        rate = self.tokens / self.seconds if self.seconds > 0 else 0.0
        return (f"{out}: {self.documents:,} documents, {self.tokens:,} tokens, {shards} shard"
                f"{'s' * (shards != 1)}, {self.skipped:,} skipped, {self.seconds:.1f} s, "
                f"{rate:,.0f} tokens/s")


def build(settings: BuildSettings) -> dict:
    """Build the datastore settings describe; -> its meta (BuildError / TokenizerSpecError on bad input)."""
    return run_build(settings).meta


def run_build(settings: BuildSettings) -> BuildReport:
    start = time.perf_counter()
    for path in settings.corpus:  # fail fast, before the slow tokenizer load
        check_corpus_path(Path(path))
    tok = load_tokenizer(settings.tokenizer)
    info = tokenizer_info(tok, settings.tokenizer)
    stats: list[SourceStats] = []
    report = SkipReporter(settings.on_error)
    texts = iter_corpus(settings.corpus, settings.format, settings.reader_options(), stats, report)
    docs = _counted(tokenize_stream(texts, settings.tokenizer, settings.workers), stats)
    build_params = {k: v for k, v in asdict(settings).items()
                    if k in ("format", "glob", "field", "roles", "exclude", "workers", "on_error")}
    try:
        meta = write_datastore(settings.out, docs, info, shard_tokens=settings.shard_tokens,
                               sources=stats, build=build_params, append=settings.append,
                               progress=settings.progress)
    except EmptyCorpusError:
        raise BuildError(_empty_message(settings, stats)) from None
    finally:
        report.close()
    return BuildReport(meta, sum(s.documents for s in stats), sum(s.tokens for s in stats),
                       sum(sum(s.skipped.values()) for s in stats), time.perf_counter() - start, stats)


def _counted(stream, stats: list[SourceStats]) -> Iterator[np.ndarray]:
    """Count documents and tokens per source as they pass to the writer."""
    for index, ids in stream:  # ids: [n] int32
        source = stats[index]
        if len(ids) == 0:
            source.skip(EMPTY)
            continue
        source.documents += 1
        source.tokens += len(ids)
        yield ids


def _empty_message(settings: BuildSettings, stats: list[SourceStats]) -> str:
    skipped = sum((s.skipped for s in stats), Counter())
    files = sum(s.files for s in stats)
    why = ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items())) or "nothing skipped"
    return (f"empty corpus: {', '.join(settings.corpus)} gave no documents "
            f"({files} file{'s' * (files != 1)} read; skipped: {why})")
