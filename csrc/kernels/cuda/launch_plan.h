// The one launch heuristic for the CUDA kernels: a pure function of the
// problem size, the dtype and the device, so it is unit-tested on the host.
#pragma once
#include <cstdint>

namespace fln::cuda {

struct DeviceInfo {
  int index = 0;
  int sm_count = 1;
  int cc_major = 8;
};

struct Plan {
  bool registers = true;  // register kernels; false: looped fallback kernels
  int vec = 1;            // elements per access
  int nv = 1;             // accesses per thread per row
  int tpr = 1;            // threads of a CTA per row (power of two)
  int csize = 1;          // CTAs of a cluster per row
  int cta_threads = 128;  // threads per CTA
  int rows_per_cta = 1;
  int64_t groups = 0;     // row groups (CTAs, or clusters) in the grid, before any persistence cap
};

// Elements a thread may hold in registers: forward keeps x; backward keeps x,
// dy and the dweight/dbias partials, so it gets half.  Counted in 4-byte registers.
constexpr int max_elems_per_thread(bool bwd, int acc_bytes) { return (bwd ? 8 : 16) * 4 / acc_bytes; }

inline int next_pow2(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

// vec_ok: every pointer and row stride allows accesses of 16 bytes and cols is
// a multiple of that width (the caller checks alignment at run time).
inline Plan make_plan(int64_t rows, int64_t cols, int elem_bytes, int acc_bytes, bool vec_ok, bool bwd,
                      const DeviceInfo& dev) {
  Plan p;
  p.vec = vec_ok ? 16 / elem_bytes : 1;
  const int emax = max_elems_per_thread(bwd, acc_bytes);
  const int nv_max = emax / p.vec > 0 ? emax / p.vec : 1;
  const int64_t nvec = (cols + p.vec - 1) / p.vec;
  // Give each thread nv_max accesses (several 16-byte loads in flight) and
  // use as many threads as that takes; past 1024 threads, split the row over a
  // thread-block cluster (sm_90+, at most 16 CTAs), else fall back.
  const int64_t threads = (nvec + nv_max - 1) / nv_max;
  if (threads > 1024) {
    const int64_t cs = (threads + 1023) / 1024;
    if (dev.cc_major < 9 || cs > 16) {
      p.registers = false;
      p.cta_threads = 512;
      p.groups = rows;
      return p;
    }
    p.csize = next_pow2(cs);
    p.tpr = 1024;
  } else {
    p.tpr = next_pow2(threads);
  }
  const int64_t per_thread = (nvec + int64_t(p.tpr) * p.csize - 1) / (int64_t(p.tpr) * p.csize);
  p.nv = next_pow2(per_thread);
  p.cta_threads = p.tpr > 128 ? p.tpr : 128;
  p.rows_per_cta = p.cta_threads / p.tpr;
  p.groups = (rows + p.rows_per_cta - 1) / p.rows_per_cta;
  return p;
}

}  // namespace fln::cuda
