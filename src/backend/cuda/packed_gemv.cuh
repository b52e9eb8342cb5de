// A warp's part of the decode GEMV over packed weights (packed_gemv.cu has the design): the
// geometry, the loads, and a warp's dot products of its rows with the quantized input, shared by the
// GEMV kernels and by whatever else runs the same arithmetic per warp (the same sums, so the same
// bits).
#pragma once
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/packed_blocks.h"
#include "backend/cuda/packed_kernels.h"
#include "backend/cuda/warp_reduce.cuh"

namespace g4::packed {

constexpr int kRowsPerWarp = 2;  // rows sharing a warp's activation loads

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

}  // namespace g4::packed
