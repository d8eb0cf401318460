"""Per-row decode state: committed tokens, stop conditions (max_new_tokens, EOS, stop strings)."""
from __future__ import annotations

import numpy as np

from decoder import _step
from decoder.stats import GenerationStats
from decoder.tree import as_i64


class Row:
    def __init__(self, index: int, prompt: np.ndarray, max_new: int, eos: np.ndarray, stop: list[str]):
        self.index = index  # the row id drafters see (position in the caller's batch)
        self.prompt_len = int(prompt.shape[0])
        self.max_new = max_new
        self.buf = np.empty(self.prompt_len + max_new, dtype=np.int64)  # [p + max_new] prompt + output
        self.buf[: self.prompt_len] = prompt
        self.length = self.prompt_len
        self.eos = eos  # [e] int64
        self.stop = [s for s in stop if s]
        self.stop_window = max((len(s) for s in self.stop), default=0) + 2  # tokens of earlier text
        self.done = False
        self.stats = GenerationStats()
        self.failures0 = 0
        # Draft tokens accepted vs expected by the calibrated estimates, over this row's recent
        # steps (decayed sums): how far this prompt departs from what calibration learnt overall.
        self.accepted_recent = 0.0
        self.expected_recent = 0.0

    @property
    def context(self) -> np.ndarray:
        return self.buf[: self.length]

    @property
    def output(self) -> np.ndarray:
        return self.buf[self.prompt_len : self.length]

    def trust(self, prior: float) -> float:
        """Factor on this row's path probabilities: (accepted + prior) / (expected + prior)."""
        return (self.accepted_recent + prior) / (self.expected_recent + prior)

    def observe_step(self, expected: float, accepted: int, decay: float) -> None:
        self.expected_recent = decay * self.expected_recent + expected
        self.accepted_recent = decay * self.accepted_recent + accepted

    @property
    def remaining(self) -> int:
        return self.max_new - (self.length - self.prompt_len)

    def append(self, tokens: np.ndarray, reason: str, tokenizer) -> int:
        """Append tokens (already cut at max_new_tokens and the first EOS by `commit_lengths`),
        then cut at the first stop string; reason: "length" | "eos" | "" (go on). -> how many."""
        start, n = self.length, int(tokens.shape[0])
        self.buf[start : start + n] = tokens
        self.length += n
        if self.stop and n:
            cut = self._stop_cut(start, tokenizer)
            if cut is not None:
                self.length, reason = cut, "stop"
                n = cut - start
        if reason:
            self.done, self.stats.stop_reason = True, reason
        return n

    def _stop_cut(self, start: int, tokenizer) -> int | None:
        """Length of the context ending with the first token that completes a stop string."""
        lo = max(self.prompt_len, start - self.stop_window)
        if not self._has_stop(tokenizer.decode(self.buf[lo : self.length].tolist())):
            return None
        for end in range(start + 1, self.length + 1):  # once per decode: the step that stops
            if self._has_stop(tokenizer.decode(self.buf[lo:end].tolist())):
                return end
        return self.length

    def _has_stop(self, text: str) -> bool:
        return any(s in text for s in self.stop)

    def text(self, tokenizer) -> str:
        text = tokenizer.decode(self.output.tolist(), skip_special_tokens=True)
        if self.stats.stop_reason == "stop":  # cut right after the first stop string
            ends = [text.find(s) + len(s) for s in self.stop if s in text]
            if ends:
                text = text[: min(ends)]
        return text


def commit_lengths(tokens: np.ndarray, length: np.ndarray, remaining: np.ndarray,
                   eos: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Every row's accepted path + bonus (tokens [B, D+1], row r's first length[r] + 1) cut at
    its remaining budget and after its first EOS (generate keeps the EOS token).
    -> (tokens to append [B] int64, stop reason per row: "length" | "eos" | "").
    One C call (decoder/_step.c `cut`; the numpy version is in tests/decoder_step_reference.py)."""
    b = length.shape[0]
    assert tokens.ndim == 2 and tokens.shape[0] == b and remaining.shape == (b,), "commit_lengths shapes"
    n = np.empty(b, dtype=np.int64)
    reason = np.empty(b, dtype=np.int64)
    _step.cut(as_i64(tokens), as_i64(length), as_i64(remaining), as_i64(eos), n, reason)
    return n, [STOP_REASONS[i] for i in reason.tolist()]


STOP_REASONS = ("", "length", "eos")  # the reason codes of _step.cut and _step.settle
