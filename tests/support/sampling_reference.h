// Test helpers shared by the CPU and CUDA sampler tests: docs/DESIGN.md §4's kept-and-renormalised
// distribution computed independently in double precision, and a chi-square goodness-of-fit check.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "sampling/sampling_params.h"

namespace g4::testing {

// Probability of each id under docs/DESIGN.md §4 (temperature > 0): top-k (lower id wins ties), softmax,
// top-p (shortest prefix reaching top_p, crossing token kept), min-p, renormalised.
// `margin` receives the smallest distance of a top-p / min-p decision from its boundary, so a test
// can avoid logits whose kept set would depend on rounding.
inline std::vector<double> reference_distribution(const std::vector<float>& logits, const SamplingParams& p,
                                                  double* margin = nullptr) {
  const size_t vocab = logits.size();
  std::vector<size_t> order(vocab);
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return logits[a] > logits[b]; });
  size_t kept = (p.top_k > 0 && size_t(p.top_k) < vocab) ? size_t(p.top_k) : vocab;

  const double max_s = double(logits[order[0]]) / p.temperature;
  std::vector<double> prob(vocab, 0.0);
  double total = 0;
  for (size_t r = 0; r < kept; ++r) {
    const size_t id = order[r];
    prob[id] = std::isinf(logits[id]) && logits[id] < 0 ? 0.0 : std::exp(double(logits[id]) / p.temperature - max_s);
    total += prob[id];
  }
  for (size_t r = 0; r < kept; ++r) prob[order[r]] /= total;

  double closest = 1.0;
  if (p.top_p < 1.0f) {
    double cumulative = 0;
    size_t r = 0;
    while (r < kept) {
      const double before = cumulative;
      cumulative += prob[order[r++]];
      closest = std::min({closest, std::fabs(before - p.top_p), std::fabs(cumulative - p.top_p)});
      if (cumulative >= p.top_p) break;
    }
    for (size_t drop = r; drop < kept; ++drop) prob[order[drop]] = 0;
    kept = r;
  }
  if (p.min_p > 0.0f) {
    const double floor = double(p.min_p) * prob[order[0]];
    for (size_t r = 0; r < kept; ++r) {
      closest = std::min(closest, std::fabs(prob[order[r]] - floor) / prob[order[0]]);
      if (prob[order[r]] < floor) prob[order[r]] = 0;
    }
  }
  const double sum = std::accumulate(prob.begin(), prob.end(), 0.0);
  for (double& x : prob) x /= sum;
  if (margin) *margin = closest;
  return prob;
}

// Upper quantile of the chi-square distribution with `dof` degrees of freedom at the standard
// normal quantile z (Wilson–Hilferty).
inline double chi_square_quantile(int dof, double z) {
  const double k = dof;
  const double a = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// Fails unless `counts` (draws per id) fits `expected` (probabilities): no draw outside the support,
// and Pearson's statistic under the 1 - 1e-6 quantile (bins with expected count < 5 pooled).
inline void expect_distribution(const std::vector<int64_t>& counts, const std::vector<double>& expected,
                                const std::string& label) {
  int64_t draws = 0;
  for (int64_t c : counts) draws += c;
  double statistic = 0, pooled_observed = 0, pooled_expected = 0;
  int bins = 0;
  for (size_t id = 0; id < counts.size(); ++id) {
    if (expected[id] == 0) {
      EXPECT_EQ(counts[id], 0) << label << ": id " << id << " is outside the kept set";
      continue;
    }
    const double e = expected[id] * double(draws);
    if (e < 5) {
      pooled_observed += double(counts[id]);
      pooled_expected += e;
      continue;
    }
    statistic += (double(counts[id]) - e) * (double(counts[id]) - e) / e;
    ++bins;
  }
  if (pooled_expected > 0) {
    statistic += (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
    ++bins;
  }
  if (bins < 2) return;  // a single outcome: the support check above is the whole test
  EXPECT_LT(statistic, chi_square_quantile(bins - 1, 4.75)) << label << ": chi-square over " << bins << " bins";
}

}  // namespace g4::testing
