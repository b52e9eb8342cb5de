// The CUDA sampler (docs/DESIGN.md §4). Two paths, both returning sample_row()'s token:
//  * the segment path (below, "The segment path"): rows spread over the whole GPU, one block per
//    segment of a row; takes every greedy and NaN row and every row with a top-k or top-p cut
//    whose candidates provably decide the token (rows with a small top-k cut in larger batches in
//    the first kernel's one read, "collected rows");
//  * the cluster kernel (sample_rows_kernel), for the rows the segment path leaves: one
//    thread-block cluster of kClusterBlocks blocks samples one row. Each block copies its slice of
//    the logits into shared memory once, and every later pass reads shared memory; the blocks
//    combine their partial results through distributed shared memory and cluster barriers.
// Nothing sorts the vocabulary.
//
// Files: sampler_rows.cuh (row primitives both paths share), sampler_segments.cu (the segment
// path), sampler_cluster.cu (the cluster kernel); this file runs them in turn.
#include "backend/cuda/cuda_sampler.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/sampler_paths.h"
#include "sampling/sampling_math.h"
#include "util/error.h"

namespace g4 {

CudaSampler::CudaSampler(int64_t max_vocab) : max_vocab_(max_vocab) {
  G4_CHECK(max_vocab >= 1 && max_vocab <= sampling::kMaxVocab, "CUDA sampler: vocab size " + std::to_string(max_vocab) + " out of range");
  check_cluster_kernel_fits(max_vocab);
  // launch_kernel raises the kernel's shared memory limit when a launch needs it.
  // The segment path's workspace, reused by every call (segment_extremes_kernel clears what it must).
  const SegmentWorkspaceBytes bytes = segment_workspace_bytes(max_vocab);
  extremes_ = DeviceBuffer(bytes.extremes);
  row_scratch_ = DeviceBuffer(bytes.row_scratch);
  candidates_ = DeviceBuffer(bytes.candidates);
  fallback_ = DeviceBuffer(bytes.fallback);
  collect_ = DeviceBuffer(bytes.collect);
  G4_CUDA(cudaMemset(collect_.data(), 0, collect_.bytes()));  // the kernels leave it zero from here on
}

CudaSampler::~CudaSampler() = default;

void CudaSampler::sample(const CudaSampleBatch& batch, CUstream_st* stream) const {
  G4_CHECK(batch.vocab >= 1 && batch.vocab <= max_vocab_,
           "CUDA sampler: vocab " + std::to_string(batch.vocab) + " exceeds the prepared " + std::to_string(max_vocab_));
  G4_CHECK(batch.rows >= 1 && batch.rows <= 65535, "CUDA sampler: batch of " + std::to_string(batch.rows) + " rows out of range");
  for (int64_t first = 0; first < batch.rows; first += kChunkRows) {
    CudaSampleBatch chunk = batch;
    chunk.rows = std::min(kChunkRows, batch.rows - first);
    chunk.logits += first * batch.logits_row_stride;
    chunk.params += first;
    chunk.tokens += first;
    sample_chunk(chunk, stream);
  }
}

// Up to kChunkRows rows: the two segment kernels, then the cluster kernel for the rows they leave.
void CudaSampler::sample_chunk(const CudaSampleBatch& batch, CUstream_st* stream) const {
  const SegmentBuffers buffers{extremes_.data(), row_scratch_.data(), candidates_.data(), fallback_.as<int>(),
                               collect_.data()};
  const Pdl pdl = launch_segment_kernels(batch, buffers, stream);
  launch_cluster_kernel(batch, buffers.fallback + 1, buffers.fallback, pdl, stream);
}

void CudaSampler::describe(const CudaSampleBatch& rows, RowDistribution* out, CUstream_st* stream) const {
  G4_CHECK(rows.vocab >= 1 && rows.vocab <= max_vocab_,
           "CUDA sampler: vocab " + std::to_string(rows.vocab) + " exceeds the prepared " + std::to_string(max_vocab_));
  G4_CHECK(rows.rows >= 1 && rows.rows <= 65535, "CUDA sampler: " + std::to_string(rows.rows) + " rows out of range");
  launch_describe_kernel(rows, out, stream);
}

int64_t CudaSampler::cluster_kernel_rows(CUstream_st* stream) const {
  int count = 0;
  G4_CUDA(cudaMemcpyAsync(&count, fallback_.data(), sizeof(int), cudaMemcpyDeviceToHost, stream));
  G4_CUDA(cudaStreamSynchronize(stream));
  return count;
}

}  // namespace g4
