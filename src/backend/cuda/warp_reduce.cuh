// Reductions across the lanes of a warp by an xor butterfly: every lane ends with the result. The
// offsets are explicit because the order of a float sum decides its rounding; each caller keeps the
// order it was written and tested with.
#pragma once
#include <cuda_runtime.h>

#include <type_traits>

namespace g4 {

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
  template <typename T>
  __device__ T operator()(T a, T b) const { return max(a, b); }
};

// v = op(v, lane ^ offset's v) for each offset in turn.
template <typename Op, int... kOffsets, typename T>
__device__ inline T xor_reduce(T v) {
  ((v = Op{}(v, __shfl_xor_sync(0xffffffffu, v, kOffsets))), ...);
  return v;
}

// The largest 64-bit value of the warp in two 32-bit redux.sync steps (sm_80+): the largest high
// word, then the largest low word among the lanes holding it. A maximum does not depend on the order
// of its steps, so the result is the butterfly's, in 2 instructions instead of 10 shuffles (the
// sampler reduces 64-bit ranks many times per thread: docs/DESIGN.md §4).
__device__ inline unsigned long long warp_max_u64(unsigned long long v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned high = __reduce_max_sync(0xffffffffu, unsigned(v >> 32));
  const unsigned low = __reduce_max_sync(0xffffffffu, unsigned(v >> 32) == high ? unsigned(v) : 0u);
  return (static_cast<unsigned long long>(high) << 32) | low;
#else
  return xor_reduce<MaxOp, 16, 8, 4, 2, 1>(v);
#endif
}

// The whole warp: offsets 16, 8, 4, 2, 1 (a 64-bit maximum: warp_max_u64).
template <typename Op, typename T>
__device__ inline T warp_reduce(T v) {
  if constexpr (std::is_same_v<Op, MaxOp> && sizeof(T) == 8 && std::is_unsigned_v<T>)
    return T(warp_max_u64(static_cast<unsigned long long>(v)));
  else
    return xor_reduce<Op, 16, 8, 4, 2, 1>(v);
}

}  // namespace g4
