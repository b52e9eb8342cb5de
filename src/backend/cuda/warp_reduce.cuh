// Reductions across the lanes of a warp by an xor butterfly: every lane ends with the result. The
// offsets are explicit because the order of a float sum decides its rounding; each caller keeps the
// order it was written and tested with.
#pragma once
#include <cuda_runtime.h>

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

// The whole warp: offsets 16, 8, 4, 2, 1.
template <typename Op, typename T>
__device__ inline T warp_reduce(T v) {
  return xor_reduce<Op, 16, 8, 4, 2, 1>(v);
}

}  // namespace g4
