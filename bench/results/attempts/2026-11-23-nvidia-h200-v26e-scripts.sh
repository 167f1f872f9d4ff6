# v26e: abtmp/run.sh of ab4; ab3 ran the same loop with variants H S T, two rounds (see its -ab3 file);
# ab2's run.sh and ncu1.py follow. abtmp/ab3.py is the one in 2026-11-23-nvidia-h200-v26-scripts.sh.
# ==== abtmp/run.sh (ab4)
set -u
for v in H F; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/$v -xf -; done
cp abtmp/h/* /tmp/H/csrc/kernels/cuda/
date
for v in H F; do (cd /tmp/$v && MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
date
F="fwd:ln:bf16:128 fwd:ln:bf16:256 fwd:ln:bf16:512 fwd:ln:bf16:768 fwd:ln:bf16:1024 fwd:ln:fp16:256 fwd:ln:fp16:512 fwd:ln:fp32:256 fwd:ln:fp32:512 fwd:rms:bf16:256 fwd:rms:bf16:768"
F="$F fwd:rms:bf16:12288 fwd:ln:bf16:12288 fwd:rms:fp16:12288 fwd:ln:fp32:6144 fwd:rms:fp32:6144 fwd:ln:bf16:11264 fwd:rms:bf16:10496"
F="$F fwd:rms:bf16:16384 fwd:ln:bf16:16384 fwd:rms:fp16:16384 fwd:ln:bf16:14336 fwd:ln:bf16:24576"
for round in 1 2 3; do
  for v in H F; do PYTHONPATH=/tmp/$v python3 abtmp/ab3.py $v $F; done
done 2>&1 | grep -v Warning | tee $OUT/ab.txt
date
cd /tmp/F && timeout 120 python3 -m pytest -q -n 8 -x tests/python/test_cuda_only.py -k "short_rows or sweep or reread" > $OUT/testF.txt 2>&1; echo testF rc $? >> $OUT/testF.txt
tail -3 $OUT/testF.txt
date
# ==== abtmp/run.sh (ab2: H = b6e3ccc, R = its launch_plan.h with reread_despite_inflight's params test dropped)
set -u
for v in H R; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/$v -xf -; done
cp abtmp/r/* /tmp/R/csrc/kernels/cuda/
for v in H R; do (cd /tmp/$v && MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
F=""; for dt in bf16 fp16; do for h in 7168 8192 12288 16384; do F="$F fwd:rms:$dt:$h"; done; F="$F fwd:ln:$dt:16384"; done
F="$F fwd:ln:bf16:256 fwd:rms:bf16:768 fwd:ln:bf16:768"
for round in 1 2 3; do
  for v in H R; do PYTHONPATH=/tmp/$v python3 abtmp/ab3.py $v $F; done
done 2>&1 | grep -v Warning | tee $OUT/ab.txt
(cd /tmp/H && python3 -m fused_layernorm.bench --peers ours,compile --ops rmsnorm,layernorm --dtypes bf16 --hidden 256,768,7168,8192,12288,16384 --directions fwd --no-small --out /tmp/bo > $OUT/bench_sub.txt 2>&1)
PYTHONPATH=/tmp/H timeout 150 ncu --profile-from-start off --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section WarpStateStats python3 abtmp/ncu1.py 12288 > $OUT/ncu12288.txt 2>&1
# ==== abtmp/ncu1.py (ab2)
"""[experiment] one RMS bf16 12288 forward each: ours, then torch.compile (for ncu)."""
import sys, torch
from fused_layernorm import fused_rms_norm
h = int(sys.argv[1]); rows = (1 << 27) // h
x = torch.randn(rows, h, device="cuda", dtype=torch.bfloat16); w = torch.randn(h, device="cuda", dtype=torch.bfloat16)
def ref(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)
c = torch.compile(ref, dynamic=False)
with torch.no_grad():
    for _ in range(2):
        fused_rms_norm(x, w, 1e-6); c(x, w, 1e-6)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fused_rms_norm(x, w, 1e-6); c(x, w, 1e-6)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
