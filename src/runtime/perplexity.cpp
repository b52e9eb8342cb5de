#include "runtime/perplexity.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "util/error.h"

namespace g4 {

namespace {

// log_softmax of one row of logits, in double.
std::vector<double> log_softmax(const float* logits, int64_t vocab) {
  const float max = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - max);
  const double log_sum = std::log(sum) + max;
  std::vector<double> out(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) out[i] = double(logits[i]) - log_sum;
  return out;
}

// The largest value of `row` other than the one at `top` (its largest).
double second_largest(const std::vector<double>& row, std::vector<double>::const_iterator top) {
  double second = -INFINITY;
  for (auto it = row.begin(); it != row.end(); ++it)
    if (it != top) second = std::max(second, *it);
  return second;
}

// Running mean and the standard error of the mean.
struct MeanAndError {
  double sum = 0, sum_sq = 0;
  int64_t n = 0;
  void add(double v) {
    sum += v;
    sum_sq += v * v;
    ++n;
  }
  double mean() const { return sum / double(n); }
  double error() const {
    if (n < 2) return 0;
    const double variance = std::max(0.0, sum_sq / double(n) - mean() * mean());
    return std::sqrt(variance / double(n - 1));
  }
};

}  // namespace

PerplexityResult measure_perplexity(Session& model, Session* base, std::span<const int32_t> tokens,
                                    const PerplexityOptions& o) {
  G4_CHECK(o.n_ctx >= 4, "perplexity: the context (chunk) length must be at least 4 tokens, got " +
                             std::to_string(o.n_ctx));
  G4_CHECK(o.max_chunks >= 0, "perplexity: the chunk limit must be >= 0 (0 = all), got " + std::to_string(o.max_chunks));
  G4_CHECK(o.n_ctx <= model.max_seq_len() && (!base || o.n_ctx <= base->max_seq_len()),
           "perplexity: a chunk of " + std::to_string(o.n_ctx) + " tokens does not fit the session's context");
  G4_CHECK(!base || base->vocab_size() == model.vocab_size(),
           "perplexity: the base model's vocabulary (" + (base ? std::to_string(base->vocab_size()) : "") +
               ") differs from the model's (" + std::to_string(model.vocab_size()) + ")");
  const int64_t whole = int64_t(tokens.size()) / o.n_ctx;
  G4_CHECK(whole >= 1, "perplexity: the text has " + std::to_string(tokens.size()) +
                           " tokens, fewer than one chunk of " + std::to_string(o.n_ctx));
  const int64_t chunks = o.max_chunks > 0 ? std::min(whole, o.max_chunks) : whole;
  const int64_t first = o.n_ctx / 2, vocab = model.vocab_size();

  MeanAndError nll, kl;
  int64_t same_top = 0, clear = 0, same_top_clear = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    std::vector<int32_t> chunk(tokens.begin() + c * o.n_ctx, tokens.begin() + (c + 1) * o.n_ctx);
    chunk[0] = o.bos_id;
    model.reset();
    const std::vector<float> logits = model.logits_all(chunk);
    std::vector<float> base_logits;
    if (base) {
      base->reset();
      base_logits = base->logits_all(chunk);
    }
    for (int64_t j = first; j < o.n_ctx - 1; ++j) {
      const std::vector<double> lp = log_softmax(logits.data() + j * vocab, vocab);
      nll.add(-lp[chunk[j + 1]]);
      if (!base) continue;
      const std::vector<double> base_lp = log_softmax(base_logits.data() + j * vocab, vocab);
      double d = 0;
      for (int64_t i = 0; i < vocab; ++i) d += std::exp(base_lp[i]) * (base_lp[i] - lp[i]);
      kl.add(d);
      const auto base_top = std::max_element(base_lp.begin(), base_lp.end());
      const bool same = std::max_element(lp.begin(), lp.end()) - lp.begin() == base_top - base_lp.begin();
      same_top += same;
      if (*base_top - second_largest(base_lp, base_top) > kClearTopMargin) {
        ++clear;
        same_top_clear += same;
      }
    }
  }
  PerplexityResult r;
  r.chunks = chunks;
  r.scored = nll.n;
  r.perplexity = std::exp(nll.mean());
  r.perplexity_error = nll.error() * r.perplexity;
  if (base) {
    r.mean_kl = kl.mean();
    r.mean_kl_error = kl.error();
    r.same_top_token = double(same_top) / double(kl.n);
    r.clear_positions = clear;
    if (clear > 0) r.same_top_token_clear = double(same_top_clear) / double(clear);
  }
  return r;
}

}  // namespace g4
