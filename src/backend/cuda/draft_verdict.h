// The speculative verdict on the device (Backend::judge_drafts): one verify chunk's drafts judged
// from the distributions CudaSampler::describe wrote, with speculative_math.h's arithmetic, so the
// verdict is judge_drafts's (sampling/speculative.h) bit for bit.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_sampler.h"
#include "sampling/sampling_params.h"

namespace g4 {

struct DraftVerdictLaunch {
  const float* target = nullptr;       // [count + 1][vocab]: the verify chunk's logits
  const float* draft = nullptr;        // draft i's logits at draft + i * draft_stride
  int64_t draft_stride = 0, vocab = 0;
  const int64_t* drafts = nullptr;     // draft i at drafts[i * draft_step]
  int64_t draft_step = 1;
  int count = 0;                       // K, at least 1
  const SamplingParams* params = nullptr;  // [count + 1]: row i's draw
  const RowDistribution* p = nullptr;  // [count]: the target's rows
  const RowDistribution* q = nullptr;  // [count]: the drafter's rows
  int64_t* verdict = nullptr;          // [2]: in: verdict[1] holds row count's draw (the bonus);
                                       // out: accepted drafts, then the token or a speculative.h code
};

void launch_draft_verdict(const DraftVerdictLaunch& a, cudaStream_t stream);

}  // namespace g4
