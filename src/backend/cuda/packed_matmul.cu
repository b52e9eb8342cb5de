// y[T, N] = x[T, K] · w[N, K]^T over packed block-quantized weights for a few dozen tokens
// (kMaxGemvTokens < T <= kMaxPackedMatmulTokens): a decode batch, a short prefill chunk. The weights
// are read once for all tokens and dequantized in registers straight into tensor-core fragments
// (mma.sync m16n8k16, bf16 in, float32 sums), instead of dequantizing every matrix to a bf16
// scratch for cuBLAS (docs/DESIGN.md, "Quantized weights on the GPU").
//
// Geometry: a CTA of 8 warps takes 128 weight rows (a 16-row tile per warp) and one slice of K;
// every token is an mma column (tiles of 8; 16, 32 or 64 columns compiled). The slice passes
// through shared memory 128 values at a time, double-buffered by cp.async: the activations, and
// the weight rows' bytes of the chunk's four blocks from each region of the packed layout (so the
// next chunk's weights stream in while this one's are multiplied). Each lane reads its rows'
// blocks there with load_block (a row's 16 quant bytes serve its four lanes) and unpacks only its
// own two quant words (packed_blocks.h: unpack_word_pair). K is permuted inside each k16
// step — lane c's fragment slots 2c, 2c+1, 2c+8, 2c+9 hold weights 4c..4c+3 — so a lane's eight
// weights of a block are two whole quant words and its activations two 8-byte loads; the sum over
// k is the same. Slices of K are fixed by the matrix shape (never by T), and slices' partial sums
// are added in slice order by a second kernel, so a row's result does not depend on the others.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/packed_kernels.h"
#include "backend/cuda/pdl.cuh"

namespace g4 {

namespace {

using namespace packed;

constexpr int kWarps = 8, kThreads = 32 * kWarps;
// One 16-row tile per warp: 79 registers and ~58 KB of stages at 64 tokens of Q4_0, so three CTAs
// share a multiprocessor, which makes a 64-sequence step faster than two tiles a warp (128
// registers, two CTAs; docs/PERF.md).
constexpr int kWarpTiles = 1, kRowsPerWarp = 16 * kWarpTiles, kRowsPerCta = kWarps * kRowsPerWarp;
constexpr int kChunk = kPackedMatmulChunk;  // k values per shared-memory stage
constexpr int kChunkBlocks = kChunk / kBlock;
constexpr int kXStride = kChunk + 16;       // bf16 per staged row: 288 bytes, so a warp's 8 rows of
                                            // fragment loads fall in distinct banks per half-warp
constexpr int kTargetCtas = 384;            // slices of K are added until a matrix has about this many CTAs
                                            // (three per multiprocessor; 384 measured faster than 256 and 512)
constexpr int kMaxTokens = kMaxPackedMatmulTokens;

// 8 bytes global -> shared (zeros when !valid: src unread).
__device__ inline void cp_async8(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 8 : 0) : "memory");
}

// q - quant_offset of byte j of `word`, exactly, as a float (the byte under 2^23's mantissa).
template <DType kType>
__device__ inline float centred_quant(uint32_t word, int j) {
  constexpr float bias = 8388608.0f + float(quant_offset(kType)) + (kType == DType::Q8_0 ? 128.0f : 0.0f);
  if constexpr (kType == DType::Q8_0) word ^= 0x80808080u;  // int8 -> biased unsigned
  return __uint_as_float(__byte_perm(word, 0x4B000000u, 0x7540u | unsigned(j))) - bias;
}

// Two bf16 weights (bytes j, j + 1 of `word`), as dequantize_quant computes them, rounded once.
template <DType kType>
__device__ inline uint32_t weight_pair(uint32_t word, int j, float scale, float min) {
  float w[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    w[h] = scale * centred_quant<kType>(word, j + h);
    if constexpr (has_min(kType)) w[h] += min;
  }
  return pack_bf16x2(w[0], w[1]);
}

struct Geometry {
  int64_t T, N, K;
  int chunks_per_slice;
};

// A stage's weights in shared memory: per region of the packed layout, each of the CTA's rows'
// bytes for the chunk's blocks — qs rows padded by 16 bytes (so the 8 rows of a fragment load fall
// in distinct banks), Q6_K's 4 scales of the chunk or a K-quant's super-block head.
template <DType kType>
struct StagedWeights {
  static constexpr Format f = format_of(kType);
  static constexpr int kQsPitch = kChunkBlocks * f.qs + 16, kQhBytes = kChunkBlocks * f.qh,
                       kParamBytes = kChunkBlocks * f.params, kSuperBytes = kType == DType::Q6_K ? 8 : f.super;
  static constexpr int kQh = kRowsPerCta * kQsPitch, kParams = kQh + kRowsPerCta * kQhBytes,
                       kSuper = kParams + kRowsPerCta * kParamBytes,
                       kBytes = kSuper + (kSuperBytes > 0 ? kRowsPerCta * 16 : 0);

  // Local row lr's regions (block j of the chunk is block j of these); super_d stays in global memory.
  __device__ static RowRegions<const uint8_t> row(const uint8_t* stage, int lr, const uint8_t* super_d) {
    return {stage + lr * kQsPitch, stage + kQh + lr * kQhBytes, stage + kParams + lr * kParamBytes,
            stage + kSuper + lr * 16, super_d};
  }
};

template <int kTiles>
constexpr int activation_stage_bytes() { return 8 * kTiles * kXStride * int(sizeof(bf16)); }

// Copies a region's bytes of every row of the CTA for one chunk: `bytes` (a multiple of 8) per row
// starting at region_of(row), into stage + lr * pitch; rows past N as zeros.
template <class RegionOf>
__device__ inline void stage_region(uint8_t* stage, int pitch, int bytes, int64_t first_row, int64_t N,
                                    RegionOf region_of) {
  const int pieces = (bytes + 15) / 16;
  for (int i = threadIdx.x; i < kRowsPerCta * pieces; i += kThreads) {
    const int lr = i / pieces, piece = i % pieces;
    const int64_t row = first_row + lr;
    const bool valid = row < N;
    const uint8_t* src = region_of(valid ? row : first_row) + 16 * piece;
    const uint32_t dst = shared_addr(stage + lr * pitch + 16 * piece);
    if (bytes - 16 * piece >= 16)
      cp_async16(dst, src, valid);
    else
      cp_async8(dst, src, valid);
  }
}

// Stages chunk `chunk` of K: x[:, its 128 values] (rows beyond T as zeros) and the CTA's weight rows'
// bytes of its 4 blocks; one cp.async group.
template <DType kType, int kTiles>
__device__ inline void stage_chunk(const bf16* x, const uint8_t* w, const Geometry& g, int64_t first_row,
                                   int64_t chunk, uint8_t* stage) {
  using S = StagedWeights<kType>;
  constexpr Format f = S::f;
  bf16* xs = reinterpret_cast<bf16*>(stage + S::kBytes);
  constexpr int kPieces = kChunk / 8;  // 16-byte pieces per activation row
  const int64_t k0 = chunk * kChunk, b0 = chunk * kChunkBlocks;
  for (int i = threadIdx.x; i < 8 * kTiles * kPieces; i += kThreads) {
    const int t = i / kPieces, piece = i % kPieces;
    const bool valid = t < g.T;
    cp_async16(shared_addr(xs + t * kXStride + piece * 8), x + (valid ? t : 0) * g.K + k0 + piece * 8, valid);
  }
  auto regions = [&](int64_t row) { return row_regions<kType>(w, g.N, g.K, row); };
  stage_region(stage, S::kQsPitch, kChunkBlocks * f.qs, first_row, g.N,
               [&](int64_t row) { return regions(row).qs + b0 * f.qs; });
  if constexpr (S::kQhBytes > 0)
    stage_region(stage + S::kQh, S::kQhBytes, S::kQhBytes, first_row, g.N,
                 [&](int64_t row) { return regions(row).qh + b0 * f.qh; });
  if constexpr (S::kParamBytes > 0)
    stage_region(stage + S::kParams, S::kParamBytes, S::kParamBytes, first_row, g.N,
                 [&](int64_t row) { return regions(row).params + b0 * f.params; });
  if constexpr (S::kSuperBytes > 0)  // Q6_K: the chunk's 4 of the super-block's 8 scales (2 bytes each)
    stage_region(stage + S::kSuper, 16, S::kSuperBytes, first_row, g.N, [&](int64_t row) {
      return regions(row).super + (b0 / kSubBlocks) * 16 + (kType == DType::Q6_K ? 2 * (b0 % kSubBlocks) : 0);
    });
  cp_async_commit();
}

// The A fragments of one 16-row tile for block j of the staged chunk (block b of the row):
// frag[step] for k16 steps 0 (weights 0..15) and 1.
template <DType kType>
__device__ inline void tile_fragments(const uint8_t* stage, const uint8_t* w, const Geometry& g, int64_t cta_row,
                                      int tile_row, int j, int64_t b, int lane, uint32_t (&frag)[2][4]) {
  const int c = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // rows lane / 4 and lane / 4 + 8
    const int lr = tile_row + lane / 4 + 8 * h;
    uint32_t lo = 0, hi = 0;
    BlockWeights bw{};
    if (cta_row + lr < g.N) {
      const uint8_t* super_d = row_regions<kType>(w, g.N, g.K, cta_row + lr).super_d + (b / kSubBlocks) * 2;
      const RawBlock raw = load_block<kType, PlainLoads>(StagedWeights<kType>::row(stage, lr, super_d), j);
      unpack_word_pair<kType>(raw, c, &lo, &hi);
      unpack_scales<kType>(raw, int(b % kSubBlocks), bw);
    }
    frag[0][h] = weight_pair<kType>(lo, 0, bw.scale, bw.min);         // slots 2c, 2c+1: weights 4c, 4c+1
    frag[0][2 + h] = weight_pair<kType>(lo, 2, bw.scale, bw.min);     // slots 2c+8, 2c+9: 4c+2, 4c+3
    frag[1][h] = weight_pair<kType>(hi, 0, bw.scale_hi, bw.min);      // the same for weights 16..31
    frag[1][2 + h] = weight_pair<kType>(hi, 2, bw.scale_hi, bw.min);
  }
}

template <DType kType, int kTiles>
constexpr int stage_bytes() { return StagedWeights<kType>::kBytes + activation_stage_bytes<kTiles>(); }

// Grid (row tiles, slices). Slice s sums chunks [s, s + 1) * chunks_per_slice of K; with one slice
// the CTA writes y, otherwise its float sums go to partial[s][T][N].
template <DType kType, int kTiles>
__global__ void __launch_bounds__(kThreads) packed_matmul_kernel(const bf16* x, const uint8_t* w, bf16* y,
                                                                 float* partial, Geometry g) {
  extern __shared__ __align__(16) uint8_t stages[];  // two stages of stage_bytes<kType, kTiles>()
  constexpr int kStageBytes = stage_bytes<kType, kTiles>();
  pdl_launch_dependents();
  pdl_wait();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, c = lane % 4, r = lane / 4;
  const int64_t cta_row = int64_t(blockIdx.x) * kRowsPerCta;
  const int64_t chunks = g.K / kChunk;
  const int64_t chunk_begin = int64_t(blockIdx.y) * g.chunks_per_slice;
  const int64_t chunk_end = chunk_begin + g.chunks_per_slice < chunks ? chunk_begin + g.chunks_per_slice : chunks;
  float acc[kWarpTiles][kTiles][4] = {};
  stage_chunk<kType, kTiles>(x, w, g, cta_row, chunk_begin, stages);
  for (int64_t chunk = chunk_begin; chunk < chunk_end; ++chunk) {
    const uint8_t* stage = stages + ((chunk - chunk_begin) % 2) * kStageBytes;
    if (chunk + 1 < chunk_end) {
      stage_chunk<kType, kTiles>(x, w, g, cta_row, chunk + 1, stages + ((chunk + 1 - chunk_begin) % 2) * kStageBytes);
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    } else {
      cp_async_wait_all();
    }
    __syncthreads();
    const bf16* xs = reinterpret_cast<const bf16*>(stage + StagedWeights<kType>::kBytes);
#pragma unroll
    for (int j = 0; j < kChunkBlocks; ++j) {
      const int64_t b = chunk * kChunkBlocks + j;
      uint32_t frag[kWarpTiles][2][4];  // [tile][k16 step][register]
#pragma unroll
      for (int m = 0; m < kWarpTiles; ++m)
        tile_fragments<kType>(stage, w, g, cta_row, warp * kRowsPerWarp + 16 * m, j, b, lane, frag[m]);
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        const bf16* xt = xs + (8 * t + r) * kXStride + j * kBlock + 4 * c;
        const uint2 step0 = *reinterpret_cast<const uint2*>(xt), step1 = *reinterpret_cast<const uint2*>(xt + 16);
#pragma unroll
        for (int m = 0; m < kWarpTiles; ++m) {
          mma_bf16(acc[m][t], frag[m][0], step0.x, step0.y);
          mma_bf16(acc[m][t], frag[m][1], step1.x, step1.y);
        }
      }
    }
    __syncthreads();  // the next iteration's copies overwrite this stage
  }
  const int64_t first_row = cta_row + warp * kRowsPerWarp;
#pragma unroll
  for (int m = 0; m < kWarpTiles; ++m)
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t row = first_row + 16 * m + r + 8 * (e / 2), token = 8 * t + 2 * c + e % 2;
        if (row >= g.N || token >= g.T) continue;
        if (gridDim.y == 1)
          y[token * g.N + row] = __float2bfloat16(acc[m][t][e]);
        else
          partial[(int64_t(blockIdx.y) * g.T + token) * g.N + row] = acc[m][t][e];
      }
}

// Slices of K for an [N, K] matrix: chunks per slice and slice count.
std::pair<int, int> slicing(int64_t N, int64_t K) {
  const int64_t row_tiles = ceil_div(N, kRowsPerCta), chunks = K / kChunk;
  const int64_t wanted = std::clamp<int64_t>(ceil_div(kTargetCtas, row_tiles), 1, chunks);
  const int64_t per_slice = ceil_div(chunks, wanted);
  return {int(per_slice), int(ceil_div(chunks, per_slice))};
}

}  // namespace

size_t packed_matmul_workspace_bytes(int64_t N, int64_t K) {
  if (K % kChunk != 0) return 0;
  const int slices = slicing(N, K).second;
  return slices == 1 ? 0 : size_t(slices) * size_t(kMaxTokens) * size_t(N) * sizeof(float);
}

void launch_packed_matmul(DType type, const bf16* x, const uint8_t* w, bf16* y, int64_t T, int64_t N, int64_t K,
                          float* workspace, size_t workspace_bytes, cudaStream_t stream) {
  G4_CHECK(packed_matmul_fits(T, K), "packed matmul: " + std::to_string(T) + " tokens of " + std::to_string(K) +
                                         " values (wants 1.." + std::to_string(kMaxTokens) +
                                         " tokens, K a multiple of 128)");
  const auto [per_slice, slices] = slicing(N, K);
  G4_CHECK(slices == 1 || size_t(slices) * size_t(T) * size_t(N) * sizeof(float) <= workspace_bytes,
           "packed matmul: the workspace reserved for this matrix is too small");
  const Geometry g{T, N, K, per_slice};
  const dim3 grid(unsigned(ceil_div(N, kRowsPerCta)), unsigned(slices));
  with_block_type(type, [&](auto t) {
    constexpr DType kType = decltype(t)::value;
    with_token_tiles(T, [&](auto tiles) {
      constexpr int kTiles = decltype(tiles)::value;
      launch_kernel("packed_matmul_kernel", packed_matmul_kernel<kType, kTiles>, grid, kThreads,
                    2 * size_t(stage_bytes<kType, kTiles>()), stream, Pdl::kOn, x, w, y, workspace, g);
    });
  });
  if (slices == 1) return;
  launch_add_slices(workspace, slices, T * N, y, stream);
}

}  // namespace g4
