// The CUDA sampler: three kernels sample a batch of logits rows on the device with per-row
// parameters read from device memory, returning exactly sample_row()'s token (cpu_sampler.h) for
// the same logits, parameters and seed (docs/DESIGN.md §4). Includable without the CUDA headers;
// the implementation (cuda_sampler.cu) is built only when CUDA is.
//
// Graph-friendly: sample() only enqueues three kernels per 128 rows (no allocation, no host
// synchronisation; the workspace is allocated once here), reads the parameters and seeds from
// device memory on every launch, and can advance each row's seed in device memory after its draw,
// so replays of a captured graph follow the seed schedule.
#pragma once
#include <cstdint>

#include "backend/cuda/device_buffer.h"
#include "sampling/sampling_params.h"
#include "sampling/speculative_math.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace g4 {

struct CudaSampleBatch {
  const float* logits = nullptr;    // device, F32 rows of `vocab` logits (already soft-capped)
  int64_t logits_row_stride = 0;    // elements between rows; 0 = every row samples the same logits
  int64_t rows = 0;                 // batch size, 1..65535
  int64_t vocab = 0;
  SamplingParams* params = nullptr; // device, [rows]; params[r].seed is row r's seed for this draw
  int64_t* tokens = nullptr;        // device, [rows] sampled ids (kNanLogitsToken: NaN logits)
  bool advance_seed = false;        // after the draw: params[r].seed += 1 (for graph replays)
};

// A row's distribution as a draw from it sees it, for weighing given tokens (the speculative
// verdict, draft_verdict.h): sampled rows' kept set with its total; every row's argmax.
struct RowDistribution {
  sampling::KeptSet kept;  // sampled rows without NaN
  uint64_t best_rank = 0;  // the argmax's rank (sampling_math.h: rank_of)
  int32_t has_nan = 0;     // then nothing else holds
};

class CudaSampler {
 public:
  // Prepares the kernels for rows of up to `max_vocab` logits on the current device and allocates
  // the workspace (~8.5 MB at V = 262 144). Throws g4::Error when the device cannot hold such a row
  // in one cluster.
  explicit CudaSampler(int64_t max_vocab);
  ~CudaSampler();
  CudaSampler(const CudaSampler&) = delete;
  CudaSampler& operator=(const CudaSampler&) = delete;

  // Enqueues the sampling of every row of `batch` on `stream` (nullptr = the default stream).
  // Parameters must be valid (a Sampler validated them). A row with NaN logits gets
  // kNanLogitsToken (its seed advances like any row's).
  void sample(const CudaSampleBatch& batch, CUstream_st* stream) const;

  // Enqueues the distribution of every row of `rows` (its logits, stride, rows, vocab and params;
  // tokens and advance_seed unused) into out[r] (device memory): the kept set sample() draws from.
  void describe(const CudaSampleBatch& rows, RowDistribution* out, CUstream_st* stream) const;

  int64_t max_vocab() const { return max_vocab_; }

  // Waits for `stream` and returns how many rows of the last call's last 128 the whole-row cluster
  // kernel sampled (rows without a top-k or top-p cut, or whose candidates did not decide the
  // token): a diagnostic for tests and benchmarks, 0 for typical rows with a cut.
  int64_t cluster_kernel_rows(CUstream_st* stream) const;

 private:
  void sample_chunk(const CudaSampleBatch& batch, CUstream_st* stream) const;

  int64_t max_vocab_ = 0;
  DeviceBuffer extremes_;     // the segment path's workspace (cuda_sampler.cu)
  DeviceBuffer row_scratch_;
  DeviceBuffer candidates_;
  DeviceBuffer fallback_;     // int count, then the rows left to the cluster kernel
  DeviceBuffer collect_;      // per row: the first kernel's bound and arrivals
};

}  // namespace g4
