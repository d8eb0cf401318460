"""Issue 5's benchmark: every draft source alone and all together, against plain greedy decoding
and transformers' prompt lookup (`prompt_lookup_num_tokens=10`), side by side in one run.

Workloads (benchmarks/workloads.py): code = HumanEval prompts, datastore of stdlib + site-packages
code (benchmarks/work/code, else stdlib); chat = held-out first-turn ShareGPT prompts in the chat
template, datastore of the other conversations' assistant turns (benchmarks/work/sharegpt, built
here once, ~22M tokens); reference = stdlib functions to document/refactor/explain (code store)
and ShareGPT second turns revising the first answer (ShareGPT store), the text to reuse passed as
`references`. SmolLM2-135M, greedy, 128 new tokens, float32 (`--dtypes float32,bfloat16` adds bf16;
same dtype on both sides of every ratio). Speed-ups are sums of plain-greedy seconds over sums of
the method's seconds, per prompt measured back to back with the methods in rotating order.

Methods: prompt_lookup (HF), each source alone, `all` (the five sources), `default` (the
recommended four: retrieval, reference, ngram, recycle) and the peer `suffix_decoding`:
SuffixDecoding's drafts (ArcticInference's C++ suffix tree, vLLM defaults, its global tree
pre-filled with the same datastore; benchmarks/peers/suffix_decoding.py) as the only drafter of the
same SpeculativeDecoder. The peer needs `make peers`; without it that column is skipped with a note.
`default` and `suffix_decoding` also run at the fixed budget `--fixed-budget` (64): tokens/step
there is the GPU-regime figure. Filling the peer's tree costs ~3 s and ~0.3 GB per million corpus
tokens (stdlib store 3.4M: 6-17 s, +0.9 GB; ShareGPT store 21.5M: 49-470 s, +5.0 GB on 2 shared
cores), once per run; `--peer-corpus-tokens N` caps it.

    python -m benchmarks.bench_drafters [--code 4 --chat 4 --ref-code 2 --ref-chat 2] [--methods ...]

Writes benchmarks/results/drafters.json, drafters.md and drafters.png.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm import tqdm

from benchmarks import decoding as bd
from benchmarks import workloads as wl
from decoder.drafters.registry import DEFAULT as DEFAULT_SOURCES  # the recommended set (README, demo)
from decoder.drafters.registry import NAMES as SOURCES
from decoder.drafters.registry import STORE
from decoder.drafters.retrieval import MIN_COUNT

PEER = "suffix_decoding"  # SuffixDecoding's drafts in our decoder (benchmarks/peers; needs `make peers`)
METHODS = ("prompt_lookup", *SOURCES, "all", "default", PEER)
FIXED_METHODS = ("default", PEER)  # also run at the fixed budget (`--fixed-budget`): the GPU-regime figure
TARGETS = {  # all sources together, bfloat16 (issue 5)
    "code": {"tokens_per_step": 3.0, "speedup": 2.2},
    "chat": {"tokens_per_step": 2.6, "speedup": 1.8},
    "reference": {"tokens_per_step": 4.0, "speedup": 2.8},
    "over_prompt_lookup": 1.3,
}
SHAREGPT_STORE = bd.WORK / "sharegpt"


@dataclass(frozen=True)
class DraftersBenchSettings:
    code: int = 4
    chat: int = 4
    ref_code: int = 2
    ref_chat: int = 2
    max_new_tokens: int = 128
    dtypes: tuple[str, ...] = ("float32",)
    methods: tuple[str, ...] = METHODS
    code_store: str | None = None
    chat_store: str | None = None
    budget: int | str = "auto"
    fixed_budget: int = 64  # 0 = no fixed-budget column
    peer_corpus_tokens: int | None = None  # cap on the datastore tokens SuffixDecoding's global tree holds
    device: str | None = None  # torch device; None = cuda when present, else cpu
    out: Path = bd.RESULTS

    def __post_init__(self) -> None:
        for name in ("code", "chat", "ref_code", "ref_chat"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0")
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ValueError(f"--methods: unknown {unknown}; choose from {','.join(METHODS)}")
        if self.max_new_tokens < 1:
            raise ValueError("--max-new-tokens must be >= 1")
        if self.fixed_budget < 0:
            raise ValueError("--fixed-budget must be >= 0")

    @property
    def variants(self) -> list[str]:
        """What each prompt runs besides plain greedy: the methods, then `method@B` at the fixed budget."""
        fixed = [] if not self.fixed_budget or self.budget == self.fixed_budget else \
            [f"{m}@{self.fixed_budget}" for m in FIXED_METHODS if m in self.methods]
        return [*self.methods, *fixed]


def ensure_sharegpt_store(out: Path = SHAREGPT_STORE, workers: int = 2) -> Path:
    """The chat datastore: the non-held-out conversations' assistant turns (built once)."""
    if (out / "data.mdb").is_file():
        return out
    from builder import BuildSettings, build

    corpus = out.with_name("sharegpt-train.jsonl")
    bd.log(f"writing the ShareGPT datastore part to {corpus}")
    counts = wl.write_sharegpt_corpus(corpus)
    bd.log(f"{counts}; building {out}")
    build(BuildSettings(corpus=(str(corpus),), format="jsonl", out=str(out), workers=workers, progress=True))
    return out


def method_drafters(method: str) -> list[str]:
    method = method.partition("@")[0]
    return {"all": list(SOURCES), "default": list(DEFAULT_SOURCES)}.get(method, [method])


def uses_store(method: str) -> bool:
    return bool(set(STORE) & set(method_drafters(method))) or method.partition("@")[0] == PEER


def peer_status() -> tuple[bool, str]:
    """(built, version or why not): imports benchmarks/peers only when asked."""
    from benchmarks.peers.suffix_decoding import available

    return available()


class PeerCorpora:
    """SuffixDecoding's global tree pre-filled with each store's documents, built on first use and
    shared by every decoder of the run (each decoder setting sees only its own earlier responses)."""

    def __init__(self, stores: dict, max_tokens: int | None):
        self.stores, self.max_tokens = stores, max_tokens
        self.trees: dict = {}
        self.info: dict = {}

    def get(self, store_key: str):
        if store_key not in self.trees:
            import resource

            from benchmarks.peers.suffix_decoding import CorpusTree

            store = self.stores[store_key]
            bd.log(f"{PEER}: filling its global suffix tree with the {store_key} store "
                   f"({store.tokens} tokens{'' if self.max_tokens is None else f', capped at {self.max_tokens}'})")
            rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            tree = CorpusTree(store, self.max_tokens)
            rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            # peak RSS growth, not the tree's estimate_memory(): that walk takes ~a minute on the chat store
            self.info[store_key] = {"documents": tree.seqs, "tokens": tree.tokens, "fill_seconds": tree.seconds,
                                    "peak_rss_growth_bytes": (rss1 - rss0) * 1024}  # ru_maxrss: KiB on Linux
            bd.log(f"{PEER}: {tree.tokens} tokens of {tree.seqs} documents in {tree.seconds:.1f} s, "
                   f"peak RSS +{(rss1 - rss0) / 1024:.0f} MiB")
            self.trees[store_key] = tree
        return self.trees[store_key]


class Decoders:
    """One SpeculativeDecoder per (method, store, budget) over one loaded model, sharing its cost
    model: a source's tables (n-grams, recycled successors, SuffixDecoding's responses) persist
    across that method's prompts only."""

    def __init__(self, model, tok, stores: dict, budget, corpora: PeerCorpora | None = None):
        from decoder.cost import CostModel

        self.model, self.tok, self.stores, self.budget = model, tok, stores, budget
        self.corpora = corpora
        self.curve = None
        self._made: dict = {}
        self._cost = None
        if budget == "auto":
            self.curve = self._make("ngram", None, budget).warmup()
            self._cost = CostModel(self.curve)

    def _make(self, method: str, store_key: str | None, budget):
        from decoder.drafters.registry import make_drafters
        from decoder.speculative import DecoderSettings, SpeculativeDecoder

        if method == PEER:
            from benchmarks.peers.suffix_decoding import SuffixDecodingDrafter

            drafters = [SuffixDecodingDrafter(corpus=self.corpora.get(store_key))]
        else:
            names = method_drafters(method)
            store = self.stores[store_key] if set(STORE) & set(names) else None
            drafters = make_drafters(names, datastore=store, tokenizer=self.tok)
        return SpeculativeDecoder(self.model, self.tok, drafters, DecoderSettings(budget=budget))

    def get(self, variant: str, store_key: str):
        """variant: a method, or `method@B` for that method at the fixed budget B."""
        method, _, fixed = variant.partition("@")
        budget = int(fixed) if fixed else self.budget
        key = (method, store_key if uses_store(method) else None, budget)
        if key not in self._made:
            dec = self._make(method, store_key, budget)
            if budget == "auto":
                dec.cost = self._cost  # measured once per model and dtype
            self._made[key] = dec
        return self._made[key]


def store_for(prompt: wl.Prompt) -> str:
    return "code" if prompt.kind in ("humaneval", "stdlib") else "chat"


def run_prompt(decs: Decoders, prompt: wl.Prompt, ids: list[int], index: int, settings, dtype: str) -> dict:
    n = settings.max_new_tokens
    base_dec = decs.get("ngram", store_for(prompt))
    eos, pad = base_dec.eos.tolist(), base_dec.pad_id
    order = ["greedy", *settings.variants]
    order = order[index % len(order):] + order[: index % len(order)]  # rotate: load drifts
    refs = list(prompt.references) or None
    timed = {}
    for method in order:
        if method in ("greedy", "prompt_lookup"):
            timed[method] = bd.hf_generate(decs.model, ids, n, eos, pad,
                                           prompt_lookup=10 if method == "prompt_lookup" else 0)
        else:
            timed[method] = bd.speculative(decs.get(method, store_for(prompt)), ids, n, references=refs)
    greedy = timed["greedy"]
    out = {"id": prompt.id, "kind": prompt.kind, "prompt_tokens": len(ids), "greedy": bd.timed_dict(greedy),
           "methods": {m: bd.timed_dict(timed[m], greedy.ids) for m in settings.variants}}
    if dtype != "float32":
        gaps = bd.position_gaps(decs.model, ids, greedy.ids)
        for method, t in out["methods"].items():
            if not t["identical"]:
                t["divergence"] = bd.divergence(decs.model, ids, greedy.ids, t["ids"], gaps)
    return out


def summarize_workload(rows: list[dict], methods: Sequence[str]) -> dict:
    out = {}
    greedy_step = sum(r["greedy"]["seconds"] for r in rows) / max(sum(r["greedy"]["steps"] for r in rows), 1)
    for m in methods:
        pairs = [{"spec": r["methods"][m], "greedy": r["greedy"]} for r in rows]
        summary = bd.summarize(pairs)
        # What limits the speed-up (measured): speed-up = tokens/step / (step cost / greedy step cost).
        summary["step_cost_vs_greedy_step"] = (summary["seconds"] / max(summary["steps"], 1)) / max(greedy_step, 1e-9)
        stats = [p["spec"].get("stats") for p in pairs if p["spec"].get("stats")]
        if stats:
            total = sum(s["seconds"] for s in stats) or 1e-9
            summary["time_share"] = {k: sum(s.get(k + "_seconds", 0.0) for s in stats) / total
                                     for k in ("draft", "forward", "bookkeeping", "prefill")}
            budgets = [b for s in stats for b in s["budgets"]]
            summary["mean_tree_budget"] = float(np.mean(budgets)) if budgets else 0.0
            acc: dict = {}
            for s in stats:
                for k, v in s["accepted_by_source"].items():
                    acc[k] = acc.get(k, 0) + v
            summary["accepted_by_source"] = acc
        divs = [p["spec"]["divergence"] for p in pairs if p["spec"].get("divergence")]
        if divs:
            summary["divergences"] = len(divs)
            summary["divergences_both_top2"] = sum(bool(d.get("both_in_top2")) for d in divs)
        out[m] = {"summary": summary}
    return out


def verdicts(results: dict) -> dict:
    out = {}
    for w, res in results["workloads"].items():
        for dtype, r in res["dtypes"].items():
            methods = r["methods"]
            if "all" not in methods:
                continue
            s = methods["all"]["summary"]
            v = {"tokens_per_step": [round(s["tokens_per_step"], 2), TARGETS[w]["tokens_per_step"]],
                 "speedup": [round(s["speedup"], 2), TARGETS[w]["speedup"]]}
            if "prompt_lookup" in methods:
                pl = methods["prompt_lookup"]["summary"]
                v["over_prompt_lookup"] = [round(pl["seconds"] / max(s["seconds"], 1e-9), 2),
                                           TARGETS["over_prompt_lookup"]]
            for val in v.values():
                val.append(val[0] >= val[1])
            v["identical"] = [s["identical"], s["prompts"], s["identical"] == s["prompts"]]
            v["limit"] = (f"{s['tokens_per_step']:.2f} tokens/step, each step costs "
                          f"{s['step_cost_vs_greedy_step']:.2f}x a plain greedy step "
                          f"(time: " + ", ".join(f"{k} {x:.0%}" for k, x in s.get("time_share", {}).items())
                          + f"; mean tree {s.get('mean_tree_budget', 0):.1f} nodes)")
            out[f"{w}/{dtype}"] = v
    return out


PEER_TARGETS = {"tokens_per_second": 1.0, "tokens_per_step_fixed": 1.5}  # ours / SuffixDecoding (issue 10)


def peer_comparison(results: dict) -> list[dict]:
    """Per workload and dtype: ours (the default sources, else all) and SuffixDecoding side by
    side, at budget auto and at the fixed budget, with the ratios ours / peer."""
    out = []
    fixed = results["settings"].get("fixed_budget") or 0
    for w, res in results["workloads"].items():
        for dtype, r in res["dtypes"].items():
            methods = r["methods"]
            ours = "default" if "default" in methods else "all" if "all" in methods else None
            if ours is None or PEER not in methods:
                continue
            row = {"workload": w, "dtype": dtype, "ours_method": ours, "fixed_budget": fixed}
            for side, m in (("ours", ours), ("peer", PEER)):
                x = methods[m]["summary"]
                row[side] = {k: x.get(k) for k in ("tokens_per_step", "tokens_per_second", "speedup", "identical",
                                                    "prompts", "mean_tree_budget")}
                fx = methods.get(f"{m}@{fixed}")
                if fx:
                    row[side]["fixed"] = {k: fx["summary"].get(k) for k in
                                          ("tokens_per_step", "tokens_per_second", "mean_tree_budget", "speedup",
                                           "identical")}
            # The peer at its faster setting: its drafts cut by our cost model (budget auto) or its
            # whole tree verified (the fixed budget exceeds it, as vLLM verifies it).
            peer_fixed = (row["peer"].get("fixed") or {}).get("tokens_per_second") or 0.0
            row["peer_best"] = "fixed" if peer_fixed > row["peer"]["tokens_per_second"] else "auto"
            ratio = lambda a, b: a / b if b else float("nan")  # noqa: E731
            row["ratios"] = {"tokens_per_step": ratio(row["ours"]["tokens_per_step"], row["peer"]["tokens_per_step"]),
                             "tokens_per_second": ratio(row["ours"]["tokens_per_second"],
                                                        max(row["peer"]["tokens_per_second"], peer_fixed))}
            if "fixed" in row["ours"] and "fixed" in row["peer"]:
                row["ratios"]["tokens_per_step_fixed"] = ratio(row["ours"]["fixed"]["tokens_per_step"],
                                                               row["peer"]["fixed"]["tokens_per_step"])
            row["targets"] = {k: [round(row["ratios"][k], 2), t, row["ratios"][k] >= t]
                              for k, t in PEER_TARGETS.items() if k in row["ratios"]}
            out.append(row)
    return out


def peer_markdown(results: dict) -> list[str]:
    peer = results.get("peer") or {}
    if not peer.get("requested"):
        return []
    lines = ["", f"## Ours vs SuffixDecoding (same corpus, same decoder, same verification)", ""]
    if not peer.get("built"):
        return lines + ["Not measured: SuffixDecoding's suffix tree is not built; run `make peers` "
                        "(benchmarks/peers/build_suffix.py) for this column."]
    cfg = peer.get("settings", {})
    corpus = "; ".join(f"{k} store: {v['tokens']} tokens of {v['documents']} documents, filled in "
                       f"{v['fill_seconds']:.1f} s, peak RSS +{v['peak_rss_growth_bytes'] / 2**20:.0f} MiB"
                       for k, v in (peer.get("corpus") or {}).items())
    cap = "" if peer.get("corpus_cap_tokens") is None else f"; capped at {peer['corpus_cap_tokens']} tokens"
    lines += [f"SuffixDecoding {peer.get('version', '?')} (ArcticInference's C++ suffix tree, `make peers`) as the "
              f"only drafter of our SpeculativeDecoder: a suffix tree per prompt (+ references) and one global tree "
              f"of earlier responses pre-filled with the datastore corpus ({corpus or 'none'}"
              f"{cap}); "
              f"vLLM defaults: max_tree_depth {cfg.get('max_tree_depth')}, max_spec_factor {cfg.get('max_spec_factor')}, "
              f"min_token_prob {cfg.get('min_token_prob')}, tree speculation {'on' if cfg.get('use_tree_spec') else 'off'}. "
              f"Ours = {', '.join(results['settings'].get('default_sources', DEFAULT_SOURCES))} (`default`; "
              f"`all` adds lookahead). Nodes/step = draft nodes verified per step. Budget "
              f"{results['settings']['budget']}; the last two columns at the fixed budget "
              f"{results['settings'].get('fixed_budget')} (the GPU regime, where tokens/step counts).", "",
              "| workload | dtype | drafts | tokens/step | nodes/step | tok/s | speed-up vs greedy | identical "
              f"| tokens/step at {results['settings'].get('fixed_budget')} | nodes/step at {results['settings'].get('fixed_budget')} |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for row in peer_comparison(results):
        for side, label in (("ours", f"ours ({row['ours_method']})"), ("peer", "SuffixDecoding")):
            x = row[side]
            fx = x.get("fixed") or {}
            fixed_cells = (f"{fx['tokens_per_step']:.2f} | {fx.get('mean_tree_budget') or 0:.1f}" if fx else "- | -")
            lines.append(f"| {row['workload']} | {row['dtype']} | {label} | {x['tokens_per_step']:.2f} "
                         f"| {x.get('mean_tree_budget') or 0:.1f} | {x['tokens_per_second']:.1f} | {x['speedup']:.2f}x "
                         f"| {x['identical']}/{x['prompts']} | {fixed_cells} |")
        r = row["ratios"]
        fixed_ratio = f"**{r['tokens_per_step_fixed']:.2f}x**" if "tokens_per_step_fixed" in r else "-"
        lines.append(f"| {row['workload']} | {row['dtype']} | ours / SuffixDecoding | {r['tokens_per_step']:.2f}x | - "
                     f"| **{r['tokens_per_second']:.2f}x** | - | - | {fixed_ratio} | - |")
    verdicts = [f"- {row['workload']}/{row['dtype']}: " + "; ".join(
        f"ours/peer {k} {v[0]} vs {v[1]}: {'met' if v[2] else 'NOT met'}" for k, v in row["targets"].items())
        for row in peer_comparison(results)]
    if verdicts:
        lines += ["", "Targets (issue 10): ours (budget auto) at least SuffixDecoding's tok/s on every workload, "
                  "the peer taken at its faster setting (budget auto, or its whole tree verified at the fixed "
                  f"budget); at the fixed budget >= 1.5x its tokens/step.", "", *verdicts]
    return lines


def markdown(results: dict) -> str:
    s = results["settings"]
    m = results["machine"]
    lines = [
        "# Draft sources benchmark: each source alone and all together",
        "",
        f"SmolLM2-135M-Instruct, greedy, {s['max_new_tokens']} new tokens, budget {s['budget']}, "
        f"retrieval min_count {s.get('retrieval_min_count', 1)}. "
        f"Code store: {results['stores']['code']['which']} ({results['stores']['code']['tokens'] or '?'} tokens); "
        f"chat store: {results['stores']['chat']['path']} ({results['stores']['chat']['tokens'] or '?'} tokens). "
        f"Machine: {m['cpus']} CPUs, {m['processor']}, load average {m['load_average_1min']} at start (shared; "
        f"all ratios measured side by side in this run). Run {results['created']}.",
        "",
        "Speed-up = plain greedy seconds / method seconds (sums over the workload's prompts); "
        "identical = outputs equal to plain greedy token for token.",
    ]
    for w, res in results["workloads"].items():
        if not res["dtypes"]:
            continue  # not measured (yet)
        lines += ["", f"## {w} ({res['prompts']} prompts: {', '.join(res['prompt_ids'])})", ""]
        dtypes = list(res["dtypes"])
        lines.append("| method | " + " | ".join(f"{d} tok/step | {d} tok/s | {d} speed-up | {d} identical"
                                                for d in dtypes) + " |")
        lines.append("|---|" + "---|---|---|---|" * len(dtypes))
        greedy = " | ".join(f"1.00 | {res['dtypes'][d]['greedy_tokens_per_second']:.1f} | 1.00x | -" for d in dtypes)
        lines.append(f"| plain greedy | {greedy} |")
        for method in next(iter(res["dtypes"].values()))["methods"]:
            cells = []
            for d in dtypes:
                x = res["dtypes"][d]["methods"][method]["summary"]
                cells.append(f"{x['tokens_per_step']:.2f} | {x['tokens_per_second']:.1f} | {x['speedup']:.2f}x "
                             f"| {x['identical']}/{x['prompts']}")
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
    if results["verdicts"]:  # only when `all` ran
        lines += ["", "## Targets (all sources together; issue 5: bfloat16, float32 reported too)", ""]
    for key, v in results["verdicts"].items():
        parts = [f"{k} {val[0]} vs {val[1]}: {'met' if val[2] else 'NOT met (%.0f%% short)' % (100 * (1 - val[0] / val[1]))}"
                 for k, val in v.items() if k not in ("identical", "limit")]
        parts.append(f"identical {v['identical'][0]}/{v['identical'][1]}")
        lines.append(f"- {key}: " + "; ".join(parts) + f". Measured limit: {v['limit']}.")
    lines += peer_markdown(results)
    divs = []
    for w, res in results["workloads"].items():
        for d, r in res["dtypes"].items():
            for p in r["prompts"]:
                for method, t in p["methods"].items():
                    if t.get("divergence"):
                        divs.append((w, d, p["id"], method, t["divergence"]))
    if divs:
        lines += ["", "## Divergences from plain greedy", "",
                  "| workload | dtype | prompt | method | position | both tokens in top-2 | top-2 gap | gap percentile |",
                  "|---|---|---|---|---|---|---|---|"]
        for w, d, pid, method, x in divs:
            lines.append(f"| {w} | {d} | {pid} | {method} | {x['position']} | {x.get('both_in_top2')} "
                         f"| {x['top2_gap']:.4f} | {x.get('gap_percentile', float('nan')):.1f}% |")
    return "\n".join(lines) + "\n"


def save(results: dict, out: Path) -> None:
    """drafters.json/.md/.png; called after each workload so a cut run keeps its part."""
    from benchmarks.plot import plot_drafters

    results["verdicts"] = verdicts(results)
    results["peer_comparison"] = peer_comparison(results)
    bd.write_json(out / "drafters.json", results)
    (out / "drafters.md").write_text(markdown(results), encoding="utf-8")
    plot_drafters(results, out / "drafters.png")


def run(settings: DraftersBenchSettings) -> dict:
    from builder.tokenizer import load_tokenizer
    from datastore.store import Datastore
    from decoder.models import load_model

    peer = {"method": PEER, "requested": PEER in settings.methods}
    if PEER in settings.methods:
        built, what = peer_status()
        peer.update(built=built, **({"version": what} if built else {"why": what}))
        if not built:
            bd.log(f"{PEER} skipped: its suffix tree is not built; run `make peers` for that column ({what})")
            settings = replace(settings, methods=tuple(m for m in settings.methods if m != PEER))
    code_dir, which = bd.pick_code_store(settings.code_store)
    chat_dir = Path(settings.chat_store) if settings.chat_store else ensure_sharegpt_store()
    bd.log(f"code store {code_dir} ({which}); chat store {chat_dir}")
    stores = {"code": Datastore.open(code_dir), "chat": Datastore.open(chat_dir)}
    tok = load_tokenizer("smollm2")
    records = list(wl.sharegpt_records())
    # workloads' list builders stop at the n-th prompt and read 0 as "all": ask only for n >= 1
    loads = {
        "code": wl.humaneval(settings.code) if settings.code else [],
        "chat": wl.chat(settings.chat, records=records) if settings.chat else [],
        "reference": ((wl.code_references(settings.ref_code) if settings.ref_code else [])
                      + (wl.sharegpt_revisions(settings.ref_chat, tok, records=records) if settings.ref_chat else [])),
    }
    loads = {k: v for k, v in loads.items() if v}
    ids = {k: [wl.encode(p, tok) for p in v] for k, v in loads.items()}
    results = {
        "benchmark": "drafters", "created": bd.now(), "machine": bd.machine(),
        "settings": {"max_new_tokens": settings.max_new_tokens, "dtypes": list(settings.dtypes),
                     "methods": list(settings.methods), "variants": settings.variants, "budget": settings.budget,
                     "fixed_budget": settings.fixed_budget, "default_sources": list(DEFAULT_SOURCES),
                     "model": "smollm2", "prompt_lookup_num_tokens": 10, "retrieval_min_count": MIN_COUNT},
        "peer": peer,
        "stores": {"code": {"path": str(code_dir), "which": which, "tokens": bd.store_tokens(stores["code"])},
                   "chat": {"path": str(chat_dir), "tokens": bd.store_tokens(stores["chat"])}},
        "targets": TARGETS,
        "workloads": {w: {"prompts": len(p), "prompt_ids": [x.id for x in p], "dtypes": {}} for w, p in loads.items()},
    }
    corpora = PeerCorpora(stores, settings.peer_corpus_tokens)
    if PEER in settings.methods:
        from benchmarks.peers.suffix_decoding import SuffixSettings

        peer.update(settings=asdict(SuffixSettings()), corpus_cap_tokens=settings.peer_corpus_tokens,
                    corpus=corpora.info)
    for dtype in settings.dtypes:
        bd.log(f"{dtype}: loading SmolLM2")
        model, mtok = load_model("smollm2", dtype=dtype, device=settings.device)
        decs = Decoders(model, mtok, stores, settings.budget, corpora)
        warm = decs.get("all", "code")
        bd.hf_generate(model, ids["code" if "code" in ids else next(iter(ids))][0], 8, warm.eos.tolist(), warm.pad_id)
        for w, prompts in loads.items():
            rows = [run_prompt(decs, p, ids[w][i], i, settings, dtype)
                    for i, p in enumerate(tqdm(prompts, desc=f"{w} {dtype}", file=sys.stderr))]
            greedy_s = sum(r["greedy"]["seconds"] for r in rows)
            entry = {"methods": summarize_workload(rows, settings.variants), "prompts": rows,
                     "greedy_tokens_per_second": sum(len(r["greedy"]["ids"]) for r in rows) / max(greedy_s, 1e-9),
                     "latency_curve_seconds": decs.curve}
            results["workloads"][w]["dtypes"][dtype] = entry
            best = max(entry["methods"].items(), key=lambda kv: kv[1]["summary"]["speedup"])
            bd.log(f"{w} {dtype}: best {best[0]} {best[1]['summary']['speedup']:.2f}x, "
                   f"{best[1]['summary']['tokens_per_step']:.2f} tokens/step")
            save(results, settings.out)
        del decs, model
    return results


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_drafters", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--code", type=int, default=4, help="HumanEval prompts (default 4)")
    p.add_argument("--chat", type=int, default=4, help="held-out ShareGPT first turns (default 4)")
    p.add_argument("--ref-code", type=int, default=2, help="stdlib functions to rework (default 2)")
    p.add_argument("--ref-chat", type=int, default=2, help="ShareGPT revision turns (default 2)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtypes", default="float32", help="comma list of float32,bfloat16 (default float32)")
    p.add_argument("--methods", default=",".join(METHODS), help=f"subset of {','.join(METHODS)}")
    p.add_argument("--code-store", default=None, help="default benchmarks/work/code, else work/stdlib")
    p.add_argument("--chat-store", default=None, help="default benchmarks/work/sharegpt (built if absent)")
    p.add_argument("--budget", default="auto")
    p.add_argument("--fixed-budget", type=int, default=64,
                   help=f"also run {' and '.join(FIXED_METHODS)} at this fixed budget (default 64; 0 = off)")
    p.add_argument("--peer-corpus-tokens", type=int, default=None,
                   help=f"cap the datastore tokens in {PEER}'s global tree (default: the whole store)")
    p.add_argument("--device", default=None, help="torch device (default: cuda when present, else cpu)")
    p.add_argument("--out", default=str(bd.RESULTS))
    args = p.parse_args(argv)
    try:
        settings = DraftersBenchSettings(
            code=args.code, chat=args.chat, ref_code=args.ref_code, ref_chat=args.ref_chat,
            max_new_tokens=args.max_new_tokens, dtypes=tuple(d for d in args.dtypes.split(",") if d),
            methods=tuple(x for x in args.methods.split(",") if x), code_store=args.code_store,
            chat_store=args.chat_store, budget=args.budget if args.budget == "auto" else int(args.budget),
            fixed_budget=args.fixed_budget, peer_corpus_tokens=args.peer_corpus_tokens, device=args.device,
            out=Path(args.out),
        )
    except ValueError as exc:
        print(f"bench_drafters: error: {exc}", file=sys.stderr)
        return 2
    results = run(settings)
    print(markdown(results))
    bd.log(f"wrote {settings.out}/drafters.json, drafters.md, drafters.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
