// Long context on the CPU backend: transformers' float64 logits at 4 096 positions (every 16th
// position and the last 32 stored) for a model with the 31B head sizes and RoPE, and for one in the
// published layout. RoPE angles grow with the position, so an imprecise frequency or angle that is
// invisible over 40 tokens moves these logits by radians (docs/DESIGN.md, "RoPE precision").
// Bound: within 1.25 x transformers' own float32 error on the same fixture, and the reference's
// greedy token at every position whose top-2 margin exceeds 1 logit; by one prefill, by chunks
// that do not divide the window, and token by token.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "model/loader.h"
#include "runtime/session.h"
#include "support/fixtures.h"

namespace g4 {
namespace {

constexpr double kHeadroomOverTransformersF32 = 1.25;

class LongContext : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ref_ = test::load_reference(GetParam());
    ASSERT_GE(ref_.positions, 4000);
    model_ = load_model(ref_.dir, backend_);
  }
  Session new_session() {
    SessionOptions o;
    o.max_seq_len = ref_.positions + 1;
    return Session(*model_, backend_, o);
  }
  void expect_matches_reference(const std::vector<float>& every_position, const std::string& how) {
    const double err = test::relative_l2(test::stored_rows(every_position, ref_), ref_.logits);
    const test::GreedyAgreement greedy = test::greedy_agreement(every_position, ref_);
    std::printf("  %s, %s: relative L2 %.3g (transformers float32 %.3g), greedy %d of %d clear positions\n",
                GetParam().c_str(), how.c_str(), err, ref_.transformers_f32.relative_l2, greedy.agreed, greedy.clear);
    EXPECT_LE(err, kHeadroomOverTransformersF32 * ref_.transformers_f32.relative_l2) << how;
    EXPECT_GE(greedy.clear, 100) << how << ": too few clear positions to test";
    EXPECT_EQ(greedy.agreed, greedy.clear) << how << ": first differing position " << greedy.first_disagreement;
  }
  CpuBackend backend_{2};
  test::Reference ref_;
  std::unique_ptr<Gemma4> model_;
};

TEST_P(LongContext, OnePrefillMatches) {
  Session s = new_session();
  expect_matches_reference(s.logits_all(ref_.tokens), "prefill");
}

TEST_P(LongContext, ChunkedPrefillMatches) {
  Session s = new_session();
  const int64_t chunk = model_->config().sliding_window / 3 + 1;  // chunks straddle the ring's wrap
  expect_matches_reference(s.logits_all(ref_.tokens, chunk), "chunk " + std::to_string(chunk));
}

TEST_P(LongContext, TokenByTokenDecodeMatches) {
  Session s = new_session();
  std::vector<float> got;
  got.reserve(size_t(ref_.positions * ref_.vocab));
  for (int32_t id : ref_.tokens) {
    s.decode(id);
    const std::vector<float> row = s.last_logits_host();
    got.insert(got.end(), row.begin(), row.end());
  }
  expect_matches_reference(got, "token by token");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LongContext, ::testing::Values("long-31b-heads", "long-published-layout"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace g4
