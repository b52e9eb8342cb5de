#include "sampling/logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "sampling/sampling_params.h"
#include "util/error.h"

namespace g4 {

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int top_n) {
  G4_CHECK(!logits.empty(), "token_logprobs: no logits");
  G4_CHECK(token >= 0 && size_t(token) < logits.size(),
           "token_logprobs: token " + std::to_string(token) + " outside the vocabulary of " + std::to_string(logits.size()));
  float max = logits[0];
  for (float z : logits) {
    G4_CHECK(!std::isnan(z), kNanLogitsError);
    max = std::max(max, z);
  }
  double sum = 0.0;
  for (float z : logits) sum += std::exp(double(z) - double(max));
  const double log_sum = std::log(sum) + double(max);
  auto logprob = [&](int32_t id) { return float(double(logits[size_t(id)]) - log_sum); };

  TokenLogprobs out;
  out.logprob = logprob(token);
  const size_t n = std::min(size_t(std::max(top_n, 0)), logits.size());
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(n), ids.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  });
  for (size_t i = 0; i < n; ++i) out.top.emplace_back(ids[i], logprob(ids[i]));
  return out;
}

}  // namespace g4
