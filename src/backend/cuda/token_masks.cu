// Constrained decoding's token masks on the device (Backend::mask_logits): block (x, r) covers a
// slice of row r's logits, one thread per token, and sets each token its mask does not allow to
// -infinity. Rows without a mask return at once.
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/launch.cuh"

namespace g4 {

namespace {

constexpr int kThreads = 256;

__global__ void mask_logits_kernel(float* logits, int64_t vocab, const uint32_t* masks, int64_t words,
                                   const int32_t* row_mask) {
  const int64_t row = blockIdx.y;
  const int32_t m = row_mask[row];
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (m < 0 || t >= vocab) return;
  const bool allowed = t < words * 32 && ((masks[m * words + (t >> 5)] >> (t & 31)) & 1u);
  if (!allowed) logits[row * vocab + t] = -INFINITY;
}

}  // namespace

void launch_mask_logits(float* logits, int64_t rows, int64_t vocab, const uint32_t* masks, int64_t words,
                        const int32_t* row_mask, cudaStream_t stream) {
  const dim3 grid(unsigned((vocab + kThreads - 1) / kThreads), unsigned(rows));
  launch_kernel("mask_logits_kernel", mask_logits_kernel, grid, kThreads, 0, stream, Pdl::kOff, logits, vocab, masks,
                words, row_mask);
}

}  // namespace g4
