"""Benchmark of `datastore-build` on the project's code corpora (builder.corpora).

For each corpus, in one run and with the page cache warmed first:
  1. tokenizer-only: the same readers, batching and threads as the build, without the writer;
  2. the full build into benchmarks/work/<corpus> (other benchmarks reuse these stores).
Each runs in a child process whose peak RSS comes from os.wait4's rusage. Reported: tokens/s, build
time / tokenizer-only time (target <= 1.3), peak RSS against 16 B x largest shard + 1 GiB, and bytes
on disk per token (target <= 7). Results: benchmarks/results/build.json and build.md.

    python benchmarks/bench_build.py                    # stdlib, then stdlib + site-packages
    python benchmarks/bench_build.py --corpora stdlib   # the small one only
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "benchmarks" / "work"
RESULTS = ROOT / "benchmarks" / "results"
GIB = 1 << 30


def settings_for(name: str, out: Path, shard_tokens: int, workers: int):
    from builder.corpora import code_settings, stdlib_settings

    make = {"stdlib": stdlib_settings, "code": code_settings}[name]
    return make(str(out), shard_tokens=shard_tokens, workers=workers, progress=False)


def child_tokenize(settings) -> dict:
    """Read and tokenize exactly as the build does, and throw the ids away."""
    from builder.sources import SkipReporter, iter_corpus
    from builder.tokenize import tokenize_stream
    from builder.tokenizer import load_tokenizer

    start = time.perf_counter()
    load_tokenizer(settings.tokenizer)
    stats: list = []
    texts = iter_corpus(settings.corpus, settings.format, settings.reader_options(), stats,
                        SkipReporter("skip", shown=0, stream=open(os.devnull, "w")))
    tokens = documents = 0
    for _, ids in tokenize_stream(texts, settings.tokenizer, settings.workers):
        tokens += len(ids)
        documents += len(ids) > 0
    return {"seconds": time.perf_counter() - start, "tokens": tokens, "documents": documents}


def child_build(settings) -> dict:
    from builder.pipeline import run_build

    report = run_build(settings)
    shards = report.meta["shards"]
    return {"seconds": report.seconds, "tokens": report.tokens, "documents": report.documents,
            "skipped": report.skipped, "shards": len(shards),
            "largest_shard_tokens": max(s["tokens"] for s in shards),
            "stored_tokens": sum(s["tokens"] for s in shards)}


def run_child(mode: str, name: str, args) -> dict:
    """Run this script as a child in `mode`; -> its JSON result plus peak_rss_bytes (or timed_out)."""
    cmd = [sys.executable, __file__, "--child", mode, "--corpora", name, "--work", str(args.work),
           "--shard-tokens", str(args.shard_tokens), "--workers", str(args.workers)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        _, status, usage = _wait(proc, args.timeout)
    except TimeoutError:
        proc.send_signal(signal.SIGTERM)  # the build unwinds and removes its temp dir
        proc.wait(60)
        return {"timed_out": True, "wall_seconds": time.perf_counter() - start}
    output = proc.stdout.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"child {mode} {name} failed ({status}): {output[-2000:]}")
    result = json.loads(output.strip().splitlines()[-1])
    result["peak_rss_bytes"] = usage.ru_maxrss * 1024  # Linux reports KiB
    result["wall_seconds"] = time.perf_counter() - start
    return result


def _wait(proc: subprocess.Popen, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return pid, status, usage
        if time.monotonic() > deadline:
            raise TimeoutError
        time.sleep(0.2)


def warm_page_cache(settings) -> int:
    """Read every corpus file once so neither timed pass pays the disk; -> bytes read."""
    from builder.readers import corpus_files

    total = 0
    for path in settings.corpus:
        for file in corpus_files(Path(path), settings.glob, settings.exclude):
            if isinstance(file, Path):
                total += len(file.read_bytes())
    return total


def bench_corpus(name: str, args) -> dict:
    out = args.work / name
    settings = settings_for(name, out, args.shard_tokens, args.workers)
    corpus_bytes = warm_page_cache(settings)
    repeats = args.repeats if name == "stdlib" else 1  # the big corpus takes many minutes a pass
    builds, toks = [], []
    # build first, so the store other benchmarks wait for exists as early as possible; passes
    # alternate so a burst of load from other jobs hits both kinds alike
    for i in range(repeats):
        print(f"[{name}] {corpus_bytes / 1e6:.0f} MB of source; build {i + 1}/{repeats}...", file=sys.stderr)
        builds.append(run_child("build", name, args))
        print(f"[{name}] build: {builds[-1]}; tokenizer-only pass...", file=sys.stderr)
        toks.append(run_child("tokenize", name, args))
        print(f"[{name}] tokenizer-only: {toks[-1]}", file=sys.stderr)
    row = {"corpus": name, "paths": list(settings.corpus), "exclude": list(settings.exclude),
           "glob": settings.glob, "source_bytes": corpus_bytes, "out": str(out),
           "builds": builds, "tokenizer_only_passes": toks}
    if any(r.get("timed_out") for r in builds + toks):
        row["build"], row["tokenizer_only"] = builds[-1], toks[-1]
        return row
    built = min(builds, key=lambda r: r["seconds"])  # the least disturbed pass of each kind
    tok = min(toks, key=lambda r: r["seconds"])
    disk = (out / "data.mdb").stat().st_size
    rss_target = 16 * built["largest_shard_tokens"] + GIB
    row.update({
        "build": built, "tokenizer_only": tok,
        "tokens": built["tokens"], "tokens_per_s": built["tokens"] / built["seconds"],
        "build_over_tokenizer": built["seconds"] / tok["seconds"],
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in builds), "rss_target_bytes": rss_target,
        "disk_bytes": disk, "bytes_per_token": disk / built["stored_tokens"],
    })
    return row


def write_results(rows: list[dict], args) -> None:
    """Write build.json/.md; rows of corpora not run this time are kept from the previous file."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    previous = RESULTS / "build.json"
    kept = []
    if previous.is_file():
        ran = {r["corpus"] for r in rows}
        kept = [r for r in json.loads(previous.read_text()).get("corpora", []) if r["corpus"] not in ran]
    order = {"stdlib": 0, "code": 1}
    rows = sorted(kept + rows, key=lambda r: order.get(r["corpus"], 2))
    machine = {"platform": platform.platform(), "python": platform.python_version(),
               "cpus": os.cpu_count(), "note": "shared 2-core CPU VM; other jobs were running"}
    meta = {"machine": machine, "shard_tokens": args.shard_tokens, "workers": args.workers,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "corpora": rows}
    (RESULTS / "build.json").write_text(json.dumps(meta, indent=2) + "\n")
    (RESULTS / "build.md").write_text(markdown(meta))


def markdown(meta: dict) -> str:
    lines = [
        "# datastore-build benchmark", "",
        f"Machine: {meta['machine']['cpus']}-core CPU VM ({meta['machine']['platform']}, Python "
        f"{meta['machine']['python']}), shared with other jobs, so absolute times are noisy; the "
        "ratio compares two passes of the same run. Shard size "
        f"{meta['shard_tokens']:,} tokens, --workers {meta['workers']}. Created {meta['created']}.",
        "",
        "| corpus | tokens | build s | tokens/s | build / tokenizer-only (<= 1.3) | peak RSS "
        "| RSS target (16 B x shard + 1 GiB) | bytes/token on disk (<= 7) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in meta["corpora"]:
        if "tokens" not in r:
            lines.append(f"| {r['corpus']} | timed out: {json.dumps(r['build'])} | | | | | | |")
            continue
        lines.append(
            f"| {r['corpus']} | {r['tokens']:,} | {r['build']['seconds']:.1f} | {r['tokens_per_s']:,.0f} "
            f"| {r['build_over_tokenizer']:.2f} ({r['tokenizer_only']['seconds']:.1f} s) "
            f"| {r['peak_rss_bytes'] / GIB:.2f} GiB | {r['rss_target_bytes'] / GIB:.2f} GiB "
            f"| {r['bytes_per_token']:.2f} |")
    lines += ["", "Stores (reused by other benchmarks): " +
              ", ".join(f"`{r['out']}`" for r in meta["corpora"]), "",
              "tokenizer-only = the build's own readers, batching and threads with the writer left "
              "out (benchmarks/bench_build.py `child_tokenize`); both passes load the tokenizer "
              "inside the timed region. stdlib: fastest of the alternating passes (all passes are "
              "in build.json); code: one pass of each.", ""]
    return "\n".join(lines)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpora", default="stdlib,code", help="comma-separated: stdlib, code")
    p.add_argument("--work", type=Path, default=WORK, help="where the stores go (default benchmarks/work)")
    p.add_argument("--shard-tokens", type=int, default=32_000_000)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--timeout", type=float, default=3600, help="seconds per child pass")
    p.add_argument("--repeats", type=int, default=3,
                   help="build/tokenizer-only pass pairs for stdlib (fastest of each is reported)")
    p.add_argument("--child", choices=("tokenize", "build"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    names = [n for n in args.corpora.split(",") if n]
    if args.child:
        signal.signal(signal.SIGTERM, _interrupt)  # unwind: the build removes its temp dir
        settings = settings_for(names[0], args.work / names[0], args.shard_tokens, args.workers)
        result = (child_tokenize if args.child == "tokenize" else child_build)(settings)
        print(json.dumps(result))
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        rows.append(bench_corpus(name, args))
        write_results(rows, args)  # after each corpus, so a long second one still leaves results
    print(f"results: {RESULTS / 'build.md'}; stores: " + ", ".join(r["out"] for r in rows))
    print((RESULTS / "build.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
