// Sampling parameters of one request (docs/DESIGN.md §3–4). Plain data with one layout on host and device:
// backends keep an array of these in their memory, one per batch row. Validated by building a
// Sampler (sampler.h).
#pragma once
#include <cstdint>

#include "util/host_device.h"

namespace g4 {

struct SamplingParams {
  float temperature = 1.0f;  // 0 (or -1, the reference design's spelling) = greedy
  float top_p = 1.0f;        // (0, 1]; 1 = off
  float min_p = 0.0f;        // [0, 1); 0 = off
  int32_t top_k = 0;         // >= 0; 0 = off; > vocab is clipped
  uint64_t seed = 0;         // the seed of this token (token j of a generation uses base + j)
};

G4_HOST_DEVICE bool is_greedy(const SamplingParams& p) { return p.temperature <= 0.0f; }

// What a row whose logits hold a NaN draws, on every backend (docs/DESIGN.md §4): no token, so that
// one faulty sequence fails alone while the other rows of its batch go on.
inline constexpr int64_t kNanLogitsToken = -1;
// The error such a row becomes for its sequence.
inline constexpr const char* kNanLogitsError = "model produced NaN logits";

}  // namespace g4
