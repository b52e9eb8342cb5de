// The scheduling policy on its own (StepPlanner, docs/DESIGN.md §7): no model and no forward —
// the tests feed the tokens a forward would have drawn. Decode rows come first, then prompt chunks
// within the step's budget, packed into forwards by rows and draws; the KV pool's room bounds
// admission and a cancellation frees it; a finished sequence leaves, a NaN fails its sequence
// alone; a follower's admissions must be the next waiting requests.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "runtime/kv_pool.h"
#include "runtime/scheduler.h"
#include "support/fixtures.h"
#include "util/error.h"

namespace g4 {
namespace {

constexpr int64_t kMaxSeqLen = 64;

// One full-attention layer of 2 KV heads of 8 dims: the pool's memory is all the planner needs.
ModelConfig pool_config() {
  ModelConfig c;
  c.vocab_size = 100;
  c.layers = {LayerConfig{.sliding = false, .head_dim = 8, .kv_heads = 2}};
  return c;
}

SchedulerRequest request(int64_t prompt_tokens, int64_t max_new_tokens = 4) {
  SchedulerRequest r;
  r.prompt.resize(size_t(prompt_tokens));
  std::iota(r.prompt.begin(), r.prompt.end(), 2);
  r.sampling = SamplingParams{.temperature = 0.0f};
  r.max_new_tokens = max_new_tokens;
  r.stop_ids = {1};
  return r;
}

class Planner : public ::testing::Test {
 protected:
  // A pool with room for `sequences` live sequences.
  void make(int64_t sequences, SchedulerLimits limits) {
    const size_t one = KvPool(config_, backend_, 0).sequence_bytes(kMaxSeqLen);
    pool_ = std::make_unique<KvPool>(config_, backend_, one * size_t(sequences));
    pool_->allocate_pages(SIZE_MAX, kMaxSeqLen);
    limits.max_seq_len = kMaxSeqLen;
    planner_ = std::make_unique<StepPlanner>(*pool_, limits);
  }
  // The result of running `plan`: each draw gives `token`.
  static StepResult drawing(const StepPlan& plan, int32_t token) {
    StepResult result;
    for (const PlannedForward& f : plan.forwards)
      result.forwards.push_back(ForwardDraws{std::vector<int32_t>(size_t(f.draws()), token), {}, 0, false});
    return result;
  }

  ModelConfig config_ = pool_config();
  CpuBackend backend_{1};
  std::unique_ptr<KvPool> pool_;
  std::unique_ptr<StepPlanner> planner_;
};

TEST_F(Planner, DecodeRowsFirstThenPromptChunksWithinTheBudget) {
  make(2, {.prefill_tokens_per_step = 16, .forward_rows = 8, .forward_draws = 4});
  const RequestId a = planner_->add(request(10)), b = planner_->add(request(20)), c = planner_->add(request(5));

  // Step 1: a's whole prompt (10 of 16) starts; b starts too (room for two) but its first chunk
  // (16) does not fit the 6 left; c waits for room. A 10-row chunk exceeds 8 rows: alone.
  StepPlan plan = planner_->plan();
  EXPECT_EQ(plan.admitted, (std::vector<RequestId>{a, b}));
  ASSERT_EQ(plan.forwards.size(), 1u);
  ASSERT_EQ(plan.forwards[0].chunks.size(), 1u);
  const PlannedChunk& first = plan.forwards[0].chunks[0];
  EXPECT_EQ(first.id, a);
  EXPECT_EQ(first.position, 0);
  EXPECT_EQ(first.tokens, request(10).prompt);
  EXPECT_FALSE(first.decode);
  EXPECT_TRUE(first.draw.has_value()) << "the chunk that ends the prompt draws";
  std::vector<SequenceEvent> events = planner_->update(plan, drawing(plan, 7));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].id, a);
  EXPECT_EQ(events[0].drawn.token, 7);

  // Step 2: a's decode row (its drawn 7 at position 10) first, then b's first 16 prompt tokens,
  // which do not end its prompt (no draw) and do not fit beside the decode row: two forwards.
  plan = planner_->plan();
  EXPECT_TRUE(plan.admitted.empty()) << "c waits: no room";
  ASSERT_EQ(plan.forwards.size(), 2u);
  ASSERT_EQ(plan.forwards[0].chunks.size(), 1u);
  EXPECT_TRUE(plan.forwards[0].decodes_only());
  EXPECT_EQ(plan.forwards[0].chunks[0].tokens, std::vector<int32_t>{7});
  EXPECT_EQ(plan.forwards[0].chunks[0].position, 10);
  ASSERT_EQ(plan.forwards[1].chunks.size(), 1u);
  EXPECT_EQ(plan.forwards[1].chunks[0].id, b);
  EXPECT_EQ(plan.forwards[1].chunks[0].tokens.size(), 16u);
  EXPECT_FALSE(plan.forwards[1].chunks[0].draw.has_value());
  events = planner_->update(plan, drawing(plan, 8));
  ASSERT_EQ(events.size(), 1u) << "only a's decode row draws";

  // Step 3: b's last 4 prompt tokens end its prompt and draw, beside a's decode row.
  plan = planner_->plan();
  ASSERT_EQ(plan.forwards.size(), 1u);
  ASSERT_EQ(plan.forwards[0].chunks.size(), 2u);
  EXPECT_EQ(plan.forwards[0].chunks[1].position, 16);
  EXPECT_EQ(plan.forwards[0].draws(), 2);
  EXPECT_EQ(plan.forwards[0].rows(), 5);
  planner_->update(plan, drawing(plan, 9));
  (void)c;
}

TEST_F(Planner, TheKvPoolsRoomBoundsAdmissionAndCancellingFreesIt) {
  make(1, {.prefill_tokens_per_step = 64, .forward_rows = 64, .forward_draws = 4});
  const RequestId a = planner_->add(request(3)), b = planner_->add(request(3));
  StepPlan plan = planner_->plan();
  EXPECT_EQ(plan.admitted, std::vector<RequestId>{a});
  planner_->update(plan, drawing(plan, 7));
  EXPECT_TRUE(planner_->plan().admitted.empty()) << "one sequence fills the pool";
  EXPECT_TRUE(planner_->cancel(a));
  EXPECT_EQ(pool_->bytes_in_use(), 0u);
  EXPECT_EQ(pool_->bytes_kept(), 0u) << "a cancelled sequence keeps nothing";
  plan = planner_->plan();
  EXPECT_EQ(plan.admitted, std::vector<RequestId>{b});
}

TEST_F(Planner, AFinishedSequenceLeavesAndANanFailsAlone) {
  make(2, {.prefill_tokens_per_step = 64, .forward_rows = 64, .forward_draws = 4});
  const RequestId a = planner_->add(request(3, 2)), b = planner_->add(request(4, 2));
  StepPlan plan = planner_->plan();
  ASSERT_EQ(plan.forwards.size(), 1u);
  ASSERT_EQ(plan.forwards[0].draws(), 2);
  StepResult result = drawing(plan, 7);
  result.forwards[0].tokens[1] = kNanLogitsToken;  // b's logits held a NaN
  std::vector<SequenceEvent> events = planner_->update(plan, result);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].id, b);
  EXPECT_EQ(events[1].drawn.stop, StopReason::kFailed);
  EXPECT_EQ(events[1].error, kNanLogitsError);
  EXPECT_EQ(planner_->running(), 1u);
  plan = planner_->plan();
  events = planner_->update(plan, drawing(plan, 8));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].id, a);
  EXPECT_EQ(events[0].drawn.stop, StopReason::kMaxTokens);
  EXPECT_TRUE(planner_->idle());
  EXPECT_EQ(pool_->bytes_in_use(), 0u) << "every sequence gave its caches back";
}

TEST_F(Planner, AFollowersAdmissionsMustBeItsNextWaitingRequests) {
  make(1, {.prefill_tokens_per_step = 64, .forward_rows = 64, .forward_draws = 4});
  const RequestId a = planner_->add(request(3)), b = planner_->add(request(3));
  const std::vector<RequestId> wrong{b};
  EXPECT_EQ(test::error_kind_of([&] { planner_->admit(wrong); }), ErrorKind::kInternal);
  const std::vector<RequestId> right{a};
  planner_->admit(right);
  EXPECT_EQ(planner_->running(), 1u);
  const std::vector<RequestId> no_room{b};
  EXPECT_EQ(test::error_kind_of([&] { planner_->admit(no_room); }), ErrorKind::kInternal);
}

TEST_F(Planner, BadRequestsAreClearErrorsOfTheirKind) {
  make(1, {.prefill_tokens_per_step = 64, .forward_rows = 64, .forward_draws = 4, .max_waiting = 1});
  EXPECT_EQ(test::error_kind_of([&] { planner_->add(request(0)); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(test::error_kind_of([&] { planner_->add(request(kMaxSeqLen + 1)); }), ErrorKind::kInvalidArgument);
  planner_->add(request(3));
  EXPECT_EQ(test::error_kind_of([&] { planner_->add(request(3)); }), ErrorKind::kBusy);
  SchedulerLimits limits{.max_seq_len = kMaxSeqLen, .prefill_tokens_per_step = 8, .forward_rows = 8, .forward_draws = 1};
  KvPool tiny(config_, backend_, 16);  // smaller than one sequence
  StepPlanner starved(tiny, limits);
  EXPECT_EQ(test::error_kind_of([&] { starved.add(request(3)); }), ErrorKind::kResourceExhausted);
}

}  // namespace
}  // namespace g4
