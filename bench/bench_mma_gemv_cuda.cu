// The measurement of docs/DESIGN.md §7's plan "The way out of the invariance tax": can a
// tensor-core kernel stream 4-bit weights at one to eight tokens as fast as the dp2a GEMV (2.85 TB/s
// inside a decode step), and at 16 to 64 tokens as fast as the packed matmul, so that one
// arithmetic could serve every row count, batch invariant by construction?
//
// The weights are Q4_0 numbers in the tile-interleaved records of backend/cuda/q4_0_records.h (the
// Marlin idea): for each 16-row tile and each 64 values of K, a 576-byte record — 32 lanes × 16
// bytes of quants, each lane's 16 bytes exactly its A-fragment nibbles for four mma.m16n8k16 steps,
// then the 16 rows' two fp16 scales — so a lane loads its weights with one 16-byte load and turns
// them into fragments in registers, with no shared memory and no shuffles. A warp takes one tile over a slice of K (slices fixed by
// the shape alone), and the slices' float sums are added from 0 in slice order: by a second kernel
// (launch_add_slices) or, with one tile a block and a slice a warp, in the block ("tile"). Up to 8
// tokens are one mma's 8 columns, read from global memory; 16, 32 or 64 tokens are 2, 4 or 8
// column tiles, staged per record in shared memory by cp.async for the block's 8 warps. Every
// kernel adds in the same order, so a token's outputs should have the same bits at any token
// count: checked.
// K is permuted within each block of 32 (the same products in a fixed order, so the same bits at
// every token count): a lane's activations of a block are one 16-byte load.
//
// Three arithmetics (Arith):
//   rounded       the packed matmul's: weights bf16(d · (q − 8)) — the two nibbles of a fragment
//                 register sit 16 bits apart, so one mask makes the bf16 pair 128 + q, and with d =
//                 hi + lo (hi its bf16, lo exact in 3 bits) fma.rn.bf16x2(q − 8, hi, (q − 8)·lo)
//                 rounds once (docs/DESIGN.md §3);
//   post-scaled   the fragments are q − 8 exactly (the mask, one bf16x2 subtraction); the tensor
//                 cores sum a block of 32's products, which its scale then multiplies in float:
//                 d · Σ (q − 8)·x, no weight rounding, no scale in the inner loop.
//   post-sc+mma   as post-scaled, the fragments the masked 128 + q as is (no subtraction), and the
//                 block's 136 · Σ x by a second pair of mma over a constant fragment, from 0, added
//                 to the weights' sum in float. (Measured 2026-12-02 with the offset mma adding into
//                 the weights' sum and the loads still behind branches: no faster at one token,
//                 1.3–1.6× slower at 64; measured again now that the loads are clean.)
//
// Prints µs per matrix and TB/s for the 31B's shapes at 1, 2, 8, 16 and 64 tokens (weights rotated
// through 600 MB so L2 holds none), after checking sampled rows against a host reference computed
// from the same layout, and the bits of tokens at 8 and 64 against the same tokens alone; then the
// dp2a GEMV over the same records at one token (dp2a_records_kernel). Compare with
// `bench_packed_gemv_cuda q4_0 T` on the same machine.
//   bench_mma_gemv_cuda [q_proj|o_proj|gate|down]
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/mma.cuh"
#include "backend/cuda/packed_kernels.h"
#include "backend/cuda/q4_0_records.h"
#include "cuda_timing.h"
#include "util/half.h"

namespace {

using g4::bench::check;

constexpr int kTileRows = g4::records::kTileRows, kChunk = g4::records::kValues;  // a record: 16 rows × 64 values
constexpr int kQuantBytes = g4::records::kQuantBytes, kRecordBytes = g4::records::kBytes;
constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kUnroll = 4;                                 // records a lane loads before using them (≤ 8 tokens)
constexpr int kAhead = 2;                                  // records a lane loads ahead of use (16-64 tokens)
constexpr int kXStride = kChunk + 32;                      // bf16 per staged token: 192 bytes, so that the
                                                           // 16-byte loads of tokens g, g + 1 miss each other's banks
constexpr int kXStages = 4;                                // staged records of tokens in the ring
constexpr int kTargetWarps = 132 * 32;                     // slices of K until about this many warps
constexpr int kTileSlices = 8;                             // "tile": a warp a slice, one tile a block
constexpr size_t kRotationBytes = size_t(600) << 20;
constexpr int kReps = 40;

enum class Arith { kRounded, kPostScaled, kPostScaledOffset };
const char* name_of(Arith a) {
  return a == Arith::kRounded ? "rounded" : a == Arith::kPostScaled ? "post-scaled" : "post-sc+mma";
}

// A random Q4_0 matrix in GGUF form (scales like a small model's: fp16 in [0.001, 0.01)), packed
// into records.
std::vector<uint8_t> random_layout(int64_t N, int64_t K, uint64_t seed) {
  std::vector<uint8_t> gguf(size_t(N * K / 32) * g4::records::kGgufBlockBytes);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> scale(0.001f, 0.01f);
  for (size_t at = 0; at < gguf.size(); at += g4::records::kGgufBlockBytes) {
    const uint16_t h = g4::f32_to_f16(scale(rng));
    std::memcpy(&gguf[at], &h, 2);
    for (int i = 2; i < g4::records::kGgufBlockBytes; i += 8) {
      const uint64_t v = rng();
      std::memcpy(&gguf[at + i], &v, std::min(8, g4::records::kGgufBlockBytes - i));
    }
  }
  std::vector<uint8_t> bytes(g4::records::matrix_bytes(N, K));
  for (int64_t tile = 0; tile < N / kTileRows; ++tile)
    for (int64_t chunk = 0; chunk < K / kChunk; ++chunk)
      g4::records::pack_q4_0_record(gguf.data(), K, tile, chunk, bytes.data() + g4::records::record_offset(K, tile, chunk));
  return bytes;
}

// The weight the kernel multiplies: (q - 8) · d, d the fp16 scale of its row's block of 32; rounded
// to bf16 by the rounded arithmetic.
double weight_at(const std::vector<uint8_t>& layout, int64_t K, int64_t n, int64_t k, Arith arith) {
  const uint8_t* r = layout.data() + g4::records::record_offset(K, n / kTileRows, k / kChunk);
  const int row = int(n % kTileRows), kk = int(k % kChunk);
  const float w = float(g4::records::quant_at(r, row, kk) - 8) * g4::f16_to_f32(g4::records::scale_bits_at(r, row, kk));
  return arith == Arith::kRounded ? double(g4::bf16_to_f32(g4::f32_to_bf16(w))) : double(w);
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

// Fragment register j of `word` as the bf16 pair 128 + q (low element the even k), and as q - 8.
__device__ inline uint32_t biased_pair(uint32_t word, int j) { return ((word >> (4 * j)) & 0x000F000Fu) | 0x43004300u; }
__device__ inline __nv_bfloat162 centred_pair(uint32_t word, int j) {
  return __hsub2(as_bf162(biased_pair(word, j)), as_bf162(0x43084308u));  // - (136, 136): exact
}
// ... and as the bf16 pair of d · (q - 8), rounded once: q·lo is exact.
__device__ inline uint32_t rounded_pair(uint32_t word, int j, const SplitScale& d) {
  const __nv_bfloat162 q = centred_pair(word, j);
  return as_u32(__hfma2(q, d.hi, __hmul2(q, d.lo)));
}

constexpr uint32_t kMinus136Pair = 0xC308C308u;  // the bf16 pair (-136, -136)

// d = A·B from 0 (the C operand a zero register: no zeroing moves), else as g4::mma_bf16.
__device__ inline void mma_from_zero(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

// A lane's share of one record: its 16 bytes of quants and the fp16 scale pairs of rows g, g + 8.
struct Record {
  uint4 quants;
  uint32_t scales[2];
};
// Loads: ld.global.cs (evict first), or as the dp2a GEMV's, ld.global.nc.L1::no_allocate (kNoAllocate).
template <bool kNoAllocate = false>
__device__ inline Record load_record(const uint8_t* records, int chunk, int lane) {
  const uint8_t* r = records + size_t(chunk) * kRecordBytes;
  const unsigned* scales = reinterpret_cast<const unsigned*>(r + kQuantBytes) + lane / 4;
  if constexpr (kNoAllocate) {
    Record out;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(out.quants.x), "=r"(out.quants.y), "=r"(out.quants.z), "=r"(out.quants.w)
        : "l"(r + 16 * lane));
    asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(out.scales[0]) : "l"(scales));
    asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(out.scales[1]) : "l"(scales + 8));
    return out;
  } else {
    return {__ldcs(reinterpret_cast<const uint4*>(r) + lane), {__ldcs(scales), __ldcs(scales + 8)}};
  }
}

// Calls use(chunk, record) for the records [first, end) of a slice in order, loading kBatch of them
// before using them (the weights' loads in flight).
template <int kBatch, bool kNoAllocate = false, typename Use>
__device__ inline void for_each_record(const uint8_t* records, int first, int end, int lane, Use&& use) {
  for (int chunk = first; chunk < end; chunk += kBatch) {
    Record r[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) r[u] = load_record<kNoAllocate>(records, chunk + u < end ? chunk + u : first, lane);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (chunk + u >= end) break;
      use(chunk + u, r[u]);
    }
  }
}

// d[p] += the record's products for column tile p (8 tokens), in the arithmetic kArith; load_b(blk, v)
// fills v[p] with the lane's 8 activations of block blk for column tile p: the B fragments of steps
// 2 blk (v.x, v.y) and 2 blk + 1 (v.z, v.w). The one multiplication all kernels use.
template <Arith kArith, int kTiles, typename LoadB>
__device__ inline void multiply_record(const Record& r, LoadB&& load_b, float (&d)[kTiles][4]) {
  // Rows g and g + 8, blocks 0 and 1 (k-steps 0-1 and 2-3).
  const float2 s_g = __half22float2(*reinterpret_cast<const __half2*>(&r.scales[0]));
  const float2 s_g8 = __half22float2(*reinterpret_cast<const __half2*>(&r.scales[1]));
  const uint32_t words[4] = {r.quants.x, r.quants.y, r.quants.z, r.quants.w};
  if constexpr (kArith == Arith::kRounded) {
    const SplitScale split[2][2] = {{split_scale(s_g.x), split_scale(s_g.y)}, {split_scale(s_g8.x), split_scale(s_g8.y)}};
#pragma unroll
    for (int blk = 0; blk < 2; ++blk) {
      uint4 v[kTiles];
      load_b(blk, v);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int s = 2 * blk + h;
        const uint32_t a[4] = {rounded_pair(words[s], 0, split[0][blk]), rounded_pair(words[s], 1, split[1][blk]),
                               rounded_pair(words[s], 2, split[0][blk]), rounded_pair(words[s], 3, split[1][blk])};
#pragma unroll
        for (int p = 0; p < kTiles; ++p) g4::mma_bf16(d[p], a, h == 0 ? v[p].x : v[p].z, h == 0 ? v[p].y : v[p].w);
      }
    }
  } else {
#pragma unroll
    for (int blk = 0; blk < 2; ++blk) {
      uint32_t a[2][4];
      uint4 v[kTiles];
      load_b(blk, v);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          a[h][j] = kArith == Arith::kPostScaled ? as_u32(centred_pair(words[2 * blk + h], j)) : biased_pair(words[2 * blk + h], j);
      }
      const float scale_g = blk == 0 ? s_g.x : s_g.y, scale_g8 = blk == 0 ? s_g8.x : s_g8.y;
#pragma unroll
      for (int p = 0; p < kTiles; ++p) {
        float t[4];
        mma_from_zero(t, a[0], v[p].x, v[p].y);
        g4::mma_bf16(t, a[1], v[p].z, v[p].w);
        if constexpr (kArith == Arith::kPostScaledOffset) {
          constexpr uint32_t kOffset[4] = {kMinus136Pair, kMinus136Pair, kMinus136Pair, kMinus136Pair};
          float o[4];
          mma_from_zero(o, kOffset, v[p].x, v[p].y);
          g4::mma_bf16(o, kOffset, v[p].z, v[p].w);
#pragma unroll
          for (int e = 0; e < 4; ++e) t[e] += o[e];
        }
        d[p][0] = fmaf(t[0], scale_g, d[p][0]);
        d[p][1] = fmaf(t[1], scale_g, d[p][1]);
        d[p][2] = fmaf(t[2], scale_g8, d[p][2]);
        d[p][3] = fmaf(t[3], scale_g8, d[p][3]);
      }
    }
  }
}

// The lane's activations of block blk of record `chunk` for up to 8 tokens, read from global
// memory: column g is token g's, or for g >= T token T - 1's again (those columns are never
// stored), so that no load waits on a branch.
struct GlobalB {
  const uint4* x;  // the lane's token row, at its 8 values of the first block
  __device__ void operator()(int chunk, int blk, uint4 (&v)[1]) const { v[0] = __ldg(x + unsigned(chunk) * (kChunk / 8) + 4 * blk); }
};
__device__ inline GlobalB global_b(const __nv_bfloat16* x, int T, int K, int lane) {
  const int g = lane / 4;
  return {reinterpret_cast<const uint4*>(x + size_t(min(g, T - 1)) * K) + lane % 4};
}

// The lane's accumulators (column tiles of 8 tokens) into partial[slice][T][N].
template <int kTokenTiles>
__device__ inline void store_partial(const float (&d)[kTokenTiles][4], float* partial, int T, int N, int tile, int lane) {
  float* out = partial + size_t(blockIdx.y) * T * N;
  const int g = lane / 4, c = lane % 4, row = tile * kTileRows + g;
#pragma unroll
  for (int i = 0; i < kTokenTiles; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = 8 * i + 2 * c + h;
      if (t < T) {
        out[size_t(t) * N + row] = d[i][h];
        out[size_t(t) * N + row + 8] = d[i][2 + h];
      }
    }
  }
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
template <Arith kArith>
__global__ void __launch_bounds__(kThreads) mma_gemv_kernel(const uint8_t* w, const __nv_bfloat16* x, float* partial,
                                                             int T, int N, int K, int chunks_per_slice) {
  const int lane = threadIdx.x % 32, tile = blockIdx.x * kWarps + threadIdx.x / 32;
  if (tile >= N / kTileRows) return;
  const auto [first, end] = slice_chunks(K, chunks_per_slice);
  const GlobalB b_of = global_b(x, T, K, lane);
  const uint8_t* records = w + g4::records::record_offset(K, tile, 0);
  float d[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
  for_each_record<kUnroll>(records, first, end, lane, [&](int chunk, const Record& r) {
    multiply_record<kArith, 1>(r, [&](int blk, uint4(&v)[1]) { b_of(chunk, blk, v); }, d);
  });
  store_partial<1>(d, partial, T, N, tile, lane);
}

// y[T][N] for T <= 8 tokens, one tile a block: warp s takes slice s of kTileSlices, and the block adds
// the slices' sums from 0 in slice order (as launch_add_slices does) and stores y itself.
template <Arith kArith, int kTileUnroll, bool kNoAllocate>
__global__ void __launch_bounds__(32 * kTileSlices) mma_gemv_tile_kernel(const uint8_t* w, const __nv_bfloat16* x,
                                                                          __nv_bfloat16* y, int T, int N, int K,
                                                                          int chunks_per_slice) {
  __shared__ float sums[kTileSlices][32][4];
  const int lane = threadIdx.x % 32, slice = threadIdx.x / 32, tile = blockIdx.x;
  const int first = slice * chunks_per_slice, end = min(K / kChunk, first + chunks_per_slice);
  const GlobalB b_of = global_b(x, T, K, lane);
  const uint8_t* records = w + g4::records::record_offset(K, tile, 0);
  float d[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
  for_each_record<kTileUnroll, kNoAllocate>(records, first, end, lane, [&](int chunk, const Record& r) {
    multiply_record<kArith, 1>(r, [&](int blk, uint4(&v)[1]) { b_of(chunk, blk, v); }, d);
  });
#pragma unroll
  for (int j = 0; j < 4; ++j) sums[slice][lane][j] = d[0][j];
  __syncthreads();
  if (slice != 0) return;
  const int g = lane / 4, c = lane % 4;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < kTileSlices; ++s) sum += sums[s][lane][j];
    const int t = 2 * c + j % 2, row = tile * kTileRows + g + 8 * (j / 2);
    if (t < T) y[size_t(t) * N + row] = __float2bfloat16(sum);
  }
}

// partial[slice][T][N] for 8 < T <= 8 · kTokenTiles tokens: as mma_gemv_kernel, the block's tokens
// staged record by record in shared memory (a ring of kXStages, cp.async), each lane reading its 8
// values of a block with one 16-byte load per column tile, the weights loaded kAhead records ahead
// of use.
template <Arith kArith, int kTokenTiles>
__global__ void __launch_bounds__(kThreads, 2) mma_matmul_kernel(const uint8_t* w, const __nv_bfloat16* x, float* partial,
                                                               int T, int N, int K, int chunks_per_slice) {
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
  const uint8_t* records = w + g4::records::record_offset(K, has_tile ? tile : 0, 0);
  Record r[kAhead + 1];
#pragma unroll
  for (int j = 0; j < kAhead; ++j) r[j] = load_record(records, first + min(j, count - 1), lane);
  float d[kTokenTiles][4] = {};
  const int g = lane / 4, c = lane % 4;
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
      const __nv_bfloat16* mine = &xs[i % kXStages][g * kXStride + 8 * c];
      multiply_record<kArith, kTokenTiles>(r[u], [&](int blk, uint4(&v)[kTokenTiles]) {
#pragma unroll
        for (int p = 0; p < kTokenTiles; ++p) v[p] = *reinterpret_cast<const uint4*>(mine + 8 * p * kXStride + 32 * blk);
      }, d);
    }
  }
  if (has_tile) store_partial<kTokenTiles>(d, partial, T, N, tile, lane);
}

// The dp2a GEMV's arithmetic over the same records, one token: could sessions keep their integer
// GEMV on this layout? x is quantized per block of 32 to int16 with a float scale (as the packed
// GEMV's input), laid out so that lane c's 16 bytes of a block are the int16 pairs its quants pair
// with: masked, a record word holds row g's quants of values 0, 2, 1, 3 of its four (bytes 0..3)
// and row g + 8's in the high nibbles, so one mask (and a shift) gives dp2a its four int8 of a row.
// xs holds the sum of the lane's 8 int16 of a block (the q - 8 offset). Each lane keeps rows g and
// g + 8 in float; the four lanes of a row add their sums at the end (a butterfly over c).
__global__ void __launch_bounds__(kThreads) dp2a_records_kernel(const uint8_t* w, const uint4* xq, const int* xs,
                                                                 const float* xd, float* partial, int N, int K,
                                                                 int chunks_per_slice) {
  const int lane = threadIdx.x % 32, tile = blockIdx.x * kWarps + threadIdx.x / 32;
  if (tile >= N / kTileRows) return;
  const auto [first, end] = slice_chunks(K, chunks_per_slice);
  const int g = lane / 4, c = lane % 4;
  const uint8_t* records = w + g4::records::record_offset(K, tile, 0);
  float acc_g = 0.0f, acc_g8 = 0.0f;
  for_each_record<kUnroll>(records, first, end, lane, [&](int chunk, const Record& r) {
    const float2 s_g = __half22float2(*reinterpret_cast<const __half2*>(&r.scales[0]));
    const float2 s_g8 = __half22float2(*reinterpret_cast<const __half2*>(&r.scales[1]));
    const uint32_t words[4] = {r.quants.x, r.quants.y, r.quants.z, r.quants.w};
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const unsigned block = unsigned(chunk) * 2 + b;
      const uint4 a = __ldg(xq + block * 4 + c);
      const int offset = -8 * __ldg(xs + block * 4 + c);
      const float dx = __ldg(xd + block);
      const uint32_t w0 = words[2 * b], w1 = words[2 * b + 1];
      const int q0 = int(w0 & 0x0F0F0F0Fu), q1 = int(w1 & 0x0F0F0F0Fu);
      const int p0 = int((w0 >> 4) & 0x0F0F0F0Fu), p1 = int((w1 >> 4) & 0x0F0F0F0Fu);
      int dot_g = __dp2a_lo(int(a.x), q0, offset);
      dot_g = __dp2a_hi(int(a.y), q0, dot_g);
      dot_g = __dp2a_lo(int(a.z), q1, dot_g);
      dot_g = __dp2a_hi(int(a.w), q1, dot_g);
      int dot_g8 = __dp2a_lo(int(a.x), p0, offset);
      dot_g8 = __dp2a_hi(int(a.y), p0, dot_g8);
      dot_g8 = __dp2a_lo(int(a.z), p1, dot_g8);
      dot_g8 = __dp2a_hi(int(a.w), p1, dot_g8);
      acc_g = fmaf(float(dot_g), (b == 0 ? s_g.x : s_g.y) * dx, acc_g);
      acc_g8 = fmaf(float(dot_g8), (b == 0 ? s_g8.x : s_g8.y) * dx, acc_g8);
    }
  });
#pragma unroll
  for (int m = 1; m <= 2; m *= 2) {
    acc_g += __shfl_xor_sync(~0u, acc_g, m);
    acc_g8 += __shfl_xor_sync(~0u, acc_g8, m);
  }
  if (c == 0) {
    partial[size_t(blockIdx.y) * N + tile * kTileRows + g] = acc_g;
    partial[size_t(blockIdx.y) * N + tile * kTileRows + g + 8] = acc_g8;
  }
}

struct Shape {
  const char* name;
  int64_t N, K;
};
// The 31B's matrices: hidden 5 376, MLP 21 504, queries 8 192.
constexpr Shape kShapes[] = {{"q_proj", 8192, 5376}, {"o_proj", 5376, 8192}, {"gate", 21504, 5376}, {"down", 5376, 21504}};

// Slices of K fixed by the shape alone: added until the matrix has about kTargetWarps warps.
struct Slicing {
  int slices, chunks_per_slice;
};
Slicing slicing_of(const Shape& shape) {
  const int64_t tiles = shape.N / kTileRows, chunks = shape.K / kChunk;
  const int slices = int(std::clamp<int64_t>(kTargetWarps / tiles, 1, chunks));
  return {slices, int((chunks + slices - 1) / slices)};
}

// How the slices of K are added: a second kernel, or in the block ("tile", up to 8 tokens: records
// loaded 4 at a time by ld.global.cs, 4 or 8 by ld.global.nc.L1::no_allocate).
enum class Adding { kSecondKernel, kInBlock, kInBlockNoAllocate, kInBlockNoAllocate8 };
bool in_block(Adding a) { return a != Adding::kSecondKernel; }
const char* name_of(Adding a) {
  constexpr const char* kNames[] = {"", "tile", "tile nc", "tile nc8"};
  return kNames[int(a)];
}

template <Arith kArith>
void launch_kernel(const uint8_t* w, const __nv_bfloat16* x, float* partial, __nv_bfloat16* y, int T, int N, int K,
                   int slices, int chunks_per_slice, Adding adding) {
  if (T <= 8 && in_block(adding)) {
    const unsigned blocks = unsigned(N / kTileRows);
    if (adding == Adding::kInBlock) mma_gemv_tile_kernel<kArith, 4, false><<<blocks, 32 * kTileSlices>>>(w, x, y, T, N, K, chunks_per_slice);
    else if (adding == Adding::kInBlockNoAllocate) mma_gemv_tile_kernel<kArith, 4, true><<<blocks, 32 * kTileSlices>>>(w, x, y, T, N, K, chunks_per_slice);
    else mma_gemv_tile_kernel<kArith, 8, true><<<blocks, 32 * kTileSlices>>>(w, x, y, T, N, K, chunks_per_slice);
    return;
  }
  const dim3 grid(unsigned((N / kTileRows + kWarps - 1) / kWarps), unsigned(slices));
  if (T <= 8) mma_gemv_kernel<kArith><<<grid, kThreads>>>(w, x, partial, T, N, K, chunks_per_slice);
  else if (T <= 16) mma_matmul_kernel<kArith, 2><<<grid, kThreads>>>(w, x, partial, T, N, K, chunks_per_slice);
  else if (T <= 32) mma_matmul_kernel<kArith, 4><<<grid, kThreads>>>(w, x, partial, T, N, K, chunks_per_slice);
  else mma_matmul_kernel<kArith, 8><<<grid, kThreads>>>(w, x, partial, T, N, K, chunks_per_slice);
  g4::launch_add_slices(partial, slices, int64_t(T) * N, reinterpret_cast<g4::bf16*>(y), nullptr);
}

struct Run {
  const Shape& shape;
  Arith arith;
  Adding adding;
  int slices, chunks_per_slice;
  float* partial;
  __nv_bfloat16* y;
  void launch(const uint8_t* w, const __nv_bfloat16* x, int T) const {
    const int N = int(shape.N), K = int(shape.K);
    if (arith == Arith::kRounded) launch_kernel<Arith::kRounded>(w, x, partial, y, T, N, K, slices, chunks_per_slice, adding);
    else if (arith == Arith::kPostScaled) launch_kernel<Arith::kPostScaled>(w, x, partial, y, T, N, K, slices, chunks_per_slice, adding);
    else launch_kernel<Arith::kPostScaledOffset>(w, x, partial, y, T, N, K, slices, chunks_per_slice, adding);
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
        const double term =
            weight_at(layout, run.shape.K, n, k, run.arith) * double(g4::bf16_to_f32(x_bits[size_t(t * run.shape.K + k)]));
        want += term;
        scale += std::fabs(term);
      }
      const double got = g4::bf16_to_f32(y_bits[size_t(t * run.shape.N + n)]);
      worst = std::max(worst, std::fabs(got - want) / std::max(scale, 1e-30));
    }
  }
  return worst;
}

// Tokens of the last T-token run whose outputs differ in any bit from the same token run alone
// (T = 1), over a few tokens.
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

// dp2a_records_kernel on token 0 of x: checked against the host's sum of the same integers and
// scales, then timed like the mma kernels.
void measure_dp2a(const Shape& shape, const std::vector<uint8_t>& layout, const std::vector<uint8_t*>& w,
                  const std::vector<uint16_t>& x_bits, float* partial, __nv_bfloat16* y) {
  const int64_t K = shape.K, N = shape.N, blocks = K / 32;
  std::vector<int16_t> xi(static_cast<size_t>(K));
  std::vector<float> xd(static_cast<size_t>(blocks));
  std::vector<int> xs(static_cast<size_t>(blocks * 4));
  std::vector<uint32_t> xq(static_cast<size_t>(blocks * 16));
  for (int64_t b = 0; b < blocks; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(g4::bf16_to_f32(x_bits[size_t(32 * b + i)])));
    xd[size_t(b)] = amax / 32767.0f;
    for (int i = 0; i < 32; ++i) {
      const float v = g4::bf16_to_f32(x_bits[size_t(32 * b + i)]);
      xi[size_t(32 * b + i)] = int16_t(amax > 0 ? std::lround(std::clamp(v / xd[size_t(b)], -32767.0f, 32767.0f)) : 0);
    }
    for (int c = 0; c < 4; ++c) {
      const int16_t* v = &xi[size_t(32 * b + 8 * c)];
      auto pair = [](int16_t lo, int16_t hi) { return uint32_t(uint16_t(lo)) | uint32_t(uint16_t(hi)) << 16; };
      uint32_t* out = &xq[size_t((b * 4 + c) * 4)];
      out[0] = pair(v[0], v[2]), out[1] = pair(v[1], v[3]), out[2] = pair(v[4], v[6]), out[3] = pair(v[5], v[7]);
      int sum = 0;
      for (int i = 0; i < 8; ++i) sum += v[i];
      xs[size_t(b * 4 + c)] = sum;
    }
  }
  uint4* dq = nullptr;
  int* ds = nullptr;
  float* dd = nullptr;
  check(cudaMalloc(&dq, xq.size() * 4), "cudaMalloc xq");
  check(cudaMalloc(&ds, xs.size() * 4), "cudaMalloc xs");
  check(cudaMalloc(&dd, xd.size() * 4), "cudaMalloc xd");
  check(cudaMemcpy(dq, xq.data(), xq.size() * 4, cudaMemcpyHostToDevice), "copy xq");
  check(cudaMemcpy(ds, xs.data(), xs.size() * 4, cudaMemcpyHostToDevice), "copy xs");
  check(cudaMemcpy(dd, xd.data(), xd.size() * 4, cudaMemcpyHostToDevice), "copy xd");
  const auto [slices, per_slice] = slicing_of(shape);
  const dim3 grid(unsigned((N / kTileRows + kWarps - 1) / kWarps), unsigned(slices));
  auto launch = [&](const uint8_t* weights) {
    dp2a_records_kernel<<<grid, kThreads>>>(weights, dq, ds, dd, partial, int(N), int(K), per_slice);
    g4::launch_add_slices(partial, slices, N, reinterpret_cast<g4::bf16*>(y), nullptr);
  };
  launch(w[0]);
  check(cudaDeviceSynchronize(), "dp2a kernel");
  std::vector<uint16_t> got(static_cast<size_t>(N));
  check(cudaMemcpy(got.data(), y, got.size() * 2, cudaMemcpyDeviceToHost), "copy y");
  double worst = 0;
  for (int64_t n = 0; n < N; n += 97) {
    double want = 0, scale = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double term = weight_at(layout, K, n, k, Arith::kPostScaled) * double(xi[size_t(k)]) * double(xd[size_t(k / 32)]);
      want += term;
      scale += std::fabs(term);
    }
    worst = std::max(worst, std::fabs(double(g4::bf16_to_f32(got[size_t(n)])) - want) / std::max(scale, 1e-30));
  }
  const double us = 1e3 * g4::bench::ms_per_launch([&](int i) { launch(w[size_t(i) % w.size()]); }, 3, kReps);
  std::printf("%-7s [%6lld, %5lld] %-11s %-8s T=1  %8.2f us  %5.2f TB/s  %2d slices  max error %.2e%s\n", shape.name,
              static_cast<long long>(N), static_cast<long long>(K), "dp2a", "", us, double(layout.size()) / (us * 1e-6) / 1e12,
              slices, worst, worst < 1e-2 ? "" : "  WRONG");
  cudaFree(dq);
  cudaFree(ds);
  cudaFree(dd);
}

}  // namespace

int main(int argc, char** argv) {
  const char* only_shape = argc > 1 ? argv[1] : nullptr;  // e.g. "gate": that matrix alone
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_mma_gemv_cuda: no GPU present, skipped\n");
    return 0;
  }
  constexpr int kMaxT = 64;
  std::printf("Q4_0 numbers in a tile-interleaved layout, mma.m16n8k16 at 1..64 tokens (us per matrix; T <= 8 "
              "'tile': one tile a block, %d slices added in the block)\n", kTileSlices);
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
    float* partial = nullptr;
    __nv_bfloat16* y = nullptr;
    check(cudaMalloc(&partial, size_t(shape.K / kChunk) * kMaxT * shape.N * sizeof(float)), "cudaMalloc partial");
    check(cudaMalloc(&y, size_t(kMaxT) * shape.N * 2), "cudaMalloc y");
    auto measure = [&](const Run& run, int T, bool checked) {
      run.launch(w[0], x, T);
      check(cudaDeviceSynchronize(), "kernel");
      const double error = checked ? max_relative_error(run, layout, x_bits, T) : -1.0;
      const int other_bits = checked && T > 1 ? tokens_with_other_bits(run, w[0], x, T) : 0;
      const double us = 1e3 * g4::bench::ms_per_launch([&](int i) { run.launch(w[size_t(i) % copies], x, T); }, 3, kReps);
      std::printf("%-7s [%6lld, %5lld] %-11s %-8s T=%-2d %8.2f us  %5.2f TB/s  %2d slices", shape.name,
                  static_cast<long long>(shape.N), static_cast<long long>(shape.K), name_of(run.arith),
                  T <= 8 ? name_of(run.adding) : "", T, us, double(bytes) / (us * 1e-6) / 1e12,
                  T <= 8 && in_block(run.adding) ? kTileSlices : run.slices);
      if (error >= 0) std::printf("  max error %.2e%s", error, error < 1e-2 ? "" : "  WRONG");
      if (checked && T > 1) std::printf("  %s", other_bits == 0 ? "same bits as alone" : "OTHER BITS than alone");
      std::printf("\n");
    };
    const int64_t chunks = shape.K / kChunk;
    const Slicing slicing = slicing_of(shape);
    for (Arith arith : {Arith::kRounded, Arith::kPostScaled, Arith::kPostScaledOffset}) {
      const Run run{shape, arith, Adding::kSecondKernel, slicing.slices, slicing.chunks_per_slice, partial, y};
      for (int T : {1, 2, 8, 16, 64}) measure(run, T, T == 1 || T == 8 || T == 64);
      // One tile a block: its 8 slices, which the 64-token run below shares (the same bits alone).
      for (Adding adding : {Adding::kInBlock, Adding::kInBlockNoAllocate, Adding::kInBlockNoAllocate8}) {
        const Run tile{shape, arith, adding, kTileSlices, int((chunks + kTileSlices - 1) / kTileSlices), partial, y};
        for (int T : {1, 8}) measure(tile, T, T == 8);
        if (adding == Adding::kInBlockNoAllocate8) measure(tile, 64, true);
      }
    }
    measure_dp2a(shape, layout, w, x_bits, partial, y);
    for (uint8_t* p : w) cudaFree(p);
    cudaFree(x);
    cudaFree(partial);
    cudaFree(y);
  }
  return 0;
}
