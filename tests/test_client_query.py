"""`datastore-query` through `main([...])`: both modes give the same tree, JSON matches
Datastore.draft, auth/TLS flags work, bad input exits 2 with a clear message."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from client.query_cli import main
from datastore.server import ServeSettings, serve
from datastore.store import Datastore
from server_support import build_store, encode, make_ca_and_cert

TEXT = "    def __init__(self"


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory, smollm2_tokenizer):
    path = tmp_path_factory.mktemp("query") / "store"
    build_store(path, smollm2_tokenizer, modules=("textwrap.py", "argparse.py"))
    return path


@pytest.fixture(scope="module")
def server(store_dir):
    """On a copy: py-lmdb opens an environment once per process, and the tests open the
    original in process too."""
    copy = store_dir.parent / "served"
    shutil.copytree(store_dir, copy)
    with serve(copy, ServeSettings(live=False)) as handle:
        yield handle


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_local_json_equals_datastore_draft(capsys, store_dir, smollm2_tokenizer):
    code, out, _ = run(capsys, "--datastore", str(store_dir), "--text", TEXT, "--budget", "20",
                       "--max-depth", "5", "--json")
    assert code == 0
    got = json.loads(out)
    ids = encode(smollm2_tokenizer, TEXT)
    with Datastore.open(store_dir) as ds:
        want = ds.draft(ids, 20, 5)
    assert got["context"] == ids.tolist()
    assert got["tokens"] == want.tokens.tolist() and got["parents"] == want.parents.tolist()
    assert got["counts"] == want.counts.tolist() and got["match_len"] == want.match_len
    assert got["depths"] == want.depths().tolist()
    assert got["matched_suffix"] == ids[len(ids) - want.match_len:].tolist()
    assert got["matched_text"] == smollm2_tokenizer.decode(got["matched_suffix"])
    assert len(want) > 0


def test_remote_text_output_equals_local(capsys, store_dir, server):
    code_l, local, _ = run(capsys, "--datastore", str(store_dir), "--text", TEXT)
    code_r, remote, _ = run(capsys, "--address", server.address, "--text", TEXT)
    assert code_l == code_r == 0 and local == remote
    lines = local.splitlines()
    assert lines[1].startswith("match_len: ") and "self'" in lines[1]
    nodes = lines[3:]
    assert nodes and all("count=" in n and "depth=" in n for n in nodes)
    assert "'" in nodes[0]  # tokens shown as repr, whitespace visible


def test_tokens_mode_matches_the_ids(capsys, store_dir, server, smollm2_tokenizer):
    ids = encode(smollm2_tokenizer, TEXT).tolist()
    code, out, _ = run(capsys, "--address", server.address, "--tokens", ",".join(map(str, ids)),
                       "--json")
    assert code == 0
    with Datastore.open(store_dir) as ds:
        assert json.loads(out)["tokens"] == ds.draft(np.asarray(ids)).tokens.tolist()


def test_auth_and_tls_flags(capsys, store_dir, tmp_path):
    certs = make_ca_and_cert(tmp_path)
    (tmp_path / "tok").write_text("letmein\n")
    (tmp_path / "bad").write_text("nope\n")
    s = ServeSettings(live=False, auth_token="letmein", tls_cert=str(certs["server"]),
                      tls_key=str(certs["server_key"]))
    with serve(store_dir, s) as srv:
        code, out, err = run(capsys, "--address", srv.address, "--text", TEXT,
                             "--auth-token-file", str(tmp_path / "tok"),
                             "--tls-ca", str(certs["ca"]))
        assert code == 0 and "count=" in out, err
        code, _, err = run(capsys, "--address", srv.address, "--text", TEXT,
                           "--auth-token-file", str(tmp_path / "bad"), "--tls-ca", str(certs["ca"]))
        assert code == 2 and "UNAUTHENTICATED" in err
        code, _, err = run(capsys, "--address", srv.address, "--text", TEXT,
                           "--auth-token-file", str(tmp_path / "missing"))
        assert code == 2 and "--auth-token-file" in err and "missing" in err


def test_min_count_backs_off_in_both_modes(capsys, store_dir, server, smollm2_tokenizer):
    """TEXT's longest match occurs under 5 times: --min-count 5 grows the trie from a shorter
    suffix, exactly as Datastore.draft(min_count=5) does, in process and over gRPC."""
    ids = encode(smollm2_tokenizer, TEXT)
    local = {}
    for k in ("1", "5"):
        code, out, err = run(capsys, "--datastore", str(store_dir), "--text", TEXT,
                             "--min-count", k, "--json")
        assert code == 0, err
        local[k] = json.loads(out)
        code, out, err = run(capsys, "--address", server.address, "--text", TEXT,
                             "--min-count", k, "--json")
        assert code == 0 and json.loads(out) == local[k], err
    with Datastore.open(store_dir) as ds:
        want = ds.draft(ids, min_count=5)
    got = local["5"]
    assert got["match_len"] == want.match_len and got["tokens"] == want.tokens.tolist()
    assert got["counts"] == want.counts.tolist() and got["parents"] == want.parents.tolist()
    assert 0 < got["match_len"] < local["1"]["match_len"]
    assert got["tokens"] != local["1"]["tokens"]


@pytest.mark.parametrize("argv, message", [
    (["--datastore", "/nonexistent/store", "--tokens", "1"], "no such datastore"),
    (["--address", "127.0.0.1:1", "--tokens", "1"], "UNAVAILABLE"),
    (["--tokens", "1"], "exactly one of --datastore"),
    (["--datastore", "X", "--address", "Y", "--tokens", "1"], "exactly one of --datastore"),
    (["--datastore", "X"], "exactly one of --text"),
    (["--datastore", "X", "--tokens", "1", "--budget", "0"], "--budget"),
    (["--datastore", "X", "--tokens", "1", "--min-count", "0"], "--min-count must be >= 1"),
])
def test_bad_input_exits_2(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and message in err and out == ""
    assert "Traceback" not in err


def test_bad_tokens_and_foreign_tokenizer(capsys, store_dir, tmp_path):
    code, _, err = run(capsys, "--datastore", str(store_dir), "--tokens", "1,x")
    assert code == 2 and "comma-separated" in err
    code, _, err = run(capsys, "--datastore", str(store_dir), "--tokens", "99999999")
    assert code == 2 and "outside the vocabulary" in err
    (tmp_path / "notatok").mkdir()
    code, _, err = run(capsys, "--datastore", str(store_dir), "--text", "x", "--tokenizer",
                       str(tmp_path / "notatok"))
    assert code == 2 and "tokenizer" in err
