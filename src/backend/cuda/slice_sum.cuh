// Slices of K added inside the kernel that computed them. The tensor-core kernels over packed
// weights (packed_matmul.cu, packed_batch_gemv.cu) give each thread block 128 weight rows and one
// slice of K, a slice's float sums going to a workspace; the last block of a row tile to finish
// (an arrival counter per tile) adds the tile's slices from 0 in slice order and writes y. The
// order is fixed, so the bits are those of a separate adding kernel, without its launch: one per
// matrix, ~7 a layer in a 64-row step (docs/DESIGN.md §3).
//
// The workspace: kMaxSliceTiles arrival counters (zero when allocated; every launch leaves them
// zero), then the partial sums [slice][T][N]. The counters' place does not depend on N, so one
// workspace serves matrices of any shape; launches that share it must run one after another (one
// stream; with PDL a kernel touches the workspace only after pdl_wait()).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace g4 {

inline constexpr int kSliceTileRows = 128;   // weight rows of a thread block, so of an arrival counter
inline constexpr int kMaxSliceTiles = 4096;  // row tiles of the largest matrix: 524 288 rows
inline constexpr size_t kSliceArrivalBytes = kMaxSliceTiles * sizeof(unsigned);

// Bytes of a workspace for `slices` slices of T tokens of an N-row matrix (0 for one slice: y directly).
inline size_t slice_workspace_bytes(int slices, int64_t T, int64_t N) {
  return slices == 1 ? 0 : kSliceArrivalBytes + size_t(slices) * size_t(T) * size_t(N) * sizeof(float);
}

// Whether a matrix of N rows fits the counters.
inline bool slice_tiles_fit(int64_t N) { return N <= int64_t(kMaxSliceTiles) * kSliceTileRows; }

struct SliceWorkspace {
  unsigned* arrivals;
  float* partial;  // [slice][T][N]
};

inline SliceWorkspace slice_workspace(float* workspace) {
  return {reinterpret_cast<unsigned*>(workspace), reinterpret_cast<float*>(reinterpret_cast<char*>(workspace) + kSliceArrivalBytes)};
}

// Called by every thread of a block (grid: row tiles × slices) once its partial sums are stored:
// whether it is the last of its row tile's slices to finish; that block's counter goes back to 0.
__device__ inline bool finished_last_slice(unsigned* arrivals) {
  __shared__ bool last;
  __threadfence();  // this thread's partial sums are visible before the block arrives
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(arrivals + blockIdx.x, 1u) == gridDim.y - 1;
    if (last) arrivals[blockIdx.x] = 0;
  }
  __syncthreads();
  return last;
}

// y[t][row] = bf16(Σ_s partial[s][t][row]) from 0 in slice order, for the block's row tile
// [row0, row0 + kSliceTileRows) ∩ [0, N) and every t < T. Reads through L2: other blocks wrote them.
__device__ inline void add_tile_slices(const float* partial, int slices, int64_t T, int64_t N, int64_t row0,
                                       __nv_bfloat16* y) {
  for (int64_t i = threadIdx.x; i < T * kSliceTileRows; i += blockDim.x) {
    const int64_t t = i / kSliceTileRows, row = row0 + i % kSliceTileRows;
    if (row >= N) continue;
    float sum = 0.0f;
    for (int s = 0; s < slices; ++s) sum += __ldcg(partial + (int64_t(s) * T + t) * N + row);
    y[t * N + row] = __float2bfloat16(sum);
  }
}

}  // namespace g4
