# ==== abtmp/run1.sh
set -u
for v in B P1 P2; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/$v -xf -; done
cp abtmp/fk1.cuh /tmp/P1/csrc/kernels/cuda/fwd_kernel.cuh
cp abtmp/fk2.cuh /tmp/P2/csrc/kernels/cuda/fwd_kernel.cuh
for v in B P1 P2; do (cd /tmp/$v && MAX_JOBS=5 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
S="ln:fwd:bf16:65536:248 ln:fwd:bf16:65536:496 ln:fwd:bf16:65536:992 ln:fwd:bf16:65536:4096"
C="ln:fwd:bf16:65536 ln:fwd:fp16:65536 rms:fwd:bf16:65536 rms:fwd:fp16:65536 ln:fwd:fp32:32768 rms:fwd:fp32:32768 ln:fwd:bf16:49152 ln:fwd:bf16:131072 rms:fwd:bf16:131072 ln:fwd:fp32:65536 rms:fwd:fp32:131072 ln:fwd:fp32:131072 lnmw:fwd:bf16:65536 ln:fwd:bf16:262144 ln:fwd:fp32:16384 ln:fwd:fp32:24576 ln:fwd:bf16:24576"
for round in 1 2; do
  for v in B P1 P2; do PYTHONPATH=/tmp/$v python3 abtmp/ab.py $v $S $C; done
done
# ==== abtmp/run2.sh
set -u
for v in B F; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/$v -xf -; done
cp abtmp/fk_first.cuh /tmp/F/csrc/kernels/cuda/fwd_kernel.cuh
for v in B F; do (cd /tmp/$v && MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
S="ln:fwd:bf16:65536:248 ln:fwd:bf16:65536:992"
C="ln:fwd:bf16:65536 ln:fwd:fp16:65536 rms:fwd:bf16:65536 rms:fwd:fp16:65536 ln:fwd:fp32:32768 rms:fwd:fp32:32768 ln:fwd:bf16:49152 ln:fwd:bf16:131072 rms:fwd:bf16:131072 ln:fwd:fp32:65536 rms:fwd:fp32:131072 ln:fwd:fp32:131072 lnmw:fwd:bf16:65536 ln:fwd:bf16:262144 ln:fwd:fp32:24576 ln:fwd:bf16:24576 ln:fwd:fp32:12288 rms:fwd:fp32:16384 ln:fwd:bf16:65536:63 ln:fwd:bf16:65536:65"
for round in 1 2; do
  for v in B F; do PYTHONPATH=/tmp/$v python3 abtmp/ab.py $v $S $C; done
done
M="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy"
G="Duration|DRAM Throughput|Issue Slots Busy|Executed Instructions |No Eligible|Active Warps Per|Eligible Warps|Registers Per|Achieved Occ|Grid Size|Block Size|L1/TEX Hit|L2 Hit|Mem Busy|Warp Cycles Per Issued|Theoretical Occ|SM Active"
for s in ln:fwd:bf16:1024 rms:fwd:bf16:8192 rms:fwd:bf16:1024; do
  PYTHONPATH=/tmp/B timeout 120 ncu --kernel-name regex:norm_fwd --launch-skip 2 --launch-count 1 $M python3 abtmp/one.py $s > $OUT/ncu_ours_${s//:/_}.txt 2>&1
  grep -E "$G" $OUT/ncu_ours_${s//:/_}.txt | sed "s/^/ours $s /"
done
for s in ln:bf16:1024 rms:bf16:8192 rms:bf16:1024; do
  timeout 200 ncu --kernel-name regex:triton --launch-skip 2 --launch-count 1 $M python3 abtmp/comp.py $s > $OUT/ncu_comp_${s//:/_}.txt 2>&1
  grep -E "$G|triton_" $OUT/ncu_comp_${s//:/_}.txt | sed "s/^/comp $s /"
done
# ==== abtmp/run3.sh
set -u
for v in B R1 R2; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/$v -xf -; done
cp abtmp/rows_base.cuh /tmp/B/csrc/kernels/cuda/fwd_rows_kernel.cuh
cp abtmp/rows_v1.cuh /tmp/R1/csrc/kernels/cuda/fwd_rows_kernel.cuh
cp abtmp/rows_v2.cuh /tmp/R2/csrc/kernels/cuda/fwd_rows_kernel.cuh
for v in B R1 R2; do (cd /tmp/$v && MAX_JOBS=5 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
C="ln:fwd:bf16:256 ln:fwd:bf16:512 ln:fwd:bf16:768 ln:fwd:bf16:1024 rms:fwd:bf16:256 rms:fwd:bf16:512 rms:fwd:bf16:768 rms:fwd:bf16:1024 ln:fwd:fp16:1024 ln:fwd:fp32:256 ln:fwd:fp32:512 rms:fwd:fp32:512 ln:fwd:bf16:64 rms:fwd:bf16:128 lnmw:fwd:bf16:1024 lnnb:fwd:bf16:1024 ln:fwd:bf16:1000"
for round in 1 2 3; do
  for v in B R1 R2; do PYTHONPATH=/tmp/$v python3 abtmp/ab.py $v $C; done
done
cd /tmp/R2 && timeout 300 python3 -m pytest tests/python -x -q -k "fwd or forward or accuracy or short or rows" 2>&1 | tail -5
# ==== abtmp/comp.py
# [experiment, not kept] torch.compile's forward, a few calls, for ncu
import sys, torch
import torch.nn.functional as F
for spec in sys.argv[1:]:
    op, dt, h = spec.split(":")
    h = int(h); rows = (1 << 27) // h
    dtype = dict(bf16=torch.bfloat16, fp32=torch.float32)[dt]
    x = torch.randn(rows, h, device="cuda", dtype=dtype)
    w = torch.randn(h, device="cuda", dtype=dtype); b = torch.randn(h, device="cuda", dtype=dtype)
    if op == "ln":
        f = torch.compile(lambda x: F.layer_norm(x, [h], w, b, 1e-5))
    else:
        f = torch.compile(lambda x: F.rms_norm(x, [h], w, 1e-6))
    with torch.no_grad():
        for _ in range(4): f(x)
    torch.cuda.synchronize()
