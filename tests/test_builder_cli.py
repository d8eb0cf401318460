"""datastore-build / builder.build: real corpora in tmp_path, the real SmolLM2 tokenizer, real LMDB."""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import builder
from builder.cli import main
from builder.errors import BuildError
from builder.pipeline import BuildSettings
from builder.records import EMPTY, MALFORMED_JSON, MISSING_FIELD, NON_UTF8, TRUNCATED
from builder.tokenizer import tokenizer_info
from builder.writer import write_datastore
from builder_helpers import expected_stream, fake_tokenizer, naive_suffix_array, read_store, store_stream, temp_dirs_next_to

SEP = 49152  # SmolLM2's vocabulary size, hence the separator
SUMMARY = re.compile(r"(\d[\d,]*) documents, (\d[\d,]*) tokens, (\d+) shards?, (\d[\d,]*) skipped, "
                     r"[\d.]+ s, [\d,]+ tokens/s")


@pytest.fixture
def corpus(tmp_path):
    """A JSONL file with every kind of bad line, a source tree, and the texts expected from them."""
    root = tmp_path / "corpus"
    (root / "src" / "pkg").mkdir(parents=True)
    lines = ['{"text": "The quick brown fox."}', '{"text": broken', '{"title": "no text"}',
             '{"text": ""}', '{"text": "def jumps(over):\\n    return over"}']
    (root / "docs.jsonl").write_bytes(("\n".join(lines) + "\n").encode() + b'{"text": "\xff"}\n')
    files = {"src/a.py": "import os\nprint(os.sep)\n", "src/pkg/b.py": "class B:\n    pass\n",
             "src/pkg/empty.py": "", "src/notes.txt": "not python"}
    for rel, text in files.items():
        (root / rel).write_text(text)
    texts = ["The quick brown fox.", "def jumps(over):\n    return over",
             files["src/a.py"], files["src/pkg/b.py"]]
    return root, texts


def expected_tokens(tok, texts):
    out = []
    for text in texts:
        out += tok.encode(text, add_special_tokens=False) + [SEP]
    return out


def run(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_build_jsonl_and_source_tree(corpus, tmp_path, capsys, smollm2_tokenizer):
    root, texts = corpus
    out = tmp_path / "ds"
    code, stdout, stderr = run(["--corpus", str(root / "docs.jsonl"), "--corpus", str(root / "src"),
                                "--glob", "*.py", "--out", str(out)], capsys)
    assert code == 0, stderr
    meta, shards = read_store(out)
    want = expected_tokens(smollm2_tokenizer, texts)
    assert store_stream(shards) == want
    assert shards[0]["sa"].tolist() == naive_suffix_array(shards[0]["tokens"])
    assert meta["tokenizer"] == tokenizer_info(smollm2_tokenizer, "smollm2")
    jsonl, tree = meta["sources"]
    n = [len(smollm2_tokenizer.encode(t, add_special_tokens=False)) for t in texts]
    assert jsonl == {"path": str(root / "docs.jsonl"), "format": "auto", "files": 1, "records": 6,
                     "documents": 2, "tokens": n[0] + n[1],
                     "skipped": {MALFORMED_JSON: 1, MISSING_FIELD: 1, EMPTY: 1, NON_UTF8: 1}}
    assert tree["tokens"] == n[2] + n[3]
    assert tree["files"] == 3 and tree["documents"] == 2 and tree["skipped"] == {EMPTY: 1}
    assert meta["build"]["glob"] == "*.py" and meta["build"]["workers"] == 1
    assert f"{root / 'docs.jsonl'}:2: malformed JSON" in stderr
    assert f"{root / 'docs.jsonl'}:3: missing field" in stderr
    match = SUMMARY.search(stdout)
    assert match and match.groups()[:4] == ("4", f"{len(want) - 4:,}", "1", "5")


def test_python_api(corpus, tmp_path, smollm2_tokenizer):
    root, texts = corpus
    meta = builder.build(BuildSettings(corpus=[str(root / "src")], out=tmp_path / "ds", glob="*.py",
                                       shard_tokens=8))
    stored, shards = read_store(tmp_path / "ds")
    assert stored == meta
    assert len(meta["shards"]) > 1 and all(s["tokens"] <= 8 for s in meta["shards"])
    docs = [smollm2_tokenizer.encode(t, add_special_tokens=False) for t in texts[2:]]
    assert store_stream(shards) == expected_stream(docs, SEP, 8)  # long documents cut at 7 tokens


def test_sharegpt_truncated_via_cli(tmp_path, capsys, smollm2_tokenizer):
    convs = [{"id": str(i), "conversations": [{"from": "human", "value": f"q{i}"},
                                              {"from": "gpt", "value": f"answer {i}"}]} for i in range(5)]
    text = json.dumps(convs, indent=1)
    path = tmp_path / "chat.json"
    path.write_text(text[:text.index('"4"')])
    code, _, stderr = run(["--corpus", str(path), "--out", str(tmp_path / "ds")], capsys)
    assert code == 0, stderr
    meta, shards = read_store(tmp_path / "ds")
    assert store_stream(shards) == expected_tokens(smollm2_tokenizer, [f"answer {i}" for i in range(4)])
    assert meta["sources"][0]["skipped"] == {TRUNCATED: 1}
    assert "truncated record" in stderr


def test_append_equals_one_build(corpus, tmp_path, capsys):
    root, _ = corpus
    one, inc = tmp_path / "one", tmp_path / "inc"
    args = ["--glob", "*.py"]
    assert main(["--corpus", str(root / "docs.jsonl"), "--corpus", str(root / "src"), "--out", str(one)] + args) == 0
    assert main(["--corpus", str(root / "docs.jsonl"), "--out", str(inc)] + args) == 0
    assert main(["--corpus", str(root / "src"), "--out", str(inc), "--append"] + args) == 0
    one_meta, one_shards = read_store(one)
    inc_meta, inc_shards = read_store(inc)
    assert store_stream(inc_shards) == store_stream(one_shards)
    assert len(inc_meta["shards"]) == 2
    for key in ("documents", "tokens"):
        assert sum(s[key] for s in inc_meta["shards"]) == sum(s[key] for s in one_meta["shards"])
    assert inc_meta["sources"] == one_meta["sources"]
    capsys.readouterr()


def digest(path: Path) -> str:
    return hashlib.sha256((path / "data.mdb").read_bytes()).hexdigest()


@pytest.fixture
def old_store(corpus, tmp_path):
    root, _ = corpus
    out = tmp_path / "old"
    assert main(["--corpus", str(root / "src"), "--glob", "*.py", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("extra, message", [
    (["--corpus", "{root}/missing"], "missing: no such file or directory"),
    (["--corpus", "{root}/src", "--glob", "*.rs"], "empty corpus: "),
    (["--corpus", "{root}/src", "--tokenizer", "no-such-tokenizer"], "unknown tokenizer"),
    (["--corpus", "{root}/docs.jsonl", "--on-error", "fail"], "docs.jsonl:2: malformed JSON"),
    (["--corpus", "{root}/src", "--shard-tokens", "1"], "--shard-tokens must be"),
    (["--corpus", "{root}/src", "--workers", "0"], "--workers must be"),
    (["--corpus", "{root}/src", "--roles", ","], "--roles"),
])
def test_bad_input_exits_2_and_keeps_the_old_store(corpus, old_store, capsys, extra, message):
    root, _ = corpus
    before = digest(old_store)
    capsys.readouterr()
    argv = [a.format(root=root) for a in extra] + ["--out", str(old_store)]
    code, stdout, stderr = run(argv, capsys)
    assert code == 2
    assert message in stderr and stderr.startswith("datastore-build: error: ")
    assert digest(old_store) == before
    assert temp_dirs_next_to(old_store) == []


def test_append_with_another_tokenizer_exits_2(corpus, tmp_path, capsys):
    root, _ = corpus
    out = tmp_path / "fake"
    write_datastore(out, [np.array([1, 2, 3])], fake_tokenizer(100))
    before = digest(out)
    code, _, stderr = run(["--corpus", str(root / "src"), "--out", str(out), "--append"], capsys)
    assert code == 2 and "fingerprint" in stderr and "'fake'" in stderr
    assert digest(out) == before


def test_argparse_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--corpus", "x", "--out", "y", "--format", "xml"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_settings_validation(tmp_path):
    with pytest.raises(BuildError, match="--corpus"):
        BuildSettings(corpus=(), out=str(tmp_path))
    with pytest.raises(BuildError, match="--format"):
        BuildSettings(corpus=("x",), out=str(tmp_path), format="csv")
    with pytest.raises(BuildError, match="--on-error"):
        BuildSettings(corpus=("x",), out=str(tmp_path), on_error="ignore")
    s = BuildSettings(corpus="x", out=tmp_path, roles="gpt")
    assert s.corpus == ("x",) and s.roles == ("gpt",) and s.out == str(tmp_path)


def console_script() -> str:
    path = Path(sys.executable).parent / "datastore-build"
    assert path.is_file(), "install the repo (make install) to get the console script"
    return str(path)


def test_console_script(corpus, tmp_path, smollm2_tokenizer):
    root, texts = corpus
    ok = subprocess.run([console_script(), "--corpus", str(root / "src"), "--glob", "*.py",
                         "--out", str(tmp_path / "ds"), "--workers", "2"],
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    tokens = len(expected_tokens(smollm2_tokenizer, texts[2:])) - 2
    assert SUMMARY.search(ok.stdout).groups()[:3] == ("2", str(tokens), "1")
    bad = subprocess.run([console_script(), "--corpus", str(root / "nope"), "--out", str(tmp_path / "x")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "nope: no such file or directory" in bad.stderr
    assert not (tmp_path / "x").exists()
    helped = subprocess.run([console_script(), "--help"], capture_output=True, text=True, timeout=300)
    assert helped.returncode == 0 and "--on-error" in helped.stdout and "--append" in helped.stdout


def test_standard_corpora_settings_are_valid():
    from builder.corpora import STDLIB_EXCLUDE, code_settings, stdlib_settings

    std = stdlib_settings("x")
    assert std.glob == "*.py" and std.exclude == STDLIB_EXCLUDE and Path(std.corpus[0]).is_dir()
    code = code_settings("y", workers=2)
    assert code.corpus[0] == std.corpus[0] and code.workers == 2 and all(Path(p).is_dir() for p in code.corpus)
