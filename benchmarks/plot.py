"""PNG plots of the decode benchmarks' result JSON (matplotlib, Agg: no display needed).

    python -m benchmarks.plot benchmarks/results/decode.json      # -> decode.png beside it
    python -m benchmarks.plot benchmarks/results/drafters.json
    python -m benchmarks.plot benchmarks/results/ceiling.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _curve_panel(ax, curves: dict) -> None:
    for dtype, curve in curves.items():
        if not curve:
            continue
        c = {int(t): float(s) for t, s in curve.items()}  # JSON keys are strings
        ts = sorted(c)
        ax.plot(ts, [c[t] * 1e3 for t in ts], marker="o", label=dtype)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens in one forward (T)")
    ax.set_ylabel("latency (ms)")
    ax.set_title("cost model: forward latency")
    ax.legend()
    ax.grid(alpha=0.3)


def plot_decode(results: dict, out: Path) -> None:
    dtypes = list(results["dtypes"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    curves = {d: results["dtypes"][d]["latency_curve_seconds"] or {} for d in dtypes}
    _curve_panel(a, curves)
    runs = []  # (label, summary): budget auto per dtype, then any fixed-budget pass
    for d in dtypes:
        r = results["dtypes"][d]
        runs.append((d, r["summary"]))
        if "fixed_budget" in r:
            runs.append((f"{d}\nbudget {r['fixed_budget']['budget']}", r["fixed_budget"]["summary"]))
    x = range(len(runs))
    tps = [m["tokens_per_step"] for _, m in runs]
    spd = [m["speedup"] for _, m in runs]
    b.bar([i - 0.2 for i in x], tps, width=0.4, label="tokens/step")
    b.bar([i + 0.2 for i in x], spd, width=0.4, label="speed-up vs plain greedy")
    b.axhline(1.0, color="grey", lw=0.8)
    b.set_xticks(list(x), [label for label, _ in runs])
    b.set_title("retrieval-only speculative decoding, HumanEval")
    b.legend()
    for i, (t, s) in enumerate(zip(tps, spd)):
        b.text(i - 0.2, t, f"{t:.2f}", ha="center", va="bottom")
        b.text(i + 0.2, s, f"{s:.2f}x", ha="center", va="bottom")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_drafters(results: dict, out: Path) -> None:
    """One panel per workload: speed-up over plain greedy for each method, a bar per dtype."""
    workloads = [w for w, r in results["workloads"].items() if r["dtypes"]]  # measured ones
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4.5), squeeze=False)
    for ax, w in zip(axes[0], workloads):
        per_dtype = results["workloads"][w]["dtypes"]
        dtypes = list(per_dtype)
        methods = list(next(iter(per_dtype.values()))["methods"])
        width = 0.8 / max(len(dtypes), 1)
        for j, d in enumerate(dtypes):
            vals = [per_dtype[d]["methods"][m]["summary"]["speedup"] for m in methods]
            xs = [i + (j - (len(dtypes) - 1) / 2) * width for i in range(len(methods))]
            ax.bar(xs, vals, width=width, label=d)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(range(len(methods)), methods, rotation=40, ha="right")
        ax.set_ylabel("speed-up vs plain greedy")
        ax.set_title(w)
        ax.legend()
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_ceiling(results: dict, out: Path) -> None:
    """Replayed retrieval drafts: tokens/step and modeled speed-up against the fixed budget."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for m, r in results["by_min_count"].items():
        budgets = sorted(int(k) for k in r["fixed"])
        a.plot(budgets[1:], [r["fixed"][str(k)]["tokens_per_step"] for k in budgets[1:]], marker="o",
               label=f"min_count {m}")
        b.plot(budgets[1:], [r["fixed"][str(k)]["modeled_speedup"] for k in budgets[1:]], marker="o",
               label=f"min_count {m}")
    for ax, title in ((a, "tokens/step of B-node retrieval tries"),
                      (b, "modeled speed-up on this CPU's fp32 curve")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tree budget B (nodes)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    a.axhline(1.8, color="grey", lw=0.8, ls="--")
    b.axhline(1.3, color="grey", lw=0.8, ls="--")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m benchmarks.plot RESULTS.json", file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        print(f"plot: {path}: {exc}", file=sys.stderr)
        return 2
    kind = results.get("benchmark")
    if kind == "decode":
        plot_decode(results, path.with_suffix(".png"))
    elif kind == "drafters":
        plot_drafters(results, path.with_suffix(".png"))
    elif kind == "ceiling":
        plot_ceiling(results, path.with_suffix(".png"))
    else:
        print(f"plot: {path}: unknown benchmark {kind!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
