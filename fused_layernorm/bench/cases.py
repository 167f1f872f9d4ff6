"""What is measured: shapes, dtypes, inputs and the minimal bytes each case moves."""
from dataclasses import dataclass
from typing import Optional

import torch

OPS = ("layernorm", "rmsnorm")
DIRECTIONS = ("fwd", "bwd", "fwdbwd")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
EPS = {"layernorm": 1e-5, "rmsnorm": 1e-6}

# GPU: every case holds 2**27 elements (256 MiB of bf16), rows = numel // hidden.
HIDDEN = (256, 512, 768, 1024, 2048, 4096, 5120, 7168, 8192, 12288, 16384, 32768, 65536, 131072, 262144)
QUICK_HIDDEN = (1024, 4096, 8192, 65536)
GPU_DTYPES = ("bf16", "fp16", "fp32")
QUICK_DTYPES = ("bf16", "fp32")
LOG2_NUMEL = 27

# Small shapes: per-call cost through the Python API, what an eager user pays.
SMALL_ROWS = (1, 8, 64, 512)
SMALL_HIDDEN = 4096
SMALL_DTYPE = "bf16"
SMALL_DIRECTIONS = ("fwd", "fwdbwd")

# CPU mode: hidden 128 to 16384 (the range the CPU backend is held to), a few
# minutes on two cores.
CPU_ROWS = 4096
CPU_HIDDEN = (128, 1024, 4096, 16384)
CPU_DTYPES = ("bf16", "fp32")
CPU_DIRECTIONS = ("fwd", "fwdbwd")


@dataclass
class Inputs:
    x: torch.Tensor  # (rows, hidden), no grad; callers make their own leaves
    w: torch.Tensor  # (hidden,), leaf with requires_grad
    b: Optional[torch.Tensor]  # (hidden,) for layernorm, None for rmsnorm
    dy: torch.Tensor  # (rows, hidden), the incoming gradient; never modify


def make_inputs(op: str, rows: int, hidden: int, dtype: torch.dtype, device, seed: int = 0) -> Inputs:
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=dtype)

    x = randn(rows, hidden).add_(0.5)  # a non-zero mean exercises the centring
    w = randn(hidden).mul_(0.1).add_(1.0).requires_grad_()
    b = randn(hidden).mul_(0.1).requires_grad_() if op == "layernorm" else None
    dy = randn(rows, hidden)
    return Inputs(x, w, b, dy)


def bytes_moved(op: str, direction: str, rows: int, hidden: int, dtype: torch.dtype) -> int:
    """Minimal traffic: every tensor read once and written once.

    fwd: x read, y written, weight (+ bias) read.
    bwd: x and dy read, dx written, weight read, dweight (+ dbias) written.
    fwdbwd: the sum of both.
    """
    es = torch.empty((), dtype=dtype).element_size()
    big = rows * hidden * es
    vec = hidden * es
    n_params = 2 if op == "layernorm" else 1
    fwd = 2 * big + n_params * vec
    bwd = 3 * big + (1 + n_params) * vec
    return {"fwd": fwd, "bwd": bwd, "fwdbwd": fwd + bwd}[direction]
