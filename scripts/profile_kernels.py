"""Run a few (op, direction, dtype, hidden) cases once each between
cudaProfilerStart/Stop, for `ncu --profile-from-start off`; with --time, also
print each case's median time and % of the copy bandwidth instead.

  ncu --profile-from-start off --clock-control none --section SpeedOfLight \
      python scripts/profile_kernels.py ln:fwd:bf16:4096 ln:bwd:bf16:4096
  python scripts/profile_kernels.py --time ln:fwd:bf16:4096
"""
import argparse

import torch

import fused_layernorm  # noqa: F401  (registers the ops)
from fused_layernorm.bench import cases, timing

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
OPS = torch.ops.fused_layernorm


def make_call(op, direction, dtype, hidden, log2_numel):
    rows = (1 << log2_numel) // hidden
    name = "layernorm" if op == "ln" else "rmsnorm"
    inp = cases.make_inputs(name, rows, hidden, DT[dtype], "cuda")
    x, w, b, dy = inp.x, inp.w.detach(), None if inp.b is None else inp.b.detach(), inp.dy
    if op == "ln":
        y, mean, rstd = OPS.layer_norm_fwd(x, [hidden], w, b, 1e-5)
        fwd = lambda: OPS.layer_norm_fwd(x, [hidden], w, b, 1e-5)
        bwd = lambda: OPS.layer_norm_bwd(dy, x, [hidden], mean, rstd, w, b, [True, True, True])
    else:
        y, rstd = OPS.rms_norm_fwd(x, [hidden], w, 1e-6)
        fwd = lambda: OPS.rms_norm_fwd(x, [hidden], w, 1e-6)
        bwd = lambda: OPS.rms_norm_bwd(dy, x, [hidden], rstd, w, [True, True])
    nbytes = cases.bytes_moved(name, direction, rows, hidden, DT[dtype])
    return (fwd if direction == "fwd" else bwd), nbytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="+", help="op:dir:dtype:hidden, op ln|rms, dir fwd|bwd")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--log2-numel", type=int, default=27)
    a = ap.parse_args()
    copy_gbs = timing.copy_bandwidth("cuda")["gbps"] if a.time else None
    flush = timing.L2Flush() if a.time else None
    for spec in a.cases:
        op, direction, dtype, hidden = spec.split(":")
        call, nbytes = make_call(op, direction, dtype, int(hidden), a.log2_numel)
        call()
        torch.cuda.synchronize()
        if a.time:
            us, _ = timing.cuda_time_us(call, reps=25, warmup=3, flush=flush)
            gbs = nbytes / us / 1e3
            print(f"{spec:24s} {us:9.1f} us {gbs:8.0f} GB/s {100 * gbs / copy_gbs:5.1f}% of copy")
        else:
            torch.cuda.profiler.start()
            call()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
    if a.time:
        print(f"copy bandwidth {copy_gbs:.0f} GB/s")


if __name__ == "__main__":
    main()
