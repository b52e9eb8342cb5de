// Matmuls of up to kMaxTileTokens tokens on tensor cores over packed block-quantized weights,
// batch invariant (tile_matmul.cu; docs/DESIGN.md §7, "Batched matmuls"). Launchers
// enqueue on `stream` and return at once; pointers are device pointers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"
#include "util/dtype.h"

namespace g4 {

inline constexpr int kMaxTileTokens = 64;
inline constexpr int kMaxTileTargets = 3;

// One [rows, K] weight (packed in the launch's block type) and its output y [T, rows].
// A matrix whose K is cut into slices > 1 (tile_slices) meets its slices in `partials`
// (tile_partial_floats, twice that for the gated GELU) and `counters` (tile_counter_count, zero).
struct TileTarget {
  const void* w = nullptr;
  bf16* y = nullptr;
  int64_t rows = 0;
  int slices = 1;
  float* partials = nullptr;
  unsigned* counters = nullptr;
};

// The K slices of an [N, K] matrix: a function of its shape alone, so that every token count
// computes a row the same way.
int tile_slices(int64_t N, int64_t K);
size_t tile_partial_floats(int64_t N, int64_t K);
int64_t tile_counter_count(int64_t N);

// y_i[T, N_i] = x[T, K] · w_i^T for 1..kMaxTileTokens tokens and 1..kMaxTileTargets matrices of
// one block type sharing x; K a multiple of 32 (of 256 for the K-quants).
void launch_tile_matmul(DType type, const bf16* x, int64_t T, int64_t K, const TileTarget* targets, int count,
                        cudaStream_t stream);
// gate.y[T, N] = gelu_tanh(x · gate^T) * (x · up^T), gate and up of one type and shape; gate and up
// are rounded to bf16 before the GELU-mul, as the separate matmuls store them.
void launch_tile_gated_gelu(DType type, const bf16* x, int64_t T, int64_t K, const TileTarget& gate,
                            const void* w_up, cudaStream_t stream);

}  // namespace g4
