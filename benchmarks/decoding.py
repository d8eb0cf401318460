"""Helpers shared by the decode benchmarks (bench_decode, bench_drafters): which datastore, the
decoders per dtype, side-by-side timing, near-tie analysis of bf16 divergences, result files.

Every ratio is measured within one run on the same machine (it is shared and noisy): a prompt's
speculative decode and its plain greedy decode run back to back, alternating which goes first.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / "benchmarks" / "work"
RESULTS = REPO / "benchmarks" / "results"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def machine() -> dict:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def store_tokens(store) -> int | None:
    """Static tokens of an open Datastore (informational)."""
    tokens = getattr(store, "tokens", None)
    return int(tokens) if tokens is not None else None


def pick_code_store(explicit: str | None = None) -> tuple[Path, str]:
    """-> (datastore dir, which). Preference: --datastore, benchmarks/work/code (stdlib +
    site-packages, the builder benchmark's), benchmarks/work/stdlib, the demo's data/stdlib-smollm2
    (built here if absent)."""
    if explicit:
        return Path(explicit), "given"
    for name, which in (("code", "stdlib+site-packages (benchmarks/work/code)"),
                        ("stdlib", "stdlib only (benchmarks/work/stdlib; work/code absent)")):
        if (WORK / name / "data.mdb").is_file():
            return WORK / name, which
    from decoder.demo import DEFAULT_STORE, ensure_stdlib_datastore

    return ensure_stdlib_datastore(DEFAULT_STORE), "stdlib only (data/stdlib-smollm2; benchmarks/work/* absent)"


@dataclass
class Timed:
    ids: list[int]
    seconds: float
    steps: int
    stats: dict | None = None  # GenerationStats.to_dict() for speculative runs

    @property
    def tokens_per_step(self) -> float:
        return len(self.ids) / self.steps if self.steps else 0.0


class ForwardCounter:
    """Counts model.forward calls = steps of plain generate and of prompt lookup. Their first
    forward (prompt + first token) yields a token, so it is a step, as the speculative decoder's
    first step (last prompt token + tree, after a prefill of the rest) is."""

    def __init__(self, model):
        self.calls = 0
        self._handle = model.register_forward_hook(self._hook)

    def _hook(self, *_):
        self.calls += 1

    def close(self) -> None:
        self._handle.remove()


def _sync(model) -> None:
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


@torch.inference_mode()
def hf_generate(model, ids: Sequence[int], max_new_tokens: int, eos: list[int], pad: int,
                prompt_lookup: int = 0) -> Timed:
    """model.generate greedy (prompt_lookup > 0: transformers' prompt lookup decoding), timed."""
    x = torch.tensor([list(ids)], dtype=torch.long, device=model.device)  # [1, p] int64
    kwargs = {"prompt_lookup_num_tokens": prompt_lookup} if prompt_lookup else {}
    counter = ForwardCounter(model)
    try:
        _sync(model)
        t0 = time.perf_counter()
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                             max_new_tokens=max_new_tokens, eos_token_id=eos or None, pad_token_id=pad,
                             temperature=None, top_p=None, top_k=None, **kwargs)
        _sync(model)
        seconds = time.perf_counter() - t0
    finally:
        counter.close()
    new = out[0, x.shape[1]:].tolist()
    return Timed(new, seconds, max(counter.calls, 1))


def speculative(decoder, ids: Sequence[int], max_new_tokens: int, references=None) -> Timed:
    gen = decoder.generate(list(ids), max_new_tokens=max_new_tokens, references=references)
    return Timed(list(gen.token_ids), gen.stats.seconds, gen.stats.steps, gen.stats.to_dict())


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.inference_mode()
def position_gaps(model, prompt: Sequence[int], output: Sequence[int]) -> np.ndarray:
    """[len(output)] float32: the model's top-1 minus top-2 logit at every output position, from
    one forward over prompt + output (the margin greedy decoding had at each token)."""
    ids = torch.tensor([list(prompt) + list(output)], device=model.device)  # [1, p + n]
    logits = model(input_ids=ids).logits[0, len(prompt) - 1: -1].float()  # [n, V]
    top = logits.topk(2, dim=-1).values  # [n, 2]
    return (top[:, 0] - top[:, 1]).cpu().numpy()


NEAR_TIE_STEPS = 2  # a divergence whose two tokens' logits are this many rounding steps apart or less


def rounding_step(value: float, dtype: torch.dtype) -> float:
    """Spacing of representable numbers of `dtype` at |value| (bf16: 8 significant bits)."""
    return float(torch.finfo(dtype).eps * 2.0 ** np.floor(np.log2(max(abs(value), 1e-30))))


@torch.inference_mode()
def divergence(model, prompt: Sequence[int], base: Sequence[int], spec: Sequence[int],
               gaps: np.ndarray | None = None) -> dict | None:
    """Where speculative and plain greedy outputs part: the model's logits at that position
    (one forward over prompt + the common prefix) and how small the top-2 gap is compared with
    every position of the baseline output (its percentile)."""
    pos = first_difference(base, spec)
    if pos is None:
        return None
    ids = torch.tensor([list(prompt) + list(base[:pos])], device=model.device)
    logits = model(input_ids=ids).logits[0, -1].float()  # [V]
    top2 = logits.topk(2)
    out = {
        "position": pos,
        "greedy_token": int(base[pos]) if pos < len(base) else None,
        "speculative_token": int(spec[pos]) if pos < len(spec) else None,
        "top2_tokens": [int(t) for t in top2.indices.tolist()],
        "top2_gap": float(top2.values[0] - top2.values[1]),
    }
    out["top_logit"] = float(top2.values[0])
    if out["greedy_token"] is not None and out["speculative_token"] is not None:
        out["gap_between_the_two"] = float(logits[out["greedy_token"]] - logits[out["speculative_token"]])
        out["both_in_top2"] = {out["greedy_token"], out["speculative_token"]} <= set(out["top2_tokens"])
        # In the model's dtype, logits near the top are multiples of one rounding step; a gap of
        # a step or two is what two summation orders (chunked vs one token) can produce.
        out["gap_in_rounding_steps"] = abs(out["gap_between_the_two"]) / rounding_step(out["top_logit"], model.dtype)
        out["near_tie"] = out["both_in_top2"] or out["gap_in_rounding_steps"] <= NEAR_TIE_STEPS
    if gaps is not None and gaps.size:
        out["gap_percentile"] = float((gaps < out["top2_gap"]).mean() * 100)
    return out


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=_json_default) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _json_default(obj):
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj)}")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def summarize(rows: list[dict], spec_key: str = "spec", base_key: str = "greedy") -> dict:
    """Totals over prompts: tokens/step = all new tokens / all steps; speed-up = all greedy
    seconds / all speculative seconds (a ratio of sums, so long prompts weigh what they cost)."""
    tokens = sum(len(r[spec_key]["ids"]) for r in rows)
    steps = sum(r[spec_key]["steps"] for r in rows)
    spec_s = sum(r[spec_key]["seconds"] for r in rows)
    base_s = sum(r[base_key]["seconds"] for r in rows)
    base_tokens = sum(len(r[base_key]["ids"]) for r in rows)
    identical = sum(bool(r[spec_key]["identical"]) for r in rows)
    per_prompt = [r[base_key]["seconds"] / max(r[spec_key]["seconds"], 1e-9) for r in rows]
    return {
        "prompts": len(rows),
        "new_tokens": tokens,
        "steps": steps,
        "tokens_per_step": tokens / max(steps, 1),
        "seconds": spec_s,
        "baseline_seconds": base_s,
        "tokens_per_second": tokens / max(spec_s, 1e-9),
        "baseline_tokens_per_second": base_tokens / max(base_s, 1e-9),
        "speedup": base_s / max(spec_s, 1e-9),
        "speedup_median_prompt": float(np.median(per_prompt)) if per_prompt else None,
        "identical": identical,
        "identical_rate": identical / max(len(rows), 1),
    }


def timed_dict(t: Timed, reference: Sequence[int] | None = None) -> dict:
    out = {"ids": t.ids, "seconds": t.seconds, "steps": t.steps, "tokens_per_step": t.tokens_per_step}
    if reference is not None:
        out["identical"] = list(t.ids) == list(reference)
        out["first_difference"] = first_difference(reference, t.ids)
    if t.stats is not None:
        out["stats"] = {k: v for k, v in t.stats.items() if k not in ("latency_curve",)}
    return out
