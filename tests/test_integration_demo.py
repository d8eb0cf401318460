"""`make demo` end to end on one prompt: the real stdlib datastore (built once into the demo's
cache, data/stdlib-smollm2, if absent) and SmolLM2."""
from __future__ import annotations

import re

import pytest

from decoder.cli import UsageError
from decoder.demo import DemoSettings, main


@pytest.mark.slow
def test_demo_one_prompt(capsys):
    rc = main(["--prompts", "1", "--max-new-tokens", "64"])
    out = capsys.readouterr().out
    assert rc == 0, out
    row = re.search(r"^HumanEval/0\s+([\d.]+)\s+([\d.]+)x\s+(yes|NO)", out, re.M)
    assert row, out
    assert row.group(3) == "yes"
    assert float(row.group(1)) > 1.0, "the stdlib datastore should save SmolLM2 some forward passes"
    assert "1/1 outputs identical" in out


def test_demo_bad_arguments(capsys):
    assert main(["--prompts", "0"]) == 2
    assert "--prompts" in capsys.readouterr().err
    assert main(["--drafters", "retrieval,bogus"]) == 2
    assert "'bogus'" in capsys.readouterr().err
    with pytest.raises(UsageError):
        DemoSettings(max_new_tokens=0)
