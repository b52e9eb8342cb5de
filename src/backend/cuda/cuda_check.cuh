// CUDA error handling and small device helpers shared by the CUDA backend's translation units.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "util/error.h"

namespace g4 {

// Throws g4::Error naming the failed call and CUDA's message.
inline void cuda_check(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so later calls are not blamed for it
  throw Error(ErrorKind::kInternal, std::string("CUDA error in ") + call + ": " + cudaGetErrorString(status));
}
#define G4_CUDA(call) ::g4::cuda_check((call), #call)

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Thread blocks of `threads` for a grid-stride loop over n items (at least 1, at most 65535 · 8).
inline unsigned grid_stride_blocks(int64_t n, int threads) {
  return unsigned(std::clamp<int64_t>(ceil_div(n, threads), 1, 65535 * 8));
}

// 8 bf16 values moved as one 16-byte access.
union Bf16x8 {
  uint4 raw;
  __nv_bfloat162 pair[4];
};

__device__ inline void unpack8(const uint4& raw, float* out) {
  Bf16x8 v;
  v.raw = raw;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(v.pair[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

__device__ inline uint4 pack8(const float* in) {
  Bf16x8 v;
#pragma unroll
  for (int i = 0; i < 4; ++i) v.pair[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
  return v.raw;
}

// A float32 value as the bf16 activation stores it: fused kernels round where the separate ops
// stored their results, so they compute what the op-by-op forward did.
__device__ inline float round_bf16(float v) { return __bfloat162float(__float2bfloat16(v)); }

__device__ inline float gelu_tanh(float g) {
  const float k = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g)));
}

}  // namespace g4
