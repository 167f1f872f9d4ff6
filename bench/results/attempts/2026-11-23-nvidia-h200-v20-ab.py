"""[experiment, not kept] Times cases against the fused_layernorm on PYTHONPATH; % of copy."""
import sys
import torch
from fused_layernorm.bench import cases, timing

OPS = torch.ops.fused_layernorm
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def make(op, direction, dtype, hidden, rows=None):
    rows = rows or (1 << 27) // hidden
    name = "rmsnorm" if op.startswith("rms") else "layernorm"
    inp = cases.make_inputs(name, rows, hidden, DT[dtype], "cuda")
    x, w, dy = inp.x, inp.w.detach(), inp.dy
    b = None if (op not in ("ln", "lnmw") or inp.b is None) else inp.b.detach()
    if op == "lnmw":
        w, b = w.float(), b.float()
    if name == "layernorm":
        y, mean, rstd = OPS.layer_norm_fwd(x, [hidden], w, b, 1e-5)
        fwd = lambda: OPS.layer_norm_fwd(x, [hidden], w, b, 1e-5)
        bwd = lambda: OPS.layer_norm_bwd(dy, x, [hidden], mean, rstd, w, b, [True, True, b is not None])
        ref = torch.nn.functional.layer_norm(x[:64].double(), [hidden], w.double(),
                                             None if b is None else b.double(), 1e-5)
    else:
        y, rstd = OPS.rms_norm_fwd(x, [hidden], w, 1e-6)
        fwd = lambda: OPS.rms_norm_fwd(x, [hidden], w, 1e-6)
        bwd = lambda: OPS.rms_norm_bwd(dy, x, [hidden], rstd, w, [True, True])
        xd = x[:64].double()
        ref = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    err = (y[:64].double() - ref).abs().max().item()
    tol = 0.1 if dtype != "fp32" else 1e-4
    nb = cases.bytes_moved(name, direction, rows, hidden, DT[dtype])
    if op == "lnmw":
        nb += 2 * hidden * 2
    if b is None and name == "layernorm":
        nb -= hidden * x.element_size() * (1 if direction == "fwd" else 1)
    return (fwd if direction == "fwd" else bwd), nb, err < tol, err


def main():
    copy = timing.copy_bandwidth("cuda")["gbps"]
    flush = timing.L2Flush()
    tag = sys.argv[1]
    for spec in sys.argv[2:]:
        f = spec.split(":")
        op, d, dt, h = f[:4]
        call, nb, ok, err = make(op, d, dt, int(h), int(f[4]) if len(f) > 4 else None)
        call()
        torch.cuda.synchronize()
        us, _ = timing.cuda_time_us(call, reps=25, warmup=3, flush=flush)
        print(f"{tag} {spec:24s} {us:9.1f} us {100 * nb / us / 1e3 / copy:6.1f} %{'' if ok else f'  BAD {err:.2e}'}",
              flush=True)
        del call
        torch.cuda.empty_cache()
    print(f"{tag} copy {copy:.0f} GB/s")


if __name__ == "__main__":
    main()
