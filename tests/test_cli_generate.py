"""`specdec generate` / `specdec warmup` on a tiny random Llama saved as a HF directory, with a real
LMDB datastore that holds the model's own greedy continuations of some prompts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_fixtures import PROMPTS, STORED_NEW_TOKENS, UNSEEN_PROMPT, foreign_store, make_setup
from decoder.cli import main

ALL_DRAFTERS = "retrieval,reference,ngram,lookahead,recycle"


@pytest.fixture(scope="module")
def setup(tmp_path_factory, smollm2_tokenizer):
    return make_setup(tmp_path_factory.mktemp("cli"), smollm2_tokenizer)


def run_json(capsys, *argv) -> tuple[int, dict]:
    rc = main(["generate", *map(str, argv), "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, f"--json must print exactly one line, got {out!r}"
    return rc, json.loads(out[0])


@pytest.mark.parametrize("prompt", PROMPTS[:2] + (UNSEEN_PROMPT,))
def test_compare_identical_to_greedy(setup, capsys, prompt):
    n = STORED_NEW_TOKENS
    rc, report = run_json(capsys, "--model", setup.model_dir, "--datastore", setup.store,
                          "--prompt", prompt, "--max-new-tokens", n, "--compare")
    assert rc == 0
    for key in ("identical", "new_tokens", "steps", "tokens_per_step", "seconds", "baseline_seconds",
                "speedup", "stats", "accepted_by_source"):
        assert key in report, key
    assert report["identical"] is True
    assert report["new_tokens"] == n == len(report["token_ids"])
    assert report["tokens_per_step"] == pytest.approx(report["new_tokens"] / report["steps"])
    assert report["speedup"] == pytest.approx(report["baseline_seconds"] / report["seconds"], rel=1e-6)
    if prompt in setup.greedy:
        # The store holds this very continuation: retrieval must have saved forward passes.
        assert report["token_ids"] == setup.greedy[prompt]
        assert report["steps"] < n
        assert report["accepted_by_source"].get("retrieval", 0) > 0


def test_text_output_and_stats_line(setup, capsys, smollm2_tokenizer):
    prompt = PROMPTS[0]
    rc = main(["generate", "--model", str(setup.model_dir), "--datastore", str(setup.store),
               "--prompt", prompt, "--max-new-tokens", "16", "--compare"])
    captured = capsys.readouterr()
    assert rc == 0
    assert captured.out == smollm2_tokenizer.decode(setup.greedy[prompt][:16]) + "\n"
    assert "tokens/step" in captured.err and "identical: yes" in captured.err


def test_prompt_file_reference_and_all_drafters(setup, capsys, tmp_path):
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(PROMPTS[2], encoding="utf-8")
    reference = tmp_path / "ref.txt"
    reference.write_text(UNSEEN_PROMPT * 3, encoding="utf-8")
    rc, report = run_json(capsys, "--model", setup.model_dir, "--datastore", setup.store,
                          "--prompt-file", prompt_file, "--reference", reference,
                          "--drafters", ALL_DRAFTERS, "--max-new-tokens", 24, "--compare")
    assert rc == 0 and report["identical"] is True
    assert report["token_ids"] == setup.greedy[PROMPTS[2]][:24]


def test_fixed_budget_and_no_datastore_needed_without_retrieval(setup, capsys):
    rc, report = run_json(capsys, "--model", setup.model_dir, "--drafters", "ngram",
                          "--prompt", UNSEEN_PROMPT, "--max-new-tokens", 12, "--budget", 4, "--compare")
    assert rc == 0 and report["identical"] is True


def test_stop_string_ends_output(setup, capsys, smollm2_tokenizer):
    prompt = PROMPTS[0]
    full = smollm2_tokenizer.decode(setup.greedy[prompt])
    stop = full[len(full) // 2: len(full) // 2 + 4]
    rc, report = run_json(capsys, "--model", setup.model_dir, "--datastore", setup.store,
                          "--prompt", prompt, "--max-new-tokens", STORED_NEW_TOKENS,
                          "--stop", stop, "--compare")
    assert rc == 0 and report["identical"] is True
    assert report["new_tokens"] < STORED_NEW_TOKENS


# ------------------------------------------------------------------ bad input: exit status 2


def expect_usage_error(capsys, argv, *needles):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    for needle in needles:
        assert needle in err, (needle, err)


def test_missing_datastore(setup, capsys, tmp_path):
    missing = tmp_path / "nope"
    expect_usage_error(capsys, ["generate", "--model", str(setup.model_dir), "--datastore", str(missing),
                                "--prompt", "x"], str(missing))


def test_not_a_datastore(setup, capsys, tmp_path):
    expect_usage_error(capsys, ["generate", "--model", str(setup.model_dir), "--datastore", str(tmp_path),
                                "--prompt", "x"], str(tmp_path))


def test_tokenizer_mismatch(setup, capsys, tmp_path, smollm2_tokenizer):
    store = foreign_store(tmp_path, smollm2_tokenizer)
    rc = main(["generate", "--model", str(setup.model_dir), "--datastore", str(store), "--prompt", "x"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "tokenizer" in err.lower() or "fingerprint" in err.lower(), err


def test_unknown_drafter(setup, capsys):
    expect_usage_error(capsys, ["generate", "--model", str(setup.model_dir), "--datastore",
                                str(setup.store), "--prompt", "x", "--drafters", "retrieval,magic"],
                       "'magic'", "retrieval,longest,reference,ngram,lookahead,recycle")


@pytest.mark.parametrize("extra, needle", [
    ([], "--prompt"),  # no prompt at all
    (["--prompt", "x", "--prompt-file", "f"], "exactly one"),
    (["--prompt-file", "/nonexistent/prompt.txt"], "/nonexistent/prompt.txt"),
    (["--prompt", "x", "--reference", "/nonexistent/ref.txt"], "/nonexistent/ref.txt"),
    (["--prompt", "x", "--budget", "zero"], "--budget"),
    (["--prompt", "x", "--budget", "0"], "--budget"),
    (["--prompt", "x", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["--prompt", "x", "--temperature", "0.7", "--compare"], "--compare"),
    (["--prompt", "x", "--top-p", "1.5"], "--top-p"),
    (["--prompt", "x", "--min-count", "0"], "--min-count"),
    (["--prompt", "x", "--insert-output"], "--address"),
    (["--prompt", "x", "--address", "127.0.0.1:1"], "not both"),
])
def test_bad_arguments(setup, capsys, extra, needle):
    expect_usage_error(capsys, ["generate", "--model", str(setup.model_dir), "--datastore",
                                str(setup.store), *extra], needle)


def test_retrieval_without_a_source(setup, capsys):
    expect_usage_error(capsys, ["generate", "--model", str(setup.model_dir), "--prompt", "x"],
                       "--datastore", "--address")


def test_unknown_model(setup, capsys, tmp_path):
    expect_usage_error(capsys, ["generate", "--model", str(tmp_path / "no-model"), "--datastore",
                                str(setup.store), "--prompt", "x"], "no-model")


def test_argparse_errors_exit_2(capsys):
    assert main(["generate", "--dtype", "float8"]) == 2
    assert main([]) == 2
    assert "float8" in capsys.readouterr().err


def test_warmup_curve(setup, capsys):
    rc = main(["warmup", "--model", str(setup.model_dir), "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    curve = {int(t): s for t, s in report["latency_seconds"].items()}
    assert 1 in curve and len(curve) >= 4
    assert all(s > 0 for s in curve.values())


def test_console_script(setup):
    """The installed `specdec` entry point, as a user runs it."""
    exe = Path(sys.executable).parent / "specdec"
    assert exe.is_file(), "the console script is not installed (pip install -e .)"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    ok = subprocess.run([str(exe), "generate", "--model", str(setup.model_dir), "--datastore",
                         str(setup.store), "--prompt", PROMPTS[1], "--max-new-tokens", "8",
                         "--compare", "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["identical"] is True
    bad = subprocess.run([str(exe), "generate", "--model", str(setup.model_dir), "--datastore",
                          str(setup.store), "--prompt", "x", "--drafters", "nope"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and "nope" in bad.stderr


@pytest.mark.parametrize("flag,packed", [((), True), (("--no-packed-linears",), False)])
def test_packed_linears_flag(setup, capsys, monkeypatch, flag, packed):
    """float32 on the CPU packs the model's linears unless --no-packed-linears; identical either way."""
    import decoder.models as models

    calls = []
    real = models.pack_linears
    monkeypatch.setattr(models, "pack_linears", lambda model: calls.append(real(model)))
    rc, report = run_json(capsys, "--model", setup.model_dir, "--datastore", setup.store,
                          "--prompt", PROMPTS[0], "--max-new-tokens", 8, "--compare", *flag)
    assert rc == 0 and report["identical"] is True
    assert (len(calls) == 1 and calls[0] > 0) if packed else calls == []
