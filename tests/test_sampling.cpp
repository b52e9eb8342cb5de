// The host sampler (docs/DESIGN.md §4: validation and semantics): distributions, edge cases, NaN rows
// (also through the CPU backend's sample), the RNG, the CLI.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "sampling/cpu_sampler.h"
#include "sampling/logit_penalties.h"
#include "sampling/philox.h"
#include "sampling/sampler.h"
#include "sampling/sampling_math.h"
#include "sampling/sampling_params.h"
#include "sampling/sampling_settings.h"
#include "support/fixtures.h"
#include "support/sampling_reference.h"
#include "util/error.h"

namespace g4 {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

SamplingParams make_params(float temperature, int32_t top_k = 0, float top_p = 1.0f, float min_p = 0.0f) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  return p;
}

std::vector<int64_t> count_draws(const std::vector<float>& logits, SamplingParams p, int64_t draws,
                                 uint64_t first_seed) {
  std::vector<int64_t> counts(logits.size(), 0);
  for (int64_t j = 0; j < draws; ++j) {
    p.seed = first_seed + uint64_t(j);
    const int64_t token = sample_row(logits.data(), int64_t(logits.size()), p);
    EXPECT_GE(token, 0);
    EXPECT_LT(token, int64_t(logits.size()));
    ++counts[size_t(token)];
  }
  return counts;
}

// Random logits whose kept set is not within `min_margin` of a top-p or min-p boundary.
std::vector<float> random_logits(std::mt19937_64& rng, size_t vocab, const SamplingParams& p, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  for (;;) {
    std::vector<float> logits(vocab);
    for (float& z : logits) z = normal(rng);
    double margin = 0;
    testing::reference_distribution(logits, p, &margin);
    if (margin > 1e-4) return logits;
  }
}

TEST(Philox, MatchesTheRandom123KnownAnswers) {
  const Philox4x32 zero = philox4x32_10(Philox4x32{{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(zero.v[0], 0x6627e8d5u);
  EXPECT_EQ(zero.v[1], 0xe169c58du);
  EXPECT_EQ(zero.v[2], 0xbc57ac4cu);
  EXPECT_EQ(zero.v[3], 0x9b00dbd8u);
  const Philox4x32 pi = philox4x32_10(Philox4x32{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
                                      0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(pi.v[0], 0xd16cfe09u);
  EXPECT_EQ(pi.v[1], 0x94fdccebu);
  EXPECT_EQ(pi.v[2], 0x5001e420u);
  EXPECT_EQ(pi.v[3], 0x24126ea1u);
}

TEST(SamplingMath, WeightsFollowTheExponential) {
  using namespace sampling;
  EXPECT_EQ(token_weight(3.0f, 3.0f, 1.0f), kWeightOne);
  EXPECT_EQ(token_weight(kInf, kInf, 1.0f), kWeightOne);
  EXPECT_EQ(token_weight(-kInf, 0.0f, 1.0f), 0u);
  EXPECT_EQ(token_weight(-30.0f, 0.0f, 1.0f), 0u);
  for (float d = -27.9f; d < 0; d += 0.037f) {
    const double exact = std::exp(double(d)) * double(kWeightOne);
    EXPECT_NEAR(double(token_weight(d, 0.0f, 1.0f)), exact, exact * 3e-7 + 1) << "d = " << d;
  }
}

TEST(SamplingMath, KeysOrderLikeTheLogits) {
  using namespace sampling;
  const std::vector<float> increasing = {-kInf, -1e30f, -2.0f, -1e-30f, -0.0f, 0.0f, 1e-30f, 2.0f, 1e30f, kInf};
  for (size_t i = 1; i < increasing.size(); ++i) {
    EXPECT_LT(logit_key(increasing[i - 1]), logit_key(increasing[i])) << increasing[i];
    EXPECT_EQ(float_bits(key_logit(logit_key(increasing[i]))), float_bits(increasing[i]));
  }
}

struct Mix {
  const char* name;
  SamplingParams params;
  size_t vocab;
  float scale;
};

// Many parameter mixes: the empirical distribution over 1e5 draws fits the reference.
TEST(CpuSampler, DrawsFollowTheKeptDistribution) {
  const Mix mixes[] = {
      {"plain", make_params(1.0f), 24, 1.5f},
      {"cold top-k", make_params(0.7f, 5), 30, 1.0f},
      {"hot top-p", make_params(1.3f, 0, 0.8f), 40, 2.0f},
      {"all filters", make_params(1.0f, 10, 0.9f, 0.05f), 32, 1.5f},
      {"min-p", make_params(2.0f, 0, 1.0f, 0.1f), 20, 3.0f},
      {"narrow", make_params(0.5f, 3, 0.5f), 16, 1.0f},
      {"top-k over vocab", make_params(1.0f, 100), 12, 1.0f},
      {"sharp top-p", make_params(0.2f, 0, 0.95f), 50, 0.5f},
      {"top-k 1", make_params(1.5f, 1), 10, 1.0f},
      {"wide flat", make_params(1.0f, 0, 0.99f, 0.001f), 64, 0.3f},
  };
  std::mt19937_64 rng(1234);
  uint64_t seed = 1;
  for (const Mix& mix : mixes) {
    const std::vector<float> logits = random_logits(rng, mix.vocab, mix.params, mix.scale);
    const std::vector<int64_t> counts = count_draws(logits, mix.params, 100000, seed);
    seed += 100000;
    testing::expect_distribution(counts, testing::reference_distribution(logits, mix.params), mix.name);
  }
}

TEST(CpuSampler, NegativeInfinityIsNeverDrawn) {
  const std::vector<float> logits = {-kInf, 0.0f, -kInf, 1.0f, -kInf};
  const SamplingParams p = make_params(1.0f);
  const std::vector<int64_t> counts = count_draws(logits, p, 100000, 7);
  testing::expect_distribution(counts, testing::reference_distribution(logits, p), "-inf");
  EXPECT_EQ(counts[0] + counts[2] + counts[4], 0);
}

TEST(CpuSampler, AllEqualLogitsAreUniform) {
  const std::vector<float> logits(37, 0.25f);
  const SamplingParams p = make_params(0.8f);
  const std::vector<int64_t> counts = count_draws(logits, p, 100000, 99);
  testing::expect_distribution(counts, std::vector<double>(37, 1.0 / 37), "all equal");
}

TEST(CpuSampler, TopKTiesKeepTheLowerIds) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, 3.0f, 0.0f};
  const std::vector<int64_t> counts = count_draws(logits, make_params(1.0f, 2), 20000, 5);
  EXPECT_EQ(counts[1] + counts[3], 20000) << "ids 1 and 3 are the first two of the tied 3.0s";
  EXPECT_NEAR(double(counts[1]) / 20000, 0.5, 0.02);
  // With top_k = 4 the tie is whole and the next token (2.0) is in.
  const std::vector<int64_t> four = count_draws(logits, make_params(1.0f, 4), 20000, 5);
  EXPECT_EQ(four[0] + four[5], 0);
  EXPECT_GT(four[2], 0);
}

TEST(CpuSampler, TopPKeepsTheCrossingTokenAndBreaksTiesByLowerId) {
  const std::vector<float> logits(4, 2.0f);  // each token has p = 0.25
  // 0.25 + 0.25 reaches 0.5 exactly: ids 0 and 1.
  std::vector<int64_t> counts = count_draws(logits, make_params(1.0f, 0, 0.5f), 20000, 11);
  EXPECT_EQ(counts[0] + counts[1], 20000);
  EXPECT_GT(counts[0], 9000);
  EXPECT_GT(counts[1], 9000);
  // 0.6 is crossed by the third token, which is kept.
  counts = count_draws(logits, make_params(1.0f, 0, 0.6f), 30000, 11);
  EXPECT_EQ(counts[3], 0);
  for (int id = 0; id < 3; ++id) EXPECT_GT(counts[size_t(id)], 9000);
}

TEST(CpuSampler, TinyTopPKeepsOnlyTheArgmax) {
  const std::vector<float> logits = {0.5f, 2.0f, 1.9f, 2.0f, -1.0f};
  SamplingParams p = make_params(1.5f, 0, 1e-6f);
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    p.seed = seed;
    ASSERT_EQ(sample_row(logits.data(), 5, p), 1);
  }
}

TEST(CpuSampler, GreedyTakesTheLowestIdArgmax) {
  const std::vector<float> logits = {1.0f, 5.0f, -2.0f, 5.0f, 4.9f};
  for (float temperature : {0.0f, -1.0f}) {
    SamplingParams p = make_params(temperature, 2, 0.5f, 0.5f);
    for (uint64_t seed = 0; seed < 100; ++seed) {
      p.seed = seed;
      EXPECT_EQ(sample_row(logits.data(), 5, p), 1);
    }
  }
}

TEST(CpuSampler, SingleTokenVocabulary) {
  const float logit = -3.0f;
  for (const SamplingParams& p : {make_params(0.0f), make_params(1.0f), make_params(1.0f, 5, 0.1f, 0.9f)}) {
    EXPECT_EQ(sample_row(&logit, 1, p), 0);
  }
}

// A row with a NaN logit draws kNanLogitsToken, so that its sequence fails alone; the host
// sampler's caller API (Sampler::sample_host) throws the error users see.
TEST(CpuSampler, NanLogitsDrawTheNanToken) {
  const std::vector<float> logits = {0.0f, kNan, 1.0f};
  for (float temperature : {0.0f, 1.0f}) {
    EXPECT_EQ(sample_row(logits.data(), 3, make_params(temperature)), kNanLogitsToken);
    EXPECT_EQ(test::error_of([&] { Sampler(make_params(temperature)).sample_host(logits.data(), 3, 0); }),
              "model produced NaN logits");
  }
}

// Backend::sample on the CPU: a NaN in one row of a batch gives that row kNanLogitsToken and
// throws nothing; the other rows draw their tokens.
TEST(CpuBackendSample, ANanRowDrawsTheNanTokenAndTheOthersTheirs) {
  constexpr int64_t kRows = 3, kVocab = 50;
  std::mt19937_64 rng(12);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(size_t(kRows * kVocab));
  for (float& z : logits) z = normal(rng);
  logits[size_t(kVocab + 7)] = kNan;
  std::vector<SamplingParams> params = {make_params(0.0f), make_params(0.0f), make_params(1.0f, 10, 0.9f)};
  params[2].seed = 99;
  CpuBackend backend(1);
  const Tensor device_logits = backend.alloc(DType::F32, kRows, kVocab);
  const SamplingRows device_params = backend.alloc_sampling_rows(kRows);
  const Tensor device_tokens = backend.alloc(DType::I64, kRows, 1);
  backend.upload(logits.data(), device_logits);
  backend.upload_sampling_rows(params, device_params);
  backend.sample(device_logits, device_params, device_tokens);
  std::vector<int64_t> tokens(kRows);
  backend.download(device_tokens, tokens.data());
  EXPECT_EQ(tokens[1], kNanLogitsToken);
  for (int64_t r : {0, 2})
    EXPECT_EQ(tokens[size_t(r)], sample_row(logits.data() + r * kVocab, kVocab, params[size_t(r)])) << "row " << r;
}

TEST(CpuSampler, SameSeedSameTokenAndSeedsMatter) {
  std::mt19937_64 rng(5);
  const std::vector<float> logits = random_logits(rng, 1000, make_params(1.0f), 2.0f);
  SamplingParams p = make_params(1.0f, 0, 0.95f);
  p.seed = 42;
  const int64_t first = sample_row(logits.data(), 1000, p);
  EXPECT_EQ(sample_row(logits.data(), 1000, p), first);
  std::vector<int64_t> tokens;
  for (p.seed = 0; p.seed < 50; ++p.seed) tokens.push_back(sample_row(logits.data(), 1000, p));
  std::sort(tokens.begin(), tokens.end());
  EXPECT_GT(std::unique(tokens.begin(), tokens.end()) - tokens.begin(), 5);
}

// A Gemma-sized row with every filter: the drawn tokens follow the reference.
TEST(CpuSampler, FullVocabularyRow) {
  std::mt19937_64 rng(77);
  std::normal_distribution<float> normal(0.0f, 2.5f);
  std::vector<float> logits(262144);
  for (float& z : logits) z = normal(rng);
  logits[1234] = 14.0f, logits[99999] = 13.5f, logits[200000] = 13.0f;
  const SamplingParams p = make_params(0.9f, 40, 0.9f, 0.02f);
  double margin = 0;
  const std::vector<double> expected = testing::reference_distribution(logits, p, &margin);
  ASSERT_GT(margin, 1e-4);
  testing::expect_distribution(count_draws(logits, p, 20000, 3), expected, "V = 262144");
}

void expect_rejected(const SamplingParams& p, const std::string& message) {
  try {
    const Sampler sampler(p);  // validates
    ADD_FAILURE() << "accepted, expected: " << message;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

TEST(Sampler, SeedScheduleIsBasePlusTokenIndex) {
  SamplingParams p = make_params(0.9f, 40, 0.9f, 0.0f);
  p.seed = ~uint64_t(0) - 1;  // the schedule wraps at 2^64
  const Sampler sampler(p);
  EXPECT_EQ(sampler.for_token(0).seed, p.seed);
  EXPECT_EQ(sampler.for_token(3).seed, uint64_t(1));
  EXPECT_EQ(sampler.starting_at(2).for_token(1).seed, sampler.for_token(3).seed);
  EXPECT_EQ(sampler.for_token(5).top_k, 40);
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(300);
  for (float& z : logits) z = normal(rng);
  for (int64_t j = 0; j < 8; ++j)
    EXPECT_EQ(sampler.sample_host(logits.data(), 300, j), sample_row(logits.data(), 300, sampler.for_token(j)));
}

// A speculative round's rows: row i is what the state gives after drafts[0, i) are recorded — a
// draft seen again is counted again, a new one starts its count — and the state itself is left as it
// was. Without penalties, no rows.
TEST(PenaltyState, AdjustmentsAlongDraftsAreTheDrawsAfterThem) {
  const std::vector<int32_t> prompt = {5, 9, 12};
  const LogitPenalties penalties{.presence = 0.5f, .frequency = 0.75f, .repetition = 1.25f, .bias = {{7, -2.0f}}};
  PenaltyState state(penalties, prompt);
  state.record(9);
  const std::vector<int32_t> drafts = {3, 9, 3};
  const std::vector<std::vector<LogitAdjustment>> rows = state.adjustments_along(drafts);
  ASSERT_EQ(rows.size(), drafts.size() + 1);
  PenaltyState stepped = state;
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::vector<LogitAdjustment> want = stepped.adjustments();
    ASSERT_EQ(rows[i].size(), want.size()) << "row " << i;
    for (size_t a = 0; a < want.size(); ++a) {
      EXPECT_EQ(rows[i][a].token, want[a].token) << "row " << i;
      EXPECT_EQ(rows[i][a].bias, want[a].bias) << "row " << i;
      EXPECT_EQ(rows[i][a].repetition, want[a].repetition) << "row " << i;
      EXPECT_EQ(rows[i][a].subtract, want[a].subtract) << "row " << i;
    }
    if (i < drafts.size()) stepped.record(drafts[i]);
  }
  EXPECT_EQ(rows[3].size(), rows[0].size() + 1) << "token 3 is adjusted once drafted";
  EXPECT_EQ(state.adjustments().size(), rows[0].size()) << "the state moved";
  EXPECT_TRUE(PenaltyState(LogitPenalties{}, prompt).adjustments_along(drafts).empty());
}

// A request's choices: choice 0 keeps the seed; the others get seeds that are neither the seed nor
// one of the next per-token seeds of any choice (base + t), and all differ.
TEST(SamplingSettings, ChoiceSeedsAreUnrelated) {
  for (const uint64_t seed : {uint64_t(0), uint64_t(42), ~uint64_t(0)}) {
    EXPECT_EQ(choice_seed(seed, 0), seed);
    std::vector<uint64_t> bases;
    for (uint64_t j = 0; j < 1000; ++j) bases.push_back(choice_seed(seed, j));
    std::vector<uint64_t> sorted = bases;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 1; i < sorted.size(); ++i)
      EXPECT_GT(sorted[i] - sorted[i - 1], uint64_t(1) << 20) << "two choices' token seeds overlap, seed " << seed;
  }
}

TEST(SamplingParams, ValidationFollowsTheSpecTable) {
  for (const SamplingParams& ok : {make_params(0.0f), make_params(-1.0f), make_params(2.0f, 0, 1.0f, 0.0f),
                                   make_params(0.7f, 1 << 30, 1e-9f, 0.999f)}) {
    EXPECT_NO_THROW(Sampler{ok});
  }
  const std::string temperature = "temperature must be in [0, 2] or -1";
  for (float t : {-0.5f, -2.0f, 2.01f, kNan, kInf, -kInf}) expect_rejected(make_params(t), temperature);
  const std::string top_p = "top_p must be in (0, 1]";
  for (float v : {0.0f, -0.1f, 1.01f, kNan, kInf}) expect_rejected(make_params(1.0f, 0, v), top_p);
  const std::string min_p = "min_p must be in [0, 1)";
  for (float v : {1.0f, -0.01f, kNan, kInf}) expect_rejected(make_params(1.0f, 0, 1.0f, v), min_p);
  expect_rejected(make_params(1.0f, -1), "top_k must be >= 0");
}

// ---- g4 sample ----

using test::CommandResult;
using test::run_g4;

std::vector<int64_t> parse_ids(const std::string& text) {
  std::istringstream lines(text);
  std::vector<int64_t> ids;
  for (int64_t id; lines >> id;) ids.push_back(id);
  return ids;
}

TEST(SampleCommand, PrintsTheSeedSchedulesTokens) {
  std::mt19937_64 rng(3);
  const SamplingParams p = make_params(0.8f, 20, 0.9f, 0.01f);
  const std::vector<float> logits = random_logits(rng, 100, p, 2.0f);
  const std::string file = test::write_floats(logits, "g4_test_sample_logits.f32");
  const CommandResult result = run_g4("sample --logits " + file +
                                      " --vocab 100 --temperature 0.8 --top-k 20 --top_p 0.9 --min_p 0.01"
                                      " --seed 1000 --draws 500");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::vector<int64_t> ids = parse_ids(result.output);
  ASSERT_EQ(ids.size(), 500u);
  SamplingParams expected = p;
  for (size_t j = 0; j < ids.size(); ++j) {
    expected.seed = 1000 + j;
    EXPECT_EQ(ids[j], sample_row(logits.data(), 100, expected)) << "draw " << j;
  }
}

TEST(SampleCommand, RejectsBadInput) {
  const std::string file = test::write_floats(std::vector<float>(10, 0.0f), "g4_test_sample_bad.f32");
  const std::pair<std::string, std::string> cases[] = {
      {"--top_p 1.5", "top_p must be in (0, 1]"},
      {"--top_p 0", "top_p must be in (0, 1]"},
      {"--temperature 3", "temperature must be in [0, 2] or -1"},
      {"--temperature nan", "temperature must be in [0, 2] or -1"},
      {"--min_p 1", "min_p must be in [0, 1)"},
      {"--top_k -2", "top_k must be >= 0"},
      {"--vocab 11", "expected 44 for --vocab 11"},
      {"--seed abc", "--seed must be an unsigned 64-bit integer or -1"},
      {"--backend tpu", "--backend must be cpu or cuda"},
      {"--draws 0", "--draws must be >= 1"},
      {"--draws -5", "--draws must be >= 1"},
  };
  for (const auto& [flags, message] : cases) {
    const CommandResult result = run_g4("sample --logits " + file + " " + flags);
    EXPECT_NE(result.exit_code, 0) << flags;
    EXPECT_NE(result.output.find("error: "), std::string::npos) << flags << ": " << result.output;
    EXPECT_NE(result.output.find(message), std::string::npos) << flags << ": " << result.output;
  }
  // 41 bytes: not a whole number of float32 values.
  const std::string odd = test::temp_dir("sample_odd_logits") + "/odd.f32";
  std::ofstream(odd, std::ios::binary) << std::string(41, '\0');
  const CommandResult odd_result = run_g4("sample --logits " + odd);
  EXPECT_NE(odd_result.exit_code, 0);
  EXPECT_NE(odd_result.output.find("must hold float32 values (41 bytes)"), std::string::npos) << odd_result.output;
  const CommandResult missing = run_g4("sample --logits /nonexistent/logits.f32");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("cannot open logits file"), std::string::npos) << missing.output;
}

TEST(SampleCommand, RandomSeedIsPrinted) {
  const std::string file = test::write_floats({0.0f, 1.0f, 2.0f}, "g4_test_sample_seed.f32");
  const CommandResult result = run_g4("sample --logits " + file + " --seed -1 --draws 3");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("Sampling base seed: "), std::string::npos) << result.output;
}

// --backend cuda where it cannot run: a build without CUDA says so; a CUDA build with every GPU
// hidden (CUDA_VISIBLE_DEVICES empty, so this runs on GPU machines too) says no GPU is available.
TEST(SampleCommand, CudaBackendWithoutAGpuFailsClearly) {
  const std::string file = test::write_floats({0.0f, 1.0f}, "g4_test_sample_cuda.f32");
  const CommandResult result = run_g4("sample --logits " + file + " --backend cuda", "CUDA_VISIBLE_DEVICES=");
  EXPECT_NE(result.exit_code, 0);
#ifdef G4_HAVE_CUDA
  EXPECT_NE(result.output.find("no CUDA GPU is available"), std::string::npos) << result.output;
#else
  EXPECT_NE(result.output.find("built without CUDA"), std::string::npos) << result.output;
#endif
}

}  // namespace
// One merge for flags and requests alike: given over model over defaults, each value's source
// reported; a given seed is kept, a missing one drawn (not for greedy decoding); a bad value fails
// naming it, the model's too.
TEST(ResolveSampling, GivenOverModelOverDefaultsAndTheSeed) {
  SamplingParams defaults;
  defaults.temperature = 0.8f;
  defaults.top_k = 0;
  defaults.top_p = 1.0f;
  defaults.seed = 5;
  const SamplingChoices model{.temperature = 1.0f, .top_p = 0.95f, .top_k = 64};
  const SamplingChoices given{.temperature = 0.5f, .min_p = 0.1f};
  const ResolvedSampling r = resolve_sampling(given, uint64_t(42), model, defaults);
  const SamplingParams& p = r.sampler.params();
  EXPECT_EQ(p.temperature, 0.5f);
  EXPECT_EQ(p.top_k, 64);
  EXPECT_EQ(p.top_p, 0.95f);
  EXPECT_EQ(p.min_p, 0.1f);
  EXPECT_EQ(p.seed, 42u);
  EXPECT_FALSE(r.random_seed);
  EXPECT_EQ(r.temperature_from, SettingFrom::kGiven);
  EXPECT_EQ(r.top_k_from, SettingFrom::kModel);
  EXPECT_EQ(r.top_p_from, SettingFrom::kModel);
  EXPECT_EQ(r.min_p_from, SettingFrom::kGiven);
  EXPECT_EQ(resolve_sampling({}, uint64_t(42), {}, defaults).top_k_from, SettingFrom::kDefault);
  // No seed: a fresh one each time (two equal 64-bit draws would be a broken generator).
  const ResolvedSampling a = resolve_sampling({}, std::nullopt, {}, defaults), b = resolve_sampling({}, std::nullopt, {}, defaults);
  EXPECT_TRUE(a.random_seed);
  EXPECT_NE(a.sampler.params().seed, b.sampler.params().seed);
  // Greedy uses no seed: none is drawn.
  EXPECT_EQ(resolve_sampling({.temperature = 0.0f}, std::nullopt, {}, defaults).sampler.params().seed, 5u);
  EXPECT_THROW(resolve_sampling({.top_p = 1.5f}, std::nullopt, {}, defaults), Error);
  EXPECT_THROW(resolve_sampling({}, std::nullopt, {.min_p = 2.0f}, defaults), Error);
}

}  // namespace g4
