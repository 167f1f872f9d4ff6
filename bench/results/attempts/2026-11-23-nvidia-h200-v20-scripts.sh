# [experiment, not kept] one build with run-time overrides; sweep x_smem slices / re-read.
set -u
ROOT=$PWD
rm -rf /tmp/B; mkdir -p /tmp/B
tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp -cf - . | tar -C /tmp/B -xf -
(cd /tmp/B && MAX_JOBS=16 python3 setup.py build_ext --inplace > $OUT/buildB.txt 2>&1; echo B rc $?)
C="ln:fwd:bf16:65536 ln:fwd:fp16:65536 rms:fwd:bf16:65536 ln:fwd:fp32:32768 rms:fwd:fp32:32768 ln:fwd:fp32:65536 rms:fwd:fp32:65536 ln:fwd:bf16:32768 rms:fwd:bf16:32768 ln:fwd:bf16:131072"
R="ln:fwd:fp16:16384 ln:fwd:bf16:16384 rms:fwd:bf16:16384 ln:fwd:fp32:8192"
for round in 1 2; do
  PYTHONPATH=/tmp/B python3 abtmp/ab.py base $C $R
  for cfg in "16384 8" "16384 4" "32768 8" "32768 4" "65536 8" "8192 4"; do
    set -- $cfg
    FLN_FORCE_XS=1 FLN_XS_SLICE=$1 FLN_XS_NV=$2 PYTHONPATH=/tmp/B python3 abtmp/ab.py xs$1n$2 $C
  done
  FLN_FORCE_RR=1 PYTHONPATH=/tmp/B python3 abtmp/ab.py rr $R
done
set -u
rm -rf /tmp/B; mkdir -p /tmp/B
tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp -cf - . | tar -C /tmp/B -xf -
(cd /tmp/B && MAX_JOBS=16 python3 setup.py build_ext --inplace > $OUT/buildB.txt 2>&1; echo B rc $?)
C="ln:fwd:bf16:65536 ln:fwd:bf16:65536:1984 ln:fwd:bf16:65536:1860 ln:fwd:bf16:65536:4092 rms:fwd:bf16:65536 rms:fwd:bf16:65536:1984 ln:fwd:fp32:32768 ln:fwd:fp32:32768:4092 ln:fwd:fp32:32768:8184 rms:fwd:fp32:32768:4092 ln:fwd:fp32:65536 ln:fwd:fp32:65536:2040 ln:fwd:bf16:32768 ln:fwd:bf16:32768:4224"
for round in 1 2; do PYTHONPATH=/tmp/B python3 abtmp/ab.py base $C; done
for s in ln:fwd:bf16:65536 ln:fwd:fp32:65536 ln:fwd:fp32:32768 rms:fwd:bf16:65536; do
  PYTHONPATH=/tmp/B timeout 200 ncu --kernel-name regex:norm_fwd --launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy python3 abtmp/one.py $s > $OUT/ncu_${s//:/_}.txt 2>&1
  grep -E "Duration|DRAM Throughput|Issue Slots Busy|Issued Ipc|Executed Instructions |No Eligible|Active Warps Per|Eligible Warps|Stall|Registers Per|Achieved Occ|Grid Size|Block Size|Cluster|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Warp Cycles Per Issued" $OUT/ncu_${s//:/_}.txt | sed "s/^/$s /"
done
set -u
rm -rf /tmp/B; mkdir -p /tmp/B
tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp -cf - . | tar -C /tmp/B -xf -
(cd /tmp/B && MAX_JOBS=16 python3 setup.py build_ext --inplace > $OUT/buildB.txt 2>&1; echo B rc $?)
PYTHONPATH=/tmp/B python3 abtmp/flush.py 2 ln:fwd:bf16:65536 rms:fwd:bf16:65536 ln:fwd:fp32:32768 rms:fwd:fp32:32768 ln:fwd:bf16:32768 ln:fwd:bf16:4096 ln:bwd:bf16:65536 ln:bwd:bf16:4096 eager:fwd:bf16:4096 eager:fwd:bf16:65536
set -u
for v in B C D; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp -cf - . | tar -C /tmp/$v -xf -; done
sed -i '1i #define FLN_NOXCHG 1' /tmp/C/csrc/kernels/cuda/common.cuh
sed -i '1i #define FLN_NOXCHG 1\n#define FLN_NOCTA 1' /tmp/D/csrc/kernels/cuda/common.cuh
for v in B C D; do (cd /tmp/$v && MAX_JOBS=5 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
C="ln:fwd:bf16:65536 rms:fwd:bf16:65536 ln:fwd:fp32:32768 rms:fwd:fp32:32768 ln:fwd:fp32:65536 ln:fwd:bf16:131072 rms:fwd:fp32:131072 ln:fwd:bf16:49152 ln:fwd:fp32:24576"
for round in 1 2; do
  PYTHONPATH=/tmp/B python3 abtmp/ab.py base $C
  PYTHONPATH=/tmp/C python3 abtmp/ab.py noxchg $C
  PYTHONPATH=/tmp/D python3 abtmp/ab.py noreduce $C
  FLN_FWD_CTA=256 PYTHONPATH=/tmp/B python3 abtmp/ab.py cta256 $C
done
set -u
for v in B E; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp -cf - . | tar -C /tmp/$v -xf -; done
sed -i '1i #define FLN_EARLY_STAGE 1' /tmp/E/csrc/kernels/cuda/fwd_kernel.cuh
for v in B E; do (cd /tmp/$v && MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
grep -A2 "Li4ELb1ELb0ELb1ELb1E" $OUT/buildE.txt | grep -i spill | head
C="ln:fwd:bf16:65536 ln:fwd:fp16:65536 rms:fwd:bf16:65536 ln:fwd:fp32:32768 rms:fwd:fp32:32768 ln:fwd:fp32:65536 rms:fwd:fp32:65536 ln:fwd:bf16:131072 rms:fwd:fp32:131072 ln:fwd:bf16:49152 ln:fwd:fp32:24576 ln:fwd:fp32:20480 rms:fwd:bf16:131072 lnnb:fwd:bf16:65536"
for round in 1 2; do
  PYTHONPATH=/tmp/B python3 abtmp/ab.py base $C
  PYTHONPATH=/tmp/E python3 abtmp/ab.py early $C
done
set -u
for v in B W; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp -cf - . | tar -C /tmp/$v -xf -; done
sed -i '1i #define FLN_WARP_PUSH 1' /tmp/W/csrc/kernels/cuda/fwd_kernel.cuh
for v in B W; do (cd /tmp/$v && MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
C="ln:fwd:bf16:65536 ln:fwd:fp16:65536 rms:fwd:bf16:65536 ln:fwd:fp32:32768 rms:fwd:fp32:32768 ln:fwd:fp32:65536 rms:fwd:fp32:65536 ln:fwd:bf16:131072 rms:fwd:fp32:131072 ln:fwd:fp32:131072 ln:fwd:bf16:49152 ln:fwd:fp32:24576 ln:fwd:fp32:20480 rms:fwd:bf16:131072 lnnb:fwd:bf16:65536 lnmw:fwd:bf16:65536 ln:fwd:bf16:4096 ln:fwd:bf16:262144"
for round in 1 2; do
  PYTHONPATH=/tmp/B python3 abtmp/ab.py base $C
  PYTHONPATH=/tmp/W python3 abtmp/ab.py wpush $C
done
R="lnmw:fwd:bf16:16384 lnnb:fwd:bf16:16384 ln:fwd:fp16:16384 rms:fwd:fp16:16384 ln:fwd:bf16:8192"
for round in 1 2; do
  PYTHONPATH=/tmp/B python3 abtmp/ab.py base $R
  FLN_FORCE_RR=1 PYTHONPATH=/tmp/B python3 abtmp/ab.py rr $R
done
