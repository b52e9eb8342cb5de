// Packed block-quantized weights (layout: packed_blocks.h) in and out of their layout: GGUF blocks
// packed at upload, random blocks for synthetic weights, rows dequantized to bf16 for the prefill
// GEMM, and embedding rows. One thread per block (the dequantized rows staged through shared memory
// for whole-warp stores); the weights come through the functions the host tests run
// (tests/test_packed_blocks.cpp), so the values are decode_row's bit for bit.
#include <algorithm>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/packed_kernels.h"
#include "quant/random_blocks.h"

namespace g4 {

namespace {

using namespace packed;

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) { return grid_stride_blocks(n, kThreads); }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void check_packed_shape(DType type, int64_t cols, const void* data) {
  G4_CHECK(is_block_quantized(type) && cols % block_size(type) == 0,
           "packed weights: " + dtype_name(type) + " rows of " + std::to_string(cols) + " values");
  G4_CHECK(aligned16(data), "packed weights must be 16-byte aligned");
}

template <DType kType>
__global__ void pack_rows_kernel(const uint8_t* gguf, int64_t first_row, int64_t n, uint8_t* dst, int64_t rows,
                                 int64_t cols, int64_t per_row, int64_t gguf_block_bytes) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * per_row; i += int64_t(gridDim.x) * blockDim.x)
    pack_block<kType>(gguf + i * gguf_block_bytes, row_regions<kType>(dst, rows, cols, first_row + i / per_row),
                      i % per_row);
}

template <DType kType>
__global__ void fill_random_blocks_kernel(uint8_t* dst, int64_t rows, int64_t cols, int64_t per_row,
                                          RandomBlockScales scales, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * per_row;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint8_t block[kMaxGgufBlockBytes];
    random_block(kType, scales, seed, uint64_t(i), block);
    pack_block<kType>(block, row_regions<kType>(dst, rows, cols, i / per_row), i % per_row);
  }
}

// The 32 weights of block b of `row` times `scale` as bf16, handed to put(v, piece) as their four
// 16-byte pieces v = 0..3 (weights 8v .. 8v + 7).
template <DType kType, typename Put>
__device__ inline void dequantize_block(const uint8_t* w, int64_t rows, int64_t cols, int64_t row, int64_t b,
                                        float scale, Put&& put) {
  const BlockWeights bw =
      unpack_block<kType>(load_block<kType, PlainLoads>(row_regions<kType>(w, rows, cols, row), b), int(b % kSubBlocks));
#pragma unroll
  for (int v = 0; v < kBlock / 8; ++v) {
    float values[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) values[j] = dequantized<kType>(bw, 8 * v + j) * scale;
    put(v, pack8(values));
  }
}

// A warp dequantizes 32 consecutive blocks (2 KB of output) a trip, a thread a block, the pieces
// staged in shared memory so that each store instruction writes 512 contiguous bytes (whole 32-byte
// sectors): a thread storing its own block's pieces writes 16 bytes every 64, which ran at 1.5-2.1
// TB/s on the H200 against 3.7-3.9 this way (docs/PERF.md). Shared index
// q ^ ((q >> 3) & 3) (16-byte units) keeps both the writes (stride 4) and the reads (stride 1) free
// of bank conflicts.
template <DType kType>
__global__ void __launch_bounds__(kThreads) dequantize_rows_kernel(const uint8_t* w, int64_t rows, int64_t K,
                                                                   int64_t first_row, int64_t n, bf16* out) {
  constexpr int kPieces = kBlock / 8;
  __shared__ uint4 staged[kThreads / 32][32 * kPieces];
  pdl_launch_dependents();
  pdl_wait();  // `out` is a scratch the previous chunk's GEMM reads
  const int64_t blocks = K / kBlock, total = n * blocks;
  const int lane = int(threadIdx.x % 32);
  uint4* mine = staged[threadIdx.x / 32];
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  auto at = [](int q) { return q ^ ((q >> 3) & 3); };
  for (int64_t base = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32 * 32; base < total; base += warps * 32) {
    const int64_t i = base + lane;
    if (i < total)
      dequantize_block<kType>(w, rows, K, first_row + i / blocks, i % blocks, 1.0f,
                              [&](int v, const uint4& piece) { mine[at(kPieces * lane + v)] = piece; });
    __syncwarp();
    uint4* dst = reinterpret_cast<uint4*>(out + base * kBlock);
    const int64_t pieces = min(int64_t(32), total - base) * kPieces;
#pragma unroll
    for (int r = 0; r < kPieces; ++r)
      if (32 * r + lane < pieces) dst[32 * r + lane] = mine[at(32 * r + lane)];
    __syncwarp();
  }
}

template <DType kType>
__global__ void embed_packed_kernel(const uint8_t* table, int64_t rows, int64_t hidden, const int32_t* ids,
                                    float scale, bf16* out) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t t = blockIdx.y, blocks = hidden / kBlock;
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < blocks; b += int64_t(gridDim.x) * blockDim.x) {
    uint4* dst = reinterpret_cast<uint4*>(out + t * hidden + b * kBlock);
    dequantize_block<kType>(table, rows, hidden, ids[t], b, scale, [&](int v, const uint4& piece) { dst[v] = piece; });
  }
}

}  // namespace

void launch_pack_rows(DType type, const uint8_t* gguf, int64_t first_row, int64_t n, uint8_t* dst, int64_t rows,
                      int64_t cols, cudaStream_t stream) {
  check_packed_shape(type, cols, dst);
  const int64_t per_row = cols / block_size(type);
  with_block_type(type, [&](auto t) {
    launch_kernel("pack_rows_kernel", pack_rows_kernel<decltype(t)::value>, grid_for(n * per_row), kThreads, 0, stream,
                  Pdl::kOff, gguf, first_row, n, dst, rows, cols, per_row, int64_t(block_bytes(type)));
  });
}

void launch_fill_random_blocks(DType type, uint8_t* dst, int64_t rows, int64_t cols, float spread, uint64_t seed,
                               cudaStream_t stream) {
  check_packed_shape(type, cols, dst);
  const RandomBlockScales scales = random_block_scales(type, spread);
  const int64_t per_row = cols / block_size(type);
  with_block_type(type, [&](auto t) {
    launch_kernel("fill_random_blocks_kernel", fill_random_blocks_kernel<decltype(t)::value>, grid_for(rows * per_row),
                  kThreads, 0, stream, Pdl::kOff, dst, rows, cols, per_row, scales, seed);
  });
}

void launch_dequantize_rows(DType type, const uint8_t* w, int64_t rows, int64_t K, int64_t first_row, int64_t n,
                            bf16* out, cudaStream_t stream) {
  check_packed_shape(type, K, w);
  G4_CHECK(aligned16(out) && first_row >= 0 && first_row + n <= rows, "dequantize_rows: bad rows or output");
  with_block_type(type, [&](auto t) {
    launch_kernel("dequantize_rows_kernel", dequantize_rows_kernel<decltype(t)::value>, grid_for(n * (K / kBlock)),
                  kThreads, 0, stream, Pdl::kOn, w, rows, K, first_row, n, out);
  });
}

void launch_embed_packed(DType type, const uint8_t* table, int64_t rows, int64_t hidden, const int32_t* ids, int64_t T,
                         float scale, bf16* out, cudaStream_t stream) {
  check_packed_shape(type, hidden, table);
  G4_CHECK(aligned16(out), "embed: the output must be 16-byte aligned");
  const unsigned blocks_x = unsigned(ceil_div(hidden / kBlock, kThreads));
  with_block_type(type, [&](auto t) {
    launch_kernel("embed_packed_kernel", embed_packed_kernel<decltype(t)::value>, dim3(blocks_x, unsigned(T)), kThreads,
                  0, stream, Pdl::kOn, table, rows, hidden, ids, scale, out);
  });
}

}  // namespace g4
