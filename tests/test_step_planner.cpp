// The scheduling policy on its own (StepPlanner, docs/DESIGN.md §7): no model and no forward —
// the tests feed the tokens a forward would have drawn. Decode rows come first, then prompt chunks
// within the step's budget, packed into forwards by rows and draws; the KV pool's pages bound
// admission and a cancellation frees them; running sequences that outgrow the pool preempt the
// youngest, which resumes when pages come back; a finished sequence leaves, a NaN fails its
// sequence alone; a follower's membership changes must name its own sequences in its order.
#include <gtest/gtest.h>

#include <map>
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

// One full-attention layer of 2 KV heads of 8 dims (pages of 32 positions, two for a sequence of
// kMaxSeqLen): the pool's memory is all the planner needs.
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
  // The result of running `plan`: each chunk's sequence takes the pages of its positions and holds
  // its tokens, as a forward leaves it (ModelRunner), and each draw gives `token`.
  StepResult drawing(const StepPlan& plan, int32_t token) {
    StepResult result;
    for (const PlannedForward& f : plan.forwards) {
      for (const PlannedChunk& c : f.chunks) {
        KvSequence& kv = planner_->kv(c.id);
        pool_->prepare(kv, int64_t(c.tokens.size()));
        kv.append(c.tokens);
      }
      result.forwards.push_back(ForwardDraws{std::vector<ChunkDraw>(size_t(f.draws()), ChunkDraw{token}), false});
    }
    return result;
  }

  ModelConfig config_ = pool_config();
  CpuBackend backend_{1};
  std::unique_ptr<KvPool> pool_;
  std::unique_ptr<StepPlanner> planner_;
};

TEST_F(Planner, DecodeRowsFirstThenPromptChunksWithinTheBudget) {
  make(1, {.prefill_tokens_per_step = 16, .forward_rows = 8, .forward_draws = 4});
  const RequestId a = planner_->add(request(10)), b = planner_->add(request(20)), c = planner_->add(request(5));

  // Step 1: a's whole prompt (10 of 16) starts; b starts too (a page each: the pool's two) but its
  // first chunk (16) does not fit the 6 left; c waits for a page. A 10-row chunk exceeds 8 rows: alone.
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

TEST_F(Planner, ThePoolsPagesBoundAdmissionAndCancellingFreesThem) {
  make(1, {.prefill_tokens_per_step = 64, .forward_rows = 64, .forward_draws = 4});
  EXPECT_EQ(pool_->pages_total(), 2);
  // 40 prompt tokens and the first new one: both pages.
  const RequestId a = planner_->add(request(40)), b = planner_->add(request(40));
  StepPlan plan = planner_->plan();
  EXPECT_EQ(plan.admitted, std::vector<RequestId>{a});
  planner_->update(plan, drawing(plan, 7));
  EXPECT_TRUE(planner_->plan().admitted.empty()) << "one sequence fills the pool";
  EXPECT_TRUE(planner_->cancel(a));
  EXPECT_EQ(pool_->pages_in_use(), 0);
  plan = planner_->plan();
  EXPECT_EQ(plan.admitted, std::vector<RequestId>{b});
}

// Two sequences of one page each outgrow a pool of two pages at position 32: the youngest is
// preempted (its page copied out), the oldest runs to its end, and the youngest then resumes where
// it stood and ends with all its tokens.
TEST_F(Planner, TheYoungestIsPreemptedWhenRunningSequencesOutgrowThePool) {
  make(1, {.prefill_tokens_per_step = 64, .forward_rows = 64, .forward_draws = 4});
  const RequestId a = planner_->add(request(20, 30)), b = planner_->add(request(20, 30));
  std::map<RequestId, int64_t> drawn;
  std::vector<RequestId> preempted, resumed;
  for (int step = 0; !planner_->idle() && step < 200; ++step) {
    const StepPlan plan = planner_->plan();
    preempted.insert(preempted.end(), plan.preempted.begin(), plan.preempted.end());
    resumed.insert(resumed.end(), plan.resumed.begin(), plan.resumed.end());
    EXPECT_LE(planner_->running() + planner_->waiting(), 2u) << "waiting() counts the preempted";
    for (const SequenceEvent& e : planner_->update(plan, drawing(plan, 7))) ++drawn[e.id];
    EXPECT_LE(pool_->pages_in_use(), 2);
  }
  EXPECT_TRUE(planner_->idle());
  EXPECT_EQ(preempted, std::vector<RequestId>{b});
  EXPECT_EQ(resumed, std::vector<RequestId>{b});
  EXPECT_EQ(planner_->preemptions(), 1);
  EXPECT_EQ(drawn[a], 30);
  EXPECT_EQ(drawn[b], 30);
  EXPECT_EQ(pool_->pages_in_use(), 0);
}

TEST_F(Planner, AFinishedSequenceLeavesAndANanFailsAlone) {
  make(2, {.prefill_tokens_per_step = 64, .forward_rows = 64, .forward_draws = 4});
  const RequestId a = planner_->add(request(3, 2)), b = planner_->add(request(4, 2));
  StepPlan plan = planner_->plan();
  ASSERT_EQ(plan.forwards.size(), 1u);
  ASSERT_EQ(plan.forwards[0].draws(), 2);
  StepResult result = drawing(plan, 7);
  result.forwards[0].draws[1].token = kNanLogitsToken;  // b's logits held a NaN
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
  EXPECT_EQ(pool_->pages_in_use(), 0) << "every sequence gave its pages back";
}

TEST_F(Planner, AFollowersChangesMustNameItsSequencesInItsOrder) {
  make(1, {.prefill_tokens_per_step = 64, .forward_rows = 64, .forward_draws = 4});
  const RequestId a = planner_->add(request(3)), b = planner_->add(request(3));
  auto follow = [&](std::vector<RequestId> preempted, std::vector<RequestId> resumed, std::vector<RequestId> admitted) {
    planner_->follow(StepPlan{std::move(preempted), std::move(resumed), std::move(admitted), {}});
  };
  EXPECT_EQ(test::error_kind_of([&] { follow({}, {}, {b}); }), ErrorKind::kInternal) << "b is not the next waiting";
  follow({}, {}, {a, b});
  EXPECT_EQ(planner_->running(), 2u);
  EXPECT_EQ(test::error_kind_of([&] { follow({a}, {}, {}); }), ErrorKind::kInternal) << "a is not the youngest";
  follow({b}, {}, {});
  EXPECT_EQ(planner_->preempted(), 1u);
  EXPECT_EQ(test::error_kind_of([&] { follow({}, {a}, {}); }), ErrorKind::kInternal) << "a is not preempted";
  follow({}, {b}, {});
  EXPECT_EQ(planner_->running(), 2u);
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
