// The decode matmul: y[T, N] = x[T, K] · w[N, K]^T for a few tokens. It is bound by streaming the
// bf16 weights once, so each warp owns one output row and keeps several 16-byte weight loads in
// flight per lane; the few activation rows are re-read through L1.
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace g4 {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 4;  // independent 16-byte weight loads in flight per lane

// Weights are read exactly once per step: bypass L1 so the activations stay resident there.
__device__ inline uint4 load_streaming(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

template <int T>
__device__ inline void accumulate(const uint4& weights, const uint4* x, int64_t x_vecs_per_row, int64_t i,
                                  float (&acc)[T]) {
  float w[8];
  unpack8(weights, w);
#pragma unroll
  for (int t = 0; t < T; ++t) {
    float xf[8];
    unpack8(__ldg(x + t * x_vecs_per_row + i), xf);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[t] = fmaf(w[j], xf[j], acc[t]);
  }
}

template <int T>
__global__ __launch_bounds__(kWarpsPerBlock * 32) void gemv_kernel(const bf16* x, const bf16* w, bf16* y, int64_t N,
                                                                   int64_t K) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= N) return;
  const int64_t vecs = K / 8;
  const uint4* wrow = reinterpret_cast<const uint4*>(w + row * K);
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.0f;
  int64_t i = lane;
  for (; i + 32 * (kUnroll - 1) < vecs; i += 32 * kUnroll) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wv[u] = load_streaming(wrow + i + 32 * u);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) accumulate<T>(wv[u], xv, vecs, i + 32 * u, acc);
  }
  for (; i < vecs; i += 32) accumulate<T>(load_streaming(wrow + i), xv, vecs, i, acc);
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float s = warp_sum(acc[t]);
    if (lane == 0) y[t * N + row] = __float2bfloat16(s);
  }
}

template <int T>
void launch_for_tokens(const bf16* x, const bf16* w, bf16* y, int64_t N, int64_t K, cudaStream_t stream) {
  gemv_kernel<T><<<unsigned(ceil_div(N, kWarpsPerBlock)), kWarpsPerBlock * 32, 0, stream>>>(x, w, y, N, K);
  G4_CUDA_LAUNCHED(gemv_kernel);
}

}  // namespace

void launch_gemv(const bf16* x, const bf16* w, bf16* y, int64_t T, int64_t N, int64_t K, cudaStream_t stream) {
  G4_CHECK(K % 8 == 0, "gemv: K must be a multiple of 8");
  switch (T) {
    case 1: return launch_for_tokens<1>(x, w, y, N, K, stream);
    case 2: return launch_for_tokens<2>(x, w, y, N, K, stream);
    case 3: return launch_for_tokens<3>(x, w, y, N, K, stream);
    case 4: return launch_for_tokens<4>(x, w, y, N, K, stream);
    case 5: return launch_for_tokens<5>(x, w, y, N, K, stream);
    case 6: return launch_for_tokens<6>(x, w, y, N, K, stream);
    case 7: return launch_for_tokens<7>(x, w, y, N, K, stream);
    case 8: return launch_for_tokens<8>(x, w, y, N, K, stream);
    default: throw Error("gemv: " + std::to_string(T) + " tokens is more than kMaxGemvTokens");
  }
}

}  // namespace g4
