# v27 attempt scripts (H200). Variant builds: each run copies the tree to /tmp/T<k>, applies a diff, builds in place.

# ===== abtmp/run.sh
set -u
for k in 0 1; do rm -rf /tmp/T$k; mkdir -p /tmp/T$k; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/T$k -xf -; done
(cd /tmp/T1 && patch -p1 < $OLDPWD/abtmp/exp.diff > /dev/null)
date
for k in 0 1; do (cd /tmp/T$k && MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/build$k.txt 2>&1; echo T$k rc $?) & done; wait
date
for m in 0 1 2 4 8 5; do FLN_RR_MODE=$m PYTHONPATH=/tmp/T1 python3 abtmp/chk.py 2>&1 | grep -v Warn; done | tee $OUT/chk.txt
S="fwd:rms:bf16:7168 fwd:rms:bf16:8192 fwd:rms:bf16:5120 fwd:ln:bf16:7168 fwd:ln:bf16:8192 fwd:rms:fp32:4096"
for round in 1 2; do
  PYTHONPATH=/tmp/T0 python3 abtmp/ab3.py H $S
  for m in 0 1 2 4 8 17 5; do FLN_RR_MODE=$m PYTHONPATH=/tmp/T1 python3 abtmp/ab3.py M$m $S; done
done 2>&1 | grep -v Warning | tee $OUT/ab.txt
date
PYTHONPATH=/tmp/T0 timeout 150 python3 -m fused_layernorm.bench --peers ours,compile --ops rmsnorm --dtypes bf16 --hidden 7168,8192 --directions fwd --no-small --out /tmp/bo > $OUT/bench0.txt 2>&1
date

# ===== abtmp/run2.sh
set -u
R=$PWD
for k in 0 1 2 3 4; do rm -rf /tmp/T$k; mkdir -p /tmp/T$k; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/T$k -xf -
  if [ $k -gt 0 ]; then (cd /tmp/T$k && patch -p1 < $R/abtmp/exp2.diff > /dev/null && sed -i "s/constexpr int kExp = 0;/constexpr int kExp = $k;/" csrc/kernels/cuda/fwd_reread_kernel.cuh); fi; done
grep -h "constexpr int kExp" /tmp/T*/csrc/kernels/cuda/fwd_reread_kernel.cuh
date
for k in 0 1 2 3 4; do (cd /tmp/T$k && MAX_JOBS=4 python3 setup.py build_ext --inplace > $OUT/build$k.txt 2>&1; echo T$k rc $?) & done; wait
date
for k in 1 2 3 4; do PYTHONPATH=/tmp/T$k python3 abtmp/chk.py 2>&1 | grep -v Warn | sed "s/^/T$k /"; done | tee $OUT/chk.txt
S="fwd:rms:bf16:7168 fwd:rms:bf16:8192 fwd:rms:bf16:5120 fwd:rms:bf16:10240 fwd:ln:bf16:7168 fwd:ln:bf16:8192 fwd:rms:fp16:8192 fwd:rms:fp32:4096 fwd:ln:fp32:4096"
for round in 1 2; do
  for k in 0 1 2 3 4; do PYTHONPATH=/tmp/T$k python3 abtmp/ab3.py T$k $S; done
done 2>&1 | grep -v Warning | tee $OUT/ab.txt
date
cd /tmp/T0 && timeout 200 python3 -m fused_layernorm.bench --peers ours,compile --ops rmsnorm --dtypes bf16 --hidden 7168,8192 --directions fwd --no-small --out /tmp/bo > $OUT/bench0.txt 2>&1
date

# ===== abtmp/run3.sh
set -u
R=$PWD
V="0 8 2 4 1 15"
for k in $V; do rm -rf /tmp/T$k; mkdir -p /tmp/T$k; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/T$k -xf -
  if [ $k -gt 0 ]; then (cd /tmp/T$k && patch -p1 < $R/abtmp/exp3.diff > /dev/null && sed -i "s/constexpr int kExp = 0;/constexpr int kExp = $k;/" csrc/kernels/cuda/fwd_reread_kernel.cuh); fi; done
grep -h "constexpr int kExp" /tmp/T*/csrc/kernels/cuda/fwd_reread_kernel.cuh
date
for k in $V; do (cd /tmp/T$k && MAX_JOBS=3 python3 setup.py build_ext --inplace > $OUT/build$k.txt 2>&1; echo T$k rc $?) & done; wait
date
for k in 8 2 4 1 15; do PYTHONPATH=/tmp/T$k python3 abtmp/chk.py 2>&1 | grep -v Warn | sed "s/^/T$k /"; done | tee $OUT/chk.txt
S="fwd:rms:bf16:7168 fwd:rms:bf16:8192 fwd:rms:bf16:5120 fwd:rms:bf16:10240 fwd:ln:bf16:5120 fwd:ln:bf16:7168 fwd:ln:bf16:8192 fwd:ln:bf16:10240 fwd:rms:fp16:8192 fwd:rms:fp32:4096 fwd:ln:fp32:4096"
for round in 1 2; do
  for k in $V; do PYTHONPATH=/tmp/T$k python3 abtmp/ab3.py T$k $S; done
done 2>&1 | grep -v Warning | tee $OUT/ab.txt
date

# ===== abtmp/run4.sh
set -u
R=$PWD
for k in 0 5; do rm -rf /tmp/T$k; mkdir -p /tmp/T$k; tar --exclude=./abtmp --exclude=./build --exclude=./build-cpp --exclude=./.venv -cf - . | tar -C /tmp/T$k -xf -; done
(cd /tmp/T0 && patch -R -p1 < $R/abtmp/new.diff > /dev/null)
grep -c RereadOp /tmp/T0/csrc/kernels/cuda/launch.cuh /tmp/T5/csrc/kernels/cuda/launch.cuh
date
for k in 0 5; do (cd /tmp/T$k && MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/build$k.txt 2>&1; echo T$k rc $?) & done; wait
date
PYTHONPATH=/tmp/T5 python3 abtmp/chk.py 2>&1 | grep -v Warn | tee $OUT/chk.txt
S="fwd:rms:bf16:7168 fwd:rms:bf16:8192 fwd:rms:bf16:5120 fwd:rms:bf16:10240 fwd:ln:bf16:5120 fwd:ln:bf16:7168 fwd:ln:bf16:8192 fwd:ln:bf16:10240 fwd:rms:fp16:8192 fwd:rms:fp16:10240 fwd:ln:fp16:8192 fwd:rms:fp32:4096 fwd:ln:fp32:4096"
for round in 1 2 3; do
  for k in 0 5; do PYTHONPATH=/tmp/T$k python3 abtmp/ab3.py T$k $S; done
done 2>&1 | grep -v Warning | tee $OUT/ab.txt
date
cd /tmp/T5 && timeout 120 python3 -m fused_layernorm.bench --peers ours,compile --ops rmsnorm --dtypes bf16 --hidden 5120,7168,8192,10240 --directions fwd --no-small --out /tmp/bo > $OUT/bench5.txt 2>&1
date

# ===== abtmp/chk.py
"""[experiment] one mode's outputs against a float64 reference (rows enough for the prefetch's look-ahead)."""
import os, sys, torch
import torch.nn.functional as F
from fused_layernorm import fused_layer_norm, fused_rms_norm
torch.manual_seed(0)
bad = 0
for h in (5120, 7168, 8192, 10240, 4096):
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        rows = 2000
        x = torch.randn(rows, h, device="cuda", dtype=dt) * 3 + 1
        w = torch.randn(h, device="cuda", dtype=dt); b = torch.randn(h, device="cuda", dtype=dt)
        with torch.no_grad():
            for op in ("rms", "ln"):
                y = fused_rms_norm(x, w, 1e-6) if op == "rms" else fused_layer_norm(x, w, b, 1e-5)
                ref = (F.rms_norm(x.double(), (h,), w.double(), 1e-6) if op == "rms"
                       else F.layer_norm(x.double(), (h,), w.double(), b.double(), 1e-5))
                err = (y.double() - ref).abs().max().item()
                tol = 1e-4 if dt == torch.float32 else 0.1
                if not err < tol: bad += 1; print("BAD", op, h, dt, err)
print("mode", os.environ.get("FLN_RR_MODE"), "bad", bad)

# ab3.py: see 2026-11-23-nvidia-h200-v26-scripts.sh

# ===== abtmp/exp.diff
# diff --git a/csrc/kernels/cuda/fwd_reread_kernel.cuh b/csrc/kernels/cuda/fwd_reread_kernel.cuh
# index 5a19ac2..dd37da2 100644
# --- a/csrc/kernels/cuda/fwd_reread_kernel.cuh
# +++ b/csrc/kernels/cuda/fwd_reread_kernel.cuh
# @@ -76,6 +76,12 @@ norm_fwd_reread_kernel(FwdParams p, dacc_t<T> inv_n) {
#  
#    auto one_row = [&](int64_t row) {
#      const T* __restrict__ xrow = static_cast<const T*>(p.x) + row * p.x_stride;
# +#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
# +    if ((p.exp_mode & 1) && tid == 0 && row + p.exp_look < p.rows) {
# +      const T* nx = static_cast<const T*>(p.x) + (row + p.exp_look) * p.x_stride;
# +      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" :: "l"(nx), "r"(unsigned(p.cols * sizeof(T))) : "memory");
# +    }
# +#endif
#      // One walk over the row for its sums, kRereadLoads accesses a thread at
#      // a time (NV > 0: all NV), each valid access handed to f; the lines stay
#      // in L1.  LayerNorm's exact third walk (below) loads without allocating
# @@ -91,7 +97,10 @@ norm_fwd_reread_kernel(FwdParams p, dacc_t<T> inv_n) {
#          constexpr L2Policy Q = kThird ? L2Policy::kNormal : L2Policy::kEvictLast;
#          Frag<T, VEC> xr[NV];
#  #pragma unroll
# -        for (int u = 0; u < NV; ++u) load_l1<P, Q>(xr[u], xrow + at(tid + u * nt));
# +        for (int u = 0; u < NV; ++u) {
# +          if (tid + u * nt < nvec) load_l1<P, Q>(xr[u], xrow + at(tid + u * nt));
# +          else xr[u].zero();
# +        }
#  #pragma unroll
#          for (int u = 0; u < NV; ++u) f(xr[u]);
#        } else {
# @@ -176,7 +185,8 @@ norm_fwd_reread_kernel(FwdParams p, dacc_t<T> inv_n) {
#            const A xh = xi.get(k) * rstd + shift;
#            y[k] = affine(has_w, has_b, xh, w, b, k);
#          }
# -        store_vec(yrow + at(c), y);
# +        if (p.exp_mode & 2) store_vec<true>(yrow + at(c), y);
# +        else store_vec(yrow + at(c), y);
#        };
#        if constexpr (NV > 0) {
#          // One access at a time: two at a time spilled 8 bytes with weight
# @@ -184,8 +194,15 @@ norm_fwd_reread_kernel(FwdParams p, dacc_t<T> inv_n) {
#          // of copy bandwidth, two -> one, with L2 hints: RMS bf16 8192 98.1
#          // -> 98.1, fp32 4096 97.6 -> 100.3, fp32 5120 96.9 -> 100.5;
#          // docs/performance.md v26a).
# +        if (p.exp_mode & 8) {
# +#pragma unroll
# +          for (int j = 0; j < NV; ++j)
# +            if (tid + j * nt < nvec) write(tid + j * nt);
# +        } else {
#  #pragma unroll 1
# -        for (int j = 0; j < NV; ++j) write(tid + j * nt);
# +          for (int j = 0; j < NV; ++j)
# +            if (tid + j * nt < nvec) write(tid + j * nt);
# +        }
#        } else {
#          constexpr int U = kRereadWriteLoads<T, W>;
#          for (int j = tid; j < nvec; j += U * nt)
# diff --git a/csrc/kernels/cuda/launch.cuh b/csrc/kernels/cuda/launch.cuh
# index 8fd9f32..0018c88 100644
# --- a/csrc/kernels/cuda/launch.cuh
# +++ b/csrc/kernels/cuda/launch.cuh
# @@ -369,7 +369,10 @@ cudaError_t norm_fwd(const FwdParams& p, const DeviceInfo& dev, cudaStream_t str
#    if (pl.short_rows || pl.reread) {
#      auto kernel = pl.short_rows ? fwd_rows_kernel_for<DT, DW>(pl) : fwd_reread_kernel_for<DT, DW>(pl, p.cols);
#      const int64_t groups = pl.groups < INT32_MAX ? pl.groups : INT32_MAX;
# -    return launch(kernel, dim3(unsigned(groups)), dim3(pl.cta_threads), 0, 1, stream, p, A(1.0 / double(p.cols)));
# +    FwdParams q = p;
# +    q.exp_mode = exp_mode_env();
# +    q.exp_look = int64_t(dev.sm_count) * (2048 / pl.cta_threads) * ((q.exp_mode & 16) ? 2 : 1);
# +    return launch(kernel, dim3(unsigned(groups)), dim3(pl.cta_threads), 0, 1, stream, q, A(1.0 / double(p.cols)));
#    }
#    if constexpr (sizeof(DT) <= 4)
#      if (pl.group) {
# diff --git a/csrc/kernels/cuda/launch_plan.h b/csrc/kernels/cuda/launch_plan.h
# index 80d7813..55d118a 100644
# --- a/csrc/kernels/cuda/launch_plan.h
# +++ b/csrc/kernels/cuda/launch_plan.h
# @@ -2,9 +2,15 @@
#  // problem size, the dtype and the device, so it is unit-tested on the host.
#  #pragma once
#  #include <cstdint>
# +#include <cstdlib>
#  
#  namespace fln::cuda {
#  
# +inline int exp_mode_env() {
# +  static const int m = std::getenv("FLN_RR_MODE") ? std::atoi(std::getenv("FLN_RR_MODE")) : 0;
# +  return m;
# +}
# +
#  struct DeviceInfo {
#    int index = 0;
#    int sm_count = 1;
# @@ -340,9 +346,13 @@ constexpr int kRereadPairAccesses = 2;
#  constexpr int kRereadPairMinCta = 320;
#  constexpr int kRereadPairMinCtas = 3;
#  constexpr int kRereadSmThreads = 2048;  // kRereadMinCtas CTAs of kRereadCta threads an SM (32 registers)
# +inline int64_t pair_threads(int64_t nvec) {
# +  const int64_t t = nvec / kRereadPairAccesses;
# +  return (exp_mode_env() & 4) ? (t + 127) / 128 * 128 : t;
# +}
#  inline bool reread_pair_fits(int64_t nvec) {
#    if (nvec % (32 * kRereadPairAccesses) != 0) return false;
# -  const int64_t t = nvec / kRereadPairAccesses, ctas = kRereadSmThreads / t;
# +  const int64_t t = pair_threads(nvec), ctas = kRereadSmThreads / t;
#    return t >= kRereadPairMinCta && ctas >= kRereadPairMinCtas && ctas * t * 8 >= int64_t(kRereadSmThreads) * 7;
#  }
#  
# @@ -350,7 +360,7 @@ inline bool reread_pair_fits(int64_t nvec) {
#  // thread, one CTA a row (a grid of at most 2^31 - 1 CTAs).
#  inline bool reread_exact(const Plan& p, int64_t cols) {
#    return p.reread && p.nv == kRereadPairAccesses && p.tpr == p.cta_threads &&
# -         int64_t(p.tpr) * p.nv * p.vec == cols && p.groups < INT32_MAX;
# +         int64_t(p.tpr) * p.nv * p.vec >= cols && int64_t(p.tpr - 128) * p.nv * p.vec < cols && p.groups < INT32_MAX;
#  }
#  
#  inline Plan reread_pair_layout(int64_t rows, int64_t nvec, int vec) {
# @@ -358,7 +368,7 @@ inline Plan reread_pair_layout(int64_t rows, int64_t nvec, int vec) {
#    p.reread = true;
#    p.vec = vec;
#    p.nv = kRereadPairAccesses;
# -  p.tpr = p.cta_threads = int(nvec / kRereadPairAccesses);
# +  p.tpr = p.cta_threads = int(pair_threads(nvec));
#    p.groups = rows;
#    return p;
#  }
# diff --git a/csrc/kernels/params.h b/csrc/kernels/params.h
# index 2891ee0..81354c4 100644
# --- a/csrc/kernels/params.h
# +++ b/csrc/kernels/params.h
# @@ -20,6 +20,8 @@ struct FwdParams {
#    void* rstd = nullptr;     // [rows] of acc type; may be null
#    double eps = 1e-5;
#    bool rms = false;         // RMSNorm: no mean subtraction, no bias
# +  int exp_mode = 0;
# +  int64_t exp_look = 0;
#  };
#  
#  struct BwdParams {

# ===== abtmp/exp2.diff
# diff --git a/csrc/kernels/cuda/fwd_reread_kernel.cuh b/csrc/kernels/cuda/fwd_reread_kernel.cuh
# index 5a19ac2..dd52421 100644
# --- a/csrc/kernels/cuda/fwd_reread_kernel.cuh
# +++ b/csrc/kernels/cuda/fwd_reread_kernel.cuh
# @@ -30,6 +30,7 @@
#  
#  namespace fln::cuda {
#  
# +constexpr int kExp = 0;  // EXP: 1 two rows a CTA + L1 prefetch; 2 smem sum; 4 two rows no prefetch
#  constexpr int kRereadMaxThreads = 1024;
#  constexpr int kRereadMinCtas = 2;
#  // 16-byte loads a thread issues together in the first walk, and in the
# @@ -52,8 +53,18 @@ __device__ __forceinline__ void cta_sum(A (&v)[K], A (&sm)[2][32][2], int& parit
#  #pragma unroll
#      for (int k = 0; k < K; ++k) sm[parity][warp][k] = v[k];
#    __syncthreads();
# +  if constexpr (kExp & 2) {
# +#pragma unroll
# +    for (int k = 0; k < K; ++k) {
# +      A s0 = 0, s1 = 0;
# +#pragma unroll 8
# +      for (int w2 = 0; w2 < nw; w2 += 2) { s0 += sm[parity][w2][k]; if (w2 + 1 < nw) s1 += sm[parity][w2 + 1][k]; }
# +      v[k] = s0 + s1;
# +    }
# +  } else {
#  #pragma unroll
#    for (int k = 0; k < K; ++k) v[k] = butterfly_sum<32>(lane < nw ? sm[parity][lane][k] : A(0));
# +  }
#    parity ^= 1;
#  }
#  
# @@ -198,7 +209,18 @@ norm_fwd_reread_kernel(FwdParams p, dacc_t<T> inv_n) {
#    };
#    // The straight-line variants run one row a CTA (reread_exact: at most
#    // 2^31 - 1 rows); the loop's registers made them spill.
# -  if constexpr (NV > 0)
# +  if constexpr (NV > 0 && (kExp & 5)) {
# +    const int64_t r0 = int64_t(blockIdx.x) * 2;
# +    if constexpr (kExp & 1) {
# +      if (r0 + 1 < p.rows) {
# +        const T* nx = static_cast<const T*>(p.x) + (r0 + 1) * p.x_stride;
# +#pragma unroll
# +        for (int u = 0; u < NV; ++u) asm volatile("prefetch.global.L1 [%0];" :: "l"(nx + at(tid + u * nt)));
# +      }
# +    }
# +#pragma unroll 1
# +    for (int64_t r = r0; r < r0 + 2 && r < p.rows; ++r) one_row(r);
# +  } else if constexpr (NV > 0)
#      one_row(blockIdx.x);
#    else
#      for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) one_row(row);
# diff --git a/csrc/kernels/cuda/launch.cuh b/csrc/kernels/cuda/launch.cuh
# index 8fd9f32..5d11bef 100644
# --- a/csrc/kernels/cuda/launch.cuh
# +++ b/csrc/kernels/cuda/launch.cuh
# @@ -368,7 +368,8 @@ cudaError_t norm_fwd(const FwdParams& p, const DeviceInfo& dev, cudaStream_t str
#    // (the kernels stride past that).
#    if (pl.short_rows || pl.reread) {
#      auto kernel = pl.short_rows ? fwd_rows_kernel_for<DT, DW>(pl) : fwd_reread_kernel_for<DT, DW>(pl, p.cols);
# -    const int64_t groups = pl.groups < INT32_MAX ? pl.groups : INT32_MAX;
# +    int64_t groups = pl.groups < INT32_MAX ? pl.groups : INT32_MAX;
# +    if ((kExp & 5) && pl.reread && reread_exact(pl, p.cols)) groups = (pl.groups + 1) / 2;
#      return launch(kernel, dim3(unsigned(groups)), dim3(pl.cta_threads), 0, 1, stream, p, A(1.0 / double(p.cols)));
#    }
#    if constexpr (sizeof(DT) <= 4)

# ===== abtmp/exp3.diff
# diff --git a/csrc/kernels/cuda/fwd_reread_kernel.cuh b/csrc/kernels/cuda/fwd_reread_kernel.cuh
# index 5a19ac2..1eae378 100644
# --- a/csrc/kernels/cuda/fwd_reread_kernel.cuh
# +++ b/csrc/kernels/cuda/fwd_reread_kernel.cuh
# @@ -30,6 +30,7 @@
#  
#  namespace fln::cuda {
#  
# +constexpr int kExp = 0;  // EXP bits: 1 butterfly16; 2 sum trees; 4 16-bit write two at a time; 8 smem tree sum
#  constexpr int kRereadMaxThreads = 1024;
#  constexpr int kRereadMinCtas = 2;
#  // 16-byte loads a thread issues together in the first walk, and in the
# @@ -52,8 +53,39 @@ __device__ __forceinline__ void cta_sum(A (&v)[K], A (&sm)[2][32][2], int& parit
#  #pragma unroll
#      for (int k = 0; k < K; ++k) sm[parity][warp][k] = v[k];
#    __syncthreads();
# +  if ((kExp & 1) && nw <= 16) {
# +#pragma unroll
# +    for (int k = 0; k < K; ++k) v[k] = butterfly_sum<16>((lane & 15) < nw ? sm[parity][lane & 15][k] : A(0));
# +  } else {
#  #pragma unroll
#    for (int k = 0; k < K; ++k) v[k] = butterfly_sum<32>(lane < nw ? sm[parity][lane][k] : A(0));
# +  }
# +  parity ^= 1;
# +}
# +
# +template <int N, typename A>
# +__device__ __forceinline__ A tree_sum(const A* t) {
# +  if constexpr (N == 1) return t[0];
# +  else return tree_sum<N / 2>(t) + tree_sum<N / 2>(t + N / 2);
# +}
# +// EXP: per-warp sums in sm2[parity][k][warp] (entries >= nw zeroed at the
# +// start); every thread reads them all and adds them in one fixed tree.
# +template <typename A, int K>
# +__device__ __forceinline__ void cta_sum2(A (&v)[K], A (&sm2)[2][2][32], int& parity) {
# +  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, nw = int(blockDim.x) / 32;
# +#pragma unroll
# +  for (int k = 0; k < K; ++k) v[k] = butterfly_sum<32>(v[k]);
# +  if (lane == 0)
# +#pragma unroll
# +    for (int k = 0; k < K; ++k) sm2[parity][k][warp] = v[k];
# +  __syncthreads();
# +  if (nw <= 16) {
# +#pragma unroll
# +    for (int k = 0; k < K; ++k) v[k] = tree_sum<16>(&sm2[parity][k][0]);
# +  } else {
# +#pragma unroll
# +    for (int k = 0; k < K; ++k) v[k] = tree_sum<32>(&sm2[parity][k][0]);
# +  }
#    parity ^= 1;
#  }
#  
# @@ -67,7 +99,17 @@ norm_fwd_reread_kernel(FwdParams p, dacc_t<T> inv_n) {
#    static_assert(VEC * sizeof(T) == 16, "16-byte accesses");
#    using A = dacc_t<T>;
#    __shared__ A sm[2][32][2];
# +  __shared__ __align__(16) A sm2[2][2][32];
#    int parity = 0;
# +  if constexpr ((kExp & 8) && NV > 0) {
# +    const int nw0 = int(blockDim.x) / 32;
# +    for (int i = int(threadIdx.x); i < 128; i += int(blockDim.x))
# +      if (i % 32 >= nw0) (&sm2[0][0][0])[i] = A(0);
# +  }
# +  auto csum = [&](auto& v) {
# +    if constexpr ((kExp & 8) && NV > 0) cta_sum2(v, sm2, parity);
# +    else cta_sum(v, sm, parity);
# +  };
#    const int nvec = int(p.cols / VEC);  // cols % VEC == 0 (launch_plan.h); a row has < 2^31 accesses
#    const int tid = int(threadIdx.x), nt = int(blockDim.x);
#    const W* __restrict__ wg = static_cast<const W*>(p.w);
# @@ -115,17 +157,31 @@ norm_fwd_reread_kernel(FwdParams p, dacc_t<T> inv_n) {
#      if (p.rms) {
#        A q = 0;
#        walk([&](const Frag<T, VEC>& x) {
# +        if constexpr ((kExp & 2) && NV > 0) {
# +          A t[VEC];
# +#pragma unroll
# +          for (int k = 0; k < VEC; ++k) t[k] = x.get(k) * x.get(k);
# +          q += tree_sum<VEC>(t);
# +        } else {
#          A a = 0;
#  #pragma unroll
#          for (int k = 0; k < VEC; ++k) a += x.get(k) * x.get(k);
#          q += a;
# +        }
#        }, std::false_type{});
#        A v[1] = {q};
# -      cta_sum(v, sm, parity);
# +      csum(v);
#        var = v[0] * inv_n;
#      } else {
#        A s1 = 0, s2 = 0;
#        walk([&](const Frag<T, VEC>& x) {
# +        if constexpr ((kExp & 2) && NV > 0) {
# +          A t[VEC], u[VEC];
# +#pragma unroll
# +          for (int k = 0; k < VEC; ++k) { t[k] = x.get(k); u[k] = x.get(k) * x.get(k); }
# +          s1 += tree_sum<VEC>(t);
# +          s2 += tree_sum<VEC>(u);
# +        } else {
#          A a = 0, b = 0;
#  #pragma unroll
#          for (int k = 0; k < VEC; ++k) {
# @@ -134,9 +190,10 @@ norm_fwd_reread_kernel(FwdParams p, dacc_t<T> inv_n) {
#          }
#          s1 += a;
#          s2 += b;
# +        }
#        }, std::false_type{});
#        A v[2] = {s1, s2};
# -      cta_sum(v, sm, parity);
# +      csum(v);
#        mean = v[0] * inv_n;
#        var = v[1] * inv_n - mean * mean;
#        // Identical in every thread of the CTA: the third walk is uniform.
# @@ -149,7 +206,7 @@ norm_fwd_reread_kernel(FwdParams p, dacc_t<T> inv_n) {
#            s3 += a;
#          }, std::true_type{});
#          A q[1] = {s3};
# -        cta_sum(q, sm, parity);
# +        csum(q);
#          var = q[0] * inv_n;
#        }
#      }
# @@ -184,8 +241,13 @@ norm_fwd_reread_kernel(FwdParams p, dacc_t<T> inv_n) {
#          // of copy bandwidth, two -> one, with L2 hints: RMS bf16 8192 98.1
#          // -> 98.1, fp32 4096 97.6 -> 100.3, fp32 5120 96.9 -> 100.5;
#          // docs/performance.md v26a).
# +        if constexpr ((kExp & 4) && sizeof(T) == 2 && !has_b()) {
# +#pragma unroll
# +          for (int j = 0; j < NV; ++j) write(tid + j * nt);
# +        } else {
#  #pragma unroll 1
#          for (int j = 0; j < NV; ++j) write(tid + j * nt);
# +        }
#        } else {
#          constexpr int U = kRereadWriteLoads<T, W>;
#          for (int j = tid; j < nvec; j += U * nt)
