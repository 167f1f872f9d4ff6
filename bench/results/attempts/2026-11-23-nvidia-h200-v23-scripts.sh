# ==== abtmp/run1.sh
set -u
for v in B P T; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/$v -xf -; done
cp abtmp/base/*.cuh /tmp/B/csrc/kernels/cuda/
cp abtmp/trace/*.cuh /tmp/T/csrc/kernels/cuda/
date
for v in B P T; do (cd /tmp/$v && MAX_JOBS=6 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
date
PYTHONPATH=/tmp/T python3 abtmp/trace.py T trace ln:fwd:bf16:65536:2048 ln:fwd:fp32:32768:4096 ln:fwd:bf16:49152:2730 ln:fwd:bf16:131072:1024 2>&1 | tee $OUT/trace.txt
PYTHONPATH=/tmp/B python3 abtmp/trace.py B icpt ln:fwd:bf16:65536 rms:fwd:bf16:65536 ln:fwd:fp32:32768 ln:fwd:bf16:32768 ln:fwd:bf16:4096 ln:fwd:bf16:16384 2>&1 | tee $OUT/icpt.txt
C="ln:fwd:bf16:65536 ln:fwd:fp16:65536 rms:fwd:bf16:65536 rms:fwd:fp16:65536 ln:fwd:fp32:32768 rms:fwd:fp32:32768 ln:fwd:bf16:49152 ln:fwd:bf16:131072 rms:fwd:bf16:131072 ln:fwd:fp32:65536 ln:fwd:bf16:262144 ln:fwd:fp32:24576 lnmw:fwd:bf16:65536 ln:fwd:bf16:65536:62"
for round in 1 2; do
  for v in B P; do PYTHONPATH=/tmp/$v python3 abtmp/ab.py $v $C; done
done 2>&1 | tee $OUT/ab.txt
cd /tmp/P && timeout 150 python3 -m pytest tests/python/test_cuda_only.py tests/python/test_accuracy.py -x -q -m "not sanitize" -k "long_rows or sweep or one_affine or far_from_mean or offset or float32_params" 2>&1 | tail -3
cd /tmp/P && timeout 100 compute-sanitizer --tool memcheck python3 -m pytest tests/python/test_cuda_only.py -x -q -k "staged_rows" 2>&1 | tail -3
# ==== abtmp/run2.sh
set -u
for v in B P T; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/$v -xf -; done
cp abtmp/base/*.cuh /tmp/B/csrc/kernels/cuda/
cp abtmp/trace/*.cuh /tmp/T/csrc/kernels/cuda/
for v in B P T; do (cd /tmp/$v && MAX_JOBS=6 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
S="ln:fwd:bf16:65536:2048 ln:fwd:fp32:32768:4096 ln:fwd:bf16:49152:2728 ln:fwd:fp32:65536:2048"
PYTHONPATH=/tmp/T python3 abtmp/trace.py T trace $S 2>&1 | tee $OUT/trace.txt
PYTHONPATH=/tmp/T FLN_NO_TICKET=1 python3 abtmp/trace.py TN trace $S 2>&1 | tee -a $OUT/trace.txt
C="ln:fwd:bf16:65536 ln:fwd:fp16:65536 rms:fwd:bf16:65536 rms:fwd:fp16:65536 ln:fwd:fp32:32768 rms:fwd:fp32:32768 ln:fwd:bf16:49152 ln:fwd:bf16:131072 rms:fwd:bf16:131072 ln:fwd:fp32:65536 rms:fwd:fp32:65536 ln:fwd:bf16:262144 ln:fwd:fp32:24576 ln:fwd:bf16:24576 ln:fwd:bf16:40960 lnmw:fwd:bf16:65536 rms:fwd:fp32:131072 ln:fwd:fp32:131072 ln:fwd:bf16:65536:62 ln:fwd:bf16:65536:200"
for round in 1 2; do
  PYTHONPATH=/tmp/B python3 abtmp/ab.py B $C
  PYTHONPATH=/tmp/P python3 abtmp/ab.py P $C
  PYTHONPATH=/tmp/P FLN_NO_TICKET=1 python3 abtmp/ab.py PN $C
done 2>&1 | tee $OUT/ab.txt
cd /tmp/P && timeout 200 python3 -m pytest tests/python/test_cuda_only.py tests/python/test_accuracy.py -x -q -m "not sanitize" -k "long_rows or sweep or one_affine or far_from_mean or offset or float32_params or determin" 2>&1 | tail -3
cd /tmp/P && timeout 120 compute-sanitizer --tool memcheck python3 -m pytest tests/python/test_cuda_only.py -x -q -k "staged_rows or long_rows_float32" 2>&1 | tail -3
# ==== abtmp/run3.sh
set -u
for v in B V1 P; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/$v -xf -; done
cp abtmp/base/*.cuh /tmp/B/csrc/kernels/cuda/
cp abtmp/v1/*.cuh /tmp/V1/csrc/kernels/cuda/
for v in B V1 P; do (cd /tmp/$v && MAX_JOBS=6 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
C="ln:fwd:bf16:65536 rms:fwd:bf16:65536 ln:fwd:fp32:32768 rms:fwd:fp32:32768 ln:fwd:fp32:65536 ln:fwd:bf16:131072 ln:fwd:bf16:262144 ln:fwd:bf16:49152 ln:fwd:bf16:65536:62 ln:fwd:bf16:65536:200"
for round in 1 2; do
  PYTHONPATH=/tmp/B python3 abtmp/ab.py B $C
  PYTHONPATH=/tmp/V1 python3 abtmp/ab.py V1 $C
  PYTHONPATH=/tmp/P python3 abtmp/ab.py P $C
  PYTHONPATH=/tmp/P FLN_NO_TICKET=1 python3 abtmp/ab.py PN $C
done 2>&1 | tee $OUT/ab.txt
M="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats --section LaunchStats --section Occupancy"
for v in B P; do
  PYTHONPATH=/tmp/$v FLN_NO_TICKET=1 timeout 150 ncu --kernel-name regex:norm_fwd --launch-skip 2 --launch-count 1 $M python3 abtmp/one.py ln:fwd:bf16:65536 > $OUT/ncu_$v.txt 2>&1
  grep -E "Duration|DRAM Throughput|Issue Slots Busy|Executed Instructions |No Eligible|Registers Per|Grid Size|Block Size|Dynamic Shared|Static Shared|Warp Cycles Per Issued|Theoretical Occ|Achieved Occ|Waves|Block Limit|Shared Memory Config|Driver Shared" $OUT/ncu_$v.txt | sed "s/^/$v /"
done
cd /tmp/P && timeout 200 python3 -m pytest tests/python/test_cuda_only.py tests/python/test_accuracy.py -x -q -m "not sanitize" -k "long_rows or sweep or one_affine or far_from_mean or offset or float32_params or determin" 2>&1 | tail -2
# ==== abtmp/run4.sh
set -u
for v in B VA VC P; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/$v -xf -; done
cp abtmp/base/*.cuh /tmp/B/csrc/kernels/cuda/
cp abtmp/va/*.cuh /tmp/VA/csrc/kernels/cuda/
cp abtmp/vc/*.cuh /tmp/VC/csrc/kernels/cuda/
for v in B VA VC P; do (cd /tmp/$v && MAX_JOBS=4 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
C="ln:fwd:bf16:65536 rms:fwd:bf16:65536 ln:fwd:fp32:32768 ln:fwd:bf16:131072 ln:fwd:bf16:65536:62"
for round in 1 2; do
  for v in B VA VC P; do PYTHONPATH=/tmp/$v FLN_NO_TICKET=1 python3 abtmp/ab.py ${v}n $C; done
  PYTHONPATH=/tmp/P python3 abtmp/ab.py P $C
done 2>&1 | tee $OUT/ab.txt
# ==== abtmp/run5.sh
set -u
for v in B VG VH VN VP; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/$v -xf -; done
cp abtmp/base/*.cuh /tmp/B/csrc/kernels/cuda/
cp abtmp/base/*.cuh /tmp/VG/csrc/kernels/cuda/; cp abtmp/vg/fwd_kernel.cuh /tmp/VG/csrc/kernels/cuda/
cp abtmp/base/*.cuh /tmp/VH/csrc/kernels/cuda/; cp abtmp/vh/fwd_kernel.cuh /tmp/VH/csrc/kernels/cuda/
cp abtmp/vn/common.cuh /tmp/VN/csrc/kernels/cuda/
cp abtmp/vp/common.cuh /tmp/VP/csrc/kernels/cuda/
for v in B VG VH VN VP; do (cd /tmp/$v && MAX_JOBS=3 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
C="ln:fwd:bf16:65536 rms:fwd:bf16:65536 ln:fwd:fp32:32768 ln:fwd:bf16:131072 ln:fwd:bf16:65536:62"
for round in 1 2; do
  for v in B VG VH VN VP; do PYTHONPATH=/tmp/$v FLN_NO_TICKET=1 python3 abtmp/ab.py ${v}n $C; done
  PYTHONPATH=/tmp/VP python3 abtmp/ab.py VP $C
done 2>&1 | tee $OUT/ab.txt
cd /tmp/VP && timeout 100 python3 -m pytest tests/python/test_cuda_only.py -x -q -m "not sanitize" -k "long_rows" 2>&1 | tail -2
# ==== abtmp/run6.sh
set -u
for v in B P; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/$v -xf -; done
cp abtmp/base/*.cuh /tmp/B/csrc/kernels/cuda/
for v in B P; do (cd /tmp/$v && MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
C="ln:fwd:bf16:65536 ln:fwd:fp16:65536 rms:fwd:bf16:65536 rms:fwd:fp16:65536 ln:fwd:fp32:32768 rms:fwd:fp32:32768 ln:fwd:bf16:49152 ln:fwd:bf16:131072 rms:fwd:bf16:131072 ln:fwd:fp32:65536 rms:fwd:fp32:65536 ln:fwd:bf16:262144 rms:fwd:bf16:262144 ln:fwd:fp32:24576 ln:fwd:fp32:131072 rms:fwd:fp32:131072 ln:fwd:fp32:262144 lnmw:fwd:bf16:65536 lnnb:fwd:bf16:65536 ln:fwd:bf16:65536:62 ln:fwd:bf16:65536:200 ln:fwd:bf16:65536:500"
for round in 1 2; do
  PYTHONPATH=/tmp/B python3 abtmp/ab.py B $C
  PYTHONPATH=/tmp/P python3 abtmp/ab.py P $C
  PYTHONPATH=/tmp/P FLN_NO_TICKET=1 python3 abtmp/ab.py PN $C
done 2>&1 | tee $OUT/ab.txt
cd /tmp/P && timeout 200 python3 -m pytest tests/python/test_cuda_only.py tests/python/test_accuracy.py -x -q -m "not sanitize" -k "long_rows or one_affine or far_from_mean or offset or float32_params or determin" 2>&1 | tail -2
cd /tmp/P && timeout 150 compute-sanitizer --tool memcheck python3 -m pytest tests/python/test_cuda_only.py -x -q -k "staged_rows" 2>&1 | tail -2
# ==== abtmp/trace.py
"""[experiment] Per-CTA timestamps of the staged forward clusters (FLN_TRACE build), and
fixed cost by intercept: t(rows) at 1x/2x/4x rows for ours and for a copy of the same bytes."""
import sys, statistics as st, torch
import importlib.util
spec = importlib.util.spec_from_file_location("ab", __file__.replace("trace.py", "ab.py"))
ab = importlib.util.module_from_spec(spec); spec.loader.exec_module(ab)
from fused_layernorm.bench import timing
flush = timing.L2Flush()
tag = sys.argv[1]
mode = sys.argv[2]

def q(v, f):
    v = sorted(v); return v[min(len(v) - 1, int(f * len(v)))]

if mode == "trace":
    for s in sys.argv[3:]:
        op, d, dt, h, rows = s.split(":"); h = int(h); rows = int(rows)
        call, nb, ok, err = ab.make(op, d, dt, h, rows)
        for _ in range(3): call()
        torch.cuda.synchronize()
        evs = []
        for rep in range(4):
            flush(); e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True)
            e0.record(); y, mean, rstd = call(); e1.record(); torch.cuda.synchronize()
            evs.append(e0.elapsed_time(e1) * 1e3)
            g = mean.view(torch.int64).view(-1, 4).cpu(); c = rstd.view(torch.int64).view(-1, 4).cpu()
            med = g[:, 0].median().item()
            live = ((g - med).abs() < 10**7).all(dim=1) & (c[:, 3] > 0) & (c[:, 3] < 10**6)
            g = g[live]; c = c[live]
            t0 = g[:, 0].min().item()
            ent, land, last, ex = [[(v - t0) / 1e3 for v in g[:, k].tolist()] for k in range(4)]
            cl = [[v / 1.88e3 for v in c[:, k].tolist()] for k in range(3)]
            nrows = c[:, 3].tolist()
            print(f"{tag} {s} rep{rep} event {evs[-1]:.1f} us  ctas {int(live.sum())}  rows/CTA min/med/max {q(nrows,0)} {q(nrows,.5)} {q(nrows,1)}", flush=True)
            print(f"   entry  min/med/max {q(ent,0):.2f} {q(ent,.5):.2f} {q(ent,1):.2f}   row0 landed {q(land,0):.2f} {q(land,.5):.2f} {q(land,1):.2f}"
                  f"   last-row top {q(last,0):.2f} {q(last,.5):.2f} {q(last,1):.2f}   exit {q(ex,0):.2f} {q(ex,.1):.2f} {q(ex,.5):.2f} {q(ex,.9):.2f} {q(ex,1):.2f}")
            print(f"   per CTA (us from its entry at 1.88 GHz) landed {q(cl[0],.5):.2f} [{q(cl[0],.1):.2f}-{q(cl[0],.9):.2f}]  reduced {q(cl[1],.5):.2f}"
                  f" [{q(cl[1],.1):.2f}-{q(cl[1],.9):.2f}]  written {q(cl[2],.5):.2f} [{q(cl[2],.1):.2f}-{q(cl[2],.9):.2f}]")
        print(f"{tag} {s} events {' '.join(f'{e:.1f}' for e in evs)}")
        del call; torch.cuda.empty_cache()
else:  # intercepts
    for s in sys.argv[3:]:
        op, d, dt, h = s.split(":")[:4]; h = int(h)
        base = (1 << 27) // h
        res = []
        for k in (1, 2, 4):
            rows = base * k // 2
            call, nb, ok, err = ab.make(op, d, dt, h, rows)
            call(); torch.cuda.synchronize()
            us, _ = timing.cuda_time_us(call, reps=25, warmup=3, flush=flush)
            src = torch.empty(nb // 2, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
            cus, _ = timing.cuda_time_us(lambda: dst.copy_(src), reps=25, warmup=3, flush=flush)
            res.append((rows, nb, us, cus))
            del call, src, dst; torch.cuda.empty_cache()
        (r1, b1, u1, c1), (r2, b2, u2, c2), (r4, b4, u4, c4) = res
        fx = 2 * u2 - u4; fc = 2 * c2 - c4
        print(f"{tag} {s} rows {r1}/{r2}/{r4}: ours {u1:.1f}/{u2:.1f}/{u4:.1f} us, copy {c1:.1f}/{c2:.1f}/{c4:.1f} us;"
              f" intercept ours {fx:.1f} copy {fc:.1f} us; slope ours {(u4-u2)/(r4-r2)*1e3:.1f} ns/row = {(b4-b2)/(u4-u2)/1e3:.0f} GB/s,"
              f" copy {(b4-b2)/(c4-c2)/1e3:.0f} GB/s ({100*(c4-c2)/(u4-u2):.1f}%)", flush=True)
# ==== abtmp/run8.sh
set -u
for v in B Q; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/$v -xf -; done
cp abtmp/base/fwd_kernel.cuh abtmp/base/launch.cuh /tmp/B/csrc/kernels/cuda/; cp abtmp/base/launch_plan.h /tmp/B/csrc/kernels/cuda/
for v in B Q; do (cd /tmp/$v && MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
C="ln:fwd:bf16:65536 ln:fwd:fp16:65536 rms:fwd:bf16:65536 rms:fwd:fp16:65536 ln:fwd:fp32:32768 rms:fwd:fp32:32768 ln:fwd:bf16:49152 ln:fwd:bf16:131072 rms:fwd:bf16:262144 ln:fwd:fp32:65536 rms:fwd:fp32:131072 lnmw:fwd:bf16:65536 ln:fwd:bf16:65536:500 ln:fwd:bf16:65536:1100"
for round in 1 2 3; do
  for v in B Q; do PYTHONPATH=/tmp/$v python3 abtmp/ab.py $v $C; done
done 2>&1 | tee $OUT/ab.txt
cd /tmp/Q && timeout 200 python3 -m pytest tests/python/test_cuda_only.py tests/python/test_accuracy.py -x -q -m "not sanitize" -k "long_rows or one_affine or float32_params or determin" 2>&1 | tail -2
cd /tmp/Q && timeout 120 compute-sanitizer --tool memcheck python3 -m pytest tests/python/test_cuda_only.py -x -q -k "staged_rows" 2>&1 | tail -2
