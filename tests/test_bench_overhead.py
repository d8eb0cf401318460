"""benchmarks/bench_overhead.py on a tiny setting: batch 1 and 2, a few tokens, a tiny store of the
real SmolLM2 vocabulary built in tmp_path. Checks the JSON it writes and that its arithmetic holds
(host = wall - forward - logits ops, per step, ratio to HF), and the pieces it is built from (the
forward clock keeps generate's view of the signature, logits ops outside the forward only)."""
from __future__ import annotations

import inspect
import json
import math

import numpy as np
import pytest
import torch

from benchmarks import bench_overhead as bo


@pytest.fixture(scope="module")
def tok():
    from builder.tokenizer import load_tokenizer

    return load_tokenizer("smollm2")


@pytest.fixture(scope="module")
def store(tmp_path_factory, tok):
    from benchmarks import workloads as wl
    from builder.tokenizer import tokenizer_info
    from builder.writer import write_datastore
    from datastore.store import Datastore

    path = tmp_path_factory.mktemp("overhead") / "store"
    docs = [np.asarray(wl.encode(p, tok), dtype=np.int64) for p in wl.humaneval(6)]
    write_datastore(path, docs, tokenizer_info(tok, "smollm2"))
    with Datastore.open(path) as ds:
        yield ds


@pytest.fixture(scope="module")
def results(tmp_path_factory, store, tok):
    out = tmp_path_factory.mktemp("results")
    settings = bo.OverheadSettings(batches=(1, 2), sources=("none", "all"), budgets=(8,), new_tokens=6,
                                   warmup_tokens=2, hf_repeats=1, repeats=2, label="test", out=out, plot=True)
    res = bo.run(settings, store=store, store_info={"path": "tmp", "which": "test", "tokens": 1}, tok=tok,
                 progress=lambda msg: None)
    return res, out


def test_files_and_fields(results):
    res, out = results
    for ext in ("json", "md", "png"):
        assert (out / f"overhead_test.{ext}").is_file()
    saved = json.loads((out / "overhead_test.json").read_text())
    assert saved["configs"] == json.loads(json.dumps(res["configs"]))
    assert saved["benchmark"] == "overhead" and saved["label"] == "test"
    assert saved["stub"]["vocab_size"] == 49152 and saved["stub"]["num_hidden_layers"] == 1
    for key in ("cpu_model", "flags", "cpus", "torch", "load_average"):
        assert key in saved["machine"]
    assert set(saved["hf_generate"]) == {"1", "2"}
    assert [(e["batch"], e["sources"], e["budget"]) for e in saved["configs"]] == [
        (1, "none", 8), (1, "all", 8), (2, "none", 8), (2, "all", 8)]
    md = (out / "overhead_test.md").read_text()
    for b in (1, 2):
        for src in ("none", "all"):
            assert f"\n| {b} | {src} | 8 | " in md
    assert "<= 0.5x: " in md  # batch 1 has a target; batch 2 none


def test_arithmetic(results, tok):
    res, _ = results
    # a decoder with a PhaseTimer must have its phases reported (an older one: total only)
    has_timer = getattr(bo.make_decoder(bo.stub_model(len(tok), 0, torch.device("cpu")), tok, None, "none", 8),
                        "timer", None) is not None
    assert res["decoder"]["has_timer"] == has_timer
    assert all((e["phases_ms_per_step"] is not None) == has_timer for e in res["configs"])
    for e in res["configs"]:
        b = e["batch"]
        assert e["new_tokens"] == 6 * b  # no eos: every row decodes all its tokens
        assert e["forward_calls"] == e["steps"] + 1  # prefill + one forward per step: the clock wraps forward
        assert math.isclose(e["host_seconds"], e["wall_seconds"] - e["forward_seconds"] - e["logits_ops_seconds"],
                            rel_tol=1e-9, abs_tol=1e-12)
        assert math.isclose(e["host_ms_per_step"], e["host_seconds"] / e["steps"] * 1e3, rel_tol=1e-9)
        runs = e["host_ms_per_step_runs"]  # two fresh decoders; the median (upper of two) reported
        assert len(runs) == 2 and runs == sorted(runs) and e["host_ms_per_step"] == runs[1]
        hf = res["hf_generate"][str(b)]
        assert hf["new_tokens_per_row"] == 6 and hf["forward_calls"] == 6
        assert math.isclose(hf["ms_per_step"], hf["wall_seconds"] / 6 * 1e3, rel_tol=1e-9)
        assert e["hf_ms_per_step"] == hf["ms_per_step"]
        assert math.isclose(e["ratio"], e["host_ms_per_step"] / hf["ms_per_step"], rel_tol=1e-9)
        assert e["verdict"] == ({1: "met" if e["ratio"] <= 0.5 else "not met"}.get(b, "-"))
        assert 0 < e["forward_seconds"] < e["wall_seconds"]
        # the argmax/top-k over [B, q, V] logits is outside the forward: one call a step at least
        assert e["logits_ops_seconds"] > 0 and e["logits_ops_calls"] >= e["steps"]
        assert "host_topk" in e["logits_ops_by_op_seconds"]  # the decoder's CPU pass counts as device work
        assert math.isclose(e["logits_ops_seconds"], sum(e["logits_ops_by_op_seconds"].values()), rel_tol=1e-9)
        assert e["host_seconds"] > 0
        if e["sources"] == "none":
            assert e["tokens_per_step"] == 1.0 and e["nodes_per_step"] == 0.0 and e["steps"] == 6
        else:
            assert 0 < e["nodes_per_step"] <= 8
        assert math.isclose(e["tokens_per_step"], e["new_tokens"] / e["row_steps"], rel_tol=1e-9)
        if e["phases_ms_per_step"] is not None:  # a decoder with a PhaseTimer
            from decoder.timing import DEVICE_PHASES

            host = sum(v for k, v in e["phases_ms_per_step"].items() if k not in DEVICE_PHASES)
            assert math.isclose(host, e["timer_host_ms_per_step"], rel_tol=1e-6)
            assert e["timer_steps"] == e["steps"]
            assert sum(e["phases_ms_per_step"].values()) * e["steps"] <= e["wall_seconds"] * 1e3 * 1.001


def test_logits_clock_times_vocabulary_reductions_outside_the_forward():
    model = bo.stub_model(1000, 0, torch.device("cpu"))
    fwd = bo.ForwardClock(model)
    originals = (torch.Tensor.argmax, torch.Tensor.topk, torch.topk, torch.nn.functional.softmax)
    clock = bo.LogitsClock(1000, fwd)
    try:
        x = torch.randn(2, 3, 1000)
        x.topk(2, dim=-1)
        torch.softmax(x, dim=-1)
        torch.nn.functional.log_softmax(x, dim=-1)
        torch.randn(2, 999).argmax(dim=-1)  # not vocabulary-wide
        fwd.in_forward = True
        x.argmax(dim=-1)  # inside the model's forward: the model's own work
        fwd.in_forward = False
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([[1, 2]])).logits  # no reduction of the forward counts
        logits.argmax(dim=-1)
    finally:
        clock.close()
        fwd.close()
    assert set(clock.seconds) == {"topk", "softmax", "log_softmax", "argmax"} and clock.calls == 4
    assert all(v > 0 for v in clock.seconds.values())
    assert (torch.Tensor.argmax, torch.Tensor.topk, torch.topk, torch.nn.functional.softmax) == originals


def test_forward_clock_keeps_the_signature_and_counts():
    model = bo.stub_model(128, 0, torch.device("cpu"))
    before = inspect.signature(model.forward)
    clock = bo.ForwardClock(model)
    assert inspect.signature(model.forward) == before  # generate reads logits_to_keep from it
    with torch.inference_mode():
        model(input_ids=torch.tensor([[1, 2, 3]]))
    assert clock.calls == 1 and clock.seconds > 0
    clock.close()
    assert "forward" not in model.__dict__


@pytest.mark.parametrize("kw", [dict(batches=()), dict(batches=(0,)), dict(sources=("bogus",)),
                                dict(budgets=(0,)), dict(new_tokens=1), dict(label="a/b"), dict(device="tpu"),
                                dict(threads=-1), dict(hf_repeats=0), dict(repeats=0), dict(batches=(100,))])
def test_settings_rejected(kw):
    with pytest.raises(ValueError):
        bo.OverheadSettings(**kw)


def test_cli_usage_error(capsys):
    assert bo.main(["--sources", "nope"]) == 2
    assert "--sources" in capsys.readouterr().err
