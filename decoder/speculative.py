"""`SpeculativeDecoder`: lossless tree speculative decoding over a Hugging Face causal LM.

One step per forward (DESIGN.md "Decoder"): every drafter proposes a DraftTree for each active
row -> merged into one trie with calibrated probabilities -> the top-T nodes (T from the cost
model or a fixed budget) -> ONE model.forward over [last committed token] + tree (+ side branch)
tokens per row with explicit positions and a 4D additive mask over a DynamicCache -> greedy or
lossless-sampling acceptance -> the accepted slots gathered into place in the cache -> drafter
hooks. model.forward is called directly; nothing in transformers is patched.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from datastore.tree import DraftTree
from decoder import _step, kv
from decoder import logits as logits_pass
from decoder.attention import TreeSlots, build_batch, prefill_inputs
from decoder.calibration import Calibration
from decoder.cost import CostModel, measure_latency
from decoder.drafters.base import Drafter, SideBranch
from decoder.rows import STOP_REASONS, Row, commit_lengths
from decoder.stats import DecoderSettings, Generation, GenerationStats
from decoder.timing import PhaseTimer
from decoder.tree import Kept, MergedTree, kept_nodes, merge_rows, ranked, select_rows
from decoder.verify import sample_accept

SIDE_EXPLORE = (8, 64)  # a skipped side branch rides again after 8 steps, 16, 32 ... 64 while it does not pay
SIDE_GAIN_RATE = 0.1  # EMA rate of the side branch's yield (~10 steps of memory)
# A row's own recent record (accepted / expected draft tokens) scales its path probabilities:
# calibration is learnt over every prompt, and a prompt whose output the drafts miss (HumanEval/1:
# 1.02 tokens/step) kept paying for 6-node trees. Decay 0.9 (~10 steps); the prior (tokens) pulls
# a row with little record back to 1, so a row whose trees shrank to nothing gets tried again.
TRUST_DECAY = 0.9
TRUST_PRIOR = 2.0
TRUST_MAX = 2.0

__all__ = ["SpeculativeDecoder", "DecoderSettings", "Generation", "GenerationStats"]


def eos_ids(model, settings: DecoderSettings) -> np.ndarray:
    """[e] int64: the settings' eos ids, else every eos id of the generation config (or config)."""
    if settings.eos_token_ids is not None:
        return np.asarray(settings.eos_token_ids, dtype=np.int64)
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return np.zeros(0, dtype=np.int64)
    return np.asarray([eos] if isinstance(eos, int) else list(eos), dtype=np.int64)


def merge_side(branches: list[SideBranch | None]) -> tuple[SideBranch | None, list[tuple[int, int, int]]]:
    """Block-diagonal union of the drafters' side branches; -> (branch, [(drafter, start, m)])."""
    parts = [(i, b) for i, b in enumerate(branches) if b is not None and b.tokens.shape[0]]
    if not parts:
        return None, []
    if len(parts) == 1:
        return parts[0][1], [(parts[0][0], 0, int(parts[0][1].tokens.shape[0]))]
    total = sum(int(b.tokens.shape[0]) for _, b in parts)
    mask = np.zeros((total, total), dtype=bool)
    spans, start = [], 0
    for i, b in parts:
        m = int(b.tokens.shape[0])
        mask[start : start + m, start : start + m] = b.mask
        spans.append((i, start, m))
        start += m
    tokens = np.concatenate([b.tokens for _, b in parts]).astype(np.int64)
    depths = np.concatenate([b.depths for _, b in parts]).astype(np.int64)
    return SideBranch(tokens, depths, mask), spans


@dataclass
class _Step:
    """One step's plan for every active row."""

    merged: MergedTree  # the merged tries of all rows
    kept: Kept  # the nodes verified in the forward
    sides: list  # [B] SideBranch | None
    spans: list  # [B] [(drafter, start, m)] of each row's side branch
    expected: np.ndarray  # [B] float64 draft tokens the calibrated estimates expect from the kept nodes

    def slots(self) -> TreeSlots:
        k = self.kept
        return TreeSlots(k.tokens, k.parents, k.depths, k.row, k.starts)


class SpeculativeDecoder:
    def __init__(self, model, tokenizer, drafters: Sequence[Drafter] = (), settings: DecoderSettings | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.drafters = list(drafters)
        self.settings = settings or DecoderSettings()
        self.calibration = Calibration(len(self.drafters), self.settings.calibration())
        self.eos = eos_ids(model, self.settings)
        self.cost: CostModel | None = None
        self.pad_id = int(getattr(model.config, "pad_token_id", None) or 0)
        # bit s set: drafter s rides a side branch (lookahead); its harvest's recent yield
        self._side_bits = sum(1 << s for s, d in enumerate(self.drafters)
                              if type(d).side_branch is not Drafter.side_branch)
        self._topk = max((int(getattr(d, "topk", 0) or 0) for d in self.drafters), default=0)
        self.timer = PhaseTimer()  # per-phase seconds of every step so far (reset() to restart)
        self._side_gain = 1.0  # tokens a step, optimistic so the window gets tried first
        self._steps_without_side = 0
        self._explore_after = SIDE_EXPLORE[0]  # skipped steps before the side branch rides anyway

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls, spec: str = "smollm2", gguf_file: str | None = None, datastore=None, address: str | None = None,
        drafters=None, budget="auto", device=None, dtype=None, drafter_options=None,
        **settings_kw,
    ) -> "SpeculativeDecoder":
        """drafters: names (decoder.drafters.registry; None = its DEFAULT set) or Drafter objects;
        drafter_options: {drafter name: constructor keywords}, e.g. {"retrieval": {"min_count": 4}}."""
        from decoder.drafters.registry import make_drafters
        from decoder.models import load_model

        if dtype is not None and not isinstance(dtype, str):
            dtype = str(dtype).removeprefix("torch.")  # torch.bfloat16 -> "bfloat16"
        device = None if device is None else str(device)
        settings = DecoderSettings(budget=budget, device=device, dtype=dtype, **settings_kw)
        model, tokenizer = load_model(spec, gguf_file=gguf_file, dtype=settings.dtype, device=device,
                                      pack=settings.packed_linears)
        from decoder.drafters.registry import DEFAULT

        drafters = DEFAULT if drafters is None else drafters
        names = [d for d in drafters if isinstance(d, str)]
        objects = [d for d in drafters if not isinstance(d, str)]
        made = make_drafters(names, datastore=datastore, address=address, tokenizer=tokenizer,
                             **(drafter_options or {})) if names else []
        return cls(model, tokenizer, made + objects, settings)

    # ---- public API ---------------------------------------------------------------------
    def warmup(self) -> dict:
        """Measure the cost model's latency curve {q new tokens: seconds} on this model/device."""
        curve = measure_latency(
            self.model, context=self.settings.warmup_context, repeats=self.settings.warmup_repeats
        )
        self.cost = CostModel(curve)
        return dict(curve)

    def encode(self, prompt, chat: bool = False) -> np.ndarray:
        """str (chat: rendered with the chat template) or token ids -> [p] int64."""
        if isinstance(prompt, str):
            if chat:
                prompt = self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
                )
                ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            else:
                ids = self.tokenizer(prompt)["input_ids"]
        else:
            ids = list(prompt)
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.shape[0] == 0:
            raise ValueError("prompt is empty (no tokens)")
        vocab = int(self.model.config.vocab_size)
        if ids.min() < 0 or ids.max() >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab}), got {ids.min()}..{ids.max()}")
        return ids

    def generate(self, prompt, max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int | None = None, references=None, stop=None, chat: bool = False) -> Generation:
        return self.generate_batch([prompt], max_new_tokens, temperature, top_p, seed, references, stop, chat)[0]

    def generate_batch(self, prompts, max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0,
                       seed: int | None = None, references=None, stop=None, chat: bool = False) -> list[Generation]:
        """Decode several prompts, one forward per step for all unfinished rows.

        references: one list of references (str or token ids) for every row, or a list of such
        lists, one per row. Each row's output equals its single decode.
        """
        t0 = time.perf_counter()
        _check_sampling(max_new_tokens, temperature, top_p)
        if isinstance(prompts, str) or not len(prompts):
            raise ValueError("prompts must be a non-empty sequence of prompts")
        encoded = [self.encode(p, chat) for p in prompts]
        refs = self._references(references, len(encoded))
        if self.settings.budget == "auto" and self.cost is None:
            self.warmup()
        gen = None
        if temperature > 0:
            gen = torch.Generator(device=self.model.device)
            gen.manual_seed(seed if seed is not None else random.randrange(2**63))
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        rows = [Row(i, p, max_new_tokens, self.eos, stops) for i, p in enumerate(encoded)]
        failures0 = self._failures()
        for row in rows:
            for d in self.drafters:
                d.begin(row.index, row.context.copy(), refs[row.index])
        try:
            with torch.inference_mode():
                self._decode(rows, temperature, top_p, gen)
        finally:
            for row in rows:
                if not row.done:
                    for d in self.drafters:
                        d.end(row.index)
        seconds = time.perf_counter() - t0
        failures = self._failures() - failures0
        out = []
        for row in rows:
            row.stats.seconds, row.stats.datastore_failures = seconds, failures
            row.stats.new_tokens = int(row.output.shape[0])
            row.stats.latency_curve = None if self.cost is None else dict(self.cost.curve)
            out.append(Generation(row.text(self.tokenizer), row.output.tolist(),
                                  row.buf[: row.prompt_len].tolist(), row.stats))
        return out

    @torch.inference_mode()
    def greedy_baseline(self, prompt, max_new_tokens: int = 128, chat: bool = False) -> Generation:
        """The model's own `generate(do_sample=False)`, timed: the reference for --compare."""
        ids = self.encode(prompt, chat)
        t0 = time.perf_counter()
        x = torch.from_numpy(ids)[None].to(self.model.device)
        out = self.model.generate(
            input_ids=x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new_tokens,
            eos_token_id=self.eos.tolist() or None, pad_token_id=self.pad_id,
            temperature=None, top_p=None, top_k=None,
        )
        new = out[0, ids.shape[0]:].tolist()
        seconds = time.perf_counter() - t0
        stats = GenerationStats(steps=len(new), new_tokens=len(new), forward_seconds=seconds, seconds=seconds,
                                stop_reason="eos" if new and new[-1] in set(self.eos.tolist()) else "length")
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        return Generation(text, new, ids.tolist(), stats)

    # ---- the decode loop ----------------------------------------------------------------
    def _decode(self, rows: list[Row], temperature: float, top_p: float, gen) -> None:
        active = [r for r in rows if r.remaining > 0]
        for r in rows:
            if r.remaining <= 0:
                self._finish(r, "length")
        if not active:
            return
        cache, valid = self._prefill(active)
        timer = self.timer
        # read once: transformers' .device/.dtype walk the parameters (~5-10 us each, 3 a step)
        device, dtype = self.model.device, self.model.dtype
        checked = None
        work = _Workspace(len(active), self.settings.max_depth)  # the greedy step's outputs, reused
        while active:
            timer.start()
            t0 = time.perf_counter()
            step = self._plan(active)
            roots = np.asarray([r.buf[r.length - 1] for r in active], dtype=np.int64)  # [B]
            bases = np.asarray([r.length - 1 for r in active], dtype=np.int64)  # [B]
            ids, pos, mask, ids_host = build_batch(roots, bases, step.slots(), step.sides, valid,
                                                   dtype, device, self.pad_id)
            timer.lap("inputs")
            t1 = time.perf_counter()
            old_len = valid.shape[1]  # valid has a column per cache slot (kv.seq_length(cache))
            logits = self.model(input_ids=ids, position_ids=pos, attention_mask=mask,
                                cache=cache, use_cache=True).logits  # [B, q, V]
            _sync(device)  # no extra wait: the reduction's copy waits for it anyway
            if checked is None:  # the cache's layers, once (kv.keep_new does not check them)
                checked = kv.layers(cache)
            timer.lap("forward")
            argmax, top = self._reduce(logits)  # [B, q] int64, [B, q, k] int64 | None
            timer.lap("reduce")
            t2 = time.perf_counter()
            path, length, counts, keep = self._accept(active, step, logits, argmax, temperature, top_p, gen, work)
            timer.lap("accept")
            self._observe(active, step, counts, ids_host, top)
            timer.lap("observe")
            valid = self._compact(cache, valid, old_len, step, path, length, keep)
            cache, valid, finished = self._drop_finished(cache, valid, active)
            timer.lap("compact")
            timer.steps += 1
            t3 = time.perf_counter()
            for r in active:
                r.stats.draft_seconds += t1 - t0
                r.stats.forward_seconds += t2 - t1
                r.stats.bookkeeping_seconds += t3 - t2
            active = finished

    def _prefill(self, rows: list[Row]):
        """Forward every prompt but its last token (the first step feeds that one)."""
        t0 = time.perf_counter()
        cache = kv.new_cache()
        prompts = [r.context[:-1] for r in rows]
        if max(p.shape[0] for p in prompts) == 0:
            return cache, np.zeros((len(rows), 0), dtype=bool)
        ids, pos, mask, valid = prefill_inputs(prompts, self.model.dtype, self.model.device, self.pad_id)
        self.model(input_ids=ids, position_ids=pos, attention_mask=mask, cache=cache, use_cache=True,
                   logits_to_keep=1)
        for r in rows:
            r.stats.prefill_seconds += time.perf_counter() - t0
        return cache, valid.cpu().numpy()  # [B, S] bool, kept on the host: no device sync to read it

    def _propose(self, rows: list[Row], depth: np.ndarray) -> list[list]:
        """-> trees[r][s]: drafter s's tree for row r (one propose_batch call per drafter)."""
        live = [i for i, d in enumerate(depth.tolist()) if d > 0]
        if not live or not self.drafters:
            return [[_EMPTY] * len(self.drafters) for _ in rows]
        every = len(live) == len(rows)  # the usual case: no gather, one list per drafter as it comes
        ids = [r.index for r in rows] if every else [rows[i].index for i in live]
        contexts = [r.context for r in rows] if every else [rows[i].context for i in live]
        depths = depth if every else depth[live]
        per_source = [d.propose_batch(ids, contexts, self.settings.draft_budget, depths) for d in self.drafters]
        if every:
            return [list(row) for row in zip(*per_source)]
        # rows without a draft share one empty tree (merge_rows skips empty trees, names unread):
        # an empty DraftTree per row and drafter cost ~8 us each at batch 1
        out = [[_EMPTY] * len(self.drafters) for _ in rows]
        for s, trees in enumerate(per_source):
            for i, t in zip(live, trees):
                out[i][s] = t
        return out

    def _sides(self, rows: list[Row]) -> tuple[list, list]:
        if not self._side_bits:
            return [None] * len(rows), [[] for _ in rows]
        riding = [s for s in range(len(self.drafters)) if self._side_bits >> s & 1]
        sides, spans = [], []
        for row in rows:  # per row only with a side-branch drafter (lookahead)
            branches = [None] * len(self.drafters)
            for s in riding:
                branches[s] = self.drafters[s].side_branch(row.index)
            side, span = merge_side(branches)
            sides.append(side)
            spans.append(span)
        return sides, spans

    def _plan(self, rows: list[Row]) -> _Step:
        remaining = np.asarray([r.remaining for r in rows], dtype=np.int64)  # [B]
        depth = np.minimum(self.settings.max_depth, remaining - 1)  # [B]
        trees = self._propose(rows, depth)
        sides, spans = self._sides(rows)
        self.timer.lap("propose")
        merged = merge_rows(trees, self.calibration.factors(), np.maximum(depth, 0),
                            self.settings.count_smoothing, n_sources=len(self.drafters))
        self.timer.lap("merge")
        n_side = np.asarray([0 if s is None else int(s.tokens.shape[0]) for s in sides], dtype=np.int64)
        n, with_side, expected, order = self._budget(merged, n_side, rows)
        if self._side_bits:
            for i in np.flatnonzero(~with_side & (n_side > 0)):
                sides[i], spans[i], n_side[i] = None, [], 0
        kept = kept_nodes(merged, select_rows(merged, n, order))
        for row, size, side in zip(rows, np.diff(kept.starts).tolist(), n_side.tolist()):
            row.stats.budgets.append(size)
            row.stats.side_tokens.append(side)
        self.timer.lap("budget")
        return _Step(merged, kept, sides, spans, expected)

    def _budget(self, merged: MergedTree, n_side: np.ndarray, rows: list[Row]):
        """-> (tree nodes to keep [B], whether each row's side branch rides along [B] bool, draft
        tokens the calibrated estimates expect from those nodes [B] (0 with a fixed budget, where
        the row's trust steers nothing), ranked(merged) or None)."""
        b, limit = len(rows), self.settings.max_tree
        if self.settings.budget != "auto":
            n = np.full(b, min(int(self.settings.budget), limit), dtype=np.int64)
            return n, np.ones(b, dtype=bool), np.zeros(b), None
        order = ranked(merged)
        sizes = np.minimum(np.diff(merged.starts), limit)  # [B]
        width = int(sizes.max()) if b else 0
        rank = np.arange(len(merged)) - merged.starts[merged.row[order]]
        take = rank < limit
        calibrated = np.zeros((b, width))  # [B, L] each row's path probabilities, descending
        calibrated[merged.row[order][take], rank[take]] = merged.path_p[order][take]
        trust = np.asarray([min(r.trust(TRUST_PRIOR), TRUST_MAX) for r in rows])  # [B]
        p = np.minimum(calibrated * trust[:, None], 1.0)
        n, _ = self.cost.best_rows(p, sizes)
        with_side = np.zeros(b, dtype=bool)
        for i in np.flatnonzero(n_side):  # the side branch's state is sequential: per riding row
            n[i], with_side[i] = self._auto_budget(p[i, : sizes[i]], int(n_side[i]), limit)
        cum = np.concatenate((np.zeros((b, 1)), np.cumsum(calibrated, axis=1)), axis=1)
        return n, with_side, cum[np.arange(b), n], order

    def _auto_budget(self, p: np.ndarray, n_side: int, limit: int) -> tuple[int, bool]:
        """The cost model's choice for path probabilities p [<= limit] descending.

        The side branch (a lookahead window) costs its tokens in every forward it rides in and
        pays back later through the n-grams it harvests: it goes when the cost model, crediting
        it with the tokens its harvest recently brought per step, expects more tokens per second
        with it than without. A skipped window still rides after `_explore_after` steps, so that
        estimate stays fresh; that interval doubles (up to SIDE_EXPLORE[1]) while only exploration
        sends it and resets once it pays: lookahead alone on code cost 11% with a fixed 8.
        """
        n0, rate0 = self.cost.best(p, 0, limit)
        if n_side == 0:
            return n0, False
        n1, rate1 = self.cost.best(p, n_side, limit, bonus=self._side_gain)
        pays = rate1 > rate0
        if pays or self._steps_without_side >= self._explore_after:
            lo, hi = SIDE_EXPLORE
            self._explore_after = lo if pays else min(2 * self._explore_after, hi)
            self._steps_without_side = 0
            return n1, True
        self._steps_without_side += 1
        return n0, False

    def _reduce(self, logits: torch.Tensor) -> tuple[np.ndarray, np.ndarray | None]:
        """-> (argmax [B, q] int64, top-k [B, q, k] int64 or None): decoder.logits.top_tokens."""
        return logits_pass.top_tokens(logits, self._topk)

    def _accept(self, rows: list[Row], step: _Step, logits, argmax: np.ndarray, temperature, top_p, gen,
                work: "_Workspace"):
        """Verify every row, commit its tokens, credit sources, update calibration and the side
        branches. -> (path [B, D] kept-node indices, -1 padded; path length [B]; tokens committed [B];
        the cache slots to keep, (idx [B, 1 + W], valid [B, 1 + W], crop) or None: _compact makes them)."""
        kept = step.kept
        remaining = np.asarray([r.remaining for r in rows], dtype=np.int64)  # [B]
        if temperature > 0:
            path, length, tokens = self._sample(kept, logits, temperature, top_p, gen)
            cut, reasons = commit_lengths(tokens, length, remaining, self.eos)
            self._calibrate(step, path, tokens)
            keep = None
        else:  # one C call: acceptance, commit cut, calibration, kept cache slots
            path, length, tokens, cut, reasons, keep = self._settle(step, argmax, remaining, work)
        committed = np.zeros(len(rows), dtype=np.int64)
        sizes = np.diff(kept.starts).tolist()
        # per row: the commit itself and a few scalar updates (Python scalars: numpy's cost ~1 us each)
        for b, (row, n, size, expected, accepted) in enumerate(
                zip(rows, cut.tolist(), sizes, step.expected.tolist(), length.tolist())):
            committed[b] = row.append(tokens[b, :n], reasons[b], self.tokenizer)
            row.stats.steps += 1
            row.stats.tree_tokens += size
            row.observe_step(expected, accepted, TRUST_DECAY)
        self._credit(rows, step, path, np.minimum(committed, length))
        for b, span in enumerate(step.spans):
            n_tree = int(sizes[b])
            for i, start, m in span:
                s = 1 + n_tree + start
                self.drafters[i].side_result(rows[b].index, argmax[b, s : s + m].astype(np.int64))
        return path, length, committed, keep

    def _settle(self, step: _Step, argmax: np.ndarray, remaining: np.ndarray, work: "_Workspace"):
        """Greedy: _step.settle (acceptance, cut, calibration update, kept slots) into the workspace.
        -> (path [B, Wa], length, tokens [B, Wa + 1], cut, reasons, (idx [B, 1 + W], valid, crop))."""
        k, m, b = step.kept, step.merged, remaining.shape[0]
        path, tokens, length, cut, reason, idx, valid = work.views(b)
        cal = self.calibration
        calibrate = None
        if cal.settings.enabled and len(m):
            calibrate = (m.tokens, m.parents, m.depths, m.starts, m.raw_p, m.bins, float(cal.settings.decay),
                         cal.predicted, cal.hits)
        w, crop, updated = _step.settle(k.tokens, k.parents, k.depths, k.starts, k.local, k.merged,
                                        argmax, remaining, self.eos, calibrate, path, tokens, length, cut,
                                        reason, idx, valid)
        if updated:
            cal.changed()
        reasons = [STOP_REASONS[i] for i in reason.tolist()]
        return path, length, tokens, cut, reasons, (idx[:, : 1 + w], valid[:, : 1 + w], crop)

    def _sample(self, kept: Kept, logits, temperature, top_p, gen):
        """Lossless sampling, row by row (each row draws from its own distribution in order)."""
        b = kept.starts.shape[0] - 1
        paths, outs = [], []
        for r in range(b):
            lo, hi = int(kept.starts[r]), int(kept.starts[r + 1])
            par = kept.parents[lo:hi]
            local = np.where(par >= 0, par - lo, -1)
            path, out = sample_accept(kept.tokens[lo:hi], local, logits[r], temperature, top_p, gen)
            paths.append(path + lo)
            outs.append(out)
        width = max(p.shape[0] for p in paths)
        path = np.full((b, width), -1, dtype=np.int64)
        tokens = np.zeros((b, width + 1), dtype=np.int64)
        for r, (p, o) in enumerate(zip(paths, outs)):
            path[r, : p.shape[0]] = p
            tokens[r, : o.shape[0]] = o
        return path, np.asarray([p.shape[0] for p in paths], dtype=np.int64), tokens

    def _credit(self, rows: list[Row], step: _Step, path: np.ndarray, n: np.ndarray) -> None:
        """Count the committed draft tokens per source and feed the side branch's yield."""
        hits = np.zeros((len(rows), len(self.drafters)), dtype=np.int64)  # [B, S]
        only_side = np.empty(len(rows))  # [B] committed tokens only side-branch sources proposed
        _step.credit(step.merged.sources, step.kept.merged, path, n, self._side_bits, hits, only_side)
        if self._side_bits:
            for value in only_side.tolist():  # sequential EMA over rows, as before
                self._side_gain += SIDE_GAIN_RATE * (value - self._side_gain)
        for r, src in zip(*np.nonzero(hits)):
            stats, name = rows[r].stats.accepted_by_source, self.drafters[src].name
            stats[name] = stats.get(name, 0) + int(hits[r, src])

    def _calibrate(self, step: _Step, path: np.ndarray, tokens: np.ndarray) -> None:
        """Every merged node whose parent the model went through was tested (see Calibration)."""
        merged = step.merged
        if not len(merged):
            return
        after = np.empty(len(merged), dtype=np.int64)  # [n] the model's token after each node's parent
        _step.after(merged.parents, merged.starts, step.kept.merged, path, tokens, after)
        self.calibration.update_rows(merged, after)

    def _observe(self, rows: list[Row], step: _Step, counts: np.ndarray, ids: np.ndarray, top) -> None:
        """Drafter updates: the committed tokens of every row, then the verified top-k."""
        index = [r.index for r in rows]
        accepted = [r.buf[r.length - c : r.length].copy() for r, c in zip(rows, counts.tolist())]
        for d in self.drafters:
            d.observe_batch(index, accepted)
        if top is None:
            return
        sizes = 1 + np.diff(step.kept.starts)  # last committed token + tree slots
        if sizes.shape[0] == 1:  # one row: its first slots (views, no boolean gather)
            topk, tokens = top[0, : sizes[0]], ids[0, : sizes[0]]
        else:
            width = int(sizes.max())
            real = np.arange(width)[None, :] < sizes[:, None]  # [B, w]
            topk, tokens = top[:, :width][real], ids[:, :width][real]  # [n, k], [n]
        for d in self.drafters:
            if getattr(d, "topk", 0) > 0:
                d.observe_topk(tokens, topk[:, : d.topk])

    def _compact(self, cache, valid: np.ndarray, old_len: int, step: _Step, path: np.ndarray,
                 length: np.ndarray, keep=None) -> np.ndarray:
        """Gather each row's kept slots (its last token, then its accepted path) behind its old
        ones: one gather per layer for every row; shorter rows leave masked holes.
        keep: (idx [B, 1 + D], valid [B, 1 + D], crop) when _settle made them."""
        if keep is None:
            b, w = path.shape
            idx = np.empty((b, 1 + w), dtype=np.int64)  # [B, 1 + D] new slots kept, 0 = hole
            new_valid = np.empty((b, 1 + w), dtype=bool)
            crop = _step.compact(step.kept.local, path, length, idx, new_valid)
        else:
            idx, new_valid, crop = keep
        kv.keep_new(cache, old_len, idx, crop)
        return np.concatenate([valid, new_valid], axis=1)  # [B, S + 1 + D] bool

    def _drop_finished(self, cache, valid: np.ndarray, rows: list[Row]):
        live = [i for i, r in enumerate(rows) if not r.done]
        for r in rows:
            if r.done:
                self._finish(r, r.stats.stop_reason)
        if len(live) == len(rows):
            return cache, valid, rows
        if not live:
            return cache, valid, []
        valid = valid[live]
        any_valid = valid.any(axis=0)
        start = int(np.argmax(any_valid)) if any_valid.any() else valid.shape[1]
        kv.select(cache, torch.tensor(live, dtype=torch.long), start)  # drops the rows and the columns now all holes
        return cache, valid[:, start:], [rows[i] for i in live]

    def _finish(self, row: Row, reason: str) -> None:
        row.done = True
        row.stats.stop_reason = reason
        for d in self.drafters:
            d.end(row.index)

    def _failures(self) -> int:
        return sum(int(getattr(d, "failures", 0) or 0) for d in self.drafters)

    def _references(self, references, n_rows: int) -> list[list[np.ndarray]]:
        """-> per row, a list of [r] int64 reference token arrays.

        references: a list of references (str or token id lists) shared by every row, or, for a
        batch, one such list per row (a list of n_rows lists whose items are str or lists).
        """
        if not references:
            return [[] for _ in range(n_rows)]
        per_row = len(references) == n_rows and all(
            isinstance(r, (list, tuple)) and all(isinstance(x, (str, list, tuple, np.ndarray)) for x in r)
            for r in references
        ) and any(len(r) for r in references)
        lists = references if per_row else [references] * n_rows
        return [[self._encode_ref(r) for r in lst] for lst in lists]

    def _encode_ref(self, ref) -> np.ndarray:
        if isinstance(ref, str):
            return np.asarray(self.tokenizer(ref, add_special_tokens=False)["input_ids"], dtype=np.int64)
        return np.asarray(list(ref), dtype=np.int64).reshape(-1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_EMPTY = DraftTree.empty("none")


class _Workspace:
    """The greedy step's output arrays for up to `rows` rows and paths of up to `depth` nodes,
    made once per decode (each step takes the first B rows: contiguous views). Nothing keeps them
    past the step: the rows copy their tokens, the cache gathers with the indices, valid is
    concatenated."""

    def __init__(self, rows: int, depth: int):
        w = max(int(depth), 1)
        self.path = np.empty((rows, w), dtype=np.int64)  # [B, Wa]
        self.tokens = np.empty((rows, w + 1), dtype=np.int64)  # [B, Wa + 1]
        self.small = np.empty((3, rows), dtype=np.int64)  # length, cut, reason [B]
        self.idx = np.empty((rows, w + 1), dtype=np.int64)  # [B, 1 + Wa]
        self.valid = np.empty((rows, w + 1), dtype=bool)  # [B, 1 + Wa]

    def views(self, b: int) -> tuple[np.ndarray, ...]:
        """-> path, tokens, length, cut, reason, idx, valid for b rows."""
        small = self.small[:, :b]  # each of its rows stays contiguous
        return (self.path[:b], self.tokens[:b], small[0], small[1], small[2], self.idx[:b], self.valid[:b])


def _check_sampling(max_new_tokens, temperature, top_p) -> None:
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
