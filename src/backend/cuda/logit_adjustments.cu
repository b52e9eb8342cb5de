// Logit bias and penalties on the device (sampling/logit_penalties.h): block r applies row r's
// adjustments to its logits in place, one thread per listed token (a row lists each token once, so
// no two threads write one logit).
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/launch.cuh"

namespace g4 {

namespace {

constexpr int kThreads = 256;

__global__ void adjust_logits_kernel(float* logits, int64_t vocab, const LogitAdjustment* entries,
                                     const int32_t* offsets) {
  const int64_t row = blockIdx.x;
  float* row_logits = logits + row * vocab;
  for (int32_t i = offsets[row] + int32_t(threadIdx.x); i < offsets[row + 1]; i += kThreads) {
    const LogitAdjustment a = entries[i];
    row_logits[a.token] = adjusted_logit(row_logits[a.token], a);
  }
}

}  // namespace

void launch_adjust_logits(float* logits, int64_t rows, int64_t vocab, const LogitAdjustment* entries,
                          const int32_t* offsets, cudaStream_t stream) {
  launch_kernel("adjust_logits_kernel", adjust_logits_kernel, unsigned(rows), kThreads, 0, stream, Pdl::kOff, logits,
                vocab, entries, offsets);
}

}  // namespace g4
