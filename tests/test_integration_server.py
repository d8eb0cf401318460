"""End to end over a real `datastore-serve` subprocess: decoding through `--address`, a server
killed in the middle of a generation (output unchanged, only speed lost), and `--insert-output`
feeding the live tier."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_fixtures import PROMPTS, STORED_NEW_TOKENS, UNSEEN_PROMPT, greedy_ids, make_setup
from decoder.drafters.base import Drafter


@pytest.fixture(scope="module")
def setup(tmp_path_factory, smollm2_tokenizer):
    return make_setup(tmp_path_factory.mktemp("integration"), smollm2_tokenizer)


def start_server(store: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    exe = Path(sys.executable).parent / "datastore-serve"
    assert exe.is_file(), "datastore-serve is not installed (pip install -e .)"
    proc = subprocess.Popen([str(exe), str(store), "--port", "0", *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    line = proc.stdout.readline()  # blocks until ready or until the process exits
    if not line.startswith("serving on "):
        proc.kill()
        raise AssertionError(f"datastore-serve did not start: {line!r} {proc.stderr.read()[-2000:]}")
    return proc, line.split("serving on ", 1)[1].strip()


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the server and any workers it forked
    proc.wait(timeout=30)


class KillServerAt(Drafter):
    """Kills the server (SIGKILL, no goodbye) at its n-th step; proposes nothing itself."""

    name = "killer"

    def __init__(self, proc: subprocess.Popen, at_step: int):
        self.proc, self.at_step, self.steps, self.killed_at = proc, at_step, 0, None

    def propose(self, row, context, budget, max_depth):
        self.steps += 1
        if self.steps == self.at_step:
            stop(self.proc)
            self.killed_at = self.steps
        return super().propose(row, context, budget, max_depth)


def load_tiny(setup):
    from decoder.models import load_model

    return load_model(str(setup.model_dir), device="cpu")


def test_server_killed_mid_generation_changes_only_speed(setup):
    from decoder.drafters.registry import make_drafters
    from decoder.speculative import DecoderSettings, SpeculativeDecoder

    model, tok = load_tiny(setup)
    prompt = PROMPTS[0]
    expected = setup.greedy[prompt]
    proc, address = start_server(setup.store, "--no-live")
    try:
        killer = KillServerAt(proc, at_step=3)
        drafters = make_drafters(["retrieval"], address=address, tokenizer=tok) + [killer]
        # budget 4: at most 5 tokens a step, so the kill at step 3 lands mid-generation.
        decoder = SpeculativeDecoder(model, tok, drafters, DecoderSettings(budget=4))
        t0 = time.perf_counter()
        gen = decoder.generate(prompt, max_new_tokens=STORED_NEW_TOKENS)
        elapsed = time.perf_counter() - t0
    finally:
        stop(proc)
    assert killer.killed_at == 3, "the server was not killed mid-generation"
    assert gen.token_ids == expected == greedy_ids(model, tok, prompt, STORED_NEW_TOKENS)
    # Drafts from the server were accepted before the kill, none could come after it.
    assert gen.stats.accepted_by_source.get("retrieval", 0) > 0
    assert gen.stats.steps > 3 + 20  # greedy pace after the kill: 48 - 15 tokens left at most
    # Every later step's draft failed fast (refused, then the open breaker), except the last
    # step's: with one token left the decoder asks no drafter.
    assert gen.stats.datastore_failures >= gen.stats.steps - 3 - 1
    assert elapsed < 60, f"a dead server must not stall decoding ({elapsed:.1f} s)"


def test_cli_over_address_and_dead_address(setup, capsys):
    from decoder.cli import main

    proc, address = start_server(setup.store, "--no-live")
    try:
        rc = main(["generate", "--model", str(setup.model_dir), "--address", address, "--prompt", PROMPTS[1],
                   "--max-new-tokens", "24", "--budget", "16", "--draft-timeout", "5", "--compare", "--json"])
        report = json.loads(capsys.readouterr().out)
    finally:
        stop(proc)
    assert rc == 0 and report["identical"] is True
    assert report["accepted_by_source"].get("retrieval", 0) > 0 and report["steps"] < 24
    assert report["datastore_failures"] == 0


def test_cli_insert_output_feeds_the_live_tier(setup, capsys, tmp_path, smollm2_tokenizer):
    """The generation inserted by one decode is drafted from by the next (another node)."""
    from decoder.cli import main

    proc, address = start_server(setup.store, "--live-dir", str(tmp_path / "live"))
    argv = ["generate", "--model", str(setup.model_dir), "--address", address, "--prompt", UNSEEN_PROMPT,
            "--max-new-tokens", "32", "--budget", "16", "--draft-timeout", "5", "--json"]
    try:
        assert main([*argv, "--insert-output"]) == 0
        first = json.loads(capsys.readouterr().out)
        time.sleep(1.0)  # the live index refreshes within ~200 ms
        assert main([*argv, "--compare"]) == 0
        second = json.loads(capsys.readouterr().out)
    finally:
        stop(proc)
    assert second["identical"] is True and second["token_ids"] == first["token_ids"]
    # UNSEEN_PROMPT's continuation is in no static document: only the live tier can draft it.
    assert first["accepted_by_source"].get("retrieval", 0) < second["accepted_by_source"].get("retrieval", 0)
    assert second["steps"] < first["steps"]
