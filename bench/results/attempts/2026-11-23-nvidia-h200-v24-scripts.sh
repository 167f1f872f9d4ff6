# ==== abtmp/run1.sh
set -u
for v in B VR VA; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/$v -xf -; done
cp abtmp/vr/*.h /tmp/VR/csrc/kernels/cuda/
cp abtmp/va/*.cuh /tmp/VA/csrc/kernels/cuda/
date
for v in B VR VA; do (cd /tmp/$v && MAX_JOBS=5 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
date
(cd /tmp/B && timeout 120 python3 -m pytest tests/python/test_cuda_only.py -q -m "not sanitize" -k "row_tickets" 2>&1 | tail -3) | tee $OUT/testB.txt
C="ln:fwd:bf16:32768 ln:fwd:fp16:32768 rms:fwd:bf16:32768 rms:fwd:fp16:32768 lnmw:fwd:bf16:32768 lnnb:fwd:bf16:32768 ln:fwd:bf16:40960 ln:fwd:bf16:65536 ln:fwd:fp16:65536 rms:fwd:bf16:65536 ln:fwd:fp32:32768 rms:fwd:fp32:131072 ln:fwd:bf16:131072 rms:fwd:bf16:262144 ln:fwd:bf16:49152 ln:fwd:bf16:24576"
for round in 1 2; do
  for v in B VR VA; do PYTHONPATH=/tmp/$v python3 abtmp/ab.py $v $C; done
done 2>&1 | tee $OUT/ab.txt
date
(cd /tmp/VR && timeout 120 python3 -m pytest tests/python/test_cuda_only.py tests/python/test_accuracy.py -x -q -m "not sanitize" -k "sweep or long_rows or float32_params or one_affine" 2>&1 | tail -3) | tee $OUT/testVR.txt
date
# ==== abtmp/run2.sh
set -u
for v in B P; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/$v -xf -; done
cp abtmp/base/*.cuh /tmp/B/csrc/kernels/cuda/
cp abtmp/pr/*.h /tmp/P/csrc/kernels/cuda/
date
for v in B P; do (cd /tmp/$v && MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
date
C="ln:fwd:bf16:28672 ln:fwd:bf16:32768 ln:fwd:bf16:36864 ln:fwd:bf16:40960 ln:fwd:bf16:45056 ln:fwd:fp16:32768 ln:fwd:fp16:40960 ln:fwd:fp32:16384 ln:fwd:fp32:20480 ln:fwd:bf16:65536 ln:fwd:fp16:65536 ln:fwd:fp32:32768 rms:fwd:fp32:32768 ln:fwd:fp32:131072 rms:fwd:bf16:131072 ln:fwd:bf16:262144 ln:fwd:bf16:24576 ln:fwd:bf16:49152 rms:fwd:fp16:65536"
R="rms:fwd:bf16:40960 lnnb:fwd:bf16:40960 rms:fwd:fp32:20480 rms:fwd:bf16:28672 rms:fwd:fp32:16384"
for round in 1 2; do
  PYTHONPATH=/tmp/B python3 abtmp/ab.py B $C $R
  PYTHONPATH=/tmp/P python3 abtmp/ab.py P $C $R
  PYTHONPATH=/tmp/P FLN_X_RULE=1 python3 abtmp/ab.py PR1 $C
  PYTHONPATH=/tmp/P FLN_X_RULE=2 python3 abtmp/ab.py PR2 $C
  PYTHONPATH=/tmp/P FLN_X_RULE=3 python3 abtmp/ab.py PR3 $R
done 2>&1 | tee $OUT/ab.txt
date
(cd /tmp/P && timeout 150 compute-sanitizer --tool memcheck python3 -m pytest tests/python/test_cuda_only.py -x -q -k "staged_rows" 2>&1 | tail -2) | tee $OUT/sanP.txt
(cd /tmp/P && timeout 150 python3 -m pytest tests/python/test_cuda_only.py -x -q -m "not sanitize" -k "row_tickets or many_rows_per_cluster or long_rows_float32 or one_affine" 2>&1 | tail -2) | tee $OUT/testP.txt
(cd /tmp/P && FLN_X_RULE=3 timeout 100 python3 -m pytest tests/python/test_cuda_only.py -x -q -m "not sanitize" -k "sweep" 2>&1 | tail -2) | tee $OUT/testPR.txt
date
# ==== abtmp/run3.sh
set -u
for v in B P; do rm -rf /tmp/$v; mkdir -p /tmp/$v; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/$v -xf -; done
cp abtmp/base/* /tmp/B/csrc/kernels/cuda/
date
for v in B P; do (cd /tmp/$v && MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/build$v.txt 2>&1; echo $v rc $?) & done; wait
date
C="ln:fwd:bf16:32768 ln:fwd:fp16:32768 ln:fwd:fp32:16384 rms:fwd:bf16:32768 rms:fwd:fp32:16384 ln:fwd:bf16:24576 ln:fwd:fp32:12288 ln:fwd:bf16:28672 rms:fwd:bf16:36864 lnnb:fwd:bf16:36864 ln:fwd:bf16:36864 lnmw:fwd:bf16:36864 lnmw:fwd:bf16:40960 lnmw:fwd:bf16:32768 ln:fwd:fp32:18432 rms:fwd:fp32:18432 rms:fwd:bf16:40960 ln:fwd:bf16:65536 ln:fwd:fp16:65536 rms:fwd:bf16:65536 ln:fwd:fp32:65536 rms:fwd:fp32:131072 ln:fwd:bf16:131072 ln:fwd:bf16:262144 rms:fwd:bf16:262144 ln:fwd:bf16:49152 ln:fwd:fp32:24576"
for round in 1 2 3; do
  PYTHONPATH=/tmp/B python3 abtmp/ab.py B $C
  PYTHONPATH=/tmp/P python3 abtmp/ab.py P $C
done 2>&1 | tee $OUT/ab.txt
date
(cd /tmp/P && timeout 150 compute-sanitizer --tool memcheck python3 -m pytest tests/python/test_cuda_only.py -x -q -k "reread_rows or staged_rows" 2>&1 | tail -2) | tee $OUT/sanP.txt
(cd /tmp/P && timeout 200 python3 -m pytest tests/python/test_cuda_only.py -x -q -m "not sanitize" -k "past_reread or many_rows_per_cluster or float32_params or one_affine" 2>&1 | tail -2) | tee $OUT/testP.txt
date
# ==== abtmp/pr/launch_plan.h (experiment: FLN_X_RULE)
4a5
> #include <cstdlib>
41,43c42,43
< // one-CTA register rows and the longer rows of staged clusters; what
< // follows decides the rest (rows past 80 KB, fp64, sm_80) and dates from
< // before v18a.  A register plan keeps
---
> // one-CTA register rows; what follows decides the rest (rows past 80 KB,
> // fp64, sm_80) and dates from before v18a.  A register plan keeps
226,227c226
< // reread_despite_inflight (below), and except the longer rows of staged
< // clusters (reread_max_row, below).  Measured on
---
> // reread_despite_inflight (below).  Measured on
256,276d254
< // The longest row re-read where the register plan is a staged cluster
< // (Plan::stage_x, with row tickets) and the weight and bias are of x's
< // dtype: the rows of two CTAs an SM and their weight and bias must stay in
< // L1 for the second walk, and past that the staged cluster runs ahead, from
< // 48 KB where LayerNorm's weight and bias outweigh the row, from 64 KB
< // otherwise.  H200, % of copy bandwidth, re-read -> staged cluster
< // (docs/performance.md v24b): LN bf16 28672 91.4 -> 92.1, 32768 89.8 ->
< // 91.3, 36864 85.0 -> 91.3, 40960 84.9 -> 91.8, fp16 32768 89.9 -> 91.4,
< // fp32 18432 89.9 -> 96.1, 20480 89.8 -> 96.3; RMS bf16 36864 91.2 -> 93.1,
< // 40960 91.1 -> 93.0, fp32 18432 94.0 -> 96.1, LN without bias bf16 36864
< // 89.9 -> 92.9; but RMS bf16 28672 94.2 -> 93.0, 32768 93.2 -> 91.4, fp32
< // 16384 96.5 -> 95.1, LN without bias bf16 32768 92.7 -> 90.9.  16-bit x
< // with fp32 weight and bias stays re-read: its staged cluster lost 12-14
< // points (LN bf16 36864 70.3 -> 56.1, 40960 71.1 -> 59.1).
< constexpr int64_t kRereadMaxStagedRow = 64 * 1024;
< constexpr int64_t kRereadMaxStagedRowParams = 48 * 1024;
< inline int64_t reread_max_row(const Plan& r, int elem_bytes, int w_bytes, bool params_outweigh_row) {
<   if (!r.stage_x || w_bytes > elem_bytes) return kRereadMaxRow;
<   return params_outweigh_row ? kRereadMaxStagedRowParams : kRereadMaxStagedRow;
< }
< 
412,413c390,396
<   const bool reread_row = row_bytes <= reread_max_row(r, elem_bytes, w_bytes, params_outweigh_row);
<   if (dev.cc_major == 9 && elem_bytes <= 4 && reread_row && !keep_registers)
---
>   {  // [experiment] FLN_X_RULE: 1 = 16-bit with params outweighing the row, 2 = any such, 3 = any, staged clusters past 48 KB
>     const char* e = std::getenv("FLN_X_RULE");
>     const int rule = e ? std::atoi(e) : 0;
>     const bool hit = rule == 3 || (rule == 2 && params_outweigh_row) || (rule == 1 && elem_bytes == 2 && params_outweigh_row);
>     if (dev.cc_major == 9 && hit && row_bytes > 48 * 1024 && row_bytes <= kRereadMaxRow && r.stage_x) return r;
>   }
>   if (dev.cc_major == 9 && elem_bytes <= 4 && row_bytes <= kRereadMaxRow && !keep_registers)
# ==== abtmp/run4.sh
set -u
rm -rf /tmp/R; mkdir -p /tmp/R; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/R -xf -
cp abtmp/rr/launch_plan.h /tmp/R/csrc/kernels/cuda/
date
(cd /tmp/R && MAX_JOBS=16 python3 setup.py build_ext --inplace > $OUT/buildR.txt 2>&1; echo R rc $?)
date
C="ln:fwd:bf16:4096 rms:fwd:bf16:4096 ln:fwd:bf16:5120 rms:fwd:bf16:5120 ln:fwd:bf16:6144 rms:fwd:bf16:6144 ln:fwd:bf16:7168 rms:fwd:bf16:7168 ln:fwd:fp16:7168 rms:fwd:fp16:7168 lnnb:fwd:bf16:7168 ln:fwd:bf16:2048 rms:fwd:bf16:2048 ln:fwd:fp32:2048 rms:fwd:fp32:2048 ln:fwd:fp32:3072 rms:fwd:fp32:3072 ln:fwd:fp32:3584"
for round in 1 2 3; do
  PYTHONPATH=/tmp/R python3 abtmp/ab.py B $C
  PYTHONPATH=/tmp/R FLN_RR_MIN=4096 python3 abtmp/ab.py R4K $C
done 2>&1 | tee $OUT/ab.txt
date
(cd /tmp/R && timeout 240 python3 -m pytest tests/python/test_cuda_only.py -q -m "not sanitize" -k "cuda_graph or row_tickets" 2>&1 | tail -3) | tee $OUT/testR.txt
(cd /tmp/R && FLN_RR_MIN=4096 timeout 100 compute-sanitizer --tool memcheck python3 -m pytest tests/python/test_cuda_only.py -x -q -k "sanitize_small_sizes or sanitize_reread" 2>&1 | tail -2) | tee $OUT/sanR.txt
date
# ==== abtmp/rr/launch_plan.h against 6d8b56a's (experiment: FLN_RR_MIN, FLN_RR_FORCE)
4a5
> #include <cstdlib>
407c408,417
<   if (bwd || !vec_ok || !r.registers || r.group || row_bytes < xs.min_row_bytes) return r;
---
>   // [experiment] FLN_RR_MIN: re-read rows from this many bytes (below 16 KB); FLN_RR_FORCE: even where registers keep 64 KB in flight
>   const char* e1 = std::getenv("FLN_RR_MIN");
>   const char* e2 = std::getenv("FLN_RR_FORCE");
>   const int64_t rr_min = e1 ? std::atoll(e1) : xs.min_row_bytes;
>   const bool force = e2 && std::atoi(e2) != 0;
>   if (bwd || !vec_ok || !r.registers || r.group || r.short_rows) return r;
>   if (row_bytes < xs.min_row_bytes) {
>     if (dev.cc_major == 9 && elem_bytes <= 4 && row_bytes >= rr_min) return reread_layout(rows, cols / r.vec, r.vec);
>     return r;
>   }
411c421
<       r.csize == 1 && inflight_ok && !reread_despite_inflight(r, elem_bytes, params_outweigh_row);
---
>       !force && r.csize == 1 && inflight_ok && !reread_despite_inflight(r, elem_bytes, params_outweigh_row);
