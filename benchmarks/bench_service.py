"""The gRPC draft service over loopback: latency, batching, worker scaling, a bounded load run,
and how fast an Insert becomes visible through another worker.

Contexts: HumanEval prompts + canonical solutions cut at random points (as bench_draft.py), the
last 16 tokens sent (only max_suffix tokens matter). Servers are `datastore-serve`
subprocesses; clients are separate processes (spawned) for the throughput and load runs.
Every figure comes with a same-run baseline: in-process `Datastore.draft` for the gRPC
latency, 32 single calls for DraftBatch, --workers 1 for --workers 2.

    python benchmarks/bench_service.py --datastore benchmarks/work/code
Writes benchmarks/results/service.json and service.md.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

DEFAULT_STORES = ("benchmarks/work/code", "benchmarks/work/stdlib")
TARGETS = {"p50_ms": 2.0, "p99_ms": 10.0, "workers_ratio": 1.6}


@dataclass(frozen=True)
class BenchSettings:
    datastore: str
    contexts: int = 1000
    budget: int = 64
    max_suffix: int = 16
    batch: int = 32
    batch_rounds: int = 30
    scale_clients: int = 8
    scale_seconds: float = 10.0
    load_clients: int = 16
    load_seconds: float = 30.0
    load_timeout_s: float = 2.0
    visibility_trials: int = 20
    seed: int = 0
    out: str = "benchmarks/results/service"

    def __post_init__(self) -> None:
        if min(self.contexts, self.budget, self.batch, self.batch_rounds, self.scale_clients,
               self.load_clients) < 1:
            raise ValueError("counts must be >= 1")
        if min(self.scale_seconds, self.load_seconds, self.load_timeout_s) <= 0:
            raise ValueError("durations must be > 0")


# ------------------------------------------------------------------------------ helpers


class Server:
    def __init__(self, store: str, *args: str) -> None:
        cmd = [sys.executable, "-m", "datastore.serve_cli", store, "--log-level", "WARNING", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        ready, _, _ = select.select([self.proc.stdout], [], [], 600)
        line = self.proc.stdout.readline().strip() if ready else ""
        if not line.startswith("serving on "):
            self.stop()
            raise RuntimeError(f"datastore-serve did not start: {line!r}")
        self.address = line.split()[-1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process so far: immune to waiting for a core."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cpu(srv: "Server") -> float:
    """CPU seconds of the server and every worker it forked."""
    kids = subprocess.run(["pgrep", "-P", str(srv.proc.pid)], capture_output=True, text=True)
    total = proc_cpu(srv.proc.pid)
    for pid in kids.stdout.split():
        try:
            total += proc_cpu(int(pid))
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def stub_for(address: str):
    import grpc

    from protos.channel import client_options
    from protos.draftstore.v1 import draftstore_pb2_grpc as pb_grpc

    ch = grpc.insecure_channel(address, options=client_options() + [
        ("grpc.use_local_subchannel_pool", 1)])  # own connection (= own worker via reuseport)
    return ch, pb_grpc.DraftServiceStub(ch)


def pcts(seconds: list[float] | np.ndarray) -> dict:
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    if ms.size == 0:
        return {"calls": 0}
    return {"calls": int(ms.size), "p50_ms": float(np.percentile(ms, 50)),
            "p90_ms": float(np.percentile(ms, 90)), "p99_ms": float(np.percentile(ms, 99)),
            "p999_ms": float(np.percentile(ms, 99.9)), "max_ms": float(ms.max()),
            "mean_ms": float(ms.mean())}


def requests_for(contexts, s: BenchSettings):
    from protos import convert

    return [convert.draft_request(c[-s.max_suffix:], budget=s.budget) for c in contexts]


# ------------------------------------------------------------------------------ client processes


def client_loop(address: str, contexts: list[list[int]], budget: int, seconds: float,
                timeout: float, start_at: float, out) -> None:
    """One client process: Draft calls back to back from start_at for `seconds`."""
    import grpc

    from protos import convert
    from protos.draftstore.v1 import draftstore_pb2 as pb

    ch, stub = stub_for(address)
    reqs = [convert.draft_request(c, budget=budget) for c in contexts]
    stub.Info(pb.InfoRequest(), timeout=30)  # connected before the clock starts
    lat, failures, i = [], {}, 0
    time.sleep(max(0.0, start_at - time.time()))
    end = time.time() + seconds
    while time.time() < end:
        t0 = time.perf_counter()
        try:
            stub.Draft(reqs[i % len(reqs)], timeout=timeout)
            lat.append(time.perf_counter() - t0)
        except grpc.RpcError as exc:
            failures[exc.code().name] = failures.get(exc.code().name, 0) + 1
        i += 1
    ch.close()
    out.put((lat, failures))


def run_clients(srv: Server, contexts, n: int, seconds: float, timeout: float,
                s: BenchSettings) -> dict:
    """n client processes for `seconds`; also the cores the server used meanwhile."""
    address = srv.address
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    tails = [c[-s.max_suffix:] for c in contexts]
    start_at = time.time() + 8.0  # spawned clients import grpc/numpy first
    procs = [ctx.Process(target=client_loop, args=(address, tails[k::n], s.budget, seconds,
                                                   timeout, start_at, queue)) for k in range(n)]
    for p in procs:
        p.start()
    time.sleep(max(0.0, start_at - time.time()))
    cpu0 = server_cpu(srv)
    time.sleep(seconds)
    cores = (server_cpu(srv) - cpu0) / seconds
    results = [queue.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    lat = [x for r, _ in results for x in r]
    failures: dict[str, int] = {}
    for _, f in results:
        for k, v in f.items():
            failures[k] = failures.get(k, 0) + v
    return {"clients": n, "seconds": seconds, "throughput_per_s": len(lat) / seconds,
            "server_cores_used": cores,
            "failed_calls": sum(failures.values()), "failures_by_code": failures,
            "latency": pcts(lat)}


# ------------------------------------------------------------------------------ parts


def latency(srv: Server, store, contexts, s: BenchSettings) -> dict:
    ch, stub = stub_for(srv.address)
    reqs = requests_for(contexts, s)
    for r in reqs:  # warm: both sides touch the same pages before anything is timed
        stub.Draft(r, timeout=10)
        store.draft(list(r.context), budget=s.budget)
    grpc_lat = []
    cpu0 = proc_cpu(srv.proc.pid)
    for r in reqs:
        t0 = time.perf_counter()
        stub.Draft(r, timeout=10)
        grpc_lat.append(time.perf_counter() - t0)
    server_cpu = (proc_cpu(srv.proc.pid) - cpu0) / len(reqs)
    local, cpu0 = [], time.thread_time()
    for c in contexts:
        t0 = time.perf_counter()
        store.draft(c[-s.max_suffix:], budget=s.budget)
        local.append(time.perf_counter() - t0)
    local_cpu = (time.thread_time() - cpu0) / len(contexts)
    ch.close()
    g, base = pcts(grpc_lat), pcts(local)
    return {"grpc": g, "in_process": base,
            "server_cpu_ms_per_call": server_cpu * 1e3,
            "in_process_cpu_ms_per_call": local_cpu * 1e3,
            "overhead_p50_ms": g["p50_ms"] - base["p50_ms"],
            "ratio_p50": g["p50_ms"] / base["p50_ms"]}


def batching(srv: Server, contexts, s: BenchSettings) -> dict:
    """Wall time of one DraftBatch vs the same drafts as single calls, and the server's CPU
    time for each (on a loaded machine a long burst waits for a core more than short ones)."""
    from protos.draftstore.v1 import draftstore_pb2 as pb

    ch, stub = stub_for(srv.address)
    reqs = requests_for(contexts, s)
    batch_t, single_t, batch_cpu, single_cpu = [], [], 0.0, 0.0
    for k in range(s.batch_rounds):
        group = reqs[(k * s.batch) % len(reqs):][: s.batch]
        c0, t0 = proc_cpu(srv.proc.pid), time.perf_counter()
        stub.DraftBatch(pb.DraftBatchRequest(requests=group), timeout=30)
        batch_t.append(time.perf_counter() - t0)
        c1, t0 = proc_cpu(srv.proc.pid), time.perf_counter()
        for r in group:
            stub.Draft(r, timeout=10)
        single_t.append(time.perf_counter() - t0)
        batch_cpu += c1 - c0
        single_cpu += proc_cpu(srv.proc.pid) - c1
    ch.close()
    b, one = pcts(batch_t), pcts(single_t)
    return {"batch_size": s.batch, "rounds": s.batch_rounds, "draft_batch": b,
            "singles": one, "speedup_mean": one["mean_ms"] / b["mean_ms"],
            "speedup_p50": one["p50_ms"] / b["p50_ms"],
            "server_cpu_ms_batch": batch_cpu / s.batch_rounds * 1e3,
            "server_cpu_ms_singles": single_cpu / s.batch_rounds * 1e3,
            "server_cpu_ratio": single_cpu / max(batch_cpu, 1e-9)}


def visibility(address: str, s: BenchSettings) -> dict:
    """Insert through one worker, poll a live draft through another until it shows."""
    from protos import convert
    from protos.draftstore.v1 import draftstore_pb2 as pb

    stubs, chans = {}, []
    for _ in range(40):
        ch, stub = stub_for(address)
        chans.append(ch)
        _, call = stub.Info.with_call(pb.InfoRequest(), timeout=10)
        stubs.setdefault(dict(call.trailing_metadata())["draftstore-pid"], stub)
        if len(stubs) == 2:
            break
    if len(stubs) < 2:
        return {"error": "could not reach two workers"}
    a, b = list(stubs.values())
    rng = np.random.default_rng(s.seed)
    delays = []
    for i in range(s.visibility_trials):
        seq = rng.integers(0, 1000, 12).tolist()
        w, r = (a, b) if i % 2 == 0 else (b, a)
        w.Insert(pb.InsertRequest(sequences=[pb.TokenSequence(tokens=seq)]), timeout=10)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 5:
            tree = r.Draft(convert.draft_request(seq[:8], tier="live"), timeout=5).tree
            if seq[8] in list(tree.tokens):
                break
            time.sleep(0.002)
        delays.append(time.perf_counter() - t0)
        time.sleep(0.03)  # decorrelate from the refresh period
    for ch in chans:
        ch.close()
    return {"trials": len(delays), "delay": pcts(delays), "target_ms": 200}


# ------------------------------------------------------------------------------ run


def run(s: BenchSettings) -> dict:
    import tempfile

    from bench_draft import humaneval_contexts
    from builder.tokenizer import load_tokenizer
    from datastore.store import Datastore

    store = Datastore.open(s.datastore)
    tokenizer = load_tokenizer(store.tokenizer["name"])
    contexts = [c.tolist() for c in humaneval_contexts(tokenizer, s.contexts, s.seed)]
    report = {"settings": asdict(s), "targets": TARGETS,
              "datastore": {"path": s.datastore, "tokens": store.tokens,
                            "shards": len(store.shards)},
              "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                          "loadavg_start": os.getloadavg()}}
    live_dir = tempfile.mkdtemp(prefix="bench-live-")
    common = ["--live-dir", live_dir]
    srv = Server(s.datastore, "--workers", "1", *common)
    try:
        report["latency"] = latency(srv, store, contexts, s)
        report["batching"] = batching(srv, contexts, s)
        report["throughput_workers_1"] = run_clients(srv, contexts, s.scale_clients,
                                                     s.scale_seconds, 10.0, s)
    finally:
        srv.stop()
    store.close()
    srv = Server(s.datastore, "--workers", "2", *common)
    try:
        report["throughput_workers_2"] = run_clients(srv, contexts, s.scale_clients,
                                                     s.scale_seconds, 10.0, s)
        report["visibility"] = visibility(srv.address, s)
        report["load"] = run_clients(srv, contexts, s.load_clients, s.load_seconds,
                                     s.load_timeout_s, s)
    finally:
        srv.stop()
    shutil.rmtree(live_dir, ignore_errors=True)
    w1, w2 = report["throughput_workers_1"], report["throughput_workers_2"]
    report["workers_ratio"] = w2["throughput_per_s"] / w1["throughput_per_s"]
    report["machine"]["loadavg_end"] = os.getloadavg()
    return report


def markdown(r: dict) -> str:
    s, lat, bat = r["settings"], r["latency"], r["batching"]
    w1, w2, load, vis = (r["throughput_workers_1"], r["throughput_workers_2"], r["load"],
                         r["visibility"])
    g, base = lat["grpc"], lat["in_process"]
    row = lambda name, d: (f"| {name} | {d['p50_ms']:.3f} | {d['p90_ms']:.3f} | "  # noqa: E731
                           f"{d['p99_ms']:.3f} | {d['max_ms']:.3f} | {d['mean_ms']:.3f} |")
    lines = [
        "# Draft service over gRPC (loopback)",
        "",
        f"Datastore `{r['datastore']['path']}`: {r['datastore']['tokens']:,} tokens, "
        f"{r['datastore']['shards']} shards. {s['contexts']} HumanEval contexts (last "
        f"{s['max_suffix']} tokens sent), budget {s['budget']}. Machine: {r['machine']['cpus']} "
        f"CPUs, shared (load average {r['machine']['loadavg_start'][0]:.1f} at start, "
        f"{r['machine']['loadavg_end'][0]:.1f} at end).",
        "",
        "## Draft latency, one client, --workers 1",
        "",
        "| | p50 ms | p90 ms | p99 ms | max ms | mean ms |",
        "|---|---|---|---|---|---|",
        row("gRPC Draft", g), row("in-process Datastore.draft (baseline)", base),
        "",
        f"gRPC adds {lat['overhead_p50_ms']:.3f} ms at p50 ({lat['ratio_p50']:.2f}x the "
        f"in-process call). Server CPU per call {lat['server_cpu_ms_per_call']:.3f} ms vs "
        f"{lat['in_process_cpu_ms_per_call']:.3f} ms in process. Targets p50 <= {TARGETS['p50_ms']} ms, p99 <= {TARGETS['p99_ms']} ms: "
        f"{'met' if g['p50_ms'] <= TARGETS['p50_ms'] and g['p99_ms'] <= TARGETS['p99_ms'] else 'NOT met'}.",
        "",
        f"## DraftBatch of {bat['batch_size']} vs {bat['batch_size']} single calls "
        f"({bat['rounds']} rounds)",
        "",
        "| | p50 ms | p90 ms | p99 ms | max ms | mean ms |",
        "|---|---|---|---|---|---|",
        row("one DraftBatch", bat["draft_batch"]), row(f"{bat['batch_size']} Draft calls", bat["singles"]),
        "",
        f"DraftBatch is {bat['speedup_mean']:.2f}x faster (mean), {bat['speedup_p50']:.2f}x (p50) "
        f"in wall time; server CPU per 32 drafts: {bat['server_cpu_ms_batch']:.1f} ms batched vs "
        f"{bat['server_cpu_ms_singles']:.1f} ms as single calls ({bat['server_cpu_ratio']:.2f}x).",
        "",
        f"## Throughput, {w1['clients']} client processes, {w1['seconds']:.0f} s each",
        "",
        "| server | calls/s | p50 ms | p99 ms | failed | server cores used |",
        "|---|---|---|---|---|---|",
        f"| --workers 1 | {w1['throughput_per_s']:.0f} | {w1['latency']['p50_ms']:.2f} | "
        f"{w1['latency']['p99_ms']:.2f} | {w1['failed_calls']} | {w1['server_cores_used']:.2f} |",
        f"| --workers 2 | {w2['throughput_per_s']:.0f} | {w2['latency']['p50_ms']:.2f} | "
        f"{w2['latency']['p99_ms']:.2f} | {w2['failed_calls']} | {w2['server_cores_used']:.2f} |",
        "",
        f"Ratio workers 2 / workers 1: {r['workers_ratio']:.2f} (target >= "
        f"{TARGETS['workers_ratio']}).",
        "",
        f"## Load run: {load['clients']} client processes, {load['seconds']:.0f} s, --workers 2, "
        f"deadline {s['load_timeout_s']} s",
        "",
        f"{load['latency']['calls']:,} calls ({load['throughput_per_s']:.0f}/s), "
        f"**{load['failed_calls']} failed** {load['failures_by_code'] or ''}.",
        "",
        "| p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | mean ms |",
        "|---|---|---|---|---|---|",
        f"| {load['latency']['p50_ms']:.2f} | {load['latency']['p90_ms']:.2f} | "
        f"{load['latency']['p99_ms']:.2f} | {load['latency']['p999_ms']:.2f} | "
        f"{load['latency']['max_ms']:.2f} | {load['latency']['mean_ms']:.2f} |",
        "",
        "## Live tier: Insert through one worker, visible through the other",
        "",
    ]
    if "delay" in vis:
        d = vis["delay"]
        lines.append(f"{vis['trials']} trials: p50 {d['p50_ms']:.0f} ms, p90 {d['p90_ms']:.0f} ms, "
                     f"max {d['max_ms']:.0f} ms (target <= {vis['target_ms']} ms; includes the "
                     "polling Draft calls).")
    else:
        lines.append(vis.get("error", "not measured"))
    m = r["machine"]
    scaling = (
        f"* Worker scaling: {w1['clients']} client processes and 1-2 server processes share "
        f"{m['cpus']} cores: the server used {w1['server_cores_used']:.2f} cores with one worker and "
        f"{w2['server_cores_used']:.2f} with two."
    )
    if r["workers_ratio"] < 1.6:
        scaling += " A second worker can only add the CPU share the scheduler leaves it beside the clients."
    lines += [
        "",
        "## Reading these figures",
        "",
        f"* Load average {m['loadavg_start'][0]:.1f} at the start and {m['loadavg_end'][0]:.1f} at the "
        "end (the end figure includes this benchmark's own client processes). Wall times include "
        "waiting for a core; the CPU-time figures are the code's own cost.",
        f"* DraftBatch saves the per-call gRPC overhead: the server spends "
        f"{bat['server_cpu_ratio']:.2f}x less CPU on 32 drafts batched (wall time "
        f"{bat['speedup_mean']:.2f}x).",
        scaling,
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datastore", default=None,
                   help=f"datastore directory (default: the first of {', '.join(DEFAULT_STORES)})")
    p.add_argument("--contexts", type=int, default=1000)
    p.add_argument("--scale-seconds", type=float, default=10.0)
    p.add_argument("--load-seconds", type=float, default=30.0)
    p.add_argument("--load-clients", type=int, default=16)
    p.add_argument("--out", default="benchmarks/results/service", help="writes OUT.json/.md")
    args = p.parse_args(argv)
    store = args.datastore or next((d for d in DEFAULT_STORES if (ROOT / d).is_dir()), None)
    if store is None:
        print(f"bench_service: error: no datastore; pass --datastore (looked for "
              f"{DEFAULT_STORES})", file=sys.stderr)
        return 2
    try:
        s = BenchSettings(datastore=store, contexts=args.contexts, scale_seconds=args.scale_seconds,
                          load_seconds=args.load_seconds, load_clients=args.load_clients,
                          out=args.out)
        report = run(s)
    except (ValueError, RuntimeError) as exc:
        print(f"bench_service: error: {exc}", file=sys.stderr)
        return 2
    out = Path(s.out) if Path(s.out).is_absolute() else ROOT / s.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
