// The host sampler: docs/DESIGN.md §4 on one row of logits, with the arithmetic of sampling_math.h, so it
// returns the same token as the CUDA sampler (cuda_sampler.h) for the same logits, params and seed.
#pragma once
#include <cstdint>

#include "sampling/sampling_params.h"

namespace g4 {

// Samples one token from `vocab` float32 logits (already soft-capped) with `params` (validated by
// the caller; params.seed is this token's seed). Returns kNanLogitsToken when a logit is NaN.
// Greedy (temperature <= 0) returns the argmax, lowest id on ties.
int64_t sample_row(const float* logits, int64_t vocab, const SamplingParams& params);

}  // namespace g4
