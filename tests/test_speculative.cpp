// Speculative sampling's verdict (sampling/speculative.h): greedy keeps the drafts the target's
// argmax agrees with; a drafter that draws from the target's own distribution with the verify's
// seeds has every draft accepted and gives the target's text bit for bit; and the first token of a
// verdict is distributed as the target's kept distribution whatever the drafter's (a chi-square
// test over many seeds, with top-k, top-p and a temperature applied to both models).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "sampling/cpu_sampler.h"
#include "sampling/speculative.h"
#include "support/fixtures.h"
#include "util/error.h"

namespace g4 {
namespace {

std::vector<float> random_logits(int64_t rows, int64_t vocab, uint32_t seed, float spread = 2.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, spread);
  std::vector<float> v(size_t(rows * vocab));
  for (float& x : v) x = g(rng);
  return v;
}

TEST(Speculative, GreedyKeepsTheDraftsTheTargetsArgmaxAgreesWith) {
  const int64_t vocab = 50;
  const std::vector<float> target = random_logits(4, vocab, 1);
  std::vector<int32_t> drafts;
  for (int i = 0; i < 3; ++i) drafts.push_back(int32_t(argmax(target.data() + i * vocab, vocab)));
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  DraftVerdict all = judge_drafts(target, {}, drafts, vocab, greedy);
  EXPECT_EQ(all.accepted, 3);
  EXPECT_EQ(all.token, argmax(target.data() + 3 * vocab, vocab));  // the bonus
  drafts[1] = (drafts[1] + 1) % int32_t(vocab);
  DraftVerdict one = judge_drafts(target, {}, drafts, vocab, greedy);
  EXPECT_EQ(one.accepted, 1);
  EXPECT_EQ(one.token, argmax(target.data() + vocab, vocab));  // the correction
}

SamplingParams sampled(uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 20;
  p.top_p = 0.9f;
  p.seed = seed;
  return p;
}

TEST(Speculative, ADrafterThatDrawsFromTheTargetGivesTheTargetsOwnText) {
  const int64_t vocab = 200, k = 4;
  for (uint64_t seed = 100; seed < 140; ++seed) {
    const std::vector<float> target = random_logits(k + 1, vocab, uint32_t(seed));
    std::vector<int32_t> drafts, alone;
    for (int64_t i = 0; i <= k; ++i) {
      SamplingParams p = sampled(seed + uint64_t(i));
      alone.push_back(int32_t(sample_row(target.data() + i * vocab, vocab, p)));
      if (i < k) drafts.push_back(alone.back());
    }
    const std::vector<float> draft_logits(target.begin(), target.begin() + k * vocab);
    const DraftVerdict v = judge_drafts(target, draft_logits, drafts, vocab, sampled(seed));
    EXPECT_EQ(v.accepted, k) << "seed " << seed;
    EXPECT_EQ(v.token, alone.back()) << "seed " << seed;
  }
}

// The verdict's first token over many seeds: draft x ~ q (drawn with the seed, as a drafter does),
// then accepted x or the correction. Its distribution must be p, not q.
TEST(Speculative, TheFirstTokenIsDistributedAsTheTarget) {
  const int64_t vocab = 12;
  const std::vector<float> target = random_logits(2, vocab, 7, 1.5f), draft = random_logits(1, vocab, 8, 1.5f);
  std::vector<KeptToken> kept;
  const uint64_t total = kept_tokens(target.data(), vocab, sampled(0), kept);
  std::vector<double> expected(size_t(vocab), 0.0);
  for (const KeptToken& t : kept) expected[size_t(t.id)] = double(t.weight) / double(total);
  const int trials = 200000;
  std::vector<double> seen(size_t(vocab), 0.0);
  int accepted = 0;
  for (int s = 0; s < trials; ++s) {
    const SamplingParams p = sampled(uint64_t(s) * 7919);
    const int32_t x = int32_t(sample_row(draft.data(), vocab, p));
    const DraftVerdict v = judge_drafts(target, draft, std::vector<int32_t>{x}, vocab, p);
    accepted += v.accepted;
    seen[size_t(v.accepted == 1 ? x : v.token)] += 1;
  }
  double chi2 = 0;
  int cells = 0;
  for (int64_t t = 0; t < vocab; ++t) {
    if (expected[size_t(t)] == 0) {
      EXPECT_EQ(seen[size_t(t)], 0) << "token " << t << " lies outside the target's kept set";
      continue;
    }
    const double e = expected[size_t(t)] * trials;
    chi2 += (seen[size_t(t)] - e) * (seen[size_t(t)] - e) / e;
    ++cells;
  }
  // 99.99th percentile of chi-square with cells - 1 <= 11 degrees of freedom is below 40; drawing
  // from q instead of correcting toward p gives thousands.
  EXPECT_LT(chi2, 40.0) << cells << " cells";
  EXPECT_GT(accepted, trials / 10);
  EXPECT_LT(accepted, trials);
}

TEST(Speculative, ADraftItsOwnDistributionCouldNotGiveIsAnError) {
  const int64_t vocab = 30;
  const std::vector<float> target = random_logits(2, vocab, 3), draft = random_logits(1, vocab, 4);
  SamplingParams p = sampled(5);
  p.top_k = 1;  // q keeps only its argmax
  const int32_t other = int32_t((argmax(draft.data(), vocab) + 1) % vocab);
  EXPECT_NE(test::error_of([&] { judge_drafts(target, draft, std::vector<int32_t>{other}, vocab, p); })
                .find("outside the distribution it was drawn from"),
            std::string::npos);
}

}  // namespace
}  // namespace g4
