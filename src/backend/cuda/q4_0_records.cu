// Q4_0 weights in tile-interleaved records (q4_0_records.h): one arithmetic for 1 to 256 tokens, so
// a token's outputs have the same bits in any batch (docs/DESIGN.md §7, "Batch invariance", the
// records), and the fastest kernel g4 has for 2 to 64 tokens of Q4_0 (docs/PERF.md).
//
// Arithmetic ("post-scaled"): a lane's fragments are q - 8 exactly (one mask makes a register's
// two nibbles the bf16 pair 128 + q, one bf16x2 subtraction of 136 is exact); the tensor cores sum
// a block of 32's products (mma.m16n8k16, float sums, from 0), which the block's fp16 scale then
// multiplies in float into the running sum: d · Σ (q - 8)·x, no weight rounded. K is permuted within
// each block of 32 (the same products in a fixed order): a lane's 8 activations of a block are one
// 16-byte load.
//
// Geometry: a warp takes one 16-row tile over one slice of K, the slices fixed by the matrix shape
// alone (never by T) and their float sums added from 0 in slice order by launch_add_slices (a
// matrix of one slice writes y itself). Up to 8 tokens are one mma.sync's 8 columns, read from
// global memory (records_gemv_kernel); 16, 32 or 64 tokens are the N of a warpgroup's wgmma over
// its four tiles, staged per record in shared memory (records_wgmma_kernel), which gives mma.sync's
// bits for the same fragments (docs/PERF.md). Past 64 tokens a block takes 128 (wgmma's N = 64 per
// half; one block a multiprocessor, for its registers) and the grid's blocks take tiles of 128
// tokens, neighbouring blocks the same weights (read from DRAM once, from L2 again). Every token
// count adds the same products in the same order.
#include <algorithm>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/packed_kernels.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/q4_0_records.h"

namespace g4 {

namespace {

using records::kBytes;
using records::kQuantBytes;
using records::kTileRows;
using records::kValues;

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kBatch = 4;         // records a lane loads before using them (up to 8 tokens)
constexpr int kXStages = 4;       // staged records of tokens in the ring (16 to 128 tokens)
constexpr int kRecordsBlockTokens = 128;  // a block's tokens past kMaxPackedMatmulTokens
constexpr int kTargetWarps = 132 * 32;  // slices of K are added until a matrix has about this many
                                        // warps (a constant, not the GPU's: the same bits on any GPU)

struct Slicing {
  int slices, chunks_per_slice;
};
// N: the rows of the launch (q/k/v together: k and v alone would get 14 slices each, whose float
// partials at 64 tokens weigh as much as their weights; beside q, 4 — and 3 was slower at 1 and at
// 64 tokens), or of the one matrix (gate and up keep their own: at 2 slices instead of 3 they were
// slower at 1 and at 64 tokens). The launch's members are fixed by the model, so a matrix's bits
// still depend on nothing a batch decides (docs/DESIGN.md §7).
Slicing slicing_of(int64_t N, int64_t K) {
  const int64_t tiles = N / kTileRows, chunks = K / kValues;
  const int64_t per_slice = ceil_div(chunks, std::clamp<int64_t>(kTargetWarps / tiles, 1, chunks));
  return {int(ceil_div(chunks, per_slice)), int(per_slice)};
}

__device__ inline __nv_bfloat162 as_bf162(uint32_t v) { return *reinterpret_cast<const __nv_bfloat162*>(&v); }
__device__ inline uint32_t as_u32(__nv_bfloat162 v) { return *reinterpret_cast<const uint32_t*>(&v); }

// Fragment register j of a record word as the bf16 pair q - 8 (low element the even k).
__device__ inline uint32_t centred_pair(uint32_t word, int j) {
  uint32_t biased;  // (128 + q) as bf16: (nibbles & 0x000F000F) | 0x43004300 in one LOP3
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(biased) : "r"(word >> (4 * j)), "n"(0x000F000F), "r"(0x43004300));
  return as_u32(__hsub2(as_bf162(biased), as_bf162(0x43084308u)));  // - (136, 136): exact
}

// d = A·B from 0 (the C operand a zero register: no zeroing moves).
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
// ld.global.cs: the weights are read once per forward, so they are evicted first.
__device__ inline Record load_record(const uint8_t* records, int chunk, int lane) {
  const uint8_t* r = records + size_t(chunk) * kBytes;
  const unsigned* scales = reinterpret_cast<const unsigned*>(r + kQuantBytes) + lane / 4;
  return {__ldcs(reinterpret_cast<const uint4*>(r) + lane), {__ldcs(scales), __ldcs(scales + 8)}};
}

// The fp16 scales of rows g and g + 8 for block blk of a record.
__device__ inline float2 block_scales(const Record& r, int blk) {
  const float2 s_g = __half22float2(*reinterpret_cast<const __half2*>(&r.scales[0]));
  const float2 s_g8 = __half22float2(*reinterpret_cast<const __half2*>(&r.scales[1]));
  return blk == 0 ? make_float2(s_g.x, s_g8.x) : make_float2(s_g.y, s_g8.y);
}

// d += a block's sums t (one 8-column tile: rows g in t[0..1], g + 8 in t[2..3]) times its scales.
__device__ inline void add_scaled(float (&d)[4], const float (&t)[4], float2 scales) {
  d[0] = fmaf(t[0], scales.x, d[0]);
  d[1] = fmaf(t[1], scales.x, d[1]);
  d[2] = fmaf(t[2], scales.y, d[2]);
  d[3] = fmaf(t[3], scales.y, d[3]);
}

// d += the record's products for 8 tokens; x_block(blk) is the lane's 8 activations of block blk:
// the B fragments of k-steps 2 blk (.x, .y) and 2 blk + 1 (.z, .w).
template <typename XBlock>
__device__ inline void multiply_record(const Record& r, XBlock&& x_block, float (&d)[4]) {
  const uint32_t words[4] = {r.quants.x, r.quants.y, r.quants.z, r.quants.w};
#pragma unroll
  for (int blk = 0; blk < 2; ++blk) {
    uint32_t a[2][4];
    const uint4 v = x_block(blk);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int j = 0; j < 4; ++j) a[h][j] = centred_pair(words[2 * blk + h], j);
    }
    float t[4];
    mma_from_zero(t, a[0], v.x, v.y);
    mma_bf16(t, a[1], v.z, v.w);
    add_scaled(d, t, block_scales(r, blk));
  }
}

// As multiply_record for a warpgroup's four tiles and kTokens tokens: B is the record's tokens,
// K-major in shared memory at `desc` (a k16 step 32 bytes along the swizzled rows). Both blocks'
// sums are in flight before the first is scaled, and both are scaled before it returns.
template <int kTokens>
__device__ inline void multiply_record_wgmma(const Record& r, uint64_t desc, float (&d)[kTokens / 8][4]) {
  const uint32_t words[4] = {r.quants.x, r.quants.y, r.quants.z, r.quants.w};
  uint32_t a[4][4];
#pragma unroll
  for (int step = 0; step < 4; ++step) {
#pragma unroll
    for (int j = 0; j < 4; ++j) a[step][j] = centred_pair(words[step], j);
  }
  float t[2][kTokens / 8][4];
  wgmma_fence();  // a and t were last touched by ordinary instructions
#pragma unroll
  for (int blk = 0; blk < 2; ++blk) {
    wgmma_rs<kTokens>(t[blk], a[2 * blk], desc + 2 * (2 * blk), false);
    wgmma_rs<kTokens>(t[blk], a[2 * blk + 1], desc + 2 * (2 * blk + 1), true);
    wgmma_commit();
  }
#pragma unroll
  for (int blk = 0; blk < 2; ++blk) {
    if (blk == 0)
      wgmma_wait<1>();
    else
      wgmma_wait<0>();
    wgmma_pin(t[blk]);
    const float2 scales = block_scales(r, blk);
#pragma unroll
    for (int p = 0; p < kTokens / 8; ++p) add_scaled(d[p], t[blk][p], scales);
  }
}

// The warpgroup's wgmma as a pipeline of units — (record, block of 32, half of the tokens) in that
// order — with one unit in flight while the previous one's sums are scaled into d, across records:
// the tensor cores never wait for the scaling, nor the scaling for the tensor cores' latency, and
// the registers are one half's sums twice (a block's whole sums twice would not fit at 64 tokens).
// Every token's sums are the same products added in the same order as in multiply_record (wgmma's
// columns are independent of N), so the bits are the same.
template <int kTokens>
struct WgmmaPipeline {
  static constexpr int kHalfTiles = kTokens / 16;  // 8-column tiles of a half
  float d[kTokens / 8][4] = {};
  float t[2][kHalfTiles][4] = {};  // unit u's sums in t[u % 2] (a record has four units)
  uint32_t a[2][2][4] = {};        // block b's fragments of its two k16 steps
  // The scales of the unit in flight at a record's end (its block 1). Before the first record, a
  // unit of zeros "in flight" (no branch: a wgmma wait in a divergent path serializes them all),
  // which adds 0 · 0 to the zeros of d.
  float2 last_scales = {0.0f, 0.0f};

  // Keeps the registers a wgmma in flight reads or writes where they are until the next wait.
  __device__ void pin_in_flight() {
    wgmma_pin(t[0]);
    wgmma_pin(t[1]);
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int s = 0; s < 2; ++s)
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[b][s][j])::"memory");
  }
  // Waits for the unit before the one just issued, and scales its sums (unit parity `parity`,
  // tokens of half `half`) into d.
  __device__ void finish(int parity, int half, float2 scales) {
    wgmma_wait<1>();
    pin_in_flight();
#pragma unroll
    for (int p = 0; p < kHalfTiles; ++p) add_scaled(d[half * kHalfTiles + p], t[parity][p], scales);
  }
  __device__ void issue(int parity, int blk, int half, uint64_t desc) {
    wgmma_fence();  // t[parity] was read by the scaling, a[blk] written by ordinary instructions
    const uint64_t at = desc + (half * (kTokens / 2) * 128 >> 4) + 2 * (2 * blk);
    wgmma_rs<kTokens / 2>(t[parity], a[blk][0], at, false);
    wgmma_rs<kTokens / 2>(t[parity], a[blk][1], at + 2, true);
    wgmma_commit();
    pin_in_flight();
  }
  __device__ void load_block(const Record& r, int blk) {
    const uint32_t words[2] = {blk == 0 ? r.quants.x : r.quants.z, blk == 0 ? r.quants.y : r.quants.w};
#pragma unroll
    for (int s = 0; s < 2; ++s)
#pragma unroll
      for (int j = 0; j < 4; ++j) a[blk][s][j] = centred_pair(words[s], j);
  }
  // The record's four units, its tokens staged at `desc`.
  __device__ void multiply(const Record& r, uint64_t desc) {
    const float2 scales[2] = {block_scales(r, 0), block_scales(r, 1)};
    load_block(r, 0);
    issue(0, 0, 0, desc);
    finish(1, 1, last_scales);  // the previous record's last unit
    issue(1, 0, 1, desc);
    finish(0, 0, scales[0]);
    load_block(r, 1);
    issue(0, 1, 0, desc);
    finish(1, 1, scales[0]);
    issue(1, 1, 1, desc);
    finish(0, 0, scales[1]);
    last_scales = scales[1];
  }
  // Scales the last unit in flight.
  __device__ void drain() {
    wgmma_wait<0>();
    pin_in_flight();
#pragma unroll
    for (int p = 0; p < kHalfTiles; ++p) add_scaled(d[kHalfTiles + p], t[1][p], last_scales);
  }
};

// Where a slice's sums go: float partials [slice][T][N] for launch_add_slices, or y itself when
// one slice covers K.
struct Sums {
  float* partial;
  bf16* y;
  int T, N;
};
// The block's tokens start at token0.
template <int kTokenTiles>
__device__ inline void store_sums(const float (&d)[kTokenTiles][4], const Sums& out, int tile, int slice, int token0,
                                  int lane) {
  const int g = lane / 4, c = lane % 4, row = tile * kTileRows + g;
  float* partial = out.partial ? out.partial + size_t(slice) * out.T * out.N : nullptr;
#pragma unroll
  for (int i = 0; i < kTokenTiles; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = token0 + 8 * i + 2 * c + h;
      if (t >= out.T) continue;
      const size_t at = size_t(t) * out.N + row;
      if (partial) {
        partial[at] = d[i][h];
        partial[at + 8] = d[i][2 + h];
      } else {
        out.y[at] = __float2bfloat16(d[i][h]);
        out.y[at + 8] = __float2bfloat16(d[i][2 + h]);
      }
    }
  }
}

// One matrix of a launch: its records, where its sums go, its slices of K, and its blocks (a block:
// kWarps tiles over one slice), the launch's from first_block on.
struct RecordsPart {
  const uint8_t* w;
  Sums out;
  int chunks_per_slice, row_blocks, first_block;
};
struct RecordsParts {
  RecordsPart parts[kMaxSliceSums];
  int count;
};
// Work block `block`'s matrix, its tiles' block and its slice of K, whose chunks (records) are
// [first, end).
struct BlockWork {
  RecordsPart part;
  int row_block, slice, first, end;
};
__device__ inline BlockWork block_work(const RecordsParts& launch, int block, int K) {
  RecordsPart part = launch.parts[0];
#pragma unroll
  for (int m = 1; m < kMaxSliceSums; ++m)  // static indices: the parts stay in parameter space
    if (m < launch.count && block >= launch.parts[m].first_block) part = launch.parts[m];
  const int local = block - part.first_block, slice = local / part.row_blocks;
  const int first = slice * part.chunks_per_slice;
  return {part, local % part.row_blocks, slice, first, min(K / kValues, first + part.chunks_per_slice)};
}

// Up to 8 tokens of x [T, K], read from global memory. The records of a slice are loaded kBatch at
// a time before any is used (the weights' loads in flight).
__global__ void __launch_bounds__(kThreads) records_gemv_kernel(RecordsParts launch, const bf16* x, int K) {
  pdl_launch_dependents();
  const BlockWork work = block_work(launch, int(blockIdx.x), K);
  const Sums& out = work.part.out;
  const int lane = threadIdx.x % 32, tile = work.row_block * kWarps + threadIdx.x / 32, first = work.first, end = work.end;
  if (tile >= out.N / kTileRows) return;
  const uint8_t* records = work.part.w + records::record_offset(K, tile, 0);
  Record r[kBatch];
  auto load_batch = [&](int chunk) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) r[u] = load_record(records, chunk + u < end ? chunk + u : first, lane);
  };
  load_batch(first);  // weights only, while the previous kernel finishes (pdl.cuh)
  pdl_wait();  // x comes from the previous kernel, which may still read what this one writes
  // The lane's token row (column g of the mma: token g, or the last one again), at its 8 values of
  // a block.
  const uint4* xs = reinterpret_cast<const uint4*>(x + size_t(min(lane / 4, out.T - 1)) * K) + lane % 4;
  float d[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
  for (int chunk = first; chunk < end; chunk += kBatch) {
    if (chunk != first) load_batch(chunk);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (chunk + u >= end) break;
      const unsigned at = unsigned(chunk + u) * (kValues / 8);
      multiply_record(r[u], [&](int blk) { return __ldg(xs + at + 4 * blk); }, d[0]);
    }
  }
  store_sums<1>(d, out, tile, work.slice, 0, lane);
}

// 8 < T tokens, kTokens (16, 32, 64 or 128) a block, on Hopper's warpgroup mma: each warp's A
// fragments come from its record as in records_gemv_kernel, each warpgroup multiplies its four
// tiles by the block's tokens, staged record by record in shared memory (a ring, kXStages - 1 records ahead) as
// wgmma's K-major B operand, already in the records' order of K (`stage`). wgmma gives mma.sync's
// bits for the same fragments (docs/PERF.md), so a token keeps the bits it has
// alone. The weights are loaded kAhead records ahead into registers: 3 below 64 tokens, 2 from 64,
// where 3 is slower for lack of registers (docs/PERF.md). Block b takes token tile b % token_tiles
// of work block b / token_tiles: the token tiles of one weight slice run side by side.
// From 32 tokens the wgmma pipeline (4-7 % faster there); at 16 it lost 3-18 % (docs/PERF.md).
constexpr bool records_pipelined(int tokens) { return tokens >= 32; }
// Records staged ahead: the ring also holds the record being multiplied and, pipelined, the one
// whose last unit is still in flight.
constexpr int records_stages(int tokens) { return records_pipelined(tokens) ? kXStages + 1 : kXStages; }
// A block's dynamic shared bytes: the ring, 128 bytes a token per stage (one swizzled row), and
// room to align it to the swizzle's 1024 bytes.
constexpr size_t records_wgmma_shared_bytes(int tokens) {
  return size_t(records_stages(tokens)) * tokens * kValues * 2 + 1024;
}

template <int kTokens>
__global__ void __launch_bounds__(kThreads, kTokens > 64 ? 1 : 2)
    records_wgmma_kernel(RecordsParts launch, const bf16* x, int K, int token_tiles) {
  constexpr bool kPipelined = records_pipelined(kTokens);
  constexpr int kAhead = kTokens < 64 ? 3 : 2;
  constexpr int kStages = records_stages(kTokens), kLead = kXStages - 1;
  constexpr int kStageBytes = kTokens * kValues * 2;
  extern __shared__ uint8_t shared_bytes[];  // records_wgmma_shared_bytes: the stages, 1024-aligned here
  auto* xs = reinterpret_cast<uint8_t(*)[kStageBytes]>(shared_bytes + (-shared_addr(shared_bytes) & 1023u));
  pdl_launch_dependents();
  const BlockWork work = block_work(launch, int(blockIdx.x) / token_tiles, K);
  const Sums& out = work.part.out;
  const int token0 = int(blockIdx.x) % token_tiles * kTokens;
  const int T = out.T, lane = threadIdx.x % 32, tiles = out.N / kTileRows;
  const int tile = work.row_block * kWarps + threadIdx.x / 32;
  // A warp past the last tile multiplies the last tile's records (its warpgroup multiplies
  // together, without a branch around the wgmma) and stores nothing.
  const bool has_tile = tile < tiles;
  const int first = work.first, count = work.end - first;
  const uint8_t* records = work.part.w + records::record_offset(K, min(tile, tiles - 1), 0);
  // Record i's tokens into buffer i % kStages: a warp a token's 32 pairs of values (lane l pair
  // l, at the same place in every row of a group of 8), the block's tokens warp, warp + 8, ...;
  // rows past T are zeros (their columns are never stored). One commit per call, empty or not, so that the
  // waits below count alike in every iteration.
  const int warp = threadIdx.x / 32;
  const uint32_t lane_offset = swizzled_offset(kTokens, warp, records::staged_column(lane));
  auto stage = [&](int i) {
    if (i < count) {
      const uint32_t at = uint32_t(first + i) * kValues + 2 * lane, dst = shared_addr(xs[i % kStages]) + lane_offset;
#pragma unroll
      for (int j = 0; j < kTokens / kWarps; ++j) {
        const int t = token0 + warp + kWarps * j;  // token0 < T is always there
        cp_async4(dst + 1024 * j, x + (uint32_t(t < T ? t : token0) * uint32_t(K) + at), t < T);
      }
    }
    cp_async_commit();
  };
  Record r[kAhead + 1];
#pragma unroll
  for (int j = 0; j < kAhead; ++j) r[j] = load_record(records, first + min(j, count - 1), lane);
  pdl_wait();  // weights only before this (pdl.cuh): x comes from the previous kernel
#pragma unroll
  for (int i = 0; i < kLead; ++i) stage(i);
  WgmmaPipeline<kTokens> pipe;
  float d_unpiped[kPipelined ? 1 : kTokens / 8][4] = {};
  for (int i0 = 0; i0 < count; i0 += kAhead + 1) {
#pragma unroll
    for (int u = 0; u <= kAhead; ++u) {
      const int i = i0 + u;
      if (i >= count) break;  // the same for the whole block: the barriers stay aligned
      r[(u + kAhead) % (kAhead + 1)] = load_record(records, first + min(i + kAhead, count - 1), lane);
      cp_async_wait_group<kLead - 1>();  // record i's tokens have landed ...
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // ... for the tensor cores too
      __syncthreads();  // ... for every thread; the buffers of records before i - 1 are free
      stage(i + kLead);
      const uint64_t desc = swizzled_desc(shared_addr(xs[i % kStages]));
      if constexpr (kPipelined)
        pipe.multiply(r[u], desc);
      else
        multiply_record_wgmma<kTokens>(r[u], desc, d_unpiped);
    }
  }
  cp_async_wait_all();
  if constexpr (kPipelined) {
    pipe.drain();
    if (has_tile) store_sums<kTokens / 8>(pipe.d, out, tile, work.slice, token0, lane);
  } else {
    if (has_tile) store_sums<kTokens / 8>(d_unpiped, out, tile, work.slice, token0, lane);
  }
}

// One thread per record of the tiles of rows [first_row, first_row + n): written whole from the
// rows' packed quants (`qs`, row first_row first) and the packed params plane of all rows.
__global__ void records_from_planes_kernel(const uint8_t* qs, const uint8_t* params, int64_t first_row, int64_t n,
                                           int64_t K, uint8_t* w) {
  const int64_t chunks = K / kValues, blocks = K / 32, count = n / kTileRows * chunks;
  const auto block_of = [&](int64_t row, int64_t b) {
    records::GgufBlock block;
    block.bytes[0] = params[2 * (row * blocks + b)];
    block.bytes[1] = params[2 * (row * blocks + b) + 1];
    for (int i = 0; i < 16; ++i) block.bytes[2 + i] = qs[16 * ((row - first_row) * blocks + b) + i];
    return block;
  };
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t tile = first_row / kTileRows + i / chunks, chunk = i % chunks;
    uint8_t record[kBytes];
    records::pack_record(block_of, tile, chunk, record);
    uint4* dst = reinterpret_cast<uint4*>(w + records::record_offset(K, tile, chunk));
    for (int v = 0; v < kBytes / 16; ++v) dst[v] = reinterpret_cast<const uint4*>(record)[v];
  }
}

// out[0..32) = bf16(weight · scale) for the 32 weights of block b of `row`, as dequantize_block in
// packed_weights.cu computes them from the packed layout (dequantize_quant: d · (q - 8)).
__device__ inline void store_block(const uint8_t* w, int64_t K, int64_t row, int64_t b, float scale, bf16* out) {
  const uint8_t* record = w + records::record_offset(K, row / kTileRows, b / 2);
  const int r = int(row % kTileRows), k0 = int(b % 2) * 32;
  const float d = packed::f16_bits_to_float(records::scale_bits_at(record, r, k0));
#pragma unroll
  for (int v = 0; v < 4; ++v) {
    float values[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) values[j] = d * float(records::quant_at(record, r, k0 + 8 * v + j) - 8) * scale;
    reinterpret_cast<uint4*>(out)[v] = pack8(values);
  }
}

// Records that hold rows [first_row, first_row + n) of a K-wide matrix (n >= 1): their tiles' records.
G4_HOST_DEVICE int64_t records_of_rows(int64_t first_row, int64_t n, int64_t K) {
  return ((first_row + n - 1) / kTileRows - first_row / kTileRows + 1) * (K / kValues);
}

// Rows [first_row, first_row + n) dequantized as store_block computes them, a warp a record: lane
// 4g + c's 16 bytes are rows g and g + 8's values 8c .. 8c + 7 of both blocks (place_of), four 16-byte
// pieces of the output, so the record is read with one load a lane and written in whole sectors
// (3.8-3.9 TB/s on the H200 against 1.45 for a thread a block of byte loads: docs/PERF.md).
__global__ void dequantize_records_kernel(const uint8_t* w, int64_t K, int64_t first_row, int64_t n, bf16* out) {
  pdl_launch_dependents();
  pdl_wait();  // `out` is a scratch the previous chunk's GEMM reads
  const int64_t chunks = K / kValues, first_tile = first_row / kTileRows;
  const int64_t records = records_of_rows(first_row, n, K);
  const int lane = int(threadIdx.x % 32), g = lane / 4, c = lane % 4;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; i < records; i += warps) {
    const int64_t tile = first_tile + i / chunks, chunk = i % chunks;
    const uint8_t* record = w + records::record_offset(K, tile, chunk);
    const uint4 quants = reinterpret_cast<const uint4*>(record)[lane];
    const uint32_t words[4] = {quants.x, quants.y, quants.z, quants.w};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = g + 8 * h;
      const int64_t row = tile * kTileRows + r;
      if (row < first_row || row >= first_row + n) continue;
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const float d = packed::f16_bits_to_float(records::scale_bits_at(record, r, 32 * b));
        float values[8];
#pragma unroll
        for (int v = 0; v < 8; ++v) {
          const records::Place p = records::place_of(r, 32 * b + 8 * c + v);
          values[v] = d * float(int((words[p.word] >> p.shift) & 15) - 8);
        }
        *reinterpret_cast<uint4*>(out + (row - first_row) * K + chunk * kValues + 32 * b + 8 * c) = pack8(values);
      }
    }
  }
}

__global__ void embed_records_kernel(const uint8_t* table, int64_t hidden, const int32_t* ids, float scale, bf16* out) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t t = blockIdx.y, blocks = hidden / 32;
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < blocks; b += int64_t(gridDim.x) * blockDim.x)
    store_block(table, hidden, ids[t], b, scale, out + t * hidden + b * 32);
}

void check_records_shape(int64_t N, int64_t K, const void* w) {
  G4_CHECK(records::fits_records(N, K), "Q4_0 records: a [" + std::to_string(N) + ", " + std::to_string(K) +
                                            "] matrix (rows must be a multiple of 16, columns of 64)");
  G4_CHECK(reinterpret_cast<uintptr_t>(w) % 16 == 0, "Q4_0 records must be 16-byte aligned");
}

}  // namespace

size_t q4_0_records_workspace_bytes(int64_t N, int64_t K) {
  if (!records::fits_records(N, K)) return 0;
  const Slicing s = slicing_of(N, K);
  return s.slices == 1 ? 0 : size_t(s.slices) * size_t(kMaxRecordsTokens) * size_t(N) * sizeof(float);
}

void launch_q4_0_records_matmuls(std::span<const RecordsTarget> targets, const bf16* x, int64_t T, int64_t K,
                                 float* workspace, size_t workspace_bytes, cudaStream_t stream, bf16* gelu_out,
                                 const ResidualNormTail* then_norm) {
  G4_CHECK(!targets.empty() && targets.size() <= size_t(kMaxSliceSums), "Q4_0 records matmul: 1 to 3 matrices a launch");
  G4_CHECK(!gelu_out || (targets.size() == 2 && targets[0].N == targets[1].N),
           "Q4_0 records gated GELU: gate and up of one shape");
  G4_CHECK(!then_norm || (targets.size() == 1 && !gelu_out), "Q4_0 records: a residual norm follows one matrix");
  G4_CHECK(T >= 1 && T <= kMaxRecordsTokens,
           "Q4_0 records matmul: " + std::to_string(T) + " tokens (1 to " + std::to_string(kMaxRecordsTokens) + ")");
  RecordsParts launch{};
  launch.count = int(targets.size());
  SliceSum sums[kMaxSliceSums];
  int sum_count = 0, blocks = 0;
  size_t used = 0;  // workspace bytes: each matrix of several slices its partials [slice][T][N]
  int64_t launch_rows = 0;
  for (const RecordsTarget& t : targets) launch_rows += t.N;
  for (size_t m = 0; m < targets.size(); ++m) {
    const RecordsTarget& t = targets[m];
    check_records_shape(t.N, K, t.w);
    const Slicing s = slicing_of(gelu_out ? t.N : launch_rows, K);  // at most its slices alone (the workspace's)
    float* partial = nullptr;
    if (s.slices > 1) {
      partial = workspace + used / sizeof(float);
      used += size_t(s.slices) * size_t(T) * size_t(t.N) * sizeof(float);
      sums[sum_count++] = SliceSum{partial, s.slices, T * t.N, t.y};
    }
    const int row_blocks = int(ceil_div(t.N / kTileRows, kWarps));
    launch.parts[m] = RecordsPart{t.w, Sums{partial, t.y, int(T), int(t.N)}, s.chunks_per_slice, row_blocks, blocks};
    blocks += row_blocks * s.slices;
  }
  G4_CHECK(used <= workspace_bytes, "Q4_0 records matmul: the workspace is too small");
  if (T <= 8) {
    launch_kernel("records_gemv_kernel", records_gemv_kernel, unsigned(blocks), kThreads, 0, stream, Pdl::kOn, launch, x,
                  int(K));
  } else {
    const auto run = [&](auto tokens) {
      constexpr int kTokens = decltype(tokens)::value;
      const int token_tiles = int(ceil_div(T, kTokens));
      launch_kernel("records_wgmma_kernel", records_wgmma_kernel<kTokens>, unsigned(blocks * token_tiles), kThreads,
                    records_wgmma_shared_bytes(kTokens), stream, Pdl::kOn, launch, x, int(K), token_tiles);
    };
    if (T > kMaxPackedMatmulTokens) {
      run(std::integral_constant<int, kRecordsBlockTokens>{});
    } else {
      with_token_tiles(T, [&](auto tiles) { run(std::integral_constant<int, 8 * decltype(tiles)::value>{}); });
    }
  }
  if (gelu_out && sum_count == 2) {
    launch_add_slices_gelu(sums[0], sums[1], gelu_out, stream);
    return;
  }
  if (then_norm) {
    const ResidualNormTail& r = *then_norm;
    if (sum_count == 1) return launch_residual_norm_of_slices(sums[0], T, targets[0].N, r, stream);
    return launch_residual_norm(r.x, targets[0].y, T, targets[0].N, r.post_weight, r.scalar, r.eps, r.next_weight,
                                r.next_out, nullptr, stream);
  }
  if (sum_count > 0) launch_add_slices(std::span(sums, size_t(sum_count)), stream);
  if (gelu_out) launch_gelu_tanh_mul(targets[0].y, targets[1].y, gelu_out, T * targets[0].N, stream);
}

void launch_q4_0_records_matmul(const uint8_t* w, const bf16* x, bf16* y, int64_t T, int64_t N, int64_t K,
                                float* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const RecordsTarget one{w, y, N};
  launch_q4_0_records_matmuls(std::span(&one, 1), x, T, K, workspace, workspace_bytes, stream);
}

void launch_q4_0_records_from_planes(const uint8_t* qs, const uint8_t* params, int64_t first_row, int64_t n, int64_t K,
                                     uint8_t* w, cudaStream_t stream) {
  check_records_shape(n, K, w);
  G4_CHECK(first_row % kTileRows == 0, "Q4_0 records: rows are rearranged in whole tiles of 16");
  launch_kernel("records_from_planes_kernel", records_from_planes_kernel,
                grid_stride_blocks(n / kTileRows * (K / kValues), 256), 256, 0, stream, Pdl::kOff, qs, params,
                first_row, n, K, w);
}

void launch_dequantize_q4_0_records(const uint8_t* w, int64_t rows, int64_t K, int64_t first_row, int64_t n, bf16* out,
                                    cudaStream_t stream) {
  check_records_shape(rows, K, w);
  G4_CHECK(reinterpret_cast<uintptr_t>(out) % 16 == 0 && first_row >= 0 && first_row + n <= rows,
           "dequantize Q4_0 records: bad rows or output");
  if (n == 0) return;
  launch_kernel("dequantize_records_kernel", dequantize_records_kernel,
                grid_stride_blocks(records_of_rows(first_row, n, K) * 32, 256), 256, 0, stream, Pdl::kOn, w, K,
                first_row, n, out);
}

void launch_embed_q4_0_records(const uint8_t* table, int64_t rows, int64_t hidden, const int32_t* ids, int64_t T,
                               float scale, bf16* out, cudaStream_t stream) {
  check_records_shape(rows, hidden, table);
  G4_CHECK(reinterpret_cast<uintptr_t>(out) % 16 == 0, "embed: the output must be 16-byte aligned");
  const unsigned blocks_x = unsigned(ceil_div(hidden / 32, 256));
  launch_kernel("embed_records_kernel", embed_records_kernel, dim3(blocks_x, unsigned(T)), 256, 0, stream, Pdl::kOn,
                table, hidden, ids, scale, out);
}

}  // namespace g4
