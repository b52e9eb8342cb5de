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
#include "backend/cuda/launch.cuh"
#include "backend/cuda/packed_gemv.cuh"
#include "backend/cuda/packed_kernels.h"
#include "backend/cuda/quantized_planes.cuh"

namespace g4 {

namespace {

using namespace packed;

constexpr int kQuantizeThreads = 128;

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
