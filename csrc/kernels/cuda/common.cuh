// Device helpers shared by the CUDA normalization kernels: storage-type
// mapping, conversions, 16-byte vectors and the row reduction.
#pragma once
#include <type_traits>
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "../dtypes.h"

namespace fln::cuda {

// Largest CTA of the register kernels (launch_plan.h keeps to it): small
// enough that two CTAs share an SM, so one CTA's loads overlap another's reductions.
constexpr int kMaxCtaThreads = 512;

// A kernel's register cap (__maxnreg__, CUDA 12.4+).  Older compilers cap at
// 128, from launch bounds (kMaxCtaThreads, 1); the launchers size grids from
// the occupancy API, so they follow whichever cap the kernel got.
#if defined(__CUDACC_VER_MAJOR__) && \
    (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4))
#define FLN_MAX_REGS(R) __maxnreg__(R)
#else
#define FLN_MAX_REGS(R) __launch_bounds__(kMaxCtaThreads, 1)
#endif

// Host storage type (fln::Half, ...) -> device type (__half, ...).
template <typename T> struct DeviceType { using type = T; };
template <> struct DeviceType<Half> { using type = __half; };
template <> struct DeviceType<BFloat16> { using type = __nv_bfloat16; };
template <typename T> using device_t = typename DeviceType<T>::type;

template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };
template <typename T> using dacc_t = typename Acc<T>::type;

// Pairs of accumulators, (dweight, dbias), moved as one 8- or 16-byte access.
template <typename A> struct Acc2;
template <> struct Acc2<float> { using type = float2; };
template <> struct Acc2<double> { using type = double2; };
template <typename A> using acc2_t = typename Acc2<A>::type;

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_acc(float v) { return T(v); }
template <typename T> __device__ __forceinline__ T from_acc(double v) { return T(v); }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// s / n rounded once, from inv_n = 1 / n rounded (IEEE division's fast path:
// a residual and a correction, two FMAs).  A sum of n copies of a 16-bit
// value is exact up to 2^13 of them, so this gives a constant row's mean as
// its value where s * inv_n can be an ulp off.
__device__ __forceinline__ float exact_ratio(float s, float n, float inv_n) {
  const float q = s * inv_n;
  return __fmaf_rn(inv_n, __fmaf_rn(-n, q, s), q);
}

// LayerNorm's variance pass for 16-bit rows whose mean comes from unshifted
// sums in the K = 0 kernels (staged clusters, shared-memory rows) and the
// re-reading kernel, rows that can pass the 2^13 elements exact_ratio needs:
// sum((x - c)^2) about c = snap_center<T>(mean), the 16-bit value within
// 2^-19 of the mean where there is one, else the mean.  A constant row's sums
// leave its mean under 2^-21 off, so c is its value and the sum is 0:
// centered_stats then gives mean c and variance 0 (xhat = 0).  Any other row
// keeps its summed mean, and var = sum / n - (mean - c)^2 subtracts at most
// 2^-38 mean^2: a few roundings of var for rows all but constant.  No pass
// over the row: the staged clusters spilled with one more reduction.
template <typename T>
__device__ __forceinline__ float snap_center(float mean) {
  const float near = to_acc(from_acc<T>(mean));
  return fabsf(mean - near) <= fabsf(mean) * 0x1p-19f ? near : mean;
}
// mean and var from the summed mean and the mean square about `center`.
// (A mean of +-inf as its own center keeps the mean square as var, not NaN.)
template <typename A>
__device__ __forceinline__ void centered_stats(A& mean, A& var, A center, A mean_square) {
  const A d = mean - center;
  var = center == mean ? mean_square : mean_square - d * d;
  if (mean_square == A(0)) {
    mean = center;
    var = A(0);
  }
}

// The scale of y = x * scale - mean * scale: rstd, but 0 for a LayerNorm row
// of zero variance (constant: the statistics above make its mean its value),
// whose xhat is then 0 and y the bias; the FMA would leave the rounding of
// mean * rstd (rstd = 316 at eps 1e-5).  RMSNorm keeps rstd: x^2 may
// underflow to a zero sum of nonzero x.
template <typename A>
__device__ __forceinline__ A xhat_scale(bool rms, A var, A rstd) {
  return !rms && var == A(0) ? A(0) : rstd;
}

__device__ __forceinline__ float rsqrt_acc(float v) { return rsqrtf(v); }
__device__ __forceinline__ double rsqrt_acc(double v) { return 1.0 / sqrt(v); }

// VEC consecutive elements moved as one access (16 bytes when VEC * sizeof(T) == 16).
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec { T v[VEC]; };

// Bit patterns of 16-bit floats, two to a 32-bit word: the low half holds
// the element of lower address.
__device__ __forceinline__ float bits_to_acc(uint32_t u, bool hi, __nv_bfloat16*) {
  return __uint_as_float(hi ? (u & 0xffff0000u) : (u << 16));  // bf16 is the top half of an fp32
}
__device__ __forceinline__ float bits_to_acc(uint32_t u, bool hi, __half*) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(hi ? u >> 16 : u & 0xffffu)));
}
__device__ __forceinline__ uint32_t acc_to_bits(float lo, float hi, __nv_bfloat16*) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // one packed conversion
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t acc_to_bits(float lo, float hi, __half*) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// One access of VEC elements held in registers in the storage dtype.  16-bit
// types stay packed two to a 32-bit register (left as an array of __half the
// compiler gives every element its own register and unpacks it with extra
// instructions); get() converts one element when it is used.
template <typename T, int VEC, bool kPacked = sizeof(T) == 2>
struct Frag {
  Vec<T, VEC> r;
  __device__ __forceinline__ void load(const T* p) { r = *reinterpret_cast<const Vec<T, VEC>*>(p); }
  __device__ __forceinline__ void store(T* p) const { *reinterpret_cast<Vec<T, VEC>*>(p) = r; }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int k = 0; k < VEC; ++k) r.v[k] = T(0);
  }
  __device__ __forceinline__ void one() {
#pragma unroll
    for (int k = 0; k < VEC; ++k) r.v[k] = T(1);
  }
  __device__ __forceinline__ dacc_t<T> get(int k) const { return r.v[k]; }
};

template <typename T, int VEC>
struct Frag<T, VEC, true> {
  static constexpr int kWords = (VEC + 1) / 2;
  Vec<uint32_t, kWords> r;
  __device__ __forceinline__ void load(const T* p) {
    if constexpr (VEC == 1) r.v[0] = *reinterpret_cast<const unsigned short*>(p);
    else r = *reinterpret_cast<const Vec<uint32_t, kWords>*>(p);
  }
  __device__ __forceinline__ void store(T* p) const {
    if constexpr (VEC == 1) *reinterpret_cast<unsigned short*>(p) = static_cast<unsigned short>(r.v[0]);
    else *reinterpret_cast<Vec<uint32_t, kWords>*>(p) = r;
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int k = 0; k < kWords; ++k) r.v[k] = 0;
  }
  __device__ __forceinline__ void one() {  // 1.0 in every element
    const uint32_t b = acc_to_bits(1.0f, 1.0f, static_cast<T*>(nullptr));
#pragma unroll
    for (int k = 0; k < kWords; ++k) r.v[k] = b;
  }
  __device__ __forceinline__ float get(int k) const {
    return bits_to_acc(r.v[k / 2], k % 2 == 1, static_cast<T*>(nullptr));
  }
};

// Calls f(has_w, has_b) with std::bool_constant tags for the weight and bias
// a launch reads, so that the loop inside f tests no pointer (the choice is
// uniform for the launch).
template <typename F>
__device__ __forceinline__ void with_affine(const void* w, const void* b, F&& f) {
  using Yes = std::true_type;
  using No = std::false_type;
  if (w) {
    if (b) f(Yes{}, Yes{});
    else f(Yes{}, No{});
  } else {
    if (b) f(No{}, Yes{});
    else f(No{}, No{});
  }
}

// xhat * w[k] + b[k] for the arrays present (the tags of with_affine); an
// absent one's Frag is never read.
template <typename HasW, typename HasB, typename A, typename FW>
__device__ __forceinline__ A affine(HasW, HasB, A xh, const FW& w, const FW& b, int k) {
  if constexpr (HasW::value && HasB::value) return xh * w.get(k) + b.get(k);
  else if constexpr (HasW::value) return xh * w.get(k);
  else if constexpr (HasB::value) return xh + b.get(k);
  else return xh;
}

// 16-byte loads with an L1 policy and an L2 eviction priority; other widths
// take an ordinary load.  The caller guarantees 16-byte alignment.  The asm
// is volatile: otherwise the compiler takes it for a pure function of the
// address and may hoist it out of the test around it (a non-volatile build
// loaded the weight and bias of fwd_rows_kernel.cuh past with_affine's
// null tests: an illegal address where either was absent).  No memory
// clobber (.nc): the kernels never write what they load this way.  The L2
// priority needs sm_80 (createpolicy); builds for older GPUs
// (TORCH_CUDA_ARCH_LIST=7.5) load with the L1 policy alone.
// - L1Policy::kNoAllocate: not kept in L1 (x or dy, read once), so that L1
//   stays with what is reused.
// - L1Policy::kEvictLast: kept in L1 ahead of other lines (a weight every row
//   reads, or a row read again soon).
// - L1Policy::kEvictFirst: the last read of a line kept by kEvictLast.
// - L1Policy::kNormal: an ordinary (coherent) load, for an L2 priority alone.
// - L2Policy::kEvictLast / kEvictFirst: an L2 cache hint (createpolicy,
//   sm_80+) on the load.  The register kernels load x (and dy), weight and
//   bias evict_last in L2; the re-read kernel marks x evict_last on its
//   first read and evict_first on its last, as torch.compile's Triton
//   kernels do.  Worth 1-4 points of copy bandwidth (fwd_kernel.cuh,
//   fwd_reread_kernel.cuh); why the L2 priority of lines read once matters is
//   not established.
enum class L1Policy { kNoAllocate, kEvictLast, kEvictFirst, kNormal };
enum class L2Policy { kNormal, kEvictLast, kEvictFirst };

// The 64-bit cache policy of an L2 priority for the whole line (fraction 1).
// Not volatile: the compiler folds it into the loads' memory descriptor.
template <L2Policy Q>
__device__ __forceinline__ uint64_t l2_cache_policy() {
  static_assert(Q != L2Policy::kNormal, "no policy to create");
  uint64_t pol;
  if constexpr (Q == L2Policy::kEvictLast)
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
  else
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}

// Asks L2 for the line holding ptr: DRAM reads run ahead of what registers hold.
__device__ __forceinline__ void prefetch_l2(const void* ptr) { asm volatile("prefetch.global.L2 [%0];" ::"l"(ptr)); }

template <L1Policy P, L2Policy Q0 = L2Policy::kNormal, typename T, int VEC>
__device__ __forceinline__ void load_l1(Frag<T, VEC>& f, const T* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  constexpr L2Policy Q = L2Policy::kNormal;  // no createpolicy: the L1 policy alone
#else
  constexpr L2Policy Q = Q0;
#endif
  if constexpr (sizeof(f.r) != 16 || (P == L1Policy::kNormal && Q == L2Policy::kNormal)) {
    f.load(p);
  } else {
    uint4 v;
    if constexpr (Q == L2Policy::kNormal) {
      if constexpr (P == L1Policy::kNoAllocate)
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p));
      else if constexpr (P == L1Policy::kEvictLast)
        asm volatile("ld.global.nc.L1::evict_last.v4.u32 {%0,%1,%2,%3}, [%4];\n"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p));
      else
        asm volatile("ld.global.nc.L1::evict_first.v4.u32 {%0,%1,%2,%3}, [%4];\n"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p));
    } else {
      const uint64_t pol = l2_cache_policy<Q>();
      if constexpr (P == L1Policy::kNoAllocate)
        asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;\n"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p), "l"(pol));
      else if constexpr (P == L1Policy::kEvictLast)
        asm volatile("ld.global.nc.L1::evict_last.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;\n"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p), "l"(pol));
      else if constexpr (P == L1Policy::kEvictFirst)
        asm volatile("ld.global.nc.L1::evict_first.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;\n"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p), "l"(pol));
      else
        asm volatile("ld.global.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;\n"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p), "l"(pol));
    }
    memcpy(&f.r, &v, 16);
  }
}

// Shared memory by its 32-bit shared-window address, for the hot loops:
// through a generic pointer into dynamic shared memory, sm_90 code
// recomputed the window's base (the CTA's rank in its cluster and four more
// instructions) at every access.  The loads are volatile so that they stay
// after the cp.async waits that make their data visible.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared memory without passing through registers
// (cp.async, sm_80+; a plain copy before).  The data is visible to the
// issuing thread after cp_async_wait_all().
__device__ __forceinline__ void cp_async16_to(uint32_t saddr, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(saddr), "l"(gmem) : "memory");
#else
  uint4 v = *static_cast<const uint4*>(gmem);
  asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(saddr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
#endif
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) { cp_async16_to(smem_addr(smem), gmem); }

template <typename T, int VEC>
__device__ __forceinline__ Frag<T, VEC> load_shared16(uint32_t saddr) {
  static_assert(sizeof(Frag<T, VEC>) == 16, "16-byte accesses only");
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(saddr));
  Frag<T, VEC> f;
  memcpy(&f.r, &v, 16);
  return f;
}

// Pipelines: close the group of copies issued since the last commit, and
// wait until at most N of this thread's groups are still in flight (the
// older ones are then complete and visible to this thread).  Waiting for
// all groups (cp_async_wait_all) after issuing the next rows' copies would
// wait for those too, and nothing would overlap.
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

__device__ __forceinline__ void cp_async_wait_all() {
  cp_async_commit();
  cp_async_wait<0>();
}

// Programmatic dependent launch (sm_90+; a no-op before).  A kernel launched
// with the programmatic-serialization attribute is set up while the kernel
// before it on the stream still runs; wait_for_primary_grid() returns once
// that kernel has finished and its writes are visible.
__device__ __forceinline__ void wait_for_primary_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Loads VEC elements of T converted to the accumulation type A.
template <typename A, typename T, int VEC>
__device__ __forceinline__ void load_vec(const T* p, A (&out)[VEC]) {
  Frag<T, VEC> f;
  f.load(p);
#pragma unroll
  for (int k = 0; k < VEC; ++k) out[k] = f.get(k);
}

// Stores VEC accumulators as T: 16-bit types are converted a pair at a time.
// kEvictFirst: a 16-byte store marked evict-first (st.global.cs), for data
// this kernel never reads back.
template <bool kEvictFirst = false, typename T, typename A, int VEC>
__device__ __forceinline__ void store_vec(T* p, const A (&in)[VEC]) {
  using V = std::conditional_t<sizeof(T) == 2 && VEC % 2 == 0, Vec<uint32_t, (VEC > 1 ? VEC / 2 : 1)>, Vec<T, VEC>>;
  V v;
  if constexpr (sizeof(T) == 2 && VEC % 2 == 0) {
#pragma unroll
    for (int k = 0; k < VEC / 2; ++k) v.v[k] = acc_to_bits(in[2 * k], in[2 * k + 1], static_cast<T*>(nullptr));
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) v.v[k] = from_acc<T>(in[k]);
  }
  if constexpr (kEvictFirst && sizeof(V) == 16) {
    uint4 u;
    memcpy(&u, &v, 16);
    __stcs(reinterpret_cast<uint4*>(p), u);
  }
  else
    *reinterpret_cast<V*>(p) = v;
}

// A thread's dweight / dbias partials, held in registers for its N accesses
// of VEC columns (access i at column col(i)), written as partial row `part_row`.
template <int N, int VEC, typename A, typename Col>
__device__ __forceinline__ void store_partial_row(const A* rw, const A* rb, A* part_w, A* part_b, int64_t part_row,
                                                  int64_t n, Col col) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (col(i) >= n) continue;
    A dw[VEC], db[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      dw[k] = rw[i * VEC + k];
      db[k] = rb[i * VEC + k];
    }
    if (part_w) store_vec(part_w + part_row * n + col(i), dw);
    if (part_b) store_vec(part_b + part_row * n + col(i), db);
  }
}

// Largest thread-block cluster of any kernel (sm_90; launch_plan.h plans at most 16).
constexpr int kMaxClusterCtas = 16;

// Cluster exchange of CTA sums by push (sm_90): each CTA stores its sums into
// a slot of every CTA of the cluster (st.async), which signals that CTA's
// mbarrier with the bytes; a CTA then waits on its own mbarrier and reads its
// own shared memory.  One one-way remote store a reduction, against a full
// cluster barrier and remote loads (docs/design.md, "One reducer").
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// This thread's arrival on the mbarrier, which then also waits for `bytes`
// of asynchronous stores.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar),
               "r"(bytes)
               : "memory");
#endif
}

// Plain arrival on a CTA mbarrier (release at CTA scope).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
#endif
}

// Waits until the mbarrier's phase of parity `phase` has completed; what the
// stores that completed it wrote is then visible to this thread.  The
// mbarrier and the data are this CTA's shared memory, so the acquire is at
// CTA scope (as for copies other CTAs' TMA multicasts into it): at cluster
// scope the wait also invalidated L1 (CCTL.IVALL) at every reduction.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t phase) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(phase)
        : "memory");
#endif
}

// The counter's value before adding 1 (a relaxed atomic, not combined with
// other lanes' as the compiler does atomicAdd: the result is waited for only
// where it is used).
__device__ __forceinline__ unsigned take_ticket(unsigned* counter) {
  unsigned v;
  asm volatile("atom.global.relaxed.gpu.add.u32 %0, [%1], 1;\n" : "=r"(v) : "l"(counter) : "memory");
  return v;
}

// The address of the same shared variable in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t map_cluster(uint32_t saddr, int rank) {
  uint32_t r = saddr;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(saddr), "r"(rank));
#endif
  return r;
}

// Stores v at a cluster shared address and signals its size to the mbarrier
// `bar` of the same CTA.
__device__ __forceinline__ void st_async(uint32_t addr, uint32_t v, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(addr), "r"(v),
               "r"(bar)
               : "memory");
#endif
}
__device__ __forceinline__ void st_async(uint32_t addr, float v, uint32_t bar) {
  st_async(addr, __float_as_uint(v), bar);
}
__device__ __forceinline__ void st_async(uint32_t addr, double v, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];\n" ::"r"(addr),
               "l"(__double_as_longlong(v)), "r"(bar)
               : "memory");
#endif
}

// Shared state for RowReducer.  The warps' partials use two buffers in turn,
// so one barrier per reduction suffices (a buffer is rewritten only two
// reductions later, after every thread has passed the barrier of the
// reduction in between).  The clusters' sums use NB buffers in turn: with 4
// rather than 2, 16-bit backward clusters under kStagedReread ran faster,
// while the forward ran slower (fp32 12288: the compiler spilled more), so it
// keeps 2.  The size of this struct matters: 256 more bytes pushed the
// 2-CTA-an-SM backward (bf16 16384-65536, 64 KB of partials a CTA) past a
// shared-memory carveout step, and the L1 its spills need shrank (it ran
// slower); so the warp partials take only the warps a CTA can have.
template <typename A, int K, int NB = 2>
struct ReduceSmem {
  A warp[2][kMaxCtaThreads / 32][K];  // per-warp partials
  A cta[NB][kMaxClusterCtas][K];      // clusters: [buffer][source CTA] sums, pushed by each CTA; groups: [buffer][0] the result
  alignas(8) uint64_t bar[NB];        // clusters: completes when every CTA's sums have landed
};

// Reduces K values over the threads of one row: `tpr` threads (a power of
// two up to 32, else whole warps) of this CTA, times `csize` CTAs of a
// thread-block cluster.  Every step merges in a fixed order (xor
// butterflies), so results are the same in every run.
static_assert(kMaxCtaThreads <= 512, "RowReducer's butterflies span at most 16 warps");

// Sum over each aligned group of LANES lanes (a power of two up to 32) by
// xor butterfly: both partners of a step add the same two values, so every
// lane of the group ends with the same bits.  Callers give the lanes past
// their values zeros, which leave the sum's bits as they are; the steps run
// unconditionally (no branch per step).
template <int LANES, typename A>
__device__ __forceinline__ A butterfly_sum(A t) {
  static_assert(LANES >= 1 && LANES <= 32 && (LANES & (LANES - 1)) == 0, "lanes of one warp, a power of two");
#pragma unroll
  for (int off = LANES / 2; off > 0; off /= 2) t += __shfl_xor_sync(0xffffffffu, t, off);
  return t;
}

// How RowReducer merges two sets of K partials: an op has merge(a, b) (a
// becomes a merged with b) and identity(k) (the value of an empty part).
// Where merge(a, b) and merge(b, a) give the same bits (SumOp, softmax's
// MaxSumOp), both partners of a butterfly, and so every thread and CTA of a
// row, end equal; otherwise (add_norm's ChanOp) they may differ by rounding,
// each deterministically.  SumOp adds.
struct SumOp {
  template <typename A, int K>
  __device__ __forceinline__ static void merge(A (&a)[K], const A (&b)[K]) {
#pragma unroll
    for (int k = 0; k < K; ++k) a[k] += b[k];
  }
  template <typename A>
  __device__ __forceinline__ static A identity(int) {
    return A(0);
  }
};

// SumOp through butterfly_merge's generic path: each step shuffles all K
// values before adding them, so K chains of dependent shuffles are in flight
// at once (SumOp's own path runs one value's chain after another).
struct InterleavedSumOp : SumOp {};

// Merges v with the lanes LANES / 2, ..., 1 away (xor butterfly); every
// lane shuffles, and a step merges only where `off < active`.
// Sums take each value's butterfly in turn.
template <typename Op, int LANES, typename A, int K>
__device__ __forceinline__ void butterfly_merge(A (&v)[K], int active = LANES) {
  if constexpr (std::is_same_v<Op, SumOp>) {
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
      for (int off = LANES / 2; off > 0; off /= 2) {
        const A o = __shfl_xor_sync(0xffffffffu, v[k], off);
        if (off < active) v[k] += o;
      }
  } else {
#pragma unroll
    for (int off = LANES / 2; off > 0; off /= 2) {
      A o[K];
#pragma unroll
      for (int k = 0; k < K; ++k) o[k] = __shfl_xor_sync(0xffffffffu, v[k], off);
      if (off < active) Op::merge(v, o);
    }
  }
}

// Row groups: csize CTAs of a cooperatively launched grid (so all resident at
// once) hold a row, as a cluster would, and trade their partials through
// global memory: slots[group][buffer][rank][K] words of (tag << 32 | value
// bits), tag = the reduction's index + 1, zeroed before the launch.  A word is
// written and read as one single-copy-atomic access, so a reader that sees
// the tag in every word has the values: one store to publish and a few loads
// to collect, with no fence and no counter (NCCL's LL protocol).  A CTA
// publishes reduction j only after seeing every CTA's reduction j - 1, which
// each published after its loads of reduction j - 2 had returned, so two
// buffers suffice.
constexpr int kGroupBufs = 2;
inline size_t group_slot_bytes(int64_t groups, int csize, int values) {
  return size_t(groups) * kGroupBufs * csize * values * sizeof(unsigned long long);
}

__device__ __forceinline__ void st_relaxed_gpu(unsigned long long* p, unsigned long long v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;\n" ::"l"(p), "l"(v) : "memory");
#endif
}

__device__ __forceinline__ unsigned long long ld_relaxed_gpu(const unsigned long long* p) {
  unsigned long long v = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];\n" : "=l"(v) : "l"(p) : "memory");
#endif
  return v;
}

// Clusters (csize > 1) hold one row a CTA of more than 32 threads
// (the plans), so every reduction passes a __syncthreads before its
// push: a CTA pushes into buffer b again only after every CTA has pushed
// the reduction in between, which each did after all its threads had read
// buffer b.  Where csize > 1, call init() before the first reduce() and
// finish() after the last.
// kCluster false: a kernel never launched in clusters, compiled without the
// cluster exchange (its code slowed LayerNorm's forward).  kCtaToken: tokens
// are handed within a CTA too (below); off, that code is not compiled.
// kGroup: a kernel launched as row groups (above) exchanges through
// group_slots instead; csize is then the group's CTAs.
template <typename A, int K, int NB = 2, bool kCluster = true, typename Op = SumOp, bool kCtaToken = false,
          bool kGroup = false>
struct RowReducer {
  ReduceSmem<A, K, NB>& s;
  int tpr, csize, row_in_cta;
  uint32_t count = 0;  // reductions so far
  unsigned long long* group_slots = nullptr;  // kGroup: every group's slots

  // Clusters: the mbarriers are set up before any CTA of the cluster pushes.
  __device__ void init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (kCluster && csize > 1) {
      if (threadIdx.x == 0)
        for (int b = 0; b < NB; ++b) mbar_init(&s.bar[b], 1);
      cooperative_groups::this_cluster().sync();
    }
#endif
  }

  __device__ void reduce(A (&v)[K]) {
    int none = 0;
    reduce(v, none, nullptr);
  }

  // Also hands `token` from thread 0 of the cluster's CTA 0 to every thread
  // of the cluster, through tok (NB ints of each CTA's shared memory, the
  // same in every CTA); every CTA passes tok or none does.  With kCtaToken
  // and no cluster, a team of whole warps (one row a CTA, tpr > 32; smaller
  // teams must not pass tok) hands thread 0's through tok[parity] across the
  // warps' barrier (a slot is rewritten two reductions later, after the
  // barrier of the one in between).
  __device__ void reduce(A (&v)[K], int& token, int* tok) {
    const int parity = count & 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const bool cta_token = kCtaToken && tok && !(kCluster && csize > 1);
#else
    const bool cta_token = kCtaToken && tok;
#endif
    // Teams of whole warps take every step: no per-step test (same bits).
    if (tpr >= 32) butterfly_merge<Op, 32>(v);
    else butterfly_merge<Op, 32>(v, tpr);
    if (tpr > 32) {
      const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wpr = tpr / 32;
      if (lane == 0)
#pragma unroll
        for (int k = 0; k < K; ++k) s.warp[parity][warp][k] = v[k];
      if (cta_token && threadIdx.x == 0) tok[parity] = token;
      __syncthreads();
      if (cta_token) token = tok[parity];
      // Lane w of every warp loads warp w's partial (lanes 16-31 repeat
      // lanes 0-15), then a butterfly merges them: four shuffles, where a
      // loop over the warps' partials in every thread is up to 16 loads.
      const int src = lane & 15;
      merge16(v, &s.warp[parity][row_in_cta * wpr], src, wpr);
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (kCluster && csize > 1) {  // one row per CTA: every thread holds the CTA's partials
      const int b = count % NB;
      const uint32_t bar = smem_addr(&s.bar[b]);
      if (threadIdx.x == 0) mbar_arrive_expect_tx(bar, uint32_t(csize * K * sizeof(A) + (tok ? sizeof(int) : 0)));
      if (tok && threadIdx.x < 32) token = __shfl_sync(0xffffffffu, token, 0);
      if (threadIdx.x < csize) {  // thread r pushes to CTA r
        const int me = cluster_rank();
        const uint32_t rbar = map_cluster(bar, threadIdx.x);
#pragma unroll
        for (int k = 0; k < K; ++k) st_async(map_cluster(smem_addr(&s.cta[b][me][k]), threadIdx.x), v[k], rbar);
        if (tok && me == 0) st_async(map_cluster(smem_addr(&tok[b]), threadIdx.x), uint32_t(token), rbar);
      }
      mbar_wait(bar, (count / NB) & 1u);
      if (tok) token = tok[b];
      // Lane r reads CTA r's partials, then the same butterfly as above.
      const int src = threadIdx.x % 16;
      merge16(v, s.cta[b], src, csize);
    }
#endif
    if constexpr (kGroup) {
      static_assert(sizeof(A) == 4 && NB >= 2, "32-bit values beside their tags; the result through s.cta[count % NB]");
      if (csize > 1) group_exchange(v);
    }
    ++count;
  }

  // A CTA of a cluster must not exit while others may still store into its shared memory.
  __device__ void finish() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (kCluster && csize > 1) cooperative_groups::this_cluster().sync();
#endif
  }

 private:
  // Row groups: warp 0 publishes this CTA's partials (every thread holds
  // them), collects the group's in rank order (lane l: CTAs l, l + 32, ...,
  // then a butterfly; every CTA merges the same values in the same order, so
  // all get the same bits) and hands lane 0's result to the CTA.
  __device__ void group_exchange(A (&v)[K]) {
    const unsigned tag = count + 1;
    const int64_t group = blockIdx.x / csize;
    const int rank = int(blockIdx.x % csize);
    unsigned long long* buf = group_slots + ((group * kGroupBufs + count % kGroupBufs) * csize) * K;
    A(&out)[K] = s.cta[count % NB][0];
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      if (lane == 0)
#pragma unroll
        for (int k = 0; k < K; ++k)
          st_relaxed_gpu(&buf[rank * K + k], (unsigned long long)tag << 32 | __float_as_uint(float(v[k])));
      // Lane l merges CTAs l, l + 32, ... in turn, each 32 polled until all have landed.
      A acc[K];
      for (int first = 0; first < csize; first += 32) {
        const int c = first + lane;
        A part[K];
        for (;;) {
          bool seen = true;
#pragma unroll
          for (int k = 0; k < K; ++k) {
            part[k] = Op::template identity<A>(k);
            if (c < csize) {
              const unsigned long long w = ld_relaxed_gpu(&buf[c * K + k]);
              seen = seen && unsigned(w >> 32) == tag;
              part[k] = A(__uint_as_float(unsigned(w)));
            }
          }
          if (__all_sync(0xffffffffu, seen)) break;
        }
        if (first == 0) {
#pragma unroll
          for (int k = 0; k < K; ++k) acc[k] = part[k];
        } else {
          Op::merge(acc, part);
        }
      }
      butterfly_merge<Op, 32>(acc);
      if (lane == 0)
#pragma unroll
        for (int k = 0; k < K; ++k) out[k] = acc[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = out[k];
  }

  // v = the merge over 16 lanes of parts[src] (the identity where src >=
  // count); sums take one value's butterfly after another.
  __device__ __forceinline__ static void merge16(A (&v)[K], const A (*parts)[K], int src, int count) {
    if constexpr (std::is_same_v<Op, SumOp>) {
#pragma unroll
      for (int k = 0; k < K; ++k) v[k] = butterfly_sum<16>(src < count ? parts[src][k] : A(0));
    } else {
#pragma unroll
      for (int k = 0; k < K; ++k) v[k] = src < count ? parts[src][k] : Op::template identity<A>(k);
      butterfly_merge<Op, 16>(v);
    }
  }

  __device__ static int cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return int(cooperative_groups::this_cluster().block_rank());
#else
    return 0;
#endif
  }
};

__device__ __forceinline__ int cluster_rank_or_zero(int csize) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (csize > 1) return int(cooperative_groups::this_cluster().block_rank());
#endif
  return 0;
}

// The cluster exchanges are compiled for sm_90 only: a kernel built from older
// PTX (JIT-compiled on an sm_90 GPU) has none, so it must never be launched as
// a cluster (each CTA would normalize its slice alone).
inline bool built_for_clusters(const void* kernel) {
  cudaFuncAttributes a;
  const bool ok = cudaFuncGetAttributes(&a, kernel) == cudaSuccess && a.ptxVersion >= 90;
  cudaGetLastError();
  return ok;
}

// Row groups exchange through gpu-scope relaxed loads and stores (sm_70):
// a kernel built from older PTX has none, and its polls would never end.
inline bool built_for_groups(const void* kernel) {
  cudaFuncAttributes a;
  const bool ok = cudaFuncGetAttributes(&a, kernel) == cudaSuccess && a.ptxVersion >= 70;
  cudaGetLastError();
  return ok;
}

}  // namespace fln::cuda
