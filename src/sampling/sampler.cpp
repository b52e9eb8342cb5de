#include "sampling/sampler.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "sampling/cpu_sampler.h"
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

// docs/DESIGN.md §4's validation rules. Every comparison is written so that NaN fails it;
// infinities fall outside every range, so non-finite values are rejected with the parameter's
// own message.
const SamplingParams& validated(const SamplingParams& p) {
  G4_CHECK(p.temperature == -1.0f || (p.temperature >= 0.0f && p.temperature <= 2.0f),
           "temperature must be in [0, 2] or -1 (greedy), got " + shown(p.temperature));
  G4_CHECK(p.top_p > 0.0f && p.top_p <= 1.0f, "top_p must be in (0, 1], got " + shown(p.top_p));
  G4_CHECK(p.min_p >= 0.0f && p.min_p < 1.0f, "min_p must be in [0, 1), got " + shown(p.min_p));
  G4_CHECK(p.top_k >= 0, "top_k must be >= 0 (0 = off), got " + std::to_string(p.top_k));
  return p;
}

}  // namespace

Sampler::Sampler(const SamplingParams& params) : params_(validated(params)) {}

SamplingParams Sampler::for_token(int64_t j) const {
  SamplingParams p = params_;
  p.seed += uint64_t(j);  // uint64 wrap is the documented schedule
  return p;
}

Sampler Sampler::starting_at(int64_t j) const { return Sampler(for_token(j), Validated{}); }

int64_t Sampler::sample_host(const float* logits, int64_t vocab, int64_t j) const {
  return checked_token(sample_row(logits, vocab, for_token(j)));
}

int64_t checked_token(int64_t token) {
  G4_CHECK(token != kNanLogitsToken, kNanLogitsError);
  return token;
}

}  // namespace g4
