// The host sampler: docs/DESIGN.md §4 on one row of logits, with the arithmetic of sampling_math.h, so it
// returns the same token as the CUDA sampler (cuda_sampler.h) for the same logits, params and seed.
#pragma once
#include <cstdint>
#include <vector>

#include "sampling/sampling_params.h"

namespace g4 {

// Samples one token from `vocab` float32 logits (already soft-capped) with `params` (validated by
// the caller; params.seed is this token's seed). Returns kNanLogitsToken when a logit is NaN.
// Greedy (temperature <= 0) returns the argmax, lowest id on ties.
int64_t sample_row(const float* logits, int64_t vocab, const SamplingParams& params);

// The tokens a sampled draw from these logits can give (docs/DESIGN.md §4: after temperature,
// top-k, top-p and min-p), in id order, with their integer weights; returns their total. The draw
// is the lowest id whose cumulative weight reaches draw_target(seed, total). For a row without NaN
// and non-greedy params.
struct KeptToken {
  int32_t id;
  uint64_t weight;
};
uint64_t kept_tokens(const float* logits, int64_t vocab, const SamplingParams& params, std::vector<KeptToken>& kept);

// Whether a logit is NaN; the largest logit's lowest id (a row without NaN).
bool has_nan(const float* logits, int64_t vocab);
int64_t argmax(const float* logits, int64_t vocab);

}  // namespace g4
