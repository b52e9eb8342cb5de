// The CUDA sampler's two kernel families as the launcher (cuda_sampler.cu) runs them: the segment
// path (sampler_segments.cu) and the cluster kernel for the rows it leaves (sampler_cluster.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_sampler.h"
#include "backend/cuda/launch.cuh"

namespace g4 {

inline constexpr int64_t kChunkRows = 128;    // rows per set of launches (the segment workspace's rows)
inline constexpr int kFallbackClusters = 16;  // clusters of the cluster kernel (16 fit at once)

// ---- sampler_segments.cu ----

// Bytes of each array of the segment path's workspace for kChunkRows rows of up to max_vocab logits.
struct SegmentWorkspaceBytes {
  size_t extremes, row_scratch, candidates, fallback, collect;
};
SegmentWorkspaceBytes segment_workspace_bytes(int64_t max_vocab);
// That workspace (device memory). fallback: the count of rows left to the cluster kernel, then
// those rows; collect must be zero before the first launch (the kernels leave it zero).
struct SegmentBuffers {
  void *extremes, *row_scratch, *candidates;
  int* fallback;
  void* collect;
};
// Enqueues both segment kernels over batch (up to kChunkRows rows), which sample every row they
// can and list the others in buffers.fallback; returns how the cluster kernel is to be launched
// after them (PDL on streams g4 creates).
Pdl launch_segment_kernels(const CudaSampleBatch& batch, const SegmentBuffers& buffers, cudaStream_t stream);

// ---- sampler_cluster.cu ----

// Throws g4::Error when one cluster's shared memory cannot hold a row of max_vocab logits.
void check_cluster_kernel_fits(int64_t max_vocab);
// Enqueues the cluster kernel over the rows row_list[0, *row_count) of batch.
void launch_cluster_kernel(const CudaSampleBatch& batch, const int* row_list, const int* row_count, Pdl pdl,
                           cudaStream_t stream);
// Enqueues the description of every row of batch (logits, stride, rows, vocab, params) into out.
void launch_describe_kernel(const CudaSampleBatch& batch, RowDistribution* out, cudaStream_t stream);

}  // namespace g4
