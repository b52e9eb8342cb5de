// The first measurement of docs/DESIGN.md §7's plan "The way out of the invariance tax": can a
// tensor-core kernel stream 4-bit weights at one to eight tokens as fast as the dp2a GEMV (2.85 TB/s
// inside a decode step), and at 16 to 64 tokens as fast as the packed matmul, so that one
// arithmetic — bf16 weights rounded once, bf16 activations, mma float sums in a fixed order — could
// serve every row count, batch invariant by construction?
//
// The weights are Q4_0 numbers in a tile-interleaved layout (the Marlin idea): for each 16-row tile
// and each 64 values of K, a 576-byte record — 32 lanes × 16 bytes of quants, each lane's 16 bytes
// exactly its A-fragment nibbles for four mma.m16n8k16 steps, then the 16 rows' two fp16 scales —
// so a lane loads its weights with one 16-byte load and dequantizes them straight into registers,
// with no shared memory and no shuffles. A warp takes one tile over a slice of K (slices fixed by
// the shape alone); the slices' float sums are added in slice order by the last block of a row
// tile to finish (slice_sum.cuh). Up to 8 tokens are one mma's 8 columns, read from global memory (mma_gemv_kernel); 16, 32 or 64 tokens
// are 2, 4 or 8 column tiles, staged per record in shared memory by cp.async for the block's 8
// warps and read by ldmatrix (mma_matmul_kernel). Both dequantize by the same function and add in
// the same order, so a token's outputs should have the same bits at any token count: checked.
//
// Two dequantizations, the same bf16 weights (bf16 of scale · (q − 8), the packed matmul's): in
// float (as packed_matmul.cu), and in bf16 pairs — the two nibbles of a fragment register sit 16
// bits apart, so one mask makes the pair 128 + q, and with the scale split as d = hi + lo (hi its
// bf16, lo exact in 3 bits) fma.rn.bf16x2(q − 8, hi, (q − 8)·lo) rounds (q − 8)·d once (docs/DESIGN.md
// §3), about half the instructions.
//
// Prints µs per matrix and TB/s for the 31B's shapes at 1, 2, 4, 8, 16, 32 and 64 tokens (weights
// rotated through 600 MB so L2 holds none), after checking sampled rows against a host reference
// computed from the same layout, and the bits of tokens at 8 and 64 against the same tokens alone.
// Compare with `bench_packed_gemv_cuda q4_0 T` on the same machine.
//   bench_mma_gemv_cuda [q_proj|o_proj|gate|down [TARGET_WARPS]]
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/mma.cuh"
#include "backend/cuda/packed_kernels.h"
#include "backend/cuda/slice_sum.cuh"
#include "cuda_timing.h"
#include "util/half.h"

namespace {

using g4::bench::check;

constexpr int kTileRows = 16, kChunk = 64;                 // a record: 16 rows × 64 values of K
constexpr int kQuantBytes = 32 * 16, kRecordBytes = kQuantBytes + kTileRows * 2 * 2;  // 576
constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kUnroll = 4;                                 // records a lane loads before using them (≤ 8 tokens)
constexpr int kAhead = 2;                                  // records a lane loads ahead of use (16-64 tokens)
constexpr int kXStride = kChunk + 8;                       // bf16 per staged token: 144 bytes, so ldmatrix's
                                                           // 8 rows fall in distinct 16-byte bank groups
constexpr int kXStages = 4;                                // staged records of tokens in the ring
constexpr size_t kRotationBytes = size_t(600) << 20;
constexpr int kReps = 40;

// Where value k of row n sits: lane, word (k-step s) and bit of its record. Lane l = 4g + c holds
// the A fragments of rows g and g + 8 at k = 16s + 2c, 2c + 1, 2c + 8, 2c + 9 (mma.cuh's layout):
// word s holds register j's pair (j = 0: row g, k 2c and 2c + 1; 1: row g + 8; 2: row g, k 2c + 8
// and 2c + 9; 3: row g + 8) at bits 4j (even k) and 16 + 4j (odd k).
struct Place {
  int lane, word, shift;
};
Place place_of(int row_in_tile, int k_in_chunk) {
  const int s = k_in_chunk / 16, r = k_in_chunk % 16, c = (r % 8) / 2;
  const int g = row_in_tile % 8, j = row_in_tile / 8 + (r >= 8 ? 2 : 0);
  return {4 * g + c, s, 4 * j + 16 * (r % 2)};
}

size_t layout_bytes(int64_t N, int64_t K) { return size_t(N / kTileRows) * size_t(K / kChunk) * kRecordBytes; }

// Random quants and scales in the layout (scales like a small model's: fp16 in [0.001, 0.01)).
std::vector<uint8_t> random_layout(int64_t N, int64_t K, uint64_t seed) {
  std::vector<uint8_t> bytes(layout_bytes(N, K));
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < bytes.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(&bytes[i], &v, std::min<size_t>(8, bytes.size() - i));
  }
  std::uniform_real_distribution<float> scale(0.001f, 0.01f);
  for (size_t r = 0; r < bytes.size() / kRecordBytes; ++r) {
    for (int j = 0; j < kTileRows * 2; ++j) {
      const uint16_t h = g4::f32_to_f16(scale(rng));
      std::memcpy(&bytes[r * kRecordBytes + kQuantBytes + 2 * j], &h, 2);
    }
  }
  return bytes;
}

// The weight the kernel multiplies: bf16((q - 8) · d), d the fp16 scale of its row's block of 32.
float weight_at(const std::vector<uint8_t>& layout, int64_t K, int64_t n, int64_t k) {
  const int64_t record = (n / kTileRows) * (K / kChunk) + k / kChunk;
  const uint8_t* r = layout.data() + record * kRecordBytes;
  const Place p = place_of(int(n % kTileRows), int(k % kChunk));
  uint32_t word;
  std::memcpy(&word, r + 16 * p.lane + 4 * p.word, 4);
  uint16_t h;
  std::memcpy(&h, r + kQuantBytes + 4 * (n % kTileRows) + 2 * ((k % kChunk) / 32), 2);
  const float q = float(int((word >> p.shift) & 15u) - 8);
  return g4::bf16_to_f32(g4::f32_to_bf16(q * g4::f16_to_f32(h)));
}

__device__ inline float centred_nibble(uint32_t word, int shift) {  // q - 8, exactly
  return __uint_as_float(0x4B000000u | ((word >> shift) & 15u)) - 8388616.0f;
}

__device__ inline __nv_bfloat162 as_bf162(uint32_t v) { return *reinterpret_cast<const __nv_bfloat162*>(&v); }
__device__ inline uint32_t as_u32(__nv_bfloat162 v) { return *reinterpret_cast<const uint32_t*>(&v); }

// A scale d split as hi + lo: hi = bf16(d), lo = d - hi (exact in bf16: an fp16's 11 bits leave 3).
struct SplitScale {
  __nv_bfloat162 hi, lo;
};
__device__ inline SplitScale split_scale(float d) {
  const __nv_bfloat16 hi = __float2bfloat16_rn(d);
  return {__bfloat162bfloat162(hi), __bfloat162bfloat162(__float2bfloat16_rn(d - __bfloat162float(hi)))};
}

// Fragment register j of `word`: the bf16 pair of scale · (q - 8), low element the even k.
template <bool kBf16Pairs>
__device__ inline uint32_t weight_pair(uint32_t word, int j, float scale, const SplitScale& split) {
  if constexpr (kBf16Pairs) {
    const __nv_bfloat162 biased = as_bf162(((word >> (4 * j)) & 0x000F000Fu) | 0x43004300u);  // 128 + q
    const __nv_bfloat162 q = __hsub2(biased, __float2bfloat162_rn(136.0f));               // exact
    return as_u32(__hfma2(q, split.hi, __hmul2(q, split.lo)));  // q·lo exact: one rounding of q·d
  } else {
    return g4::pack_bf16x2(scale * centred_nibble(word, 4 * j), scale * centred_nibble(word, 16 + 4 * j));
  }
}

// A lane's share of one record: its 16 bytes of quants and the fp16 scale pairs of rows g, g + 8.
struct Record {
  uint4 quants;
  uint32_t scales[2];
};
__device__ inline Record load_record(const uint8_t* records, int chunk, int lane) {
  const uint8_t* r = records + size_t(chunk) * kRecordBytes;
  const int g = lane / 4;
  return {__ldcs(reinterpret_cast<const uint4*>(r) + lane), {__ldcs(reinterpret_cast<const unsigned*>(r + kQuantBytes) + g),
                                                             __ldcs(reinterpret_cast<const unsigned*>(r + kQuantBytes) + g + 8)}};
}

// Calls step(s, a) for the record's four k-steps s with a = the lane's A fragment of weights: the
// one dequantization both kernels use.
template <bool kBf16Pairs, typename Step>
__device__ inline void for_each_step(const Record& r, Step&& step) {
  // Rows g and g + 8, blocks 0 and 1 (k-steps 0-1 and 2-3).
  const float2 s_g = __half22float2(*reinterpret_cast<const __half2*>(&r.scales[0]));
  const float2 s_g8 = __half22float2(*reinterpret_cast<const __half2*>(&r.scales[1]));
  SplitScale split[2][2];
  if constexpr (kBf16Pairs) {
    split[0][0] = split_scale(s_g.x), split[0][1] = split_scale(s_g.y);
    split[1][0] = split_scale(s_g8.x), split[1][1] = split_scale(s_g8.y);
  }
  const uint32_t words[4] = {r.quants.x, r.quants.y, r.quants.z, r.quants.w};
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const int block = s / 2;
    const float g_scale = block == 0 ? s_g.x : s_g.y, g8_scale = block == 0 ? s_g8.x : s_g8.y;
    const uint32_t a[4] = {weight_pair<kBf16Pairs>(words[s], 0, g_scale, split[0][block]),
                           weight_pair<kBf16Pairs>(words[s], 1, g8_scale, split[1][block]),
                           weight_pair<kBf16Pairs>(words[s], 2, g_scale, split[0][block]),
                           weight_pair<kBf16Pairs>(words[s], 3, g8_scale, split[1][block])};
    step(s, a);
  }
}

// The lane's accumulators (column tiles of 8 tokens): y itself for one slice, else the workspace's
// partial[slice][T][N], which the row tile's last block to finish adds into y (slice_sum.cuh). Every
// thread of the block calls it.
template <int kTokenTiles>
__device__ inline void store_sums(const float (&d)[kTokenTiles][4], const g4::SliceWorkspace& ws, __nv_bfloat16* y,
                                  int T, int N, int tile, int lane, bool has_tile) {
  const int g = lane / 4, c = lane % 4, row = tile * kTileRows + g;
  float* out = ws.partial + size_t(blockIdx.y) * T * N;
#pragma unroll
  for (int i = 0; i < kTokenTiles; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = 8 * i + 2 * c + h;
      if (!has_tile || t >= T) continue;
      if (gridDim.y == 1) {
        y[size_t(t) * N + row] = __float2bfloat16(d[i][h]);
        y[size_t(t) * N + row + 8] = __float2bfloat16(d[i][2 + h]);
      } else {
        out[size_t(t) * N + row] = d[i][h];
        out[size_t(t) * N + row + 8] = d[i][2 + h];
      }
    }
  }
  if (gridDim.y > 1 && g4::finished_last_slice(ws.arrivals))
    g4::add_tile_slices(ws.partial, int(gridDim.y), T, N, int64_t(blockIdx.x) * g4::kSliceTileRows, y);
}

// The K chunks of slice blockIdx.y: [first, end).
struct SliceChunks {
  int first, end;
};
__device__ inline SliceChunks slice_chunks(int K, int chunks_per_slice) {
  const int first = blockIdx.y * chunks_per_slice;
  return {first, min(K / kChunk, first + chunks_per_slice)};
}

// partial[slice][T][N] for T <= 8 tokens of x [T, K] (bf16) and the layout's [N, K] weights.
template <bool kBf16Pairs>
__global__ void __launch_bounds__(kThreads) mma_gemv_kernel(const uint8_t* w, const __nv_bfloat16* x, g4::SliceWorkspace ws,
                                                             __nv_bfloat16* y, int T, int N, int K, int chunks_per_slice) {
  const int lane = threadIdx.x % 32, tile = blockIdx.x * kWarps + threadIdx.x / 32;  // < N / kTileRows (launch_kernel)
  const auto [first, end] = slice_chunks(K, chunks_per_slice);
  const int g = lane / 4, c = lane % 4;
  const bool has_token = g < T;
  const uint32_t* x_pairs = reinterpret_cast<const uint32_t*>(x + size_t(has_token ? g : 0) * K);
  const uint8_t* records = w + size_t(tile) * (K / kChunk) * kRecordBytes;
  float d[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
  for (int chunk = first; chunk < end; chunk += kUnroll) {
    Record r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) r[u] = load_record(records, chunk + u < end ? chunk + u : first, lane);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (chunk + u >= end) break;
      for_each_step<kBf16Pairs>(r[u], [&](int s, const uint32_t(&a)[4]) {
        const int k = (chunk + u) * kChunk + 16 * s + 2 * c;
        const uint32_t b0 = has_token ? __ldg(x_pairs + k / 2) : 0u, b1 = has_token ? __ldg(x_pairs + k / 2 + 4) : 0u;
        g4::mma_bf16(d[0], a, b0, b1);
      });
    }
  }
  store_sums<1>(d, ws, y, T, N, tile, lane, true);
}

// As mma_gemv_kernel, the records kAheadRecords ahead of use in a register ring, so that a warp's
// next loads are in flight while it computes (mma_gemv_kernel waits for each batch of kUnroll).
template <bool kBf16Pairs, int kAheadRecords>
__global__ void __launch_bounds__(kThreads) mma_gemv_ring_kernel(const uint8_t* w, const __nv_bfloat16* x, g4::SliceWorkspace ws,
                                                                  __nv_bfloat16* y, int T, int N, int K,
                                                                  int chunks_per_slice) {
  const int lane = threadIdx.x % 32, tile = blockIdx.x * kWarps + threadIdx.x / 32;  // < N / kTileRows
  const auto [first, end] = slice_chunks(K, chunks_per_slice);
  const int count = end - first;
  const int g = lane / 4, c = lane % 4;
  const bool has_token = g < T;
  const uint32_t* x_pairs = reinterpret_cast<const uint32_t*>(x + size_t(has_token ? g : 0) * K);
  const uint8_t* records = w + size_t(tile) * (K / kChunk) * kRecordBytes;
  Record r[kAheadRecords + 1];
#pragma unroll
  for (int j = 0; j < kAheadRecords; ++j) {
    if (j < count) r[j] = load_record(records, first + j, lane);
  }
  float d[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
  for (int i0 = 0; i0 < count; i0 += kAheadRecords + 1) {
#pragma unroll
    for (int u = 0; u <= kAheadRecords; ++u) {
      const int i = i0 + u;
      if (i >= count) break;
      if (i + kAheadRecords < count) r[(u + kAheadRecords) % (kAheadRecords + 1)] = load_record(records, first + i + kAheadRecords, lane);
      for_each_step<kBf16Pairs>(r[u], [&](int s, const uint32_t(&a)[4]) {
        const int k = (first + i) * kChunk + 16 * s + 2 * c;
        const uint32_t b0 = has_token ? __ldg(x_pairs + k / 2) : 0u, b1 = has_token ? __ldg(x_pairs + k / 2 + 4) : 0u;
        g4::mma_bf16(d[0], a, b0, b1);
      });
    }
  }
  store_sums<1>(d, ws, y, T, N, tile, lane, true);
}

// As mma_gemv_ring_kernel, one tile a block: warp s of the block takes slice s of K, and the block
// adds the slices' sums from 0 in slice order (as add_tile_slices does) and stores y itself.
template <int kAheadRecords, int kSlices>
__global__ void __launch_bounds__(32 * kSlices) mma_gemv_tile_kernel(const uint8_t* w, const __nv_bfloat16* x,
                                                                      __nv_bfloat16* y, int T, int N, int K,
                                                                      int chunks_per_slice) {
  __shared__ float sums[kSlices][32][4];
  const int lane = threadIdx.x % 32, slice = threadIdx.x / 32, tile = blockIdx.x;
  const int first = slice * chunks_per_slice, count = max(0, min(K / kChunk, first + chunks_per_slice) - first);
  const int g = lane / 4, c = lane % 4;
  const bool has_token = g < T;
  const uint32_t* x_pairs = reinterpret_cast<const uint32_t*>(x + size_t(has_token ? g : 0) * K);
  const uint8_t* records = w + size_t(tile) * (K / kChunk) * kRecordBytes;
  Record r[kAheadRecords + 1];
#pragma unroll
  for (int j = 0; j < kAheadRecords; ++j) {
    if (j < count) r[j] = load_record(records, first + j, lane);
  }
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int i0 = 0; i0 < count; i0 += kAheadRecords + 1) {
#pragma unroll
    for (int u = 0; u <= kAheadRecords; ++u) {
      const int i = i0 + u;
      if (i >= count) break;
      if (i + kAheadRecords < count) r[(u + kAheadRecords) % (kAheadRecords + 1)] = load_record(records, first + i + kAheadRecords, lane);
      for_each_step<true>(r[u], [&](int s, const uint32_t(&a)[4]) {
        const int k = (first + i) * kChunk + 16 * s + 2 * c;
        const uint32_t b0 = has_token ? __ldg(x_pairs + k / 2) : 0u, b1 = has_token ? __ldg(x_pairs + k / 2 + 4) : 0u;
        g4::mma_bf16(d, a, b0, b1);
      });
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) sums[slice][lane][j] = d[j];
  __syncthreads();
  if (slice != 0) return;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < kSlices; ++s) sum += sums[s][lane][j];
    const int t = 2 * c + j % 2, row = tile * kTileRows + g + 8 * (j / 2);
    if (t < T) y[size_t(t) * N + row] = __float2bfloat16(sum);
  }
}

// partial[slice][T][N] for 8 < T <= 8 · kTokenTiles tokens: as mma_gemv_kernel, the block's tokens
// staged record by record in shared memory (a ring of kXStages, cp.async) and read by ldmatrix, the
// weights loaded kAhead records ahead of use.
template <bool kBf16Pairs, int kTokenTiles>
__global__ void __launch_bounds__(kThreads) mma_matmul_kernel(const uint8_t* w, const __nv_bfloat16* x, g4::SliceWorkspace ws,
                                                               __nv_bfloat16* y, int T, int N, int K, int chunks_per_slice) {
  static_assert(kTokenTiles % 2 == 0, "ldmatrix.x4 reads two column tiles");
  constexpr int kTokens = 8 * kTokenTiles;
  __shared__ __align__(16) __nv_bfloat16 xs[kXStages][kTokens * kXStride];
  const int lane = threadIdx.x % 32, tile = blockIdx.x * kWarps + threadIdx.x / 32;
  const bool has_tile = tile < N / kTileRows;  // a warp without a tile still stages tokens
  const auto [first, end] = slice_chunks(K, chunks_per_slice);
  const int count = end - first;
  // Record i of the slice's tokens into buffer i % kXStages; one commit per call, empty or not, so
  // that the wait below counts alike in every iteration.
  auto stage = [&](int i) {
    if (i < count) {
      const size_t k0 = size_t(first + i) * kChunk;
      for (int piece = threadIdx.x; piece < kTokens * kChunk / 8; piece += kThreads) {
        const int t = piece / (kChunk / 8), part = piece % (kChunk / 8);
        g4::cp_async16(g4::shared_addr(&xs[i % kXStages][t * kXStride + 8 * part]),
                       x + size_t(min(t, T - 1)) * K + k0 + 8 * part, t < T);
      }
    }
    g4::cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < kXStages - 1; ++i) stage(i);
  const uint8_t* records = w + size_t(has_tile ? tile : 0) * (K / kChunk) * kRecordBytes;
  Record r[kAhead + 1];
#pragma unroll
  for (int j = 0; j < kAhead; ++j) r[j] = load_record(records, first + min(j, count - 1), lane);
  float d[kTokenTiles][4] = {};
  // ldmatrix.x4 over two column tiles: lanes 0-7 address tokens 0-7 at k 0-7 of the step, lanes
  // 8-15 the same tokens at k 8-15, lanes 16-31 the next tile's tokens likewise.
  const int ld_token = (lane / 16) * 8 + lane % 8, ld_k = ((lane / 8) % 2) * 8;
  for (int i0 = 0; i0 < count; i0 += kAhead + 1) {
#pragma unroll
    for (int u = 0; u <= kAhead; ++u) {
      const int i = i0 + u;
      if (i >= count) break;  // the same for the whole block: the barriers stay aligned
      r[(u + kAhead) % (kAhead + 1)] = load_record(records, first + min(i + kAhead, count - 1), lane);
      g4::cp_async_wait_group<kXStages - 2>();  // record i's tokens have landed
      __syncthreads();                           // ... for every thread; record i - 1's buffer is free
      stage(i + kXStages - 1);
      if (!has_tile) continue;
      const uint32_t base = g4::shared_addr(&xs[i % kXStages][ld_token * kXStride + ld_k]);
      for_each_step<kBf16Pairs>(r[u], [&](int s, const uint32_t(&a)[4]) {
#pragma unroll
        for (int p = 0; p < kTokenTiles / 2; ++p) {
          uint32_t b[4];
          g4::ldmatrix_x4(b, base + uint32_t((16 * p * kXStride + 16 * s) * 2));
          g4::mma_bf16(d[2 * p], a, b[0], b[1]);
          g4::mma_bf16(d[2 * p + 1], a, b[2], b[3]);
        }
      });
    }
  }
  store_sums<kTokenTiles>(d, ws, y, T, N, tile, lane, has_tile);
}

// As mma_matmul_kernel, the weights staged too: each stage holds one record of the block's tokens
// and each warp's record of its tile (cp.async, kStages - 1 ahead), so that more weight bytes are in
// flight than registers can hold, and no record waits in registers.
template <int kTokenTiles, int kStages>
__global__ void __launch_bounds__(kThreads) mma_matmul_async_kernel(const uint8_t* w, const __nv_bfloat16* x,
                                                                     g4::SliceWorkspace ws, __nv_bfloat16* y, int T,
                                                                     int N, int K, int chunks_per_slice) {
  static_assert(kTokenTiles % 2 == 0, "ldmatrix.x4 reads two column tiles");
  constexpr int kTokens = 8 * kTokenTiles;
  constexpr int kXBytes = kTokens * kXStride * 2, kStageBytes = kXBytes + kWarps * kRecordBytes;
  extern __shared__ __align__(16) uint8_t stages[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, tile = blockIdx.x * kWarps + warp;
  const bool has_tile = tile < N / kTileRows;
  const auto [first, end] = slice_chunks(K, chunks_per_slice);
  const int count = end - first;
  const uint8_t* records = w + size_t(has_tile ? tile : 0) * (K / kChunk) * kRecordBytes;
  auto stage = [&](int i) {  // one commit per call, empty or not
    if (i < count) {
      uint8_t* at = stages + (i % kStages) * kStageBytes;
      const size_t k0 = size_t(first + i) * kChunk;
      for (int piece = threadIdx.x; piece < kTokens * kChunk / 8; piece += kThreads) {
        const int t = piece / (kChunk / 8), part = piece % (kChunk / 8);
        g4::cp_async16(g4::shared_addr(at + (t * kXStride + 8 * part) * 2), x + size_t(min(t, T - 1)) * K + k0 + 8 * part,
                       t < T);
      }
      const uint8_t* record = records + size_t(first + i) * kRecordBytes;
      uint8_t* mine = at + kXBytes + warp * kRecordBytes;
      g4::cp_async16(g4::shared_addr(mine + 16 * lane), record + 16 * lane, has_tile);
      if (lane < (kRecordBytes - kQuantBytes) / 16)
        g4::cp_async16(g4::shared_addr(mine + kQuantBytes + 16 * lane), record + kQuantBytes + 16 * lane, has_tile);
    }
    g4::cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) stage(i);
  float d[kTokenTiles][4] = {};
  const int ld_token = (lane / 16) * 8 + lane % 8, ld_k = ((lane / 8) % 2) * 8, g = lane / 4;
  for (int i = 0; i < count; ++i) {
    g4::cp_async_wait_group<kStages - 2>();  // record i (tokens and weights) has landed
    __syncthreads();                           // ... for every thread; record i - 1's buffer is free
    stage(i + kStages - 1);
    if (!has_tile) continue;
    const uint8_t* at = stages + (i % kStages) * kStageBytes;
    const uint8_t* mine = at + kXBytes + warp * kRecordBytes;
    Record r;
    r.quants = *reinterpret_cast<const uint4*>(mine + 16 * lane);
    r.scales[0] = *reinterpret_cast<const uint32_t*>(mine + kQuantBytes + 4 * g);
    r.scales[1] = *reinterpret_cast<const uint32_t*>(mine + kQuantBytes + 4 * (g + 8));
    const uint32_t base = g4::shared_addr(at + (ld_token * kXStride + ld_k) * 2);
    for_each_step<true>(r, [&](int s, const uint32_t(&a)[4]) {
#pragma unroll
      for (int p = 0; p < kTokenTiles / 2; ++p) {
        uint32_t b[4];
        g4::ldmatrix_x4(b, base + uint32_t((16 * p * kXStride + 16 * s) * 2));
        g4::mma_bf16(d[2 * p], a, b[0], b[1]);
        g4::mma_bf16(d[2 * p + 1], a, b[2], b[3]);
      }
    });
  }
  store_sums<kTokenTiles>(d, ws, y, T, N, tile, lane, has_tile);
}

template <int kTokenTiles, int kStages>
void launch_async(dim3 grid, const uint8_t* w, const __nv_bfloat16* x, g4::SliceWorkspace ws, __nv_bfloat16* y, int T,
                  int N, int K, int chunks_per_slice) {
  constexpr int kBytes = kStages * (8 * kTokenTiles * kXStride * 2 + kWarps * kRecordBytes);
  auto kernel = mma_matmul_async_kernel<kTokenTiles, kStages>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes), "smem attribute");
  kernel<<<grid, kThreads, kBytes>>>(w, x, ws, y, T, N, K, chunks_per_slice);
}

struct Shape {
  const char* name;
  int64_t N, K;
};
// The 31B's matrices: hidden 5 376, MLP 21 504, queries 8 192.
constexpr Shape kShapes[] = {{"q_proj", 8192, 5376}, {"o_proj", 5376, 8192}, {"gate", 21504, 5376}, {"down", 5376, 21504}};

int slices_for(const Shape& s, int target_warps) {
  const int64_t tiles = s.N / kTileRows, chunks = s.K / kChunk;
  return int(std::clamp<int64_t>(target_warps / tiles, 1, chunks));
}

// How one to eight tokens are run: mma_gemv_kernel, or the ring kernel with `ahead` records in flight.
enum class Few { kBatched, kRing4, kRing6, kTile4, kTile6, kAsync4, kAsync6 };  // kTile*: 8 slices added in the
                                                                              // block; kAsync*: 16-64 tokens, weights
                                                                              // staged (stages)
constexpr int kTileSlices = 8;
const char* name_of(Few f) {
  constexpr const char* kNames[] = {"batched4", "ring4", "ring6", "tile4", "tile6", "async4", "async6"};
  return kNames[int(f)];
}
bool adds_in_block(Few f) { return f == Few::kTile4 || f == Few::kTile6; }

void launch_kernel(const uint8_t* w, const __nv_bfloat16* x, float* workspace, __nv_bfloat16* y, int T, int N, int K,
                   int slices, int chunks_per_slice, Few few) {
  constexpr bool kPairs = true;  // bf16 pairs: faster than the float dequantization at every T (2026-12-02)
  check(N % (kTileRows * kWarps) == 0 ? cudaSuccess : cudaErrorInvalidValue, "rows: a multiple of 128");
  const g4::SliceWorkspace ws = g4::slice_workspace(workspace);
  const dim3 grid(unsigned(N / (kTileRows * kWarps)), unsigned(slices));
  if (T <= 8 && adds_in_block(few)) {
    const unsigned tiles = unsigned(N / kTileRows);
    if (few == Few::kTile4) mma_gemv_tile_kernel<4, kTileSlices><<<tiles, 32 * kTileSlices>>>(w, x, y, T, N, K, chunks_per_slice);
    else mma_gemv_tile_kernel<6, kTileSlices><<<tiles, 32 * kTileSlices>>>(w, x, y, T, N, K, chunks_per_slice);
  } else if (T <= 8) {
    if (few == Few::kBatched) mma_gemv_kernel<kPairs><<<grid, kThreads>>>(w, x, ws, y, T, N, K, chunks_per_slice);
    else if (few == Few::kRing4) mma_gemv_ring_kernel<kPairs, 4><<<grid, kThreads>>>(w, x, ws, y, T, N, K, chunks_per_slice);
    else mma_gemv_ring_kernel<kPairs, 6><<<grid, kThreads>>>(w, x, ws, y, T, N, K, chunks_per_slice);
  } else if (few == Few::kAsync4 || few == Few::kAsync6) {
    const bool six = few == Few::kAsync6;
    if (T <= 16) six ? launch_async<2, 6>(grid, w, x, ws, y, T, N, K, chunks_per_slice) : launch_async<2, 4>(grid, w, x, ws, y, T, N, K, chunks_per_slice);
    else if (T <= 32) six ? launch_async<4, 6>(grid, w, x, ws, y, T, N, K, chunks_per_slice) : launch_async<4, 4>(grid, w, x, ws, y, T, N, K, chunks_per_slice);
    else six ? launch_async<8, 6>(grid, w, x, ws, y, T, N, K, chunks_per_slice) : launch_async<8, 4>(grid, w, x, ws, y, T, N, K, chunks_per_slice);
  } else if (T <= 16) {
    mma_matmul_kernel<kPairs, 2><<<grid, kThreads>>>(w, x, ws, y, T, N, K, chunks_per_slice);
  } else if (T <= 32) {
    mma_matmul_kernel<kPairs, 4><<<grid, kThreads>>>(w, x, ws, y, T, N, K, chunks_per_slice);
  } else {
    mma_matmul_kernel<kPairs, 8><<<grid, kThreads>>>(w, x, ws, y, T, N, K, chunks_per_slice);
  }
}

struct Run {
  const Shape& shape;
  int slices, chunks_per_slice;
  Few few;
  float* workspace;  // zeroed: slice_sum.cuh's counters, then the partial sums
  __nv_bfloat16* y;
  void launch(const uint8_t* w, const __nv_bfloat16* x, int T) const {
    launch_kernel(w, x, workspace, y, T, int(shape.N), int(shape.K), slices, chunks_per_slice, few);
  }
  std::vector<uint16_t> y_bits(int T) const {
    std::vector<uint16_t> bits(size_t(T * shape.N));
    check(cudaMemcpy(bits.data(), y, bits.size() * 2, cudaMemcpyDeviceToHost), "copy y");
    return bits;
  }
};

// Largest relative error over sampled rows against sum_k w·x in double (x and w as the kernel sees them).
double max_relative_error(const Run& run, const std::vector<uint8_t>& layout, const std::vector<uint16_t>& x_bits,
                          int T) {
  const std::vector<uint16_t> y_bits = run.y_bits(T);
  double worst = 0;
  for (int64_t n = 0; n < run.shape.N; n += 97) {
    for (int t = 0; t < T; ++t) {
      double want = 0, scale = 0;
      for (int64_t k = 0; k < run.shape.K; ++k) {
        const double term = double(weight_at(layout, run.shape.K, n, k)) *
                            double(g4::bf16_to_f32(x_bits[size_t(t * run.shape.K + k)]));
        want += term;
        scale += std::fabs(term);
      }
      const double got = g4::bf16_to_f32(y_bits[size_t(t * run.shape.N + n)]);
      worst = std::max(worst, std::fabs(got - want) / std::max(scale, 1e-30));
    }
  }
  return worst;
}

// Tokens of the last T-token run (y_all) whose outputs differ in any bit from the same token run
// alone (T = 1), over a few tokens.
int tokens_with_other_bits(const Run& run, const uint8_t* w, const __nv_bfloat16* x, int T) {
  const std::vector<uint16_t> all = run.y_bits(T);
  int differing = 0;
  for (int t : {0, 1, 7, T / 2 + 1, T - 1}) {
    if (t >= T) continue;
    run.launch(w, x + size_t(t) * run.shape.K, 1);
    const std::vector<uint16_t> alone = run.y_bits(1);
    differing += std::equal(alone.begin(), alone.end(), all.begin() + size_t(t) * run.shape.N) ? 0 : 1;
  }
  return differing;
}

}  // namespace

int main(int argc, char** argv) {
  const char* only_shape = argc > 1 ? argv[1] : nullptr;  // e.g. "gate": that matrix alone
  const int only_target = argc > 2 ? std::atoi(argv[2]) : 0;  // e.g. 3168: those target warps alone
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_mma_gemv_cuda: no GPU present, skipped\n");
    return 0;
  }
  constexpr int kMaxT = 64;
  constexpr int kTargets[] = {132 * 16, 132 * 24, 132 * 32, 132 * 64};  // warps the slices of K aim at
  std::printf("Q4_0 numbers in a tile-interleaved layout, bf16-pair dequantization, mma.m16n8k16 at 1..64 tokens\n"
              "(us per matrix, the slices added by the last block of a row tile, or in the block: tile*)\n");
  for (const Shape& shape : kShapes) {
    if (only_shape && std::strcmp(only_shape, shape.name) != 0) continue;
    const std::vector<uint8_t> layout = random_layout(shape.N, shape.K, 7);
    const size_t bytes = layout.size(), copies = std::max<size_t>(2, (kRotationBytes + bytes - 1) / bytes);
    std::vector<uint8_t*> w(copies);
    for (uint8_t*& p : w) {
      check(cudaMalloc(&p, bytes), "cudaMalloc weights");
      check(cudaMemcpy(p, layout.data(), bytes, cudaMemcpyHostToDevice), "copy weights");
    }
    std::vector<uint16_t> x_bits(size_t(kMaxT * shape.K));
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (uint16_t& b : x_bits) b = g4::f32_to_bf16(uniform(rng));
    __nv_bfloat16* x = nullptr;
    check(cudaMalloc(&x, x_bits.size() * 2), "cudaMalloc x");
    check(cudaMemcpy(x, x_bits.data(), x_bits.size() * 2, cudaMemcpyHostToDevice), "copy x");
    float* workspace = nullptr;
    __nv_bfloat16* y = nullptr;
    const size_t workspace_bytes = g4::slice_workspace_bytes(int(shape.K / kChunk), kMaxT, shape.N);
    check(cudaMalloc(&workspace, workspace_bytes), "cudaMalloc workspace");
    check(cudaMemset(workspace, 0, workspace_bytes), "zero workspace");
    check(cudaMalloc(&y, size_t(kMaxT) * shape.N * 2), "cudaMalloc y");
    auto measure = [&](const Run& run, int T, bool check_bits) {
      run.launch(w[0], x, T);
      check(cudaDeviceSynchronize(), "kernel");
      const double error = check_bits ? max_relative_error(run, layout, x_bits, T) : -1.0;
      const int other_bits = check_bits && T > 1 ? tokens_with_other_bits(run, w[0], x, T) : 0;
      const double us = 1e3 * g4::bench::ms_per_launch([&](int i) { run.launch(w[size_t(i) % copies], x, T); }, 3, kReps);
      std::printf("%-7s [%6lld, %5lld] T=%-2d %-8s %8.2f us  %5.2f TB/s  %2d slices", shape.name,
                  static_cast<long long>(shape.N), static_cast<long long>(shape.K), T,
                  T <= 8 || run.few == Few::kAsync4 || run.few == Few::kAsync6 ? name_of(run.few) : "staged",
                  us, double(bytes) / (us * 1e-6) / 1e12, run.slices);
      if (error >= 0) std::printf("  max error %.2e%s", error, error < 1e-2 ? "" : "  WRONG");
      if (check_bits && T > 1) std::printf("  %s", other_bits == 0 ? "same bits as alone" : "OTHER BITS than alone");
      std::printf("\n");
    };
    for (int target : kTargets) {
      if (only_target && target != only_target) continue;
      const int slices = slices_for(shape, target);
      const int chunks_per_slice = int((shape.K / kChunk + slices - 1) / slices);
      std::printf("-- %d target warps\n", target);
      for (Few few : {Few::kBatched, Few::kRing4, Few::kRing6}) {
        const Run run{shape, slices, chunks_per_slice, few, workspace, y};
        measure(run, 1, target == kTargets[2]);
        if (few == Few::kRing4) {
          for (int T : {2, 8}) measure(run, T, T == 8 && target == kTargets[2]);
        }
      }
      const Run staged{shape, slices, chunks_per_slice, Few::kRing4, workspace, y};
      for (int T : {16, 64}) measure(staged, T, T == 64 && target == kTargets[2]);
      for (Few few : {Few::kAsync4, Few::kAsync6}) {
        const Run async{shape, slices, chunks_per_slice, few, workspace, y};  // alone: the ring4 kernel's bits
        for (int T : {16, 64}) measure(async, T, T == 64 && target == kTargets[2]);
      }
    }
    if (!only_target) {
      std::printf("-- one tile a block, %d slices added in the block\n", kTileSlices);
      const int chunks_per_slice = int((shape.K / kChunk + kTileSlices - 1) / kTileSlices);
      for (Few few : {Few::kTile4, Few::kTile6}) {
        const Run run{shape, kTileSlices, chunks_per_slice, few, workspace, y};
        for (int T : {1, 2, 8}) measure(run, T, T != 2 && few == Few::kTile4);
      }
      const Run staged{shape, kTileSlices, chunks_per_slice, Few::kTile4, workspace, y};
      measure(staged, 64, true);  // the same slices: its tokens' bits equal the tile kernel's alone
    }
    for (uint8_t* p : w) cudaFree(p);
    cudaFree(x);
    cudaFree(workspace);
    cudaFree(y);
  }
  return 0;
}
