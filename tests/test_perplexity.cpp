// measure_perplexity: the chunking and scoring of llama-perplexity (runtime/perplexity.h), its
// figures against a direct computation, and its errors. test_llamacpp_files.cpp checks it against
// llama-perplexity's own numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backend/backend_factory.h"
#include "model/kv_types.h"
#include "model/loader.h"
#include "runtime/perplexity.h"
#include "support/demo_engine.h"
#include "support/fixtures.h"

namespace g4 {
namespace {

using test::error_of;


struct Demo {
  std::unique_ptr<Backend> backend = make_backend("cpu");
  std::unique_ptr<Gemma4> model = load_model(test::fortune_demo_path(), *backend);
  Session session(int64_t n_ctx) {
    SessionOptions so;
    so.max_seq_len = n_ctx;
    return Session(*model, *backend, so);
  }
};

std::vector<int32_t> some_tokens(size_t n) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = int32_t(500 + (i * 37) % 3000);
  return t;
}

TEST(Perplexity, ScoresTheSecondHalfOfEachChunkFromBos) {
  Demo demo;
  Session s = demo.session(64);
  const std::vector<int32_t> tokens = some_tokens(64 * 2 + 10);  // two whole chunks; the rest is dropped
  PerplexityOptions o;
  o.n_ctx = 64;
  const PerplexityResult r = measure_perplexity(s, nullptr, tokens, o);
  EXPECT_EQ(r.chunks, 2);
  EXPECT_EQ(r.scored, 2 * (64 - 1 - 32));
  // The same figure from the logits directly: each chunk from BOS, positions 32..62 predict 33..63.
  double nll = 0;
  for (int c = 0; c < 2; ++c) {
    std::vector<int32_t> chunk(tokens.begin() + c * 64, tokens.begin() + (c + 1) * 64);
    chunk[0] = 2;
    s.reset();
    const std::vector<float> logits = s.logits_all(chunk);
    const int64_t V = s.vocab_size();
    for (int j = 32; j < 63; ++j) {
      double sum = 0;
      for (int64_t i = 0; i < V; ++i) sum += std::exp(double(logits[j * V + i]));
      nll += std::log(sum) - logits[j * V + chunk[j + 1]];
    }
  }
  EXPECT_NEAR(r.perplexity, std::exp(nll / r.scored), 1e-6 * r.perplexity);
  EXPECT_GT(r.perplexity_error, 0);
  EXPECT_FALSE(r.mean_kl.has_value());
  o.max_chunks = 1;
  EXPECT_EQ(measure_perplexity(s, nullptr, tokens, o).chunks, 1);
}

TEST(Perplexity, AModelAgainstItselfHasNoDivergence) {
  Demo demo;
  Session a = demo.session(64), b = demo.session(64);  // the sliding window is 64
  PerplexityOptions o;
  o.n_ctx = 32;
  const PerplexityResult r = measure_perplexity(a, &b, some_tokens(100), o);
  EXPECT_NEAR(*r.mean_kl, 0.0, 1e-9);
  EXPECT_EQ(*r.same_top_token, 1.0);
}

// Against a base, the share of same top tokens over the clear positions (the base's top-2 margin
// above kClearTopMargin) is the direct count's: a tq4/q8_0-cache session against bf16 caches.
TEST(Perplexity, SameTopTokenAtClearPositionsCountsOnlyThem) {
  Demo demo;
  SessionOptions so;
  so.max_seq_len = 64;
  Session base(*demo.model, *demo.backend, so);
  so.kv_types = KvTypes{KvType::kTq4, KvType::kQ8_0};
  Session quantized(*demo.model, *demo.backend, so);
  const std::vector<int32_t> tokens = some_tokens(128);
  PerplexityOptions o;
  o.n_ctx = 64;
  const PerplexityResult r = measure_perplexity(quantized, &base, tokens, o);
  const int64_t V = base.vocab_size();
  int64_t clear = 0, same = 0;
  for (int c = 0; c < 2; ++c) {
    std::vector<int32_t> chunk(tokens.begin() + c * 64, tokens.begin() + (c + 1) * 64);
    chunk[0] = 2;
    base.reset();
    quantized.reset();
    const std::vector<float> want = base.logits_all(chunk), got = quantized.logits_all(chunk);
    for (int j = 32; j < 63; ++j) {
      std::vector<float> row(want.begin() + j * V, want.begin() + (j + 1) * V);
      const int64_t top = std::max_element(row.begin(), row.end()) - row.begin();
      const float first = row[size_t(top)];
      row[size_t(top)] = -INFINITY;
      if (first - *std::max_element(row.begin(), row.end()) <= kClearTopMargin) continue;
      ++clear;
      same += std::max_element(got.begin() + j * V, got.begin() + (j + 1) * V) - (got.begin() + j * V) == top;
    }
  }
  ASSERT_GT(clear, 0);
  EXPECT_LT(clear, r.scored) << "every position clear: the count would not show the filter";
  EXPECT_EQ(r.clear_positions, clear);
  EXPECT_DOUBLE_EQ(*r.same_top_token_clear, double(same) / double(clear));
}

TEST(Perplexity, BadInputsAreNamed) {
  Demo demo;
  Session s = demo.session(64);
  PerplexityOptions o;
  o.n_ctx = 64;
  EXPECT_NE(error_of([&] { measure_perplexity(s, nullptr, some_tokens(63), o); }).find("fewer than one chunk"),
            std::string::npos);
  o.n_ctx = 128;
  EXPECT_NE(error_of([&] { measure_perplexity(s, nullptr, some_tokens(300), o); }).find("does not fit"),
            std::string::npos);
  o.n_ctx = 2;
  EXPECT_NE(error_of([&] { measure_perplexity(s, nullptr, some_tokens(300), o); }).find("at least 4"),
            std::string::npos);
  const test::CommandResult missing = test::run_g4("perplexity -m " + test::fortune_demo_path() + " -f /nonexistent.txt");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("/nonexistent.txt"), std::string::npos) << missing.output;
}

}  // namespace
}  // namespace g4
