// The decode matmuls over packed block-quantized weights (layout and per-block arithmetic:
// packed_blocks.h). The input rows are first quantized per block of 32 to int16 with a float scale
// (quantize_activations_kernel, once per input, shared by every matrix that reads it); then each
// warp streams kRowsPerWarp weight rows, lane l taking blocks l, l + 32, ... in that order, U
// blocks per row in flight (16-byte quant loads that bypass L1, their scales beside; blocks past the
// row's end are not loaded), and every block of every token costs 16 dp2a and a few float
// operations; the lanes' sums are then added by the warp's butterfly (SumOrder::kFastest) or, for
// batch invariance, with every rounding pinned and in the order packed_blocks.h fixes (fold_classes,
// through shared memory), which the batch GEMV (packed_batch_gemv.cu) keeps for 9 to 64 tokens.
// The rows of a warp share each activation load, which comes through L1: five
// coalesced 16-byte loads per block and token (the planes of packed_blocks.h). Launched with PDL:
// a warp asks L2 for its first weight bytes before it waits for the input.
//
// Geometry (docs/DESIGN.md §3, measured on the H200): kRowsPerWarp = 2 consecutive rows per warp
// (a lone last row is read twice and stored once), the gated GELU one row of gate and the same row
// of up; 2 blocks per row in flight in 8-warp blocks, or for one token (OneToken) 3 in 4-warp
// blocks. A lane sums its blocks in the same order whatever the geometry, so the results do not
// depend on it. Token counts 1, 2, 4 and 8 are compiled; 3 runs the 4-token kernel with the 4th
// token skipped.
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/packed_kernels.h"
#include "backend/cuda/quantized_planes.cuh"
#include "backend/cuda/warp_reduce.cuh"

namespace g4 {

namespace {

using namespace packed;

constexpr int kRowsPerWarp = 2;  // rows sharing a warp's activation loads
constexpr int kQuantizeThreads = 128;

// Blocks per row in flight per lane (U) and warps per block (W).
template <int U>
struct Geometry {
  static constexpr int kInFlight = U;
  static constexpr int kWarps = U > 2 ? 4 : kGemvWarpsPerBlock;  // fewer warps when each holds more registers
};
using Narrow = Geometry<2>;
// One token, every type: 3 blocks a row in flight in 4-warp blocks gives the fastest whole decode
// steps of the geometries measured (2 in 8-warp blocks, 4 or 6 in 4-warp blocks; docs/PERF.md,
// 2026-12-03 · f28db12), though a few matrices alone are faster another way (Q4_0's q/k/v at 6):
// what counts is the step, where each kernel's tail overlaps the next one's start.
using OneToken = Geometry<3>;

// Weight loads that bypass L1 (as load_streaming); plain loads when compiled for the host, where
// load_block's instantiations exist too but never run.
struct StreamingLoads {
  G4_HOST_DEVICE static void load16(const uint8_t* p, uint32_t* w) {
#if defined(__CUDA_ARCH__)
    const uint4 v = load_streaming(p);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
#else
    PlainLoads::load16(p, w);
#endif
  }
  G4_HOST_DEVICE static void load8(const uint8_t* p, uint32_t* w) {
#if defined(__CUDA_ARCH__)
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
#else
    PlainLoads::load8(p, w);
#endif
  }
  G4_HOST_DEVICE static uint32_t load4(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
    uint32_t v;
    asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
#else
    return PlainLoads::load4(p);
#endif
  }
  G4_HOST_DEVICE static uint32_t load2(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
    unsigned short v;
    asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
#else
    return PlainLoads::load2(p);
#endif
  }
};

// Token t's block b through L1 (the warp's rows and the other warps reread it).
__device__ inline ActivationBlock load_activation(const uint4* x, int64_t blocks, int t, int64_t b) {
  ActivationBlock a;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint4 q = __ldg(x + plane_index(t, k, blocks, b));
    a.q[4 * k] = q.x, a.q[4 * k + 1] = q.y, a.q[4 * k + 2] = q.z, a.q[4 * k + 3] = q.w;
  }
  const uint4 scales = __ldg(x + plane_index(t, 4, blocks, b));
  a.d = __uint_as_float(scales.x);
  a.dsum = __uint_as_float(scales.y);
  a.sum = int32_t(scales.z);
  a.sum_lo = int32_t(scales.w);
  return a;
}

// acc[r][t] += block b of row r · block b of token t, for the first `tokens` tokens.
template <DType kType, int T, int R, SumOrder kOrder>
__device__ inline void accumulate_block(const RawBlock (&raw)[R], int64_t b, const uint4* x, int64_t blocks, int tokens,
                                        float (&acc)[R][T]) {
  BlockWeights w[R];
#pragma unroll
  for (int r = 0; r < R; ++r) w[r] = unpack_block<kType>(raw[r], int(b % kSubBlocks));
#pragma unroll
  for (int t = 0; t < T; ++t) {
    if (T > 1 && t >= tokens) break;
    const ActivationBlock a = load_activation(x, blocks, t, b);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if constexpr (kOrder == SumOrder::kFastest)
        acc[r][t] += block_dot<kType>(w[r], a);
      else
        acc[r][t] = accumulate_block_dot<kType>(acc[r][t], w[r], a);
    }
  }
}

// The sum over the warp's lanes of acc[r][t] in fold_classes' order, in lane k = r * T + t (lanes
// from R * T on get 0): the lanes' sums go through shared memory, lane l's at column l of row k
// (rows 36 floats apart, so that the lanes reading their rows by 16 bytes meet no other lane's
// banks), and lane k adds its row's 32 in order.
template <int T, int R>
__device__ inline float fold_lane_sums(const float (&acc)[R][T], int groups, int lane) {
  constexpr int kPitch = kClasses + 4;
  __shared__ __align__(16) float scratch[kGemvWarpsPerBlock][R * T][kPitch];
  float(&fold)[R * T][kPitch] = scratch[threadIdx.x / 32];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) fold[r * T + t][lane] = acc[r][t];
  __syncwarp();
  if (lane >= R * T) return 0.0f;
  float sums[kClasses];
#pragma unroll
  for (int c = 0; c < kClasses; c += 4) {
    const float4 v = *reinterpret_cast<const float4*>(&fold[lane][c]);
    sums[c] = v.x, sums[c + 1] = v.y, sums[c + 2] = v.z, sums[c + 3] = v.w;
  }
  return fold_classes(groups, [&](int c) { return sums[c]; });
}

// Lane l's part of x[t] · rows[r], its blocks l, l + 32, ... in order, into acc[r][t].
template <DType kType, int T, int R, int U, SumOrder kOrder>
__device__ inline void lane_sums(const RowRegions<const uint8_t> (&rows)[R], const uint4* x, int64_t blocks, int tokens,
                                 int lane, float (&acc)[R][T]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;
  for (int64_t b = lane; b < blocks; b += 32 * U) {
    RawBlock raw[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (b + 32 * u < blocks)
#pragma unroll
        for (int r = 0; r < R; ++r) raw[u][r] = load_block<kType, StreamingLoads>(rows[r], b + 32 * u);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (b + 32 * u >= blocks) break;
      accumulate_block<kType, T, R, kOrder>(raw[u], b + 32 * u, x, blocks, tokens, acc);
    }
  }
}

// x[t] · rows[r] for the warp, in lane r * T + t (lanes from R * T on get 0).
template <DType kType, int T, int R, int U, SumOrder kOrder>
__device__ inline float packed_rows_dot(const RowRegions<const uint8_t> (&rows)[R], const uint4* x, int64_t blocks,
                                        int tokens, int64_t matrix_rows, int lane) {
  float acc[R][T];
  lane_sums<kType, T, R, U, kOrder>(rows, x, blocks, tokens, lane, acc);
  if constexpr (kOrder == SumOrder::kBatchInvariant) {
    return fold_lane_sums<T, R>(acc, fold_groups(matrix_rows), lane);
  } else {
    float mine = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const float sum = warp_reduce<SumOp>(acc[r][t]);
        if (lane == r * T + t) mine = sum;
      }
    return mine;
  }
}

// The quant bytes a row's first loads read.
template <DType kType, int U>
__device__ inline void prefetch_first_blocks(const RowRegions<const uint8_t>& row, int64_t blocks, int lane) {
  prefetch_l2(row.qs, min(blocks, int64_t(32 * U)) * format_of(kType).qs, lane);
}

// Block i of x [T, K] (token i / blocks) into its planes.
__global__ void quantize_activations_kernel(const bf16* x, int64_t T, int64_t blocks, uint4* out) {
  pdl_launch_dependents();
  pdl_wait();  // x comes from the previous kernel; `out` may still be read by the GEMV before it
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < T * blocks;
       i += int64_t(gridDim.x) * blockDim.x) {
    const ActivationBlock a = quantized_block(x, i);
    const int64_t t = i / blocks, b = i % blocks;
#pragma unroll
    for (int k = 0; k < 4; ++k)
      out[plane_index(t, k, blocks, b)] = make_uint4(a.q[4 * k], a.q[4 * k + 1], a.q[4 * k + 2], a.q[4 * k + 3]);
    out[plane_index(t, 4, blocks, b)] =
        make_uint4(__float_as_uint(a.d), __float_as_uint(a.dsum), uint32_t(a.sum), uint32_t(a.sum_lo));
  }
}

template <DType kType, int T, class G, SumOrder kOrder>
__global__ __launch_bounds__(G::kWarps * 32) void packed_gemv_kernel(const uint4* x,
                                                                     GemvTargets<PackedGemvTarget> launch, int64_t K,
                                                                     int tokens) {
  pdl_launch_dependents();
  unsigned block_in_target;
  const PackedGemvTarget target = gemv_target(launch, &block_in_target);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t first = (int64_t(block_in_target) * G::kWarps + warp) * kRowsPerWarp;
  if (first >= target.rows) return;
  const int64_t blocks = K / kBlock;
  RowRegions<const uint8_t> rows[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    rows[r] = row_regions<kType>(target.w, target.rows, K, min(first + r, target.rows - 1));
    prefetch_first_blocks<kType, G::kInFlight>(rows[r], blocks, lane);
  }
  pdl_wait();
  const float sum =
      packed_rows_dot<kType, T, kRowsPerWarp, G::kInFlight, kOrder>(rows, x, blocks, tokens, target.rows, lane);
  const int r = lane / T, t = lane % T;
  if (r < kRowsPerWarp && first + r < target.rows && t < tokens)
    target.y[t * target.rows + first + r] = __float2bfloat16(sum);
}

// Row `row` of gate and of up per warp; gate and up are rounded to bf16 before the GELU-mul, as the
// separate matmuls store them.
template <DType kType, int T, class G, SumOrder kOrder>
__global__ __launch_bounds__(G::kWarps * 32) void packed_gated_gelu_kernel(const uint4* x, const uint8_t* w_gate,
                                                                           const uint8_t* w_up, bf16* out, int64_t N,
                                                                           int64_t K, int tokens) {
  pdl_launch_dependents();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row = int64_t(blockIdx.x) * G::kWarps + warp;
  if (row >= N) return;
  const int64_t blocks = K / kBlock;
  const RowRegions<const uint8_t> rows[2] = {row_regions<kType>(w_gate, N, K, row), row_regions<kType>(w_up, N, K, row)};
  prefetch_first_blocks<kType, G::kInFlight>(rows[0], blocks, lane);
  prefetch_first_blocks<kType, G::kInFlight>(rows[1], blocks, lane);
  pdl_wait();
  // lane t < T: gate of token t; lane T + t: up of token t
  const float sum = packed_rows_dot<kType, T, 2, G::kInFlight, kOrder>(rows, x, blocks, tokens, N, lane);
  const float up = __shfl_down_sync(0xffffffffu, sum, T);
  if (lane < T && lane < tokens)
    out[lane * N + row] = __float2bfloat16(gelu_tanh(round_bf16(sum)) * round_bf16(up));
}

// Calls f(std::integral_constant<int, T>{}) with T the compiled token count for `tokens` (1, 2, 4, 8):
// fewer instantiations of the eight weight types than one per count.
template <typename F>
void with_token_bucket(int64_t tokens, F&& f) {
  G4_CHECK(tokens >= 1 && tokens <= kMaxGemvTokens, "packed gemv: " + std::to_string(tokens) + " tokens");
  static_assert(kMaxGemvTokens == 8, "the buckets below end at 8 tokens");
  if (tokens == 1) return f(std::integral_constant<int, 1>{});
  if (tokens == 2) return f(std::integral_constant<int, 2>{});
  if (tokens <= 4) return f(std::integral_constant<int, 4>{});
  return f(std::integral_constant<int, 8>{});
}

void check_gemv_shape(DType type, int64_t K, const uint4* x) {
  G4_CHECK(is_block_quantized(type) && K % block_size(type) == 0,
           "packed gemv: " + dtype_name(type) + " rows of " + std::to_string(K) + " values");
  G4_CHECK(x, "packed gemv: no quantized input");
}

}  // namespace

void launch_quantize_activations(const bf16* x, int64_t T, int64_t K, uint4* out, cudaStream_t stream) {
  G4_CHECK(K % kBlock == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0,
           "quantize_activations: rows of a multiple of 32 values, 16-byte aligned");
  const int64_t blocks = K / kBlock;
  launch_kernel("quantize_activations_kernel", quantize_activations_kernel,
                unsigned(ceil_div(T * blocks, kQuantizeThreads)), kQuantizeThreads, 0, stream, Pdl::kOn, x, T, blocks,
                out);
}

// Calls f(weights, tokens, geometry, order): the weight type, the compiled token count, the
// geometry and the sum order of a T-token launch over weights of `type`, as integral constants and
// a Geometry (OneToken compiled only for the fastest order: the geometry does not change the sums).
template <typename F>
void with_gemv_kernel(DType type, int64_t T, SumOrder order, F&& f) {
  with_block_type(type, [&](auto weights) {
    using Fastest = std::integral_constant<SumOrder, SumOrder::kFastest>;
    using Invariant = std::integral_constant<SumOrder, SumOrder::kBatchInvariant>;
    if (order == SumOrder::kBatchInvariant)
      return with_token_bucket(T, [&](auto tokens) { f(weights, tokens, Narrow{}, Invariant{}); });
    if (T == 1) return f(weights, std::integral_constant<int, 1>{}, OneToken{}, Fastest{});
    with_token_bucket(T, [&](auto tokens) { f(weights, tokens, Narrow{}, Fastest{}); });
  });
}

void launch_packed_gemv(DType type, const uint4* x, const PackedGemvTarget* targets, int count, int64_t T,
                        int64_t K, SumOrder order, cudaStream_t stream) {
  check_gemv_shape(type, K, x);
  with_gemv_kernel(type, T, order, [&](auto weights, auto tokens, auto geometry, auto sum_order) {
    using G = decltype(geometry);
    const GemvTargets<PackedGemvTarget> plan = plan_gemv_targets(
        targets, count, [](const PackedGemvTarget& t) { return ceil_div(t.rows, G::kWarps * kRowsPerWarp); });
    launch_kernel("packed_gemv_kernel",
                  packed_gemv_kernel<decltype(weights)::value, decltype(tokens)::value, G, decltype(sum_order)::value>,
                  plan.first_block[kMaxGemvTargets], G::kWarps * 32, 0, stream, Pdl::kOn, x, plan, K, int(T));
  });
}

void launch_packed_gated_gelu(DType type, const uint4* x, const uint8_t* w_gate, const uint8_t* w_up,
                              bf16* out, int64_t T, int64_t N, int64_t K, SumOrder order, cudaStream_t stream) {
  check_gemv_shape(type, K, x);
  with_gemv_kernel(type, T, order, [&](auto weights, auto tokens, auto geometry, auto sum_order) {
    using G = decltype(geometry);
    launch_kernel("packed_gated_gelu_kernel",
                  packed_gated_gelu_kernel<decltype(weights)::value, decltype(tokens)::value, G,
                                           decltype(sum_order)::value>,
                  unsigned(ceil_div(N, G::kWarps)), G::kWarps * 32, 0, stream, Pdl::kOn, x, w_gate, w_up, out, N, K,
                  int(T));
  });
}

}  // namespace g4
