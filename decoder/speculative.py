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
from typing import Sequence

import numpy as np
import torch

from decoder import kv
from decoder.attention import RowInput, build_inputs, prefill_inputs
from decoder.calibration import Calibration
from decoder.cost import CostModel, measure_latency
from decoder.drafters.base import Drafter, SideBranch
from decoder.rows import Row
from decoder.stats import DecoderSettings, Generation, GenerationStats
from decoder.tree import MergedTree, merge_trees, select_top, sorted_path_probs, subtree
from decoder.verify import greedy_accept, sample_accept

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


class _Plan:
    """One row's part of a step: its merged trie, the kept nodes and its side branch."""

    def __init__(self, row: Row, merged: MergedTree, keep: np.ndarray, side, spans, expected: float):
        self.row, self.merged, self.keep, self.spans = row, merged, keep, spans
        self.expected = expected  # draft tokens the calibrated estimates expect from `keep`
        tokens, parents, depths = subtree(merged, keep)
        self.input = RowInput(
            root=int(row.buf[row.length - 1]), base=row.length - 1,
            tokens=tokens, parents=parents, depths=depths, side=side,
        )


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
        self._side_gain = 1.0  # tokens a step, optimistic so the window gets tried first
        self._steps_without_side = 0
        self._explore_after = SIDE_EXPLORE[0]  # skipped steps before the side branch rides anyway

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls, spec: str = "smollm2", gguf_file: str | None = None, datastore=None, address: str | None = None,
        drafters=("retrieval",), budget="auto", device=None, dtype=None, drafter_options=None,
        **settings_kw,
    ) -> "SpeculativeDecoder":
        """drafter_options: {drafter name: constructor keywords}, e.g. {"retrieval": {"min_count": 4}}."""
        from decoder.drafters.registry import make_drafters
        from decoder.models import load_model

        if dtype is not None and not isinstance(dtype, str):
            dtype = str(dtype).removeprefix("torch.")  # torch.bfloat16 -> "bfloat16"
        device = None if device is None else str(device)
        settings = DecoderSettings(budget=budget, device=device, dtype=dtype, **settings_kw)
        model, tokenizer = load_model(spec, gguf_file=gguf_file, dtype=settings.dtype, device=device,
                                      pack=settings.packed_linears)
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
        while active:
            plans = self._draft(active)
            t1 = time.perf_counter()
            ids, pos, mask = build_inputs([p.input for p in plans], valid, self.model.dtype,
                                          self.model.device, self.pad_id)
            old_len = kv.seq_length(cache)
            logits = self.model(input_ids=ids, position_ids=pos, attention_mask=mask,
                                cache=cache, use_cache=True).logits  # [B, q, V]
            argmax = logits.argmax(dim=-1).cpu().numpy()  # [B, q] int64 (syncs the device)
            t2 = time.perf_counter()
            keep = self._accept(plans, logits, argmax, temperature, top_p, gen)
            valid = self._compact(cache, valid, old_len, keep)
            self._observe_topk(plans, ids, logits)
            cache, valid, active = self._drop_finished(cache, valid, active)
            t3 = time.perf_counter()
            for p in plans:
                p.row.stats.forward_seconds += t2 - t1
                p.row.stats.bookkeeping_seconds += t3 - t2

    def _prefill(self, rows: list[Row]):
        """Forward every prompt but its last token (the first step feeds that one)."""
        t0 = time.perf_counter()
        cache = kv.new_cache()
        prompts = [r.context[:-1] for r in rows]
        if max(p.shape[0] for p in prompts) == 0:
            return cache, torch.zeros(len(rows), 0, dtype=torch.bool, device=self.model.device)
        ids, pos, mask, valid = prefill_inputs(prompts, self.model.dtype, self.model.device, self.pad_id)
        self.model(input_ids=ids, position_ids=pos, attention_mask=mask, cache=cache, use_cache=True,
                   logits_to_keep=1)
        for r in rows:
            r.stats.prefill_seconds += time.perf_counter() - t0
        return cache, valid

    def _draft(self, rows: list[Row]) -> list[_Plan]:
        plans = []
        for row in rows:
            t0 = time.perf_counter()
            depth = min(self.settings.max_depth, row.remaining - 1)
            trees = [
                d.propose(row.index, row.context, self.settings.draft_budget, depth) if depth > 0
                else _empty(d) for d in self.drafters
            ]
            side, spans = merge_side([d.side_branch(row.index) for d in self.drafters])
            t1 = time.perf_counter()
            merged = merge_trees(trees, self.calibration.factors(), max_depth=max(depth, 0),
                                 smoothing=self.settings.count_smoothing)
            n_side = 0 if side is None else int(side.tokens.shape[0])
            n, with_side, expected = self._budget(merged, n_side, row)
            if not with_side:
                side, spans, n_side = None, [], 0
            keep = select_top(merged, n)
            plans.append(_Plan(row, merged, keep, side, spans, expected))
            row.stats.budgets.append(int(keep.shape[0]))
            row.stats.side_tokens.append(n_side)
            row.stats.draft_seconds += t1 - t0
            row.stats.bookkeeping_seconds += time.perf_counter() - t1
        return plans

    def _budget(self, merged: MergedTree, n_side: int, row: Row) -> tuple[int, bool, float]:
        """-> (tree nodes to keep, whether the side branch rides along, draft tokens the
        calibrated estimates expect from those nodes; 0 with a fixed budget, where the row's
        trust steers nothing)."""
        limit = self.settings.max_tree
        if self.settings.budget != "auto":
            return min(int(self.settings.budget), limit), True, 0.0
        calibrated = sorted_path_probs(merged, limit)  # [<= limit] descending
        p = np.minimum(calibrated * min(row.trust(TRUST_PRIOR), TRUST_MAX), 1.0)
        n, with_side = self._auto_budget(p, n_side, limit)
        return n, with_side, float(calibrated[:n].sum())

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

    def _accept(self, plans, logits, argmax, temperature, top_p, gen) -> list[np.ndarray]:
        """Verify each row, commit its tokens, run the per-row hooks; -> new slots to keep per row."""
        keeps = []
        for b, p in enumerate(plans):
            inp, row = p.input, p.row
            if temperature > 0:
                path, tokens = sample_accept(inp.tokens, inp.parents, logits[b], temperature, top_p, gen)
            else:
                path, tokens = greedy_accept(inp.tokens, inp.parents, inp.depths, argmax[b])
            n = row.commit(tokens, self.tokenizer)
            row.stats.steps += 1
            row.stats.tree_tokens += int(inp.tokens.shape[0])
            self._credit(row, p.merged, p.keep[path[:n]])  # path nodes that were committed
            row.observe_step(p.expected, int(path.shape[0]), TRUST_DECAY)
            self.calibration.update(p.merged, np.concatenate(([-1], p.keep[path])), tokens)
            n_tree = int(inp.tokens.shape[0])
            for i, start, m in p.spans:
                s = 1 + n_tree + start
                self.drafters[i].side_result(row.index, argmax[b, s : s + m].astype(np.int64))
            for d in self.drafters:
                d.observe(row.index, row.buf[row.length - n : row.length].copy())
            keeps.append(np.concatenate(([0], 1 + path)).astype(np.int64))
        return keeps

    def _credit(self, row: Row, merged: MergedTree, nodes: np.ndarray) -> None:
        bits = merged.sources[nodes]  # [k]
        if self._side_bits:
            side, other = (bits & self._side_bits) != 0, (bits & ~self._side_bits) != 0  # [k]
            only_side = int((side & ~other).sum())
            self._side_gain += SIDE_GAIN_RATE * (only_side - self._side_gain)
        for s, d in enumerate(self.drafters):
            hits = int(((bits >> s) & 1).sum())
            if hits:
                row.stats.accepted_by_source[d.name] = row.stats.accepted_by_source.get(d.name, 0) + hits

    def _compact(self, cache, valid: torch.Tensor, old_len: int, keeps: list[np.ndarray]) -> torch.Tensor:
        """Gather each row's kept slots behind its old ones; shorter rows leave masked holes."""
        width = max(k.shape[0] for k in keeps)
        idx = np.zeros((len(keeps), width), dtype=np.int64)  # [B, K] holes repeat slot 0
        new_valid = np.zeros((len(keeps), width), dtype=bool)
        for b, k in enumerate(keeps):
            idx[b, : k.shape[0]] = k
            new_valid[b, : k.shape[0]] = True
        kv.keep_new(cache, old_len, torch.from_numpy(idx))
        return torch.cat([valid, torch.from_numpy(new_valid).to(valid.device)], dim=1)

    def _observe_topk(self, plans, ids: torch.Tensor, logits: torch.Tensor) -> None:
        wanting = [d for d in self.drafters if getattr(d, "topk", 0) > 0]
        if not wanting:
            return
        k = max(d.topk for d in wanting)
        sizes = [1 + p.input.tokens.shape[0] for p in plans]  # last committed token + tree slots
        width = max(sizes)
        real = np.arange(width)[None, :] < np.asarray(sizes)[:, None]  # [B, w]
        # top-k of a view, then pick rows: copying the selected logits out first cost ~1 ms a step
        top = logits[:, :width].topk(k, dim=-1).indices.cpu().numpy()[real]  # [n, k]
        tokens = ids[:, :width].cpu().numpy()[real]  # [n]
        for d in wanting:
            d.observe_topk(tokens, top[:, : d.topk])

    def _drop_finished(self, cache, valid: torch.Tensor, rows: list[Row]):
        live = [i for i, r in enumerate(rows) if not r.done]
        for r in rows:
            if r.done:
                self._finish(r, r.stats.stop_reason)
        if len(live) == len(rows):
            return cache, valid, rows
        if not live:
            return cache, valid, []
        sel = torch.tensor(live, dtype=torch.long, device=valid.device)
        valid = valid.index_select(0, sel)
        any_valid = valid.any(dim=0)
        start = int(torch.nonzero(any_valid)[0]) if bool(any_valid.any()) else valid.shape[1]
        kv.select(cache, sel, start)  # drops the rows and the columns now all holes
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


def _empty(drafter: Drafter):
    from datastore.tree import DraftTree

    return DraftTree.empty(getattr(drafter, "name", "drafter"))


def _check_sampling(max_new_tokens, temperature, top_p) -> None:
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
