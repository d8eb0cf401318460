"""`datastore-info DIR [--json]` on a real store: the documented keys with the right values."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from builder.writer import write_datastore
from datastore.info_cli import main

TOKENIZER = {"name": "toy", "fingerprint": "2" * 64, "vocab_size": 300}
SOURCES = [
    {"path": "/data/a.jsonl", "format": "jsonl", "files": 1, "records": 12, "documents": 10,
     "tokens": 0, "skipped": {"empty document": 1, "malformed JSON": 1}},
    {"path": "/data/src", "format": "files", "files": 3, "records": 3, "documents": 3,
     "tokens": 0, "skipped": {}},
]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 300, rng.integers(1, 500)) for _ in range(13)]
    out = tmp_path_factory.mktemp("info") / "store"
    write_datastore(out, docs, TOKENIZER, shard_tokens=1000, sources=SOURCES)
    return out, docs


def test_json_has_the_documented_keys(store, capsys):
    path, docs = store
    assert main([str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format_version"] == 1
    assert info["tokens"] == sum(len(d) + 1 for d in docs) and info["documents"] == len(docs)
    assert info["shards"] == len(info["shard_list"]) > 1
    assert info["token_dtype"] == "uint16"
    assert info["bytes"] >= info["tokens"] * 6 and info["bytes"] <= (path / "data.mdb").stat().st_size
    assert info["tokenizer"] == TOKENIZER
    assert [(s["path"], s["records"], s["skipped"]) for s in info["sources"]] == \
        [(s["path"], s["records"], s["skipped"]) for s in SOURCES]


def test_table_is_readable(store, capsys):
    path, docs = store
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert f"documents       {len(docs)}" in out
    assert "/data/a.jsonl: 12 records, 2 skipped" in out and "toy vocab 300" in out


def test_console_entry_point_and_help():
    proc = subprocess.run([sys.executable, "-m", "datastore.info_cli", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--json" in proc.stdout and "Exit code 2" in proc.stdout


def test_bad_directory_exits_2_with_a_message(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "datastore-info: error:" in err and str(tmp_path) in err
