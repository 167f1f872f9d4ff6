# ==== abtmp/run1.sh
set -u
rm -rf /tmp/E; mkdir -p /tmp/E; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/E -xf -
cp abtmp/exp/*.cuh /tmp/E/csrc/kernels/cuda/
date
export TRITON_CACHE_DIR=/tmp/tcache TORCHINDUCTOR_CACHE_DIR=/tmp/ind
(cd /tmp/E && MAX_JOBS=15 python3 setup.py build_ext --inplace > $OUT/buildE.txt 2>&1; echo E rc $? >> $OUT/buildE.txt)
date; tail -2 $OUT/buildE.txt
PYTHONPATH=/tmp/E python3 abtmp/prof.py rms:8192 ln:8192 2>&1 | grep -v Warn | tee $OUT/prof.txt
S=""; for s in long_scoreboard barrier lg_throttle drain short_scoreboard wait not_selected math_pipe_throttle no_instruction mio_throttle dispatch_stall selected branch_resolving membar; do S="$S,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio"; done
M="--profile-from-start off --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,l1tex__t_sector_hit_rate.pct,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,smsp__issue_active.avg.pct_of_peak_sustained_active$S"
for c in compile:rms:bf16:8192 compile:rms:bf16:7168; do
  echo "=== $c"; PYTHONPATH=/tmp/E timeout 120 ncu $M -k regex:triton --launch-count 1 python3 abtmp/ncu1.py $c 2>&1 | grep -v "^==PROF==" | grep -E "^ +[a-z]" 
done > $OUT/ncu.txt 2>&1
for m in 0 1 3 4; do for c in ours:rms:bf16:8192 ours:ln:bf16:8192; do
  echo "=== $c mode $m"; FLN_RR_MODE=$m PYTHONPATH=/tmp/E timeout 120 ncu $M -k regex:norm_fwd --launch-count 1 python3 abtmp/ncu1.py $c 2>&1 | grep -v "^==PROF==" | grep -E "^ +[a-z]"
done; done >> $OUT/ncu.txt 2>&1
date
C=""; for h in 5120 7168 8192 10240; do C="$C ours:rms:bf16:$h ours:ln:bf16:$h"; done
C="$C ours:rms:fp16:8192 ours:ln:fp16:8192 ours:rms:fp32:4096 ours:ln:fp32:4096 ours:rms:fp32:5120"
K="compile:rms:bf16:7168 compile:rms:bf16:8192 compile:rms:bf16:10240 compile:ln:bf16:8192"
for round in 1 2; do
  for m in 0 1 2 3 4 5; do FLN_RR_MODE=$m PYTHONPATH=/tmp/E python3 abtmp/ab2.py M$m $C; done
  [ $round = 1 ] && PYTHONPATH=/tmp/E python3 abtmp/ab2.py K $K
done 2>&1 | grep -v Warning | tee $OUT/ab.txt
date
cd /tmp && tar czf $OUT/tcache.tgz tcache 2>/dev/null; ls -la $OUT
# ==== abtmp/run2.sh
set -u
for k in 0 1 2; do rm -rf /tmp/T$k; mkdir -p /tmp/T$k; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/T$k -xf -
  cp abtmp/exp/*.cuh /tmp/T$k/csrc/kernels/cuda/; sed -i "s/constexpr int kL2Exp = 0;/constexpr int kL2Exp = $k;/" /tmp/T$k/csrc/kernels/cuda/common.cuh; done
date
for k in 0 1 2; do (cd /tmp/T$k && MAX_JOBS=6 python3 setup.py build_ext --inplace > $OUT/build$k.txt 2>&1; echo T$k rc $?) & done; wait
date
P="ours:rms:bf16:5120 ours:rms:bf16:8192 ours:ln:bf16:5120 ours:ln:bf16:7168 ours:ln:bf16:8192 ours:rms:fp16:8192 ours:rms:fp32:4096 ours:ln:fp32:4096 ours:ln:fp32:5120"
C=""; for op in ln rms; do for h in 256 512 768 1024 2048 4096 12288 16384 32768; do C="$C ours:$op:bf16:$h"; done; done
C="$C ours:ln:bf16:20480 ours:rms:fp16:12288 ours:ln:fp32:512 ours:ln:fp32:2048 ours:rms:fp32:8192 ours:ln:fp32:12288 ours:ln:fp16:16384"
for round in 1 2; do
  for m in 0 5 6 7; do FLN_RR_MODE=$m PYTHONPATH=/tmp/T0 python3 abtmp/ab2.py P$m $P; done
  for k in 0 1 2; do FLN_RR_MODE=5 PYTHONPATH=/tmp/T$k python3 abtmp/ab2.py T$k $C; done
done 2>&1 | grep -v Warning | tee $OUT/ab.txt
date
# ==== abtmp/run3.sh
set -u
for v in H N X; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/$v -xf -; done
cp abtmp/head/* /tmp/H/csrc/kernels/cuda/
cp abtmp/exp/launch_plan.h /tmp/N/csrc/kernels/cuda/
cp abtmp/exp/launch_plan.h abtmp/nx/* /tmp/X/csrc/kernels/cuda/
date
for v in H N X; do (cd /tmp/$v && MAX_JOBS=6 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
date
C=""; for op in ln rms; do for h in 256 512 768 1024 2048 4096 8192 12288 16384 32768 65536; do C="$C ours:$op:bf16:$h"; done; done
C="$C ours:ln:bf16:20480 ours:ln:fp16:16384 ours:rms:fp16:1024 ours:ln:fp32:512 ours:rms:fp32:256 ours:ln:fp32:2048 ours:rms:fp32:4096 ours:ln:fp32:5120 ours:rms:fp32:8192 ours:ln:fp32:16384 ours:rms:fp32:32768"
F="ours:rms:bf16:2048 ours:ln:bf16:4096 ours:rms:bf16:4096 ours:rms:bf16:16384 ours:ln:fp32:8192 ours:rms:fp32:8192 ours:ln:bf16:32768 ours:rms:bf16:40960 ours:ln:bf16:40960 ours:ln:bf16:49152 ours:rms:bf16:65536 ours:ln:fp32:16384 ours:rms:fp32:16384 ours:ln:fp32:20480"
for round in 1 2; do
  for v in H N X; do PYTHONPATH=/tmp/$v python3 abtmp/ab2.py $v $C; done
  FLN_RR_FORCE=1 PYTHONPATH=/tmp/N python3 abtmp/ab2.py NF $F
done 2>&1 | grep -v Warning | tee $OUT/ab.txt
date
# ==== abtmp/run4.sh
set -u
for v in N Y; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/$v -xf -; done
cp abtmp/y/* /tmp/Y/csrc/kernels/cuda/
date
for v in N Y; do (cd /tmp/$v && MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
date
C=""; for op in ln rms; do for h in 256 1024 4096 8192 16384 32768 65536 131072 262144; do C="$C bwd:$op:bf16:$h"; done; done
C="$C bwd:ln:fp16:65536 bwd:ln:fp32:1024 bwd:ln:fp32:16384 bwd:rms:fp32:65536 bwd:ln:fp32:262144"
for op in ln rms; do for h in 32768 65536 131072 262144; do C="$C fwd:$op:bf16:$h"; done; done
C="$C fwd:ln:fp32:32768 fwd:ln:fp32:131072 fwd:rms:fp32:262144 fwd:ln:bf16:24576 fwd:ln:bf16:45056"
for round in 1 2; do
  for v in N Y; do PYTHONPATH=/tmp/$v python3 abtmp/ab3.py $v $C; done
done 2>&1 | grep -v Warning | tee $OUT/ab.txt
date
# ==== abtmp/ab2.py
# identical to abtmp/ab2.py in 2026-11-23-nvidia-h200-v25-scripts.sh (not repeated)
# ==== abtmp/ab3.py
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
# ==== abtmp/ncu1.py
# identical to abtmp/ncu1.py in 2026-11-23-nvidia-h200-v25-scripts.sh (not repeated)
# ==== abtmp/prof.py
"""[experiment] kernels launched by one forward call (torch.profiler)."""
import sys, torch
from torch.profiler import profile, ProfilerActivity
from fused_layernorm import fused_layer_norm, fused_rms_norm
for spec in sys.argv[1:]:
    op, h = spec.split(":")
    hidden = int(h); rows = (1 << 27) // hidden
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16); w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(w)
    f = (lambda: fused_rms_norm(x, w, 1e-6)) if op == "rms" else (lambda: fused_layer_norm(x, w, b, 1e-5))
    with torch.no_grad():
        f(); torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            f(); torch.cuda.synchronize()
    print(spec, [(e.name[:60], round(e.device_time, 1)) for e in prof.events() if e.device_type.name == "CUDA"])
# ==== abtmp/exp/launch_plan.h against launch_plan.h (FLN_RR_FORCE)
4a5
> #include <cstdlib>
477a479,480
>   if (const char* ef = std::getenv("FLN_RR_FORCE"); ef && std::atoi(ef) && dev.cc_major == 9 && elem_bytes <= 4)
>     return reread_layout(rows, cols / r.vec, r.vec);  // [experiment]
# ==== abtmp/y (ab4's Y) against the kept code
161,166c161,163
< //   sm_80+) on the load.  The register kernels load x (and dy), weight and
< //   bias evict_last in L2; the re-read kernel marks x evict_last on its
< //   first read and evict_first on its last, as torch.compile's Triton
< //   kernels do.  Worth 1-4 points of copy bandwidth (fwd_kernel.cuh,
< //   fwd_reread_kernel.cuh, docs/performance.md v26); why the L2 priority of
< //   lines read once matters is not established.
---
> //   sm_80+) on the load; the re-read kernel marks a row evict_last in L2 on
> //   its first read and evict_first on its last, as torch.compile's Triton
> //   kernels do (fwd_reread_kernel.cuh).
239c236,237
<   asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(saddr), "l"(gmem) : "memory");
---
>   const uint64_t pol = l2_cache_policy<L2Policy::kEvictLast>();  // [experiment]
>   asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(saddr), "l"(gmem), "l"(pol) : "memory");
147,149d146
<         // evict_last in L2, as the forward's x (fwd_kernel.cuh; H200, %
<         // of copy bandwidth: LN bf16 256 94.0 -> 94.8, 16384 91.5 -> 92.4,
<         // fp32 1024 97.7 -> 98.6, fp32 16384 92.5 -> 95.5; docs/performance.md v26b).
