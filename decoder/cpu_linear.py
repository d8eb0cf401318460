"""Linear layers with their weight packed once for oneDNN, for float32 inference on the CPU.

A verification forward multiplies every weight by a handful of rows (1 + tree nodes). MKL's
sgemm re-packs the weight on every call for such skinny products, so on the project's 2-core
AVX2 CPU (SmolLM2, 300-token cache) 2 new tokens cost 1.75x one token, and the cost model could
never afford a tree. oneDNN with the weight packed once (the kernel torch's inductor uses for
frozen CPU linears) measured, dense -> packed: q=1 57 -> 48 ms, q=2 94 -> 53, q=4 101 -> 62,
q=16 110 -> 84. Plain greedy `generate` on the same model gets the q=1 gain too, so speed-ups
stay measured against the same model. Logits differ from the dense ones by ~1e-4 (another
summation order), as they already do between MKL's matrix-vector and matrix-matrix kernels.

The model instance's `nn.Linear` modules are replaced by `PackedLinear`; transformers' code is
untouched. Only float32 on the CPU: bfloat16 packing needs AVX512-BF16/AMX, and CUDA has its own
kernels.
"""
from __future__ import annotations

import torch
from torch import nn

# oneDNN picks its blocking from this batch-size hint; 64 measured ~8% faster at q=16 than 16
# and ~30% faster at q=2..4 than 1 on SmolLM2.
PACK_HINT = 64


class PackedLinear(nn.Module):
    """y = x W^T + b with W pre-packed by oneDNN; a drop-in for a float32 CPU `nn.Linear`."""

    def __init__(self, linear: nn.Linear, hint: int = PACK_HINT) -> None:
        super().__init__()
        weight = linear.weight.detach()  # [out, in] float32
        self.out_features, self.in_features = int(weight.shape[0]), int(weight.shape[1])
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, hint)
        self.bias = None if linear.bias is None else linear.bias.detach()  # [out]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.shape[-1] == self.in_features, f"expected [..., {self.in_features}], got {tuple(x.shape)}"
        flat = x.reshape(-1, self.in_features)  # [rows, in]
        y = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")
        return y.reshape(*x.shape[:-1], self.out_features)  # [..., out]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN"


def packable(linear: nn.Module) -> bool:
    w = getattr(linear, "weight", None)
    return (
        type(linear) is nn.Linear and w is not None and w.device.type == "cpu"
        and w.dtype == torch.float32 and torch.backends.mkldnn.is_available()
    )


def pack_linears(model: nn.Module, hint: int = PACK_HINT) -> int:
    """Replace every packable `nn.Linear` of `model` in place; -> how many were replaced.

    Call after the model is on its device: the packed weights are not parameters and do not
    follow `model.to(...)`. A build of torch without the oneDNN op leaves the model as it was.
    """
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if packable(child)
    ]
    try:
        packed = [PackedLinear(child, hint) for _, _, child in swaps]
    except (RuntimeError, AttributeError):  # no oneDNN reorder op in this torch build / CPU
        return 0
    for (parent, name, _), new in zip(swaps, packed):
        setattr(parent, name, new)
    return len(packed)
