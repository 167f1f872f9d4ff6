# v26d: abtmp/run.sh (variants H, C, D; see the -ab1 file) and abtmp/ab3.py
set -u
for v in H C D; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/$v -xf -; done
cp abtmp/h/* /tmp/H/csrc/kernels/cuda/
cp abtmp/c/* /tmp/C/csrc/kernels/cuda/
date
for v in H C D; do (cd /tmp/$v && MAX_JOBS=6 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
date
F=""; for op in ln rms; do for dt in bf16 fp16; do for h in 256 512 640 768 1024; do F="$F fwd:$op:$dt:$h"; done; done; done
F="$F fwd:ln:fp32:256 fwd:ln:fp32:384 fwd:ln:fp32:512 fwd:rms:fp32:256 fwd:rms:fp32:384 fwd:rms:fp32:512"
for round in 1 2; do
  for v in H C D; do PYTHONPATH=/tmp/$v python3 abtmp/ab3.py $v $F; done
done 2>&1 | grep -v Warning | tee $OUT/ab.txt
date
cd /tmp/D && timeout 150 python3 -m pytest -q -n 8 tests/python/test_cuda_only.py -k "short_rows or sweep or row_count" > $OUT/testD.txt 2>&1; echo testD rc $? >> $OUT/testD.txt
tail -3 $OUT/testD.txt
date

# ---- abtmp/ab3.py
"""[experiment, not kept] ours (public API): forward under no_grad or backward alone (autograd.grad, retain_graph); % of copy."""
import sys
import torch
from fused_layernorm.bench import cases, timing
from fused_layernorm import fused_layer_norm, fused_rms_norm

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main():
    copy = timing.copy_bandwidth("cuda")["gbps"]
    flush = timing.L2Flush()
    tag = sys.argv[1]
    for spec in sys.argv[2:]:
        d, op, dt, h = spec.split(":")
        hidden = int(h)
        rows = (1 << 27) // hidden
        name = "rmsnorm" if op == "rms" else "layernorm"
        inp = cases.make_inputs(name, rows, hidden, DT[dt], "cuda")
        x = inp.x.detach().requires_grad_()
        w = inp.w.detach().requires_grad_()
        b = inp.b.detach().requires_grad_() if inp.b is not None else None
        fn = (lambda: fused_rms_norm(x, w, 1e-6)) if op == "rms" else (lambda: fused_layer_norm(x, w, b, 1e-5))
        leaves = [x, w] + ([b] if b is not None else [])
        if d == "fwd":
            with torch.no_grad():
                us, _ = timing.cuda_time_us(fn, reps=25, warmup=3, flush=flush)
        else:
            y = fn()
            dy = torch.randn_like(y)
            g = lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True)
            us, _ = timing.cuda_time_us(g, reps=25, warmup=3, flush=flush)
        nb = cases.bytes_moved(name, d, rows, hidden, DT[dt])
        print(f"{tag} {spec:24s} {us:9.1f} us {100 * nb / us / 1e3 / copy:6.1f} %", flush=True)
        del x, w, b, inp
        torch.cuda.empty_cache()
    print(f"{tag} copy {copy:.0f} GB/s")


if __name__ == "__main__":
    main()
