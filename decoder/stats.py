"""Settings and results of a speculative decode."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from decoder.calibration import CalibrationSettings


@dataclass(frozen=True)
class DecoderSettings:
    budget: int | str = "auto"  # "auto": tree size from the cost model each step; N: keep N nodes
    max_depth: int = 16  # deepest draft node verified
    max_tree: int = 128  # most tree nodes in one forward (per row)
    draft_budget: int = 64  # nodes asked of each drafter per step
    eos_token_ids: tuple[int, ...] | None = None  # None: every eos id of the model's generation config
    device: str | None = None  # from_pretrained only; an explicit model keeps its own
    dtype: str | None = None  # from_pretrained only: float32 | bfloat16 | float16
    packed_linears: bool = True  # from_pretrained only: CPU float32 weights packed for oneDNN
    count_smoothing: float = 1.0  # p = count / (parent count + this): thin evidence is discounted
    calibrate: bool = True
    calibration_prior: float = 4.0
    calibration_decay: float = 0.995
    warmup_context: int = 300  # cache length the cost model is measured with
    warmup_repeats: int = 3

    def __post_init__(self) -> None:
        b = self.budget
        if not (b == "auto" or (isinstance(b, int) and not isinstance(b, bool) and b >= 1)):
            raise ValueError(f"budget must be 'auto' or an integer >= 1, got {b!r}")
        for name in ("max_depth", "max_tree", "draft_budget", "warmup_context", "warmup_repeats"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.eos_token_ids is not None:
            ids = tuple(int(i) for i in self.eos_token_ids)
            if any(i < 0 for i in ids):
                raise ValueError(f"eos_token_ids must be >= 0, got {ids}")
            object.__setattr__(self, "eos_token_ids", ids)
        if self.dtype is not None and self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if not self.count_smoothing >= 0:
            raise ValueError(f"count_smoothing must be >= 0, got {self.count_smoothing!r}")
        self.calibration()  # validates the calibration fields

    def calibration(self) -> CalibrationSettings:
        return CalibrationSettings(
            enabled=self.calibrate, prior=self.calibration_prior, decay=self.calibration_decay
        )


@dataclass
class GenerationStats:
    steps: int = 0  # verification forwards (the prompt prefill not counted)
    new_tokens: int = 0
    accepted_by_source: dict[str, int] = field(default_factory=dict)  # draft tokens accepted; a
    # token proposed by two sources counts for both
    draft_seconds: float = 0.0
    forward_seconds: float = 0.0
    bookkeeping_seconds: float = 0.0
    prefill_seconds: float = 0.0
    seconds: float = 0.0  # wall clock of the whole call (batch: of the whole batch)
    datastore_failures: int = 0
    budgets: list[int] = field(default_factory=list)  # tree nodes kept, per step
    tree_tokens: int = 0  # tree nodes verified in total
    side_tokens: list[int] = field(default_factory=list)  # side-branch (lookahead) tokens, per step
    latency_curve: dict[int, float] | None = None  # cost model {q new tokens: seconds}
    stop_reason: str = ""  # "eos" | "stop" | "length"

    @property
    def tokens_per_step(self) -> float:
        return self.new_tokens / self.steps if self.steps else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out["tokens_per_step"] = self.tokens_per_step
        if self.latency_curve is not None:
            out["latency_curve"] = {str(k): v for k, v in self.latency_curve.items()}
        return out


@dataclass
class Generation:
    text: str
    token_ids: list[int]  # new tokens only (an EOS that ended the decode included, as generate does)
    prompt_ids: list[int]
    stats: GenerationStats
