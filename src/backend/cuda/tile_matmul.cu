// Matmuls of 1..kMaxTileTokens tokens on tensor cores (mma.sync m16n8k16, bf16 in, float32
// accumulate) over packed block-quantized weights, reading each weight once for all tokens
// (docs/DESIGN.md §7, "Batched matmuls"). Batch invariant by construction: a row's K range is cut
// into slices that depend only on the matrix shape, each slice is summed chunk by chunk in order,
// the slices are added in order, and the tensor cores compute each token's column alone, so a
// token's result does not depend on how many tokens share the launch or where it sits among them.
//
// Geometry: a CTA of 8 warps owns 128 weight rows (16 per warp: the mma's M) and one K slice; the
// tokens' activations for 4 blocks (128 values) at a time are staged in shared memory and read by
// all 8 warps. In a chunk of 4 blocks lane (gid, tq) = (lane / 4, lane % 4) loads block tq's whole
// quants (16-byte loads: a quad reads 64 contiguous bytes of a row) and scales for rows gid and
// gid + 8, and dequantizes them to bf16 (weight = bf16(q - offset) * bf16 scale + bf16 min, one
// rounding of the product: the precision of the prefill path's bf16 copy). K is permuted within
// each k16 step so that the step's four slots of lane tq are 4 consecutive weights of its block;
// the staged activations follow the same permutation.
// Slices of one row tile meet in a float32 workspace; the last CTA of the tile adds them in order.
#include <algorithm>

#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/tile_matmul.h"

namespace g4 {

namespace {

using namespace packed;

constexpr int kWarps = 8;
constexpr int kTileRows = 16 * kWarps;
constexpr int kChunkBlocks = 4;                   // blocks of 32 values staged at once: one per lane of a quad
constexpr int kChunk = kChunkBlocks * kBlock;     // values of K staged at once
// Staged activations: block j of token t at t * kTokenStride + j * kBlockStride (bf16), strides of
// 20 and 80 words, so that the 16-byte fragment loads of 8 lanes hit distinct banks.
constexpr int kBlockStride = kBlock + 8;
constexpr int kTokenStride = kChunkBlocks * kBlockStride;
constexpr int kTargetCtas = 264;                  // split K until a matrix has about this many CTAs
constexpr int kMaxSlices = 8;

__device__ inline void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ inline uint32_t bits_of(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }

// Bytes 2p and 2p + 1 of `q` (unsigned quants below 128) as two bf16 values q_c - offset, exactly.
template <int kOffset>
__device__ inline uint32_t quant_pair(uint32_t q, int p) {
  const uint32_t biased = __byte_perm(q, 0x43u, p == 0 ? 0x4140u : 0x4342u);  // bf16 128 + q_c
  const __nv_bfloat162 bias = __floats2bfloat162_rn(128.0f + kOffset, 128.0f + kOffset);
  return bits_of(__hsub2(*reinterpret_cast<const __nv_bfloat162*>(&biased), bias));
}

// Bytes 2p and 2p + 1 of `q` as int8 (Q8_0), exactly.
__device__ inline uint32_t int8_pair(uint32_t q, int p) {
  return bits_of(__floats2bfloat162_rn(float(int8_t(q >> (16 * p))), float(int8_t(q >> (16 * p + 8)))));
}

// One lane's block (of its quad's four) for its two rows: the quants as loaded and the scales as
// bf16 pairs.
struct LaneBlock {
  RawBlock raw[2];
  uint32_t scale[2][2];  // [row][half]: bf16 scale of weights 0..15 and 16..31, twice
  uint32_t min[2];       // [row]
};

template <DType kType>
__device__ inline void load_lane_block(const RowRegions<const uint8_t> (&rows)[2], int64_t b, bool present,
                                       LaneBlock& lb) {
  constexpr Format f = format_of(kType);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lb.raw[r] = RawBlock{};
    if (!present) {  // past the slice's end: zero weights
      lb.scale[r][0] = lb.scale[r][1] = lb.min[r] = 0;
      continue;
    }
    StreamingLoads::load16(rows[r].qs + b * f.qs, lb.raw[r].qs);
    if constexpr (f.qs == 32) StreamingLoads::load16(rows[r].qs + b * f.qs + 16, lb.raw[r].qs + 4);
    load_block_scales<kType, StreamingLoads>(rows[r], b, lb.raw[r]);
    const BlockScales s = block_scales<kType>(lb.raw[r], int(b % kSubBlocks));
    lb.scale[r][0] = bits_of(__floats2bfloat162_rn(s.scale, s.scale));
    lb.scale[r][1] = bits_of(__floats2bfloat162_rn(s.scale_hi, s.scale_hi));
    lb.min[r] = bits_of(__floats2bfloat162_rn(s.min, s.min));
  }
}

// Weights c = 2p, 2p + 1 of `word` (4 quants of half h) as bf16 q * scale + min.
template <DType kType>
__device__ inline uint32_t weight_pair(uint32_t word, int p, uint32_t scale, uint32_t min) {
  const uint32_t q = kType == DType::Q8_0 ? int8_pair(word, p) : quant_pair<quant_offset(kType)>(word, p);
  const __nv_bfloat162 v = __hfma2(*reinterpret_cast<const __nv_bfloat162*>(&q),
                                   *reinterpret_cast<const __nv_bfloat162*>(&scale),
                                   *reinterpret_cast<const __nv_bfloat162*>(&min));
  return bits_of(v);
}

// acc[g] += the chunk's contribution for token group g (tokens 8g..8g+7 in shared memory `xs`):
// 8 k16 steps (word i of half h of each lane's block).
template <DType kType, int G>
__device__ inline void accumulate_chunk(const LaneBlock& lb, const bf16* xs, int gid, int tq, float (&acc)[G][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t words[2][2];  // [row][half]
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if constexpr (kType == DType::Q8_0) {
        words[r][0] = lb.raw[r].qs[i];
        words[r][1] = lb.raw[r].qs[4 + i];
      } else {
        unpack_quant_word<kType>(lb.raw[r].qs[i], lb.raw[r].qh, i, &words[r][0], &words[r][1]);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t a[4];
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int p = 0; p < 2; ++p) a[2 * p + r] = weight_pair<kType>(words[r][h], p, lb.scale[r][h], lb.min[r]);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const uint2 x = *reinterpret_cast<const uint2*>(xs + (8 * g + gid) * kTokenStride + tq * kBlockStride +
                                                        16 * h + 4 * i);
        mma_bf16(acc[g], a, x.x, x.y);
      }
    }
  }
}

// Tokens [0, 8G) of x's values [k0, k0 + n) into shared memory (block j at j * kBlockStride),
// zeros past T and past n.
template <int G>
__device__ inline void stage_activations(const bf16* x, int64_t T, int64_t K, int64_t k0, int n, bf16* xs) {
  constexpr int kVectors = kChunk / 8;
  for (int i = threadIdx.x; i < 8 * G * kVectors; i += kWarps * 32) {
    const int t = i / kVectors, v = i % kVectors;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (t < T && 8 * v < n) value = *reinterpret_cast<const uint4*>(x + t * K + k0 + 8 * v);
    *reinterpret_cast<uint4*>(xs + t * kTokenStride + (v / 4) * kBlockStride + 8 * (v % 4)) = value;
  }
}

// The plan of one launch: CTA c serves target s when first_cta[s] <= c < first_cta[s + 1]; within
// it, row tile (c - first) / slices and slice (c - first) % slices.
struct TilePlan {
  TileTarget targets[kMaxTileTargets];
  unsigned first_cta[kMaxTileTargets + 1];
};

__device__ inline TileTarget tile_target(const TilePlan& plan, unsigned* cta_in_target) {
  static_assert(kMaxTileTargets == 3, "the selection below names three targets");
  const int s = blockIdx.x >= plan.first_cta[2] ? 2 : blockIdx.x >= plan.first_cta[1] ? 1 : 0;
  *cta_in_target = blockIdx.x - (s == 0 ? 0u : s == 1 ? plan.first_cta[1] : plan.first_cta[2]);
  return s == 0 ? plan.targets[0] : s == 1 ? plan.targets[1] : plan.targets[2];
}

// This CTA's sums of matrix m (0, or 1 for the gated kernel's up) for its lane's (row, token)
// pairs: either the whole row (one slice), or, once every slice is in the workspace, their sum in
// slice order; false when another CTA of the tile finishes it.
template <int G, int M>
__device__ inline bool finish_slices(const TileTarget& t, int64_t T, int64_t tile, int slice,
                                     const int64_t (&rows)[2], int tq, float (&acc)[M][G][4]) {
  if (t.slices == 1) return true;
  const int64_t N = t.rows;
  auto partial = [&](int m, int s, int64_t token, int64_t row) -> float* {
    return t.partials + ((int64_t(m) * t.slices + s) * T + token) * N + row;
  };
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t token = 8 * g + 2 * tq + c % 2, row = rows[c / 2];
        if (token < T && row < N) *partial(m, slice, token, row) = acc[m][g][c];
      }
  __threadfence();
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(t.counters + tile, 1u) == unsigned(t.slices - 1);
  __syncthreads();
  if (!last) return false;
  __threadfence();
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t token = 8 * g + 2 * tq + c % 2, row = rows[c / 2];
        if (token >= T || row >= N) continue;
        float sum = __ldcg(partial(m, 0, token, row));
        for (int s = 1; s < t.slices; ++s) sum += __ldcg(partial(m, s, token, row));
        acc[m][g][c] = sum;
      }
  if (threadIdx.x == 0) t.counters[tile] = 0;  // ready for the next launch
  return true;
}

// y[T, N] = x[T, K] · w^T for each target (M = 1), or out = gelu_tanh(x · gate^T) * (x · up^T)
// with targets[0] = gate and targets[1] = up writing targets[0].y (M = 2).
template <DType kType, int G, int M>
__global__ __launch_bounds__(kWarps * 32) void tile_matmul_kernel(const bf16* x, int64_t T, int64_t K, TilePlan plan) {
  __shared__ __align__(16) bf16 xs[8 * G * kTokenStride];
  pdl_launch_dependents();
  unsigned cta;
  const TileTarget target = tile_target(plan, &cta);
  const int slices = target.slices;
  const int64_t tile = cta / unsigned(slices), N = target.rows;
  const int slice = int(cta % unsigned(slices));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tq = lane & 3;
  const int64_t first_row = tile * kTileRows + 16 * warp;
  const int64_t rows[2] = {first_row + gid, first_row + gid + 8};
  const int64_t blocks = K / kBlock;
  const int64_t b_begin = blocks * slice / slices, b_end = blocks * (slice + 1) / slices;

  // Row regions (clamped: rows past N are read, never stored).
  RowRegions<const uint8_t> packed_rows[M][2];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const TileTarget& tm = m == 0 ? target : plan.targets[1];
#pragma unroll
    for (int r = 0; r < 2; ++r)
      packed_rows[m][r] = row_regions<kType>(static_cast<const uint8_t*>(tm.w), N, K, rows[r] < N ? rows[r] : N - 1);
  }
  LaneBlock lb[M];
#pragma unroll
  for (int m = 0; m < M; ++m) load_lane_block<kType>(packed_rows[m], b_begin + tq, b_begin + tq < b_end, lb[m]);
  pdl_wait();

  float acc[M][G][4] = {};
  for (int64_t b0 = b_begin; b0 < b_end; b0 += kChunkBlocks) {
    const int n = b_end - b0 < kChunkBlocks ? int(b_end - b0) : kChunkBlocks;
    __syncthreads();  // the previous chunk's activations are read
    stage_activations<G>(x, T, K, b0 * kBlock, n * kBlock, xs);
    __syncthreads();
    LaneBlock next[M];  // the next chunk's weights, in flight while this one is computed
    const int64_t b_next = b0 + kChunkBlocks + tq;
#pragma unroll
    for (int m = 0; m < M; ++m) load_lane_block<kType>(packed_rows[m], b_next, b_next < b_end, next[m]);
#pragma unroll
    for (int m = 0; m < M; ++m) accumulate_chunk<kType, G>(lb[m], xs, gid, tq, acc[m]);
#pragma unroll
    for (int m = 0; m < M; ++m) lb[m] = next[m];
  }

  if (!finish_slices<G, M>(target, T, tile, slice, rows, tq, acc)) return;
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int64_t token = 8 * g + 2 * tq + c % 2, row = rows[c / 2];
      if (token >= T || row >= N) continue;
      const float v = M == 1 ? acc[0][g][c] : gelu_tanh(round_bf16(acc[0][g][c])) * round_bf16(acc[M - 1][g][c]);
      target.y[token * N + row] = __float2bfloat16(v);
    }
}

// Calls f(integral_constant<int, G>) with G token groups of 8 covering T: 1, 2, 4 or 8.
template <typename F>
void with_token_groups(int64_t T, F&& f) {
  G4_CHECK(T >= 1 && T <= kMaxTileTokens, "tile matmul: " + std::to_string(T) + " tokens");
  if (T <= 8) return f(std::integral_constant<int, 1>{});
  if (T <= 16) return f(std::integral_constant<int, 2>{});
  if (T <= 32) return f(std::integral_constant<int, 4>{});
  return f(std::integral_constant<int, 8>{});
}

void launch_plan(DType type, const bf16* x, int64_t T, int64_t K, TilePlan plan, int matrices, cudaStream_t stream) {
  G4_CHECK(K % block_size(type) == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0,
           "tile matmul: " + dtype_name(type) + " rows of " + std::to_string(K) + " values, or an unaligned input");
  with_block_type(type, [&](auto weights) {
    with_token_groups(T, [&](auto groups) {
      constexpr DType kType = decltype(weights)::value;
      constexpr int G = decltype(groups)::value;
      if (matrices == 1)
        launch_kernel("tile_matmul_kernel", tile_matmul_kernel<kType, G, 1>, plan.first_cta[kMaxTileTargets],
                      kWarps * 32, 0, stream, Pdl::kOn, x, T, K, plan);
      else
        launch_kernel("tile_gated_gelu_kernel", tile_matmul_kernel<kType, G, 2>, plan.first_cta[1], kWarps * 32, 0,
                      stream, Pdl::kOn, x, T, K, plan);
    });
  });
}

}  // namespace

int tile_slices(int64_t N, int64_t K) {
  const int64_t tiles = ceil_div(N, kTileRows);
  const int64_t by_ctas = ceil_div(kTargetCtas, tiles);
  return int(std::clamp<int64_t>(by_ctas, 1, std::min<int64_t>(kMaxSlices, K / kChunk > 0 ? K / kChunk : 1)));
}

size_t tile_partial_floats(int64_t N, int64_t K) {
  const int s = tile_slices(N, K);
  return s == 1 ? 0 : size_t(s) * size_t(kMaxTileTokens) * size_t(N);
}

int64_t tile_counter_count(int64_t N) { return ceil_div(N, kTileRows); }

void launch_tile_matmul(DType type, const bf16* x, int64_t T, int64_t K, const TileTarget* targets, int count,
                        cudaStream_t stream) {
  G4_CHECK(count >= 1 && count <= kMaxTileTargets, "tile matmul: 1 to kMaxTileTargets matrices per launch");
  TilePlan plan{};
  for (int s = 0; s < kMaxTileTargets; ++s) {
    unsigned ctas = 0;
    if (s < count) {
      plan.targets[s] = targets[s];
      G4_CHECK(targets[s].slices == tile_slices(targets[s].rows, K), "tile matmul: a target's slices are not its shape's");
      G4_CHECK(targets[s].slices == 1 || (targets[s].partials && targets[s].counters), "tile matmul: no workspace");
      ctas = unsigned(ceil_div(targets[s].rows, kTileRows) * targets[s].slices);
    }
    plan.first_cta[s + 1] = plan.first_cta[s] + ctas;
  }
  launch_plan(type, x, T, K, plan, 1, stream);
}

void launch_tile_gated_gelu(DType type, const bf16* x, int64_t T, int64_t K, const TileTarget& gate,
                            const void* w_up, cudaStream_t stream) {
  G4_CHECK(gate.slices == tile_slices(gate.rows, K) && (gate.slices == 1 || (gate.partials && gate.counters)),
           "tile gated gelu: the workspace does not match the shape");
  TilePlan plan{};
  plan.targets[0] = gate;
  plan.targets[1] = gate;
  plan.targets[1].w = w_up;
  const unsigned ctas = unsigned(ceil_div(gate.rows, kTileRows) * gate.slices);
  for (int s = 1; s <= kMaxTileTargets; ++s) plan.first_cta[s] = ctas;
  launch_plan(type, x, T, K, plan, 2, stream);
}

}  // namespace g4
