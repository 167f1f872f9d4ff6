# ==== abtmp/run1.sh
set -u
rm -rf /tmp/E; mkdir -p /tmp/E; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/E -xf -
cp abtmp/exp/launch_plan.h /tmp/E/csrc/kernels/cuda/
date
(cd /tmp/E && MAX_JOBS=14 python3 setup.py build_ext --inplace > $OUT/buildE.txt 2>&1; echo E rc $? >> $OUT/buildE.txt) &
BP=$!
export TRITON_CACHE_DIR=/tmp/tcache TORCHINDUCTOR_CACHE_DIR=/tmp/ind
M="--profile-from-start off --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats --metrics l1tex__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed.sum,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio"
for c in compile:rms:bf16:8192 compile:rms:bf16:12288 compile:rms:bf16:7168 compile:ln:bf16:16384; do
  echo "=== $c"; PYTHONPATH=/tmp/E timeout 120 ncu $M -k regex:triton --launch-count 1 python3 abtmp/ncu1.py $c 2>&1 | grep -v "^==PROF==" | tail -120
done > $OUT/ncu_compile.txt 2>&1
wait $BP; date; tail -3 $OUT/buildE.txt
for c in "ours:rms:bf16:8192" "ours:rms:bf16:12288"; do
  echo "=== $c default"; PYTHONPATH=/tmp/E timeout 120 ncu $M -k regex:norm_fwd --launch-count 1 python3 abtmp/ncu1.py $c 2>&1 | grep -v "^==PROF==" | tail -120
done > $OUT/ncu_ours.txt 2>&1
for a in 2 4; do c=ours:rms:bf16:8192; echo "=== $c reread acc $a"; FLN_RR_FORCE=1 FLN_RR_MIN=1024 FLN_RR_ACC=$a PYTHONPATH=/tmp/E timeout 120 ncu $M -k regex:norm_fwd --launch-count 1 python3 abtmp/ncu1.py $c 2>&1 | grep -v "^==PROF==" | tail -120; done >> $OUT/ncu_ours.txt 2>&1
date
C="rms:bf16:7168 rms:bf16:8192 rms:bf16:12288 rms:bf16:16384 rms:bf16:32768 ln:bf16:16384 ln:bf16:1024 rms:bf16:1024"
O=""; K=""; for c in $C; do O="$O ours:$c"; K="$K compile:$c"; done
R="ours:rms:bf16:7168 ours:rms:bf16:8192 ours:rms:bf16:12288 ours:rms:bf16:16384 ours:ln:bf16:16384"
for round in 1 2; do
  PYTHONPATH=/tmp/E python3 abtmp/ab2.py B $O $K
  for a in 1 2 4; do FLN_RR_FORCE=1 FLN_RR_MIN=8192 FLN_RR_ACC=$a PYTHONPATH=/tmp/E python3 abtmp/ab2.py RR$a $R; done
done 2>&1 | grep -v Warning | tee $OUT/ab.txt
date
cd /tmp && tar czf $OUT/triton.tgz tcache ind 2>/dev/null; ls -la $OUT
# ==== abtmp/run2.sh
set -u
for v in $(ls /tmp/H/fused_layernorm/_C*.so >/dev/null 2>&1 && echo E || echo H E); do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/$v -xf -; done
BUILT=$(ls /tmp/H/fused_layernorm/_C*.so >/dev/null 2>&1 && echo 1 || echo 0)
[ $BUILT = 0 ] && cp abtmp/head/* /tmp/H/csrc/kernels/cuda/
cp abtmp/exp/launch_plan.h /tmp/E/csrc/kernels/cuda/
date
for v in $([ $BUILT = 1 ] && echo E || echo H E); do (cd /tmp/$v && MAX_JOBS=14 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
date
D="ours:rms:bf16:7168 ours:rms:bf16:8192 ours:rms:bf16:12288 ours:rms:bf16:16384 ours:ln:bf16:16384 ours:ln:bf16:7168 ours:ln:bf16:8192 ours:ln:bf16:12288 ours:rms:bf16:24576 ours:ln:bf16:24576 ours:rms:bf16:20480 ours:rms:bf16:32768 ours:rms:fp32:6144 ours:ln:fp32:12288 ours:rms:fp16:12288 ours:ln:fp32:8192"
F="ours:rms:bf16:4096 ours:rms:bf16:5120 ours:rms:bf16:6144 ours:rms:bf16:7168 ours:rms:bf16:8192 ours:rms:bf16:16384 ours:ln:bf16:4096 ours:ln:bf16:8192 ours:rms:fp32:4096 ours:ln:fp32:4096 ours:rms:fp32:2048 ours:ln:fp32:8192"
F2="ours:rms:bf16:4096 ours:rms:bf16:7168 ours:rms:bf16:8192 ours:ln:bf16:8192 ours:rms:bf16:16384 ours:ln:bf16:16384 ours:rms:bf16:12288 ours:rms:fp32:4096"
for round in 1 2; do
  for v in H E; do
    t=$v; [ $v = G ] && t=E
    g=0; [ $v = G ] && g=1
    FLN_RR_GENERIC=$g PYTHONPATH=/tmp/$t python3 abtmp/ab2.py $v-D $D
    FLN_RR_GENERIC=$g FLN_RR_FORCE=1 FLN_RR_MIN=4096 PYTHONPATH=/tmp/$t python3 abtmp/ab2.py $v-F4 $F
    FLN_RR_GENERIC=$g FLN_RR_FORCE=1 FLN_RR_MIN=4096 FLN_RR_ACC=2 PYTHONPATH=/tmp/$t python3 abtmp/ab2.py $v-F2 $F2
  done
done 2>&1 | grep -v Warning | tee $OUT/ab.txt
date
# ==== abtmp/run3.sh
set -u
for v in E C; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/$v -xf -; cp abtmp/exp/launch_plan.h /tmp/$v/csrc/kernels/cuda/; done
cp abtmp/coh/fwd_reread_kernel.cuh /tmp/C/csrc/kernels/cuda/
date
for v in E C; do (cd /tmp/$v && MAX_JOBS=14 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
date
F2=""; for op in rms ln; do for h in 4096 5120 6144 7168 8192 10240 14336 16384; do F2="$F2 ours:$op:bf16:$h"; done; done
F2="$F2 ours:ln:fp16:8192 ours:rms:fp16:7168 ours:rms:fp32:4096 ours:ln:fp32:4096 ours:rms:fp32:8192 ours:ln:fp32:8192 ours:ln:fp32:3584 ours:rms:fp32:2048"
D="ours:rms:bf16:8192 ours:rms:bf16:12288 ours:ln:bf16:16384 ours:ln:bf16:7168 ours:ln:bf16:12288 ours:rms:fp32:6144 ours:ln:fp32:12288 ours:rms:bf16:32768"
for round in 1 2; do
  for v in E C; do
    FLN_RR_FORCE=1 FLN_RR_MIN=4096 FLN_RR_ACC=2 PYTHONPATH=/tmp/$v python3 abtmp/ab2.py $v-F2 $F2
    PYTHONPATH=/tmp/$v python3 abtmp/ab2.py $v-D $D
  done
done 2>&1 | grep -v Warning | tee $OUT/ab.txt
date
# ==== abtmp/run4.sh
set -u
rm -rf /tmp/N; mkdir -p /tmp/N; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/N -xf -
rm -rf /tmp/H; mkdir -p /tmp/H; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/H -xf -; cp abtmp/head/* /tmp/H/csrc/kernels/cuda/
date
for v in H N; do (cd /tmp/$v && MAX_JOBS=14 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
date
(cd /tmp/N && timeout 200 python3 -m pytest tests/python/test_cuda_only.py -q -m "not sanitize" -k "pair_reread or float32_params or sweep" 2>&1 | tail -3) | tee $OUT/testN.txt
(cd /tmp/N && timeout 150 compute-sanitizer --tool memcheck python3 -m pytest tests/python/test_cuda_only.py -x -q -k "sanitize_reread_rows" 2>&1 | tail -2) | tee -a $OUT/testN.txt
date
C=""; for dt in bf16 fp16; do for op in ln rms; do for h in 5120 7168 8192 10240 16384; do C="$C ours:$op:$dt:$h"; done; done; done
for op in ln rms; do for h in 4096 5120 8192; do C="$C ours:$op:fp32:$h"; done; done
C="$C ours:rms:bf16:12288 ours:ln:bf16:4096 ours:ln:bf16:14336"
for round in 1 2 3; do
  for v in H N; do PYTHONPATH=/tmp/$v python3 abtmp/ab2.py $v $C; done
done 2>&1 | grep -v Warning | tee $OUT/ab.txt
date
# ==== abtmp/ab2.py
"""[experiment, not kept] ours (public API) and torch.compile, forward under no_grad; % of copy."""
import os, sys
import torch
import torch.nn.functional as F
from fused_layernorm.bench import cases, timing
from fused_layernorm import fused_layer_norm, fused_rms_norm

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
import torch._dynamo as dynamo
for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
    if hasattr(dynamo.config, knob):
        setattr(dynamo.config, knob, max(getattr(dynamo.config, knob), 4096))
cln = torch.compile(lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5), dynamic=False)
crms = torch.compile(lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6), dynamic=False)


def main():
    copy = timing.copy_bandwidth("cuda")["gbps"]
    flush = timing.L2Flush()
    tag = sys.argv[1]
    for spec in sys.argv[2:]:
        who, op, dt, h = spec.split(":")[:4]
        hidden = int(h)
        rows = (1 << 27) // hidden
        name = "rmsnorm" if op == "rms" else "layernorm"
        inp = cases.make_inputs(name, rows, hidden, DT[dt], "cuda")
        x, w = inp.x, inp.w.detach()
        b = inp.b.detach() if inp.b is not None else None
        if who == "ours":
            f = (lambda: fused_rms_norm(x, w, 1e-6)) if op == "rms" else (lambda: fused_layer_norm(x, w, b, 1e-5))
        else:
            f = (lambda: crms(x, w)) if op == "rms" else (lambda: cln(x, w, b))
        with torch.no_grad():
            y = f()
            xd = x[:64].double()
            if op == "rms":
                ref = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
            else:
                ref = F.layer_norm(xd, (hidden,), w.double(), b.double(), 1e-5)
            err = (y[:64].double() - ref).abs().max().item()
            ok = err < (0.1 if dt != "fp32" else 1e-4)
            torch.cuda.synchronize()
            us, _ = timing.cuda_time_us(f, reps=25, warmup=3, flush=flush)
        nb = cases.bytes_moved(name, "fwd", rows, hidden, DT[dt])
        print(f"{tag} {spec:24s} {us:9.1f} us {100 * nb / us / 1e3 / copy:6.1f} %{'' if ok else f'  BAD {err:.2e}'}", flush=True)
        del f, x, w, b, inp
        torch.cuda.empty_cache()
    print(f"{tag} copy {copy:.0f} GB/s")


if __name__ == "__main__":
    main()
# ==== abtmp/ncu1.py
"""[experiment] one forward of a case (ours or compile), for ncu."""
import sys, torch
import torch.nn.functional as F
who, op, dt, h = sys.argv[1].split(":")
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
hidden = int(h); rows = (1 << 27) // hidden
x = torch.randn(rows, hidden, device="cuda", dtype=DT[dt]); w = torch.randn(hidden, device="cuda", dtype=DT[dt]); b = torch.randn_like(w)
if who == "ours":
    from fused_layernorm import fused_layer_norm, fused_rms_norm
    f = (lambda: fused_rms_norm(x, w, 1e-6)) if op == "rms" else (lambda: fused_layer_norm(x, w, b, 1e-5))
else:
    c = torch.compile((lambda x, w: F.rms_norm(x, (hidden,), w, 1e-6)) if op == "rms" else (lambda x, w, b: F.layer_norm(x, (hidden,), w, b, 1e-5)), dynamic=False)
    f = (lambda: c(x, w)) if op == "rms" else (lambda: c(x, w, b))
with torch.no_grad():
    for _ in range(3): f()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    f()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
# ==== abtmp/exp/launch_plan.h against launch_plan.h (experiment overrides)
4a5
> #include <cstdlib>
292,324c293,295
< // Rows that kRereadPairAccesses 16-byte accesses a thread cover exactly
< // take the re-read kernel's straight-line variant (fwd_reread_kernel.cuh,
< // NV = 2), one CTA of cols / (2 * vec) threads a row, where at least
< // kRereadPairMinCtas such CTAs share an SM and fill at least 7/8 of its
< // kRereadSmThreads thread slots, and the CTA has at least kRereadPairMinCta
< // threads: rows of 10-21 KB (bf16 5120-10752 and fp32 2560-5376, a
< // multiple of 32 accesses, but not CTAs of 352, 416, 544 or 576 threads),
< // with weights of x's dtype or none.  Like torch.compile's Triton kernels
< // (one straight-line program a row, 16 warps at RMS bf16 8192): more
< // threads, fewer registers and instructions a thread than the register
< // rows or the looped walk at kRereadAccesses.  H200, % of copy bandwidth,
< // 86b7f27's plan -> straight pair (docs/performance.md v25a): LN bf16 5120
< // 93.1 -> 96.3, 7168 92.8 -> 94.5, 8192 93.4 -> 96.0, 10240 92.9 -> 94.0,
< // fp16 5120 93.1 -> 95.1, 8192 93.2 -> 94.1; RMS bf16 10240 93.5 -> 96.7,
< // fp16 10240 93.2 -> 95.8; fp32 5120 LN 94.2 -> 98.5, RMS 95.6 -> 98.2;
< // the rest level (RMS bf16 5120-8192 -0.0 to +0.6).  Two CTAs an SM lost or
< // gained little (LN bf16 14336, 896 threads, 93.3 -> 89.6; fp16 16384 LN
< // 92.0 -> 90.4, RMS 94.9 -> 93.5; bf16 16384 +0.2 to +0.5), and so did 256
< // threads (LN bf16 4096 95.0 -> 93.8) and 768 (RMS bf16 12288 92.6 ->
< // 90.4); the same layout through the looped walk lost (RMS bf16 16384
< // 89.3).
< constexpr int kRereadPairAccesses = 2;
< constexpr int kRereadPairMinCta = 320;
< constexpr int kRereadPairMinCtas = 3;
< constexpr int kRereadSmThreads = 2048;  // kRereadMinCtas CTAs of kRereadCta threads an SM (32 registers)
< inline bool reread_pair_fits(int64_t nvec) {
<   if (nvec % (32 * kRereadPairAccesses) != 0) return false;
<   const int64_t t = nvec / kRereadPairAccesses, ctas = kRereadSmThreads / t;
<   return t >= kRereadPairMinCta && ctas >= kRereadPairMinCtas && ctas * t * 8 >= int64_t(kRereadSmThreads) * 7;
< }
< 
< // The straight-line variant runs a plan of exactly kRereadPairAccesses a
< // thread, one CTA a row (a grid of at most 2^31 - 1 CTAs).
---
> // The re-read kernel's straight-line variants (fwd_reread_kernel.cuh, NV >
> // 0): every thread of the CTA holds exactly nv accesses of the row, nv 1, 2
> // or kRereadAccesses, and each CTA one row (a grid of one CTA a row).
326,336c297,300
<   return p.reread && p.nv == kRereadPairAccesses && int64_t(p.tpr) * p.nv * p.vec == cols && p.groups < INT32_MAX;
< }
< 
< inline Plan reread_pair_layout(int64_t rows, int64_t nvec, int vec) {
<   Plan p;
<   p.reread = true;
<   p.vec = vec;
<   p.nv = kRereadPairAccesses;
<   p.tpr = p.cta_threads = int(nvec / kRereadPairAccesses);
<   p.groups = rows;
<   return p;
---
>   const char* eg = std::getenv("FLN_RR_GENERIC");  // [experiment]
>   if (eg && std::atoi(eg)) return false;
>   const bool nv_ok = p.nv == 1 || p.nv == 2 || p.nv == kRereadAccesses;
>   return p.reread && nv_ok && int64_t(p.tpr) * p.nv * p.vec == cols && p.groups < INT32_MAX;
343c307,309
<   int64_t warps = (nvec + int64_t(kRereadAccesses) * 32 - 1) / (int64_t(kRereadAccesses) * 32);
---
>   const char* ea = std::getenv("FLN_RR_ACC");  // [experiment]
>   const int64_t acc = ea ? std::atoll(ea) : kRereadAccesses;
>   int64_t warps = (nvec + acc * 32 - 1) / (acc * 32);
471,472d436
<   if (dev.cc_major == 9 && elem_bytes <= 4 && w_bytes <= elem_bytes && reread_pair_fits(cols / r.vec))
<     return reread_pair_layout(rows, cols / r.vec, r.vec);
474c438,439
<   const bool keep_registers =
---
>   const char* ef = std::getenv("FLN_RR_FORCE");  // [experiment]
>   const bool keep_registers = !(ef && std::atoi(ef)) &&
476c441,442
<   const bool reread_row = row_bytes >= reread_min_row(elem_bytes, w_bytes, params_outweigh_row, xs) &&
---
>   const char* em = std::getenv("FLN_RR_MIN");  // [experiment]
>   const bool reread_row = row_bytes >= (em ? std::atoll(em) : reread_min_row(elem_bytes, w_bytes, params_outweigh_row, xs)) &&
# ==== abtmp/coh/fwd_reread_kernel.cuh: load_l1c = load_l1 with ld.global (no .nc), used for every load of the re-read kernel
