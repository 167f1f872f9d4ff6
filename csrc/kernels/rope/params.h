// Framework-free description of one rotary-embedding call: q and k, each
// [batch, seq, heads, head_dim] addressed through strides (in elements; the
// last dim has unit stride), rotated by the per-position cos and sin
// [batch, seq, rotary_dim] (a stride of 0 broadcasts a dim).  Filled on the
// host by the torch glue (or any C++ program) and passed by value to the CPU
// and CUDA kernels.
//
// For element i < rotary_dim of a head with partner j (pairs (i, i + rot/2)
// half-split, as Llama's rotate_half; (2m, 2m + 1) interleaved, as GPT-J) and
// sign s = -1 for the first element of its pair, +1 for the second:
//   forward   out[i] = x[i] cos[i] + s x[j] sin[i]
//   backward  dx[i]  = g[i] cos[i] - s g[j] sin[j]   (the transpose: a rotation by -theta)
// Elements from rotary_dim to head_dim are copied.  The backward reads sin
// at the partner, so it is exact for any cos/sin, not only Hugging Face's
// cat(freqs, freqs) tables where sin[i] == sin[j].
#pragma once
#include <cstdint>

namespace fln {

// One tensor's geometry: elements between batches, positions and heads.
struct RopeStrides {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t head = 0;
};

struct RopeParams {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t heads_q = 0;
  int64_t heads_k = 0;          // 0: no k (its pointers are ignored)
  int64_t head_dim = 0;         // even
  int64_t rotary_dim = 0;       // even, 2 .. head_dim
  const void* q = nullptr;      // of T
  RopeStrides q_in;
  void* q_out = nullptr;        // of T
  RopeStrides q_out_strides;
  const void* k = nullptr;      // of T
  RopeStrides k_in;
  void* k_out = nullptr;        // of T
  RopeStrides k_out_strides;
  const void* cos = nullptr;    // of C (T or float): [batch, seq, rotary_dim]
  const void* sin = nullptr;    // of C, the same strides as cos
  int64_t cs_batch = 0;         // cos/sin elements between batches (0: shared)
  int64_t cs_seq = 0;           // cos/sin elements between positions (0: shared)
  bool interleaved = false;     // GPT-J pairs (2m, 2m + 1); false: Llama's (i, i + rot/2)
  bool backward = false;        // the transpose (rotation by -theta)
};

}  // namespace fln
