"""benchmarks/gpu_check.sh's CPU-side paths: its quick self-test (GPU_CHECK_DEVICE=cpu
GPU_CHECK_QUICK=1) runs every step with tiny sizes, and the files it writes are checked here.
The GPU itself is exercised only where one is lent: this machine has none."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"
BUDGET = 480  # seconds: the "at most 8 minutes on one GPU"


def run_check(tmp_path: Path, steps: str, device: str = "cpu", timeout: int = 600, **env) -> subprocess.CompletedProcess:
    full = dict(os.environ, GPU_CHECK_DEVICE=device, GPU_CHECK_QUICK="1", GPU_CHECK_STEPS=steps,
                GPU_CHECK_OUT=str(tmp_path / "out"), GPU_CHECK_PYTHON=sys.executable, **env)
    return subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=full, capture_output=True, text=True,
                          timeout=timeout)


def steps_tsv(out: Path) -> dict[str, str]:
    return {line.split("\t")[0]: line.split("\t")[1]
            for line in (out / "steps.tsv").read_text().splitlines() if line.strip()}


def test_syntax_and_time_budget():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    limits = {m.group(1): int(m.group(2)) for m in re.finditer(r"^run_step (\w+) (\d+)$", text, re.M)}
    assert set(limits) == {"preflight", "stores", "exactness", "tests", "latency", "overhead", "drafters"}
    assert sum(limits.values()) <= BUDGET, limits
    assert re.search(r"^BUDGET=\$\{GPU_CHECK_BUDGET:-\$\(\(480 \* SLACK\)\)\}$", text, re.M)
    assert re.search(r"else SLACK=\$\{GPU_CHECK_SLACK:-1\}", text)  # on the GPU: the limits as written
    assert "set -euo pipefail" in text
    assert os.access(SCRIPT, os.X_OK)


def test_bad_device_is_refused(tmp_path):
    r = run_check(tmp_path, "preflight", device="tpu")
    assert r.returncode == 2 and "GPU_CHECK_DEVICE must be" in r.stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA device is present")
def test_cuda_requested_without_cuda_fails_loudly(tmp_path):
    """On a machine whose torch has no CUDA the check stops at its first step, with the reason."""
    r = run_check(tmp_path, "preflight,latency", device="cuda", timeout=120)
    out = tmp_path / "out"
    assert r.returncode == 1, r.stdout + r.stderr
    assert "torch.cuda.is_available() is False" in r.stdout + r.stderr
    assert steps_tsv(out) == {"preflight": "FAILED (exit 1)"}  # the latency step never ran
    assert not (out / "latency-float32").exists()
    assert "FAILED: preflight" in (out / "summary.md").read_text()
    assert json.loads((out / "preflight.json").read_text())["cuda_available"] is False


def test_quick_cpu_run(tmp_path):
    """Every step but the two that load SmolLM2 (those: test_quick_cpu_run_smollm2_steps, slow)."""
    steps = "preflight,stores,tests,latency,overhead"
    r = run_check(tmp_path, steps)
    out = tmp_path / "out"
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert steps_tsv(out) == {s: "ok" for s in steps.split(",")}
    pre = json.loads((out / "preflight.json").read_text())
    assert pre["device"] == "cpu" and pre["quick"] is True
    # the CUDA decoder tests: collected, every one reported skipped (never passed) without a GPU
    suite = ET.parse(out / "tests" / "cuda.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    assert int(suite.get("tests")) >= 50 and int(suite.get("skipped")) == int(suite.get("tests"))
    reasons = {s.get("message") for s in suite.iter("skipped")}
    assert reasons and all("no CUDA device" in m for m in reasons), reasons
    lat = json.loads((out / "latency-float32" / "latency.json").read_text())
    curve = lat["models"]["tiny"]["latency_seconds"]
    assert sorted(int(q) for q in curve) == [1, 2, 4] and all(v > 0 for v in curve.values())
    assert lat["models"]["tiny"]["device"] == "cpu"
    assert (out / "latency-float32" / "latency.md").read_text().startswith("# Forward latency")
    ov = json.loads((out / "overhead" / "overhead.json").read_text())
    assert ov["device"] == "cpu" and {(e["batch"], e["sources"]) for e in ov["configs"]} == {
        (1, "none"), (1, "retrieval"), (2, "none"), (2, "retrieval")}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed"] == [] and set(summary["steps"]) == set(steps.split(","))
    assert "latency_float32" in summary and summary["overhead"]
    md = (out / "summary.md").read_text()
    assert "ALL STEPS PASSED" in md and "## Forward latency, float32" in md
    for s in steps.split(","):
        assert (out / "logs" / f"{s}.log").is_file()


@pytest.mark.slow
def test_quick_cpu_run_smollm2_steps(tmp_path):
    """The exactness and workload steps (SmolLM2: bench_decode fp32 + bf16, bench_drafters)."""
    r = run_check(tmp_path, "stores,exactness,drafters", timeout=900)
    out = tmp_path / "out"
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert steps_tsv(out) == {"stores": "ok", "exactness": "ok", "drafters": "ok"}
    dec = json.loads((out / "decode" / "decode.json").read_text())
    assert set(dec["dtypes"]) == {"float32", "bfloat16"}
    assert dec["dtypes"]["float32"]["summary"]["identical_rate"] == 1.0
    assert dec["dtypes"]["float32"]["fixed_budget"]["summary"]["identical_rate"] == 1.0
    dr = json.loads((out / "drafters" / "drafters.json").read_text())
    assert set(dr["workloads"]) == {"code", "chat", "reference"}
    methods = dr["workloads"]["code"]["dtypes"]["float32"]["methods"]
    assert "default" in methods and "default@8" in methods  # quick: budget 4, fixed budget 8
    assert all(m["summary"]["identical_rate"] == 1.0 for m in methods.values())
    md = (out / "summary.md").read_text()
    assert "## Exactness (bench_decode)" in md and "## Workloads (bench_drafters)" in md


def test_bench_latency_cli_errors(capsys):
    from benchmarks import bench_latency as bl

    assert bl.main(["--sizes", "4,2", "--device", "cpu"]) == 2
    assert bl.main(["--models", "gpt5", "--device", "cpu"]) == 2
    assert bl.main(["--dtype", "int8", "--device", "cpu"]) == 2
    if not __import__("torch").cuda.is_available():
        assert bl.main(["--device", "cuda"]) == 2
    assert "bench_latency: error" in capsys.readouterr().err
    assert bl.LLAMA1B["vocab_size"] == 128256 and bl.LLAMA1B["num_key_value_heads"] == 8


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA device is present")
def test_load_model_on_cuda_without_cuda_says_so():
    """decoder.models.load_model refuses a CUDA device up front (before the tokenizer and the
    weights load), naming torch's build; specdec turns the ValueError into a usage error."""
    from decoder.models import load_model

    with pytest.raises(ValueError, match=r"torch.cuda.is_available\(\) is False"):
        load_model("smollm2", device="cuda")
