// The decode matmuls: y[T, N] = x[T, K] · w[N, K]^T for a few tokens, and the MLP's gate/up pair
// with its GELU-mul. They are bound by streaming the bf16 weights once, so each warp owns one
// output row (gate/up: one of each) and keeps several 16-byte weight loads in flight per lane;
// the few activation rows are re-read through L1. Launched with PDL: a warp asks L2 for the head
// of its weight row before the kernel waits for the activations, overlapping the previous
// kernel's tail.
//
// The kernels keep their own target selection and row-head prefetch (not gemv_common.cuh's): with
// those the 31B bf16 decode step was slower (docs/PERF.md, 2026-12-01), although each GEMV alone
// was as fast; this file's PTX is identical to the fast version's.
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/warp_reduce.cuh"

namespace g4 {

namespace {

constexpr int kWarpsPerBlock = kGemvWarpsPerBlock;
constexpr int kUnroll = 4;  // independent 16-byte weight loads in flight per lane

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

// Asks L2 for the first bytes of a warp's weight row, the ones its first loads will read; issued
// before pdl_wait() (weights depend on no earlier kernel), holding no registers while it waits.
__device__ inline void prefetch_row_head(const bf16* row, int64_t K, int lane) {
  constexpr int kLineElems = 64;  // 128-byte lines
  const int64_t head = min(K, int64_t(32 * kUnroll * 8));
  if (lane * kLineElems < head) asm volatile("prefetch.global.L2 [%0];" ::"l"(row + lane * kLineElems));
}

// acc[r][t] = x[t] · rows[r] for every token t and each of R weight rows, summed over the warp
// (every lane gets the sums); `vecs` = K / 8. The rows' loads are interleaved, so a warp keeps
// R * kUnroll of them in flight.
template <int T, int R>
__device__ inline void warp_rows_dot(const uint4* const (&rows)[R], const uint4* xv, int64_t vecs, int lane,
                                     float (&acc)[R][T]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;
  int64_t i = lane;
  for (; i + 32 * (kUnroll - 1) < vecs; i += 32 * kUnroll) {
    uint4 wv[R][kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) wv[r][u] = load_streaming(rows[r] + i + 32 * u);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) accumulate<T>(wv[r][u], xv, vecs, i + 32 * u, acc[r]);
  }
  for (; i < vecs; i += 32) {
    uint4 wv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wv[r] = load_streaming(rows[r] + i);
#pragma unroll
    for (int r = 0; r < R; ++r) accumulate<T>(wv[r], xv, vecs, i, acc[r]);
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = warp_reduce<SumOp>(acc[r][t]);
}

// The targets of one launch; block b serves target s when first_block[s] <= b < first_block[s + 1]
// (unused targets have no blocks).
struct GemvLaunch {
  GemvTarget targets[kMaxGemvTargets];
  unsigned first_block[kMaxGemvTargets + 1];
};

template <int T>
__global__ __launch_bounds__(kWarpsPerBlock * 32) void gemv_kernel(const bf16* x, GemvLaunch launch, int64_t K) {
  pdl_launch_dependents();
  // Selected by value, not by a dynamic index, which would copy the parameters to local memory.
  const int s = blockIdx.x >= launch.first_block[2] ? 2 : blockIdx.x >= launch.first_block[1] ? 1 : 0;
  const GemvTarget target = s == 0 ? launch.targets[0] : s == 1 ? launch.targets[1] : launch.targets[2];
  const int lane = threadIdx.x & 31;
  const unsigned first_block = s == 0 ? 0u : s == 1 ? launch.first_block[1] : launch.first_block[2];
  const int64_t row = int64_t(blockIdx.x - first_block) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= target.rows) return;
  const bf16* wrow = target.w + row * K;
  prefetch_row_head(wrow, K, lane);
  pdl_wait();
  const uint4* const rows[1] = {reinterpret_cast<const uint4*>(wrow)};
  float acc[1][T];
  warp_rows_dot<T, 1>(rows, reinterpret_cast<const uint4*>(x), K / 8, lane, acc);
  if (lane == 0) {
#pragma unroll
    for (int t = 0; t < T; ++t) target.y[t * target.rows + row] = __float2bfloat16(acc[0][t]);
  }
}

// Row `row` of gate and of up per warp, their loads interleaved; gate and up are rounded to bf16 before the GELU-mul, as
// the separate matmuls stored them.
template <int T>
__global__ __launch_bounds__(kWarpsPerBlock * 32) void gated_gelu_kernel(const bf16* x, const bf16* w_gate,
                                                                         const bf16* w_up, bf16* out, int64_t N,
                                                                         int64_t K) {
  pdl_launch_dependents();
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= N) return;
  prefetch_row_head(w_gate + row * K, K, lane);
  prefetch_row_head(w_up + row * K, K, lane);
  pdl_wait();
  const uint4* const rows[2] = {reinterpret_cast<const uint4*>(w_gate + row * K),
                                 reinterpret_cast<const uint4*>(w_up + row * K)};
  float acc[2][T];  // gate, up
  warp_rows_dot<T, 2>(rows, reinterpret_cast<const uint4*>(x), K / 8, lane, acc);
  if (lane == 0) {
#pragma unroll
    for (int t = 0; t < T; ++t)
      out[t * N + row] = __float2bfloat16(gelu_tanh(round_bf16(acc[0][t])) * round_bf16(acc[1][t]));
  }
}

unsigned blocks_for_rows(int64_t N) { return unsigned(ceil_div(N, kWarpsPerBlock)); }

}  // namespace

void launch_gemv(const bf16* x, const GemvTarget* targets, int count, int64_t T, int64_t K, cudaStream_t stream) {
  G4_CHECK(K % 8 == 0, "gemv: K must be a multiple of 8");
  G4_CHECK(count >= 1 && count <= kMaxGemvTargets, "gemv: 1 to kMaxGemvTargets matrices per launch");
  GemvLaunch launch{};
  for (int s = 0; s < kMaxGemvTargets; ++s) {  // targets past `count` start after the last block: never chosen
    if (s < count) launch.targets[s] = targets[s];
    launch.first_block[s + 1] = launch.first_block[s] + (s < count ? blocks_for_rows(targets[s].rows) : 0);
  }
  with_token_count(T, [&](auto tokens) {
    launch_kernel("gemv_kernel", gemv_kernel<decltype(tokens)::value>, launch.first_block[kMaxGemvTargets],
                  kWarpsPerBlock * 32, 0, stream, Pdl::kOn, x, launch, K);
  });
}

void launch_gated_gelu(const bf16* x, const bf16* w_gate, const bf16* w_up, bf16* out, int64_t T, int64_t N,
                       int64_t K, cudaStream_t stream) {
  G4_CHECK(K % 8 == 0, "gated_gelu: K must be a multiple of 8");
  with_token_count(T, [&](auto tokens) {
    launch_kernel("gated_gelu_kernel", gated_gelu_kernel<decltype(tokens)::value>, blocks_for_rows(N),
                  kWarpsPerBlock * 32, 0, stream, Pdl::kOn, x, w_gate, w_up, out, N, K);
  });
}

}  // namespace g4
