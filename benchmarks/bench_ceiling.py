"""How far retrieval drafts can go on issue 4's workload: plain greedy outputs replayed against the
datastore, no model in the loop.

For every position of every float32 plain greedy output in `decode.json` (written by
`bench_decode`, same prompts, same store), the datastore drafts a trie from the context so far; the
step accepts the longest trie path equal to the tokens greedy decoding produced next, plus the
bonus token. That is exactly what a verification step would accept, so the replay gives the tokens
a step of retrieval drafts for each fixed budget B, without spending a forward on it. With the
float32 latency curve of SmolLM2 measured here (one forward of q tokens over a 300-token cache
costs c(q); median of 7, packed linears as in decoding), a fixed budget's speed-up over plain
greedy is at most tokens/step x c(1) / c(1 + B): drafting itself is taken as free.

Two bounds on what a cost model could pick per step:
- best fixed budget: the B maximising that ratio;
- budget per step from hindsight statistics: steps are grouped by what the decoder knows before
  the forward (match length, log2 of the match's count), and each group gets the B that was best
  for it *over this very replay* (fitted in-sample, so optimistic).

    python -m benchmarks.bench_ceiling [--decode benchmarks/results/decode.json]

Writes benchmarks/results/ceiling.json, ceiling.md and ceiling.png.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Sequence

import numpy as np

from benchmarks import decoding as bd
from benchmarks.workloads import encode, humaneval
from decoder.cost import CostModel

BUDGETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128)
MIN_COUNTS = (1, 4, 16, 64)


def accepted(tokens: np.ndarray, parents: np.ndarray, future: Sequence[int]) -> int:
    """Length of the longest trie path (nodes in best-first order) equal to a prefix of `future`."""
    node, k = -1, 0
    while k < len(future):
        hit = np.flatnonzero((parents == node) & (tokens == future[k]))
        if not hit.size:
            return k
        node, k = int(hit[0]), k + 1
    return k


def replay(store, prompt: list[int], output: list[int], min_count: int, max_depth: int = 16) -> list[dict]:
    """One record per output position: match length, its count, accepted tokens per budget."""
    out = []
    for t in range(len(output)):
        context = np.asarray(prompt + output[:t], dtype=np.int64)
        tree = store.draft(context[-16:], budget=max(BUDGETS), max_depth=max_depth, min_count=min_count)
        count = store.count(context[len(context) - tree.match_len:].tolist()) if tree.match_len else 0
        future = output[t:t + max_depth]
        room = len(output) - t - 1  # the bonus token must exist
        acc = [min(accepted(tree.tokens[:b], tree.parents[:b], future), room) for b in BUDGETS]
        out.append({"match_len": tree.match_len, "count": count, "accepted": acc})
    return out


def walk(records: list[dict], pick) -> tuple[int, int, float]:
    """Decode by jumping over accepted tokens: -> (tokens, steps, the budget of every step)."""
    t = steps = 0
    chosen = []
    while t < len(records):
        i = pick(records[t])
        chosen.append(BUDGETS[i])
        t += records[t]["accepted"][i] + 1
        steps += 1
    return len(records), steps, chosen


def group(rec: dict) -> tuple[int, int]:
    return min(rec["match_len"], 8), int(np.log2(1 + rec["count"])) if rec["count"] else -1


def analyse(per_prompt: list[list[dict]], cost) -> dict:
    c1 = cost(1)
    fixed = {}
    for i, b in enumerate(BUDGETS):
        tokens, steps, _ = zip(*(walk(r, lambda rec, i=i: i) for r in per_prompt))
        tps = sum(tokens) / sum(steps)
        fixed[b] = {"tokens_per_step": tps, "modeled_speedup": tps * c1 / cost(1 + b)}
    # per-group budgets fitted on every position (in-sample): maximise (1 + accepted) / cost
    by_group = defaultdict(list)
    for rec in (rec for r in per_prompt for rec in r):
        by_group[group(rec)].append(rec["accepted"])
    best = {g: int(np.argmax([(1 + np.mean([a[i] for a in accs])) / cost(1 + b) for i, b in enumerate(BUDGETS)]))
            for g, accs in by_group.items()}
    tokens = steps = 0
    seconds = 0.0
    for r in per_prompt:
        n, s, chosen = walk(r, lambda rec: best[group(rec)])
        tokens, steps, seconds = tokens + n, steps + s, seconds + sum(cost(1 + b) for b in chosen)
    top = max(fixed, key=lambda b: fixed[b]["modeled_speedup"])
    return {
        "fixed": fixed,
        "best_fixed_budget": top,
        "adaptive_in_sample": {"tokens_per_step": tokens / steps, "modeled_speedup": tokens * c1 / seconds},
        "next_token_top1": float(np.mean([rec["accepted"][1] > 0 for r in per_prompt for rec in r])),
    }


def markdown(res: dict) -> str:
    curve = res["latency_curve_ms"]
    lines = [
        "# Retrieval ceiling: plain greedy outputs replayed against the datastore",
        "",
        f"{res['prompts']} HumanEval prompts, float32 plain greedy outputs from "
        f"`{res['decode_json']}` (run {res['decode_created']}); datastore {res['datastore']}. "
        "Tokens/step is what verification would accept from a trie of B nodes (exact, no model "
        "call); the speed-up is modeled: tokens/step x c(1) / c(1 + B), drafting taken as free. "
        f"Latency curve measured in this run (ms, median of 7): "
        f"{', '.join(f'q={q}: {v:.0f}' for q, v in curve.items())}. Machine: {res['machine']['cpus']} CPUs, "
        f"{res['machine']['processor']}, load average {res['machine']['load_average_1min']} at start. "
        f"Run {res['created']}.",
        "",
        "| budget B | " + " | ".join(f"min_count {m}" for m in res["min_counts"]) + " |",
        "|---|" + "---|" * len(res["min_counts"]),
    ]
    for b in BUDGETS:
        cells = [res["by_min_count"][str(m)]["fixed"][str(b)] for m in res["min_counts"]]
        lines.append(f"| {b} | " + " | ".join(
            f"{c['tokens_per_step']:.2f} tok/step, {c['modeled_speedup']:.2f}x" for c in cells) + " |")
    lines += ["", "| min_count | best fixed budget | its modeled speed-up | per-step budget fitted in-sample "
              "| next token = trie's first child |", "|---|---|---|---|---|"]
    for m in res["min_counts"]:
        a = res["by_min_count"][str(m)]
        bf = a["best_fixed_budget"]
        ad = a["adaptive_in_sample"]
        lines.append(f"| {m} | {bf} | {a['fixed'][str(bf)]['modeled_speedup']:.2f}x "
                     f"| {ad['tokens_per_step']:.2f} tok/step, {ad['modeled_speedup']:.2f}x "
                     f"| {a['next_token_top1']:.1%} |")
    lines += ["", res["conclusion"]]
    return "\n".join(lines) + "\n"


def measure_curve(repeats: int = 7) -> dict[int, float]:
    """{q: seconds} of one float32 SmolLM2 forward of q new tokens, as the decoder's cost model
    measures it at warm-up (more repeats: this curve is the bound's denominator)."""
    from decoder.cost import measure_latency
    from decoder.models import load_model

    model, _ = load_model("smollm2", dtype="float32")
    bd.log("measuring the float32 latency curve")
    return measure_latency(model, repeats=repeats)


def run(decode_json: Path, out: Path) -> dict:
    from builder.tokenizer import load_tokenizer
    from datastore.store import Datastore

    if not decode_json.is_file():
        raise SystemExit(f"bench_ceiling: {decode_json} not found: "
                         "run python -m benchmarks.bench_decode first")
    decode = json.loads(decode_json.read_text(encoding="utf-8"))
    f32 = decode["dtypes"].get("float32")
    if not f32:
        raise SystemExit(f"bench_ceiling: {decode_json} has no float32 run")
    machine, created = bd.machine(), bd.now()  # before the curve: the load it was measured under
    curve = measure_curve()
    model = CostModel(curve)

    def cost(q: float) -> float:
        return float(model.latency(q))

    store = Datastore.open(decode["datastore"]["path"], verify=False)
    tok = load_tokenizer("smollm2")
    prompts = {p.id: encode(p, tok) for p in humaneval(len(f32["prompts"]))}
    res = {"benchmark": "ceiling", "created": created, "machine": machine, "decode_json": str(decode_json),
           "decode_created": decode["created"], "datastore": decode["datastore"]["which"],
           "prompts": len(f32["prompts"]), "latency_curve_ms": {q: curve[q] * 1e3 for q in sorted(curve)},
           "min_counts": list(MIN_COUNTS), "budgets": list(BUDGETS), "by_min_count": {}}
    for m in MIN_COUNTS:
        per_prompt = [replay(store, prompts[p["id"]], p["greedy"]["ids"], m) for p in f32["prompts"]]
        a = analyse(per_prompt, cost)
        res["by_min_count"][str(m)] = json.loads(json.dumps(a, default=bd._json_default))  # str keys
        bd.log(f"min_count {m}: best fixed budget {a['best_fixed_budget']} "
               f"{a['fixed'][a['best_fixed_budget']]['modeled_speedup']:.2f}x, "
               f"in-sample per-step {a['adaptive_in_sample']['modeled_speedup']:.2f}x")
    top = max(res["by_min_count"].values(), key=lambda a: a["adaptive_in_sample"]["modeled_speedup"])
    res["ceiling_modeled_speedup"] = top["adaptive_in_sample"]["modeled_speedup"]
    res["conclusion"] = (
        f"Highest modeled speed-up of retrieval drafts on this machine's float32 curve: "
        f"{res['ceiling_modeled_speedup']:.2f}x (in-sample per-step budgets, free drafting); "
        f"issue 4's float32 target is 1.3x.")
    bd.write_json(out / "ceiling.json", res)
    (out / "ceiling.md").write_text(markdown(res), encoding="utf-8")
    from benchmarks.plot import plot_ceiling

    plot_ceiling(res, out / "ceiling.png")
    return res


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_ceiling", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--decode", default=str(bd.RESULTS / "decode.json"),
                   help="bench_decode's results (greedy outputs, latency curve, datastore path)")
    p.add_argument("--out", default=str(bd.RESULTS), help="results folder (default benchmarks/results)")
    args = p.parse_args(argv)
    res = run(Path(args.decode), Path(args.out))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
