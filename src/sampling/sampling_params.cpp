#include "sampling/sampling_params.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "util/error.h"

namespace g4 {

namespace {

std::string shown(float v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char text[32];
  std::snprintf(text, sizeof text, "%g", double(v));
  return text;
}

}  // namespace

// docs/DESIGN.md §4's validation rules. Every comparison is written so that NaN fails it; infinities fall outside every
// range, so non-finite values are rejected with the parameter's own message.
void validate_sampling_params(const SamplingParams& p) {
  G4_CHECK(p.temperature == -1.0f || (p.temperature >= 0.0f && p.temperature <= 2.0f),
           "temperature must be in [0, 2] or -1 (greedy), got " + shown(p.temperature));
  G4_CHECK(p.top_p > 0.0f && p.top_p <= 1.0f, "top_p must be in (0, 1], got " + shown(p.top_p));
  G4_CHECK(p.min_p >= 0.0f && p.min_p < 1.0f, "min_p must be in [0, 1), got " + shown(p.min_p));
  G4_CHECK(p.top_k >= 0, "top_k must be >= 0 (0 = off), got " + std::to_string(p.top_k));
}

}  // namespace g4
