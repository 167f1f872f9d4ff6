"""[experiment, not kept] Does the L2 flush's dirty lines cost the timed kernel?  % of copy per flush variant."""
import sys, torch
sys.path.insert(0, "abtmp")
import ab
from fused_layernorm.bench import timing

def zero(self): self.buf.zero_()
def read(self): self.sink = self.buf.view(torch.int64).sum()
def zero_read(self): self.buf.zero_(); self.sink = self.buf.view(torch.int64).sum()
def none(self): pass
V = {"zero": zero, "read": read, "zero_read": zero_read, "none": none}

def eager(dt, h, d):
    rows = (1 << 27) // h
    x = torch.randn(rows, h, device="cuda", dtype=ab.DT[dt])
    w = torch.randn(h, device="cuda", dtype=ab.DT[dt]); b = torch.randn_like(w)
    f = lambda: torch.nn.functional.layer_norm(x, [h], w, b, 1e-5)
    return f, 2 * rows * h * x.element_size() + 2 * h * x.element_size()

specs = sys.argv[2:]
for rnd in range(int(sys.argv[1])):
    for name, fn in V.items():
        timing.L2Flush.__call__ = fn
        copy = timing.copy_bandwidth("cuda")["gbps"]
        flush = timing.L2Flush()
        out = []
        for spec in specs:
            f = spec.split(":")
            if f[0] == "eager":
                call, nb = eager(f[2], int(f[3]), f[1]); ok = True
            else:
                call, nb, ok, err = ab.make(f[0], f[1], f[2], int(f[3]))
            us, _ = timing.cuda_time_us(call, reps=25, warmup=3, flush=flush)
            out.append(f"{spec}={100 * nb / us / 1e3 / copy:5.1f}")
            del call; torch.cuda.empty_cache()
        print(f"{name:10s} copy {copy:6.0f}  " + "  ".join(out), flush=True)
