"""Issue 10's host-overhead benchmark: the speculative decoder's HOST time per step in the GPU
regime, measured with a nearly free stub model, against a whole step of HF `generate` on that stub.

The stub is a 1-layer LlamaForCausalLM (hidden 64, 4 heads, 2 kv heads, intermediate 128) with
SmolLM2's 49,152-token vocabulary and random fp32 weights, made from its config (nothing is
downloaded). Its outputs are noise; only the time around its forward matters. Its output layer is
untied: with tied embeddings a random 1-layer model repeats its last token forever, the n-gram
drafter then accepts 10+ tokens a step and a 32-token decode leaves 3 steps to time. (Noise is rare
in code, so retrieval drafts are small: a budget of 64 kept 12-29 nodes a step; `nodes/step` says
how full the trees were.) Prompts: the first B
HumanEval prompts, one batch of B rows (the decoder gets them ragged; `generate` left-padded with an
attention mask). Datastore: the stdlib store (benchmarks.decoding.pick_code_store; built once if
absent). Every decode runs a fixed number of new tokens (no eos), after a short warm-up decode on
other HumanEval prompts.

What is device work and what is host work:
- forward: the stub's `forward` is wrapped with a device sync on both sides and timed;
- logits ops: the full-vocabulary reductions over the logits (argmax, top-k, max, softmax,
  log_softmax, sort, argsort on a tensor whose last dimension is the vocabulary, outside the
  forward). On a GPU they are kernels of microseconds; on a CPU they are memory-bound and large.
  They are timed in the same decode by wrapping those torch functions and Tensor methods for its
  duration (device sync on both sides): no profiler, whose per-op overhead would inflate the host
  time, and no second decode, whose timing under load differs (a first version subtracted a
  profiled twin decode's figure and got a negative host time on this shared machine);
- host = decode wall time - forward - logits ops; host ms/step = host / decoder steps.
- run as a script it re-executes itself once with glibc's malloc keeping freed memory
  (MALLOC_ENV), as a GPU's caching allocator does: otherwise freeing and page-faulting the
  stub's huge logits tensors every step is charged to the host.

When the decoder carries a `timer` (decoder.timing.PhaseTimer), it is reset before the timed decode
and its per-phase ms/step are reported (the decoder's own `reduce` phase beside the wrapped
reductions' figure). An older decoder without one reports the total only.

Baseline, in the same run: `model.generate(do_sample=False, min_new_tokens = max_new_tokens)` on the
same stub and batch; HF ms/step = its wall time / new tokens (its whole step, forward included).
Ratio = our host ms/step / HF ms/step. Targets (issue 10): batch 1 <= 0.5x, batch 32 <= 1.0x.

    python -m benchmarks.bench_overhead            # full: ~7 min on 2 shared cores (run_seconds)
    python -m benchmarks.bench_overhead --batches 1,8 --sources all --budgets 64 --new-tokens 16
    # an older commit's decoder, same machine (its tree on PYTHONPATH, results written here):
    cd /tmp/before && PYTHONPATH=/tmp/before python -m benchmarks.bench_overhead --label before \\
        --datastore /work/main/data/stdlib-smollm2 --out /work/main/benchmarks/results

Writes OUT/overhead[_LABEL].json, .md and .png.
"""
from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from benchmarks import decoding as bd
try:
    from decoder.drafters.registry import DEFAULT as DEFAULT_SOURCES
except ImportError:  # a decoder from before registry.DEFAULT (run with --label before): its four sources
    DEFAULT_SOURCES = ("retrieval", "reference", "ngram", "recycle")

SOURCE_SETS = {
    "none": (),
    "retrieval": ("retrieval",),
    "all": DEFAULT_SOURCES,
}
TARGETS = {1: 0.5, 32: 1.0}  # batch -> host ms/step over HF generate's whole ms/step, at most
REDUCTIONS = ("argmax", "topk", "max", "softmax", "log_softmax", "sort", "argsort")  # + _decoder_reductions()
STUB = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096)
HOST_PHASES_ORDER = ("propose", "merge", "budget", "inputs", "accept", "compact", "observe")


@dataclass(frozen=True)
class OverheadSettings:
    batches: tuple[int, ...] = (1, 8, 32)
    sources: tuple[str, ...] = ("none", "retrieval", "all")
    budgets: tuple[int, ...] = (16, 64)
    new_tokens: int = 32
    warmup_tokens: int = 16
    hf_repeats: int = 3  # HF generate timed this many times, the fastest kept (conservative for us)
    repeats: int = 3  # each configuration decoded this many times (a fresh decoder each), the median kept
    threads: int = 1  # torch intra-op threads; 0 = torch's default
    datastore: str | None = None  # default: benchmarks.decoding.pick_code_store()
    label: str = ""  # "" -> overhead.json; "before" -> overhead_before.json
    device: str = "auto"  # auto | cpu | cuda[:i]
    seed: int = 0
    out: Path = bd.RESULTS
    plot: bool = True

    def __post_init__(self) -> None:
        for name in ("batches", "budgets"):
            values = getattr(self, name)
            if not values or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in values):
                raise ValueError(f"--{name} must be integers >= 1, got {values!r}")
        if max(self.batches) > 82:  # warm-up and timed prompts must not overlap (164 HumanEval problems)
            raise ValueError(f"--batches: at most 82 rows (HumanEval has 164 prompts), got {max(self.batches)}")
        if not self.sources or any(s not in SOURCE_SETS for s in self.sources):
            raise ValueError(f"--sources must be a subset of {','.join(SOURCE_SETS)}, got {self.sources!r}")
        if self.new_tokens < 2:
            raise ValueError("--new-tokens must be >= 2")
        if self.warmup_tokens < 1:
            raise ValueError("--warmup-tokens must be >= 1")
        if self.hf_repeats < 1:
            raise ValueError("--hf-repeats must be >= 1")
        if self.repeats < 1:
            raise ValueError("--repeats must be >= 1")
        if self.threads < 0:
            raise ValueError("--threads must be >= 0 (0: torch's default)")
        if self.label and not self.label.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"--label must be letters, digits, - or _, got {self.label!r}")
        if not (self.device == "auto" or self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"--device must be auto, cpu or cuda[:i], got {self.device!r}")
        object.__setattr__(self, "out", Path(self.out))

    @property
    def stem(self) -> str:
        return "overhead" + (f"_{self.label}" if self.label else "")

    def resolved_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)


# ---------------------------------------------------------------- the stub and its clock


def stub_model(vocab: int, pad_id: int, device: torch.device, seed: int = 0):
    """1-layer random Llama with the real vocabulary, fp32, from its config only."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, pad_token_id=pad_id, bos_token_id=None, eos_token_id=None,
                      tie_word_embeddings=False, **STUB)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa")
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = pad_id
    return model.eval().float().to(device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class ForwardClock:
    """Wraps model.forward (an instance attribute shadowing the method: the decoder and `generate`
    both call the module, which calls self.forward) with a device sync on both sides, and sums its
    seconds. functools.wraps keeps the signature that `generate` inspects (logits_to_keep)."""

    def __init__(self, model):
        self.model = model
        self.device = model.device
        self.seconds = 0.0
        self.calls = 0
        self.in_forward = False  # read by LogitsClock: reductions inside the forward are the model's
        original = model.forward

        @functools.wraps(original)
        def forward(*args, **kwargs):
            sync(self.device)
            t0 = time.perf_counter()
            self.in_forward = True
            try:
                out = original(*args, **kwargs)
            finally:
                self.in_forward = False
            sync(self.device)
            self.seconds += time.perf_counter() - t0
            self.calls += 1
            return out

        model.forward = forward

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0

    def close(self) -> None:
        self.model.__dict__.pop("forward", None)


class LogitsClock:
    """Times the full-vocabulary reductions while installed: wraps torch.X and Tensor.X for X in
    REDUCTIONS and the decoder's own passes (_decoder_reductions); a call on a tensor whose last
    dimension is `vocab`, outside the wrapped forward, is timed between two device syncs and
    summed per op. close() restores the originals."""

    def __init__(self, vocab: int, forward_clock: ForwardClock):
        self.vocab, self.fwd, self.device = vocab, forward_clock, forward_clock.device
        self.seconds: dict[str, float] = {}
        self.calls = 0
        self._depth = 0
        self._saved: list[tuple[object, str, object]] = []
        targets = [(torch.Tensor, name) for name in REDUCTIONS]
        targets += [(torch, name) for name in REDUCTIONS]
        targets += [(torch.nn.functional, name) for name in ("softmax", "log_softmax")]
        targets += [(module, name) for module, name in _decoder_reductions()]
        for owner, name in targets:
            self._saved.append((owner, name, owner.__dict__.get(name, _MISSING)))
            setattr(owner, name, self._wrap(name, getattr(owner, name)))

    def _wrap(self, name: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            x = args[0] if args else kwargs.get("input", kwargs.get("self"))
            if (self._depth or self.fwd.in_forward or not isinstance(x, torch.Tensor) or x.dim() == 0
                    or x.shape[-1] != self.vocab):
                return fn(*args, **kwargs)
            sync(self.device)
            t0 = time.perf_counter()
            self._depth += 1  # F.log_softmax calls Tensor.log_softmax: count the outer call only
            try:
                out = fn(*args, **kwargs)
            finally:
                self._depth -= 1
            sync(self.device)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
            self.calls += 1
            return out

        return timed

    def reset(self) -> None:
        self.seconds, self.calls = {}, 0

    def total(self) -> float:
        return sum(self.seconds.values())

    def close(self) -> None:
        for owner, name, original in reversed(self._saved):
            if original is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._saved = []


_MISSING = object()


def _decoder_reductions() -> list[tuple[object, str]]:
    """The decoder's own full-vocabulary passes (decoder.logits.host_topk: its CPU top-k, a device
    topk on a GPU), where this decoder has them (a decoder from before does not)."""
    try:
        from decoder import logits
    except ImportError:
        return []
    return [(logits, "host_topk")]


# ---------------------------------------------------------------- one configuration


def make_decoder(model, tok, store, sources: str, budget: int):
    from decoder.drafters.registry import make_drafters
    from decoder.speculative import DecoderSettings, SpeculativeDecoder

    names = list(SOURCE_SETS[sources])
    drafters = make_drafters(names, datastore=store, tokenizer=tok) if names else []
    # no eos: every row decodes exactly new_tokens (the stub's noise may hold an eos id)
    return SpeculativeDecoder(model, tok, drafters, DecoderSettings(budget=budget, eos_token_ids=()))


def decode(dec, clock: ForwardClock, prompts: list[list[int]], n: int) -> dict:
    device = clock.device
    timer = getattr(dec, "timer", None)
    if timer is not None:
        timer.reset()
    clock.reset()
    sync(device)
    t0 = time.perf_counter()
    gens = dec.generate_batch(prompts, max_new_tokens=n)
    sync(device)
    wall = time.perf_counter() - t0
    row_steps = [int(g.stats.steps) for g in gens]
    out = {
        "wall_seconds": wall, "forward_seconds": clock.seconds, "forward_calls": clock.calls,
        "steps": max(row_steps), "row_steps": int(sum(row_steps)),
        "new_tokens": int(sum(len(g.token_ids) for g in gens)),
        "tree_tokens": int(sum(int(g.stats.tree_tokens) for g in gens)),
        "ids": [list(g.token_ids) for g in gens],
    }
    if timer is not None:
        out["timer"] = {"steps": int(timer.steps), "totals": dict(timer.totals),
                        "host_seconds": float(timer.host_seconds())}
    return out


def run_config(model, clock: ForwardClock, tok, store, sources: str, budget: int, timed_prompts, warm_prompts,
               settings: OverheadSettings) -> dict:
    """A fresh decoder: a warm-up decode on other prompts, then the timed decode, its logits
    reductions timed inside it."""
    dec = make_decoder(model, tok, store, sources, budget)
    decode(dec, clock, warm_prompts, settings.warmup_tokens)
    reductions = LogitsClock(int(model.config.vocab_size), clock)
    try:
        timed = decode(dec, clock, timed_prompts, settings.new_tokens)
    finally:
        reductions.close()
    del dec
    steps = timed["steps"]
    logits_s = reductions.total()
    host = timed["wall_seconds"] - timed["forward_seconds"] - logits_s
    entry = {
        "batch": len(timed_prompts), "sources": sources, "drafters": list(SOURCE_SETS[sources]), "budget": budget,
        "steps": steps, "row_steps": timed["row_steps"], "new_tokens": timed["new_tokens"],
        "tokens_per_step": timed["new_tokens"] / max(timed["row_steps"], 1),
        "nodes_per_step": timed["tree_tokens"] / max(timed["row_steps"], 1),
        "wall_seconds": timed["wall_seconds"], "forward_seconds": timed["forward_seconds"],
        "forward_calls": timed["forward_calls"], "logits_ops_seconds": logits_s,
        "logits_ops_by_op_seconds": dict(reductions.seconds), "logits_ops_calls": reductions.calls,
        "host_seconds": host,
        "host_ms_per_step": host / steps * 1e3,
        "forward_ms_per_step": timed["forward_seconds"] / steps * 1e3,
        "logits_ops_ms_per_step": logits_s / steps * 1e3,
        "phases_ms_per_step": None, "timer_host_ms_per_step": None, "timer_steps": None,
    }
    if "timer" in timed:
        t = timed["timer"]
        n = max(t["steps"], 1)
        entry["timer_steps"] = t["steps"]
        entry["phases_ms_per_step"] = {k: v / n * 1e3 for k, v in t["totals"].items()}
        entry["timer_host_ms_per_step"] = t["host_seconds"] / n * 1e3
    return entry


# ---------------------------------------------------------------- HF generate baseline


def left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # [B, L]
    mask = torch.zeros((len(prompts), width), dtype=torch.long)  # [B, L]
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


@torch.inference_mode()
def hf_generate(model, clock: ForwardClock, prompts: list[list[int]], n: int, pad_id: int) -> dict:
    ids, mask = left_pad(prompts, pad_id, clock.device)
    clock.reset()
    sync(clock.device)
    t0 = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=n,
                         min_new_tokens=n, pad_token_id=pad_id, temperature=None, top_p=None, top_k=None)
    sync(clock.device)
    wall = time.perf_counter() - t0
    new = int(out.shape[1] - ids.shape[1])
    return {"wall_seconds": wall, "new_tokens_per_row": new, "forward_seconds": clock.seconds,
            "forward_calls": clock.calls, "ms_per_step": wall / max(new, 1) * 1e3,
            "forward_ms_per_step": clock.seconds / max(new, 1) * 1e3,
            "non_forward_ms_per_step": (wall - clock.seconds) / max(new, 1) * 1e3}


# ---------------------------------------------------------------- the run


def machine() -> dict:
    m = bd.machine()
    info = {"cpu_model": None, "flags": {}}
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        for line in text.splitlines():
            if line.startswith("model name") and info["cpu_model"] is None:
                info["cpu_model"] = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                info["flags"] = {f: f in flags for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")}
                break
    except OSError:
        pass
    m.update(info)
    m["load_average"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    m["torch_cpu_capability"] = getattr(torch.backends.cpu, "get_cpu_capability", lambda: None)()
    m["malloc_env"] = {k: os.environ.get(k) for k in MALLOC_ENV}
    return m


def decoder_info() -> dict:
    import decoder.speculative as spec

    root = Path(spec.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "decoder"],
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {"module": str(Path(spec.__file__).resolve()), "commit": commit, "decoder_dir_modified": dirty}


def verdict(entry: dict) -> str:
    target = TARGETS.get(entry["batch"])
    if target is None:
        return "-"
    return "met" if entry["ratio"] <= target else "not met"


def run(settings: OverheadSettings, store=None, store_info: dict | None = None, tok=None,
        progress=bd.log) -> dict:
    """The whole benchmark -> results dict (also written to OUT unless settings.out is None)."""
    from benchmarks import workloads as wl

    device = settings.resolved_device()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    if tok is None:
        from builder.tokenizer import load_tokenizer

        tok = load_tokenizer("smollm2")
    if store is None:
        from datastore.store import Datastore

        path, which = bd.pick_code_store(settings.datastore)
        progress(f"datastore {path} ({which})")
        store = Datastore.open(path)
        store_info = {"path": str(path), "which": which, "tokens": bd.store_tokens(store)}
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    vocab = len(tok)
    model = stub_model(vocab, pad_id, device, settings.seed)
    clock = ForwardClock(model)
    top = max(settings.batches)
    prompts = wl.humaneval(2 * top)
    ids = [wl.encode(p, tok) for p in prompts]
    timed_all, warm_all = ids[:top], ids[top:2 * top]
    results = {
        "benchmark": "overhead", "label": settings.label or None, "created": bd.now(), "machine": machine(),
        "decoder": decoder_info(),
        "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(settings).items()
                     if k not in ("out",)},
        "device": str(device), "store": store_info or {},
        "stub": {"model": "LlamaForCausalLM", "vocab_size": vocab, "dtype": "float32",
                 "parameters": int(sum(p.numel() for p in model.parameters())), **STUB},
        "prompts": [p.id for p in prompts[:top]], "warmup_prompts": [p.id for p in prompts[top:2 * top]],
        "targets": {str(k): v for k, v in TARGETS.items()},
        "hf_generate": {}, "configs": [],
    }
    started = time.perf_counter()
    try:
        for b in settings.batches:
            timed_prompts, warm_prompts = timed_all[:b], warm_all[:b]
            hf_generate(model, clock, warm_prompts, settings.warmup_tokens, pad_id)  # warm-up
            hf = min((hf_generate(model, clock, timed_prompts, settings.new_tokens, pad_id)
                      for _ in range(settings.hf_repeats)), key=lambda h: h["ms_per_step"])
            results["hf_generate"][str(b)] = hf
            progress(f"batch {b}: HF generate {hf['ms_per_step']:.2f} ms/step "
                     f"(forward {hf['forward_ms_per_step']:.2f})")
            for sources in settings.sources:
                for budget in settings.budgets:
                    t0 = time.perf_counter()
                    # the same work every time (fresh decoder, same prompts): the median run stands
                    runs = sorted((run_config(model, clock, tok, store, sources, budget, timed_prompts,
                                              warm_prompts, settings) for _ in range(settings.repeats)),
                                  key=lambda e: e["host_ms_per_step"])
                    entry = runs[len(runs) // 2]
                    entry["host_ms_per_step_runs"] = [e["host_ms_per_step"] for e in runs]
                    entry["hf_ms_per_step"] = hf["ms_per_step"]
                    entry["ratio"] = entry["host_ms_per_step"] / hf["ms_per_step"]
                    entry["target"] = TARGETS.get(b)
                    entry["verdict"] = verdict(entry)
                    entry["config_seconds"] = time.perf_counter() - t0
                    entry["load_average_1min"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
                    results["configs"].append(entry)
                    progress(f"batch {b} {sources:<9} budget {budget:>2}: host {entry['host_ms_per_step']:.2f} "
                             f"ms/step = {entry['ratio']:.2f}x HF ({entry['verdict']}); forward "
                             f"{entry['forward_ms_per_step']:.1f}, logits ops {entry['logits_ops_ms_per_step']:.1f} "
                             f"ms/step; {entry['tokens_per_step']:.2f} tokens/step; {entry['steps']} steps; "
                             f"{entry['config_seconds']:.0f} s")
            if settings.out is not None:
                results["run_seconds"] = time.perf_counter() - started
                save(results, settings)  # after every batch size: a cut run keeps its part
    finally:
        clock.close()
    results["run_seconds"] = time.perf_counter() - started
    results["machine"]["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    results["decoder"]["has_timer"] = any(e["timer_steps"] is not None for e in results["configs"])
    if settings.out is not None:
        save(results, settings)
    return results


# ---------------------------------------------------------------- outputs


def _phase_cell(e: dict) -> str:
    p = e.get("phases_ms_per_step")
    if not p:
        return "- (no timer)"
    return ", ".join(f"{k} {v:.2f}" for k, v in p.items())


def markdown(results: dict) -> str:
    m, s = results["machine"], results["settings"]
    d = results["decoder"]
    flags = ", ".join(k for k, v in (m.get("flags") or {}).items() if v) or "?"
    la = m.get("load_average") or []
    lines = [
        f"# Decoder host overhead per step{' (' + results['label'] + ')' if results.get('label') else ''}",
        "",
        f"Stub: 1-layer Llama, hidden {results['stub']['hidden_size']}, vocabulary {results['stub']['vocab_size']:,}, "
        f"random fp32 weights, on {results['device']}. Prompts: the first B HumanEval prompts as one batch; "
        f"{s['new_tokens']} new tokens per row after a {s['warmup_tokens']}-token warm-up decode. "
        f"Store: {results['store'].get('which', results['store'].get('path', '?'))} "
        f"({results['store'].get('tokens') or '?'} tokens). "
        f"Decoder: {d['module']} at {(d['commit'] or '?')[:10]}"
        f"{' (decoder/ modified)' if d.get('decoder_dir_modified') else ''}.",
        f"Machine: {m.get('cpu_model')}, {m['cpus']} CPUs, torch {m['torch']} "
        f"({s.get('threads') or m['torch_threads']} threads), "
        f"flags {flags}; load average {', '.join(f'{x:.2f}' for x in la)} at start"
        f"{', ' + ', '.join(f'{x:.2f}' for x in m['load_average_end']) + ' at the end' if m.get('load_average_end') else ''}"
        f" (a shared machine: every ratio is measured side by side in this run). "
        f"Run {results['created']}, {results.get('run_seconds', 0):.0f} s.",
        "",
        "host = decode wall time - stub forward (synced) - full-vocabulary logits reductions (argmax, top-k, "
        "softmax, sort ... on [.., vocab] tensors, and the decoder's CPU top-k pass, synced and timed in the same "
        "decode); per step = / decoder steps; "
        f"the median of {s.get('repeats', 1)} decodes, each by a fresh decoder. "
        "HF = `generate(do_sample=False)` wall time / "
        f"new tokens on the same stub and batch (its whole step; fastest of {s.get('hf_repeats', 1)}). ratio = host / HF; targets: batch 1 <= 0.5x, "
        "batch 32 <= 1.0x. tokens/step per row; phases from the decoder's PhaseTimer (ms/step) when it has one.",
        "",
        "| batch | sources | budget | host ms/step | HF ms/step | ratio | target | tokens/step | nodes/step "
        "| forward ms/step | logits ops ms/step | per-phase ms/step |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in results["configs"]:
        tgt = f"<= {e['target']}x: {e['verdict']}" if e.get("target") is not None else "-"
        lines.append(
            f"| {e['batch']} | {e['sources']} | {e['budget']} | {e['host_ms_per_step']:.2f} | {e['hf_ms_per_step']:.2f} "
            f"| {e['ratio']:.2f}x | {tgt} | {e['tokens_per_step']:.2f} | {e['nodes_per_step']:.1f} "
            f"| {e['forward_ms_per_step']:.2f} | {e['logits_ops_ms_per_step']:.2f} | {_phase_cell(e)} |")
    lines += ["", "## HF generate on the stub", "", "| batch | ms/step | forward ms/step | rest ms/step |",
              "|---|---|---|---|"]
    for b, h in results["hf_generate"].items():
        lines.append(f"| {b} | {h['ms_per_step']:.2f} | {h['forward_ms_per_step']:.2f} | {h['non_forward_ms_per_step']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = results["configs"]
    panels = sorted({(e["sources"], e["budget"]) for e in configs},
                    key=lambda k: (list(SOURCE_SETS).index(k[0]), k[1]))
    if not panels:
        return
    cols = len({b for _, b in panels})
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    colors = dict(zip(HOST_PHASES_ORDER + ("host (no timer)", "other host"),
                      plt.get_cmap("tab10").colors))
    for ax, (src, budget) in zip(axes.flat, panels):
        es = sorted((e for e in configs if e["sources"] == src and e["budget"] == budget), key=lambda e: e["batch"])
        x = np.arange(len(es))
        bottom = np.zeros(len(es))
        names = HOST_PHASES_ORDER if any(e.get("phases_ms_per_step") for e in es) else ()
        for name in names:
            vals = np.array([(e.get("phases_ms_per_step") or {}).get(name, 0.0) for e in es])
            ax.bar(x, vals, bottom=bottom, color=colors[name], label=name)
            bottom += vals
        total = np.array([e["host_ms_per_step"] for e in es])
        rest = np.maximum(total - bottom, 0.0)  # outside the timed phases (prefill set-up, drafter begin ...)
        ax.bar(x, rest, bottom=bottom, color=colors["other host" if names else "host (no timer)"],
               label="other host" if names else "host (no timer)")
        hf = [e["hf_ms_per_step"] for e in es]
        ax.scatter(x, hf, marker="_", s=900, color="black", zorder=3, label="HF generate whole step")
        for i, e in enumerate(es):
            ax.text(i, max(total[i], hf[i]), f"{e['ratio']:.2f}x", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(x, [str(e["batch"]) for e in es])
        ax.set_xlabel("batch size")
        ax.set_ylabel("host ms / step")
        ax.set_title(f"sources: {src}, budget {budget}")
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(len(handles), 5), fontsize=8)
    title = "decoder host time per step vs HF generate's whole step (stub model)"
    if results.get("label"):
        title += f" [{results['label']}]"
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.08, 1, 0.96))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def save(results: dict, settings: OverheadSettings) -> None:
    out = settings.out
    bd.write_json(out / f"{settings.stem}.json", results)
    (out / f"{settings.stem}.md").write_text(markdown(results), encoding="utf-8")
    if settings.plot:
        plot(results, out / f"{settings.stem}.png")


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from exc


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_overhead", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--batches", default="1,8,32", help="batch sizes (default 1,8,32)")
    p.add_argument("--sources", default="none,retrieval,all",
                   help=f"source sets: none, retrieval, all (= {','.join(DEFAULT_SOURCES)}, the default set)")
    p.add_argument("--budgets", default="16,64", help="fixed tree budgets (default 16,64)")
    p.add_argument("--new-tokens", type=int, default=32, help="new tokens per row in each timed decode (default 32)")
    p.add_argument("--warmup-tokens", type=int, default=16, help="new tokens of the warm-up decodes (default 16)")
    p.add_argument("--datastore", default=None, help="default: benchmarks/work/code, work/stdlib, else "
                   "data/stdlib-smollm2 (built once)")
    p.add_argument("--label", default="", help="result file suffix, e.g. before -> overhead_before.json")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda[:i]")
    p.add_argument("--hf-repeats", type=int, default=3, help="HF generate timings per batch, fastest kept (default 3)")
    p.add_argument("--repeats", type=int, default=3,
                   help="decodes per configuration, each by a fresh decoder on the same prompts; the median "
                        "host time is reported (default 3: one noisy neighbour run no longer decides a verdict)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: on a shared 2-core machine two OpenMP threads under load "
                        "ran the stub 5-20x slower and erratically; the decoder's host work is one Python "
                        "thread anyway); 0 = torch's default")
    p.add_argument("--seed", type=int, default=0, help="stub weights' seed")
    p.add_argument("--out", default=str(bd.RESULTS), help="results folder (default benchmarks/results)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    args = p.parse_args(argv)
    try:
        settings = OverheadSettings(
            batches=_ints(args.batches), sources=tuple(x for x in args.sources.split(",") if x),
            budgets=_ints(args.budgets), new_tokens=args.new_tokens, warmup_tokens=args.warmup_tokens,
            datastore=args.datastore, label=args.label, device=args.device, seed=args.seed,
            hf_repeats=args.hf_repeats, repeats=args.repeats, threads=args.threads,
            out=Path(args.out), plot=not args.no_plot,
        )
    except ValueError as exc:
        print(f"bench_overhead: error: {exc}", file=sys.stderr)
        return 2
    results = run(settings)
    print(markdown(results))
    bd.log(f"wrote {settings.out}/{settings.stem}.json, .md{'' if not settings.plot else ', .png'}")
    return 0


# A CPU stand-in for a GPU's caching allocator: with glibc's defaults every logits tensor of the
# stub (400 MB at batch 32 x 65 slots) is mmap'ed, page-faulted and munmap'ed each step, which
# charged ~40 ms a step to "host" at batch 32 that a GPU never pays (HF's step gained from it too:
# 25 -> 15 ms). Freed memory stays in the heap and is reused.
MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


def _with_caching_malloc() -> None:
    """Re-execute this benchmark once with MALLOC_ENV (glibc reads it at start-up only)."""
    if all(os.environ.get(k) == v for k, v in MALLOC_ENV.items()):
        return
    os.environ.update(MALLOC_ENV)
    os.execv(sys.executable, [sys.executable, "-m", "benchmarks.bench_overhead", *sys.argv[1:]])


if __name__ == "__main__":
    _with_caching_malloc()
    sys.exit(main())
