// Speculative decoding in continuous batching (docs/DESIGN.md §7, "Speculative decoding"): with the
// random assistant of the fortune demo (tests/fixtures/assistant), every request of a batch gives
// the tokens it gives alone in a drafting session — greedy ones the target's own plain text, sampled
// ones the same seeded text — whatever runs beside it, through preemptions; penalised requests and
// requests for log-probabilities draft with each verify row as its draw; and the rounds are counted.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/generator.h"
#include "runtime/scheduler.h"
#include "runtime/session.h"
#include "sampling/logprobs.h"
#include "support/cuda_vs_cpu.h"
#include "support/demo_engine.h"
#include "support/fixtures.h"
#include "util/error.h"

namespace g4 {
namespace {

constexpr int64_t kMaxSeqLen = 160;
constexpr int64_t kDraftTokens = 3;
const std::string kAssistantDir = std::string(G4_FIXTURES_DIR) + "/assistant/hf";

// The fortune demo with its assistant, a KV budget of `sequences` sequences.
std::unique_ptr<Engine> drafting_engine(int64_t sequences, const std::string& backend = "cpu") {
  EngineOptions o;
  o.model_path = test::fortune_demo_path();
  o.backend = backend;
  o.max_seq_len = kMaxSeqLen;
  o.draft_model = kAssistantDir;
  o.draft_tokens = kDraftTokens;
  const size_t one = Engine(o).kv_pool().sequence_bytes(kMaxSeqLen);
  o.kv_budget_bytes = size_t(sequences) * one;
  o.max_batch_sequences = 16;
  return std::make_unique<Engine>(o);
}

// Eight requests: greedy and sampled at a temperature where the random drafter's tokens are often
// accepted (min(1, p/q)) and often not, different prompts and lengths.
std::vector<SchedulerRequest> requests() {
  std::vector<SchedulerRequest> out;
  for (int i = 0; i < 8; ++i) {
    SchedulerRequest r;
    r.prompt = test::demo_prompt(50 + 211 * i, 4 + 5 * i);
    r.sampling = i % 3 == 0 ? SamplingParams{.temperature = 0.0f}
                            : SamplingParams{.temperature = 1.5f, .seed = uint64_t(77 + 13 * i)};
    r.max_new_tokens = 9 + 4 * i;
    r.stop_ids = {};
    out.push_back(r);
  }
  return out;
}

std::vector<int32_t> alone(Engine& engine, const SchedulerRequest& r, bool draft) {
  GenerationRequest g;
  g.prompt = r.prompt;
  g.sampler = Sampler(r.sampling);
  g.max_new_tokens = r.max_new_tokens;
  g.stop_ids = r.stop_ids;
  g.penalties = r.penalties;
  if (draft) g.draft = engine.draft_options();
  return generate(*engine.create_session(), g).tokens;
}

struct Batch {
  std::map<RequestId, std::vector<int32_t>> tokens;
  std::map<RequestId, std::vector<TokenLogprobs>> logprobs;
  int64_t preemptions = 0, widest_step = 0;
};

// All requests arrive at once, or one every `stagger` steps.
Batch run(Engine& engine, const std::vector<SchedulerRequest>& rs, std::vector<RequestId>& ids, int stagger = 0) {
  SchedulerOptions so;
  so.draft = engine.draft_options();
  Scheduler scheduler(engine.runner(), so);
  Batch b;
  size_t next = 0;
  for (int step = 0; next < rs.size() || !scheduler.idle(); ++step) {
    while (next < rs.size() && (stagger == 0 || step % stagger == 0)) {
      ids.push_back(scheduler.add(rs[next++]));
      if (stagger > 0) break;
    }
    const std::vector<SequenceEvent> events = scheduler.step();
    b.widest_step = std::max(b.widest_step, int64_t(events.size()));
    for (const SequenceEvent& e : events) {
      EXPECT_TRUE(e.error.empty()) << e.error;
      if (e.drawn.stop != StopReason::kStopToken) b.tokens[e.id].push_back(e.drawn.token);
      if (e.logprobs) b.logprobs[e.id].push_back(*e.logprobs);
    }
  }
  b.preemptions = scheduler.preemptions();
  const SpeculationStats& s = scheduler.speculation_stats();
  EXPECT_GT(s.rounds, 0);
  EXPECT_GT(s.accepted, 0) << "no draft stood: the rounds were not exercised";
  EXPECT_LT(s.accepted, s.drafted) << "every draft stood: rejections were not exercised";
  return b;
}

TEST(SpeculativeScheduler, EachRequestGivesItsTokensAloneWhateverRunsBesideIt) {
  auto engine = drafting_engine(8);
  const std::vector<SchedulerRequest> rs = requests();
  for (int stagger : {0, 2}) {
    std::vector<RequestId> ids;
    const Batch b = run(*engine, rs, ids, stagger);
    ASSERT_EQ(ids.size(), rs.size());
    EXPECT_GT(b.widest_step, int64_t(rs.size())) << "some step gave several tokens of one sequence";
    for (size_t i = 0; i < rs.size(); ++i) {
      const std::vector<int32_t>& got = b.tokens.at(ids[i]);
      EXPECT_EQ(got, alone(*engine, rs[i], true)) << "request " << i << ", stagger " << stagger;
      EXPECT_EQ(int64_t(got.size()), rs[i].max_new_tokens) << "request " << i;
      if (rs[i].sampling.temperature == 0.0f)
        EXPECT_EQ(got, alone(*engine, rs[i], false)) << "greedy request " << i << ": the target's own text";
    }
  }
}

TEST(SpeculativeScheduler, PreemptedDraftingSequencesResumeWithTheirTokens) {
  auto engine = drafting_engine(2);
  std::vector<SchedulerRequest> rs = requests();
  for (SchedulerRequest& r : rs) r.max_new_tokens = 60;
  std::vector<RequestId> ids;
  const Batch b = run(*engine, rs, ids);
  EXPECT_GT(b.preemptions, 0) << "the pool of two sequences did not preempt";
  for (size_t i = 0; i < rs.size(); ++i) EXPECT_EQ(b.tokens.at(ids[i]), alone(*engine, rs[i], true)) << "request " << i;
  EXPECT_EQ(engine->kv_pool().pages_in_use(), 0);
}

// The log-probabilities of a request's tokens as plain decoding gives them: from the logits at each
// token's position of a session fed the prompt and the tokens.
std::vector<TokenLogprobs> logprobs_of(Engine& engine, const SchedulerRequest& r, const std::vector<int32_t>& tokens) {
  std::vector<int32_t> fed = r.prompt;
  fed.insert(fed.end(), tokens.begin(), tokens.end() - 1);
  const std::vector<float> logits = engine.create_session()->logits_all(fed);
  const size_t vocab = logits.size() / fed.size();
  std::vector<TokenLogprobs> out;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const size_t row = r.prompt.size() - 1 + t;
    out.push_back(token_logprobs(std::span(logits).subspan(row * vocab, vocab), tokens[t], r.top_logprobs));
  }
  return out;
}

// Logit bias, penalties and log-probabilities draft too: each verify row is adjusted as the draw at
// its position (after the drafts before it), so a penalised request gives its drafting session's
// tokens and a greedy one the target's own penalised text; a token's log-probabilities are those of
// the row it was drawn from — the logits at its position, plain decoding's.
TEST(SpeculativeScheduler, PenalisedAndLogprobRequestsDraftWithEachRowItsDraws) {
  auto engine = drafting_engine(8);
  std::vector<SchedulerRequest> rs = requests();
  rs[1].penalties.repetition = 1.3f;  // sampled
  rs[2].top_logprobs = 2;             // sampled: drafts stand
  rs[6].top_logprobs = 3;             // greedy
  SchedulerRequest& greedy = rs[3];
  ASSERT_EQ(greedy.sampling.temperature, 0.0f);
  const std::vector<int32_t> unpenalised = alone(*engine, greedy, false);
  greedy.penalties.presence = 1.5f;
  greedy.penalties.frequency = 1.0f;
  greedy.penalties.repetition = 1.4f;
  greedy.penalties.bias = {{greedy.prompt[2], -3.0f}};
  const std::vector<int32_t> plain = alone(*engine, greedy, false);
  ASSERT_NE(plain, unpenalised) << "the penalties change nothing here: the test would not see them";
  std::vector<RequestId> ids;
  const Batch b = run(*engine, rs, ids);
  EXPECT_EQ(b.tokens.at(ids[1]), alone(*engine, rs[1], true)) << "sampled, with penalties";
  EXPECT_EQ(b.tokens.at(ids[3]), plain) << "greedy with penalties";
  EXPECT_EQ(b.tokens.at(ids[2]), alone(*engine, rs[2], true)) << "sampled, with log-probabilities";
  EXPECT_EQ(b.tokens.at(ids[6]), alone(*engine, rs[6], false)) << "greedy, with log-probabilities";
  EXPECT_EQ(b.tokens.at(ids[0]), alone(*engine, rs[0], true));
  for (size_t i : {size_t(2), size_t(6)}) {
    const std::vector<TokenLogprobs>& got = b.logprobs.at(ids[i]);
    const std::vector<TokenLogprobs> want = logprobs_of(*engine, rs[i], b.tokens.at(ids[i]));
    ASSERT_EQ(got.size(), want.size()) << "request " << i << ": a token without log-probabilities";
    for (size_t t = 0; t < got.size(); ++t) {
      EXPECT_EQ(got[t].logprob, want[t].logprob) << "request " << i << ", token " << t;
      EXPECT_EQ(got[t].top, want[t].top) << "request " << i << ", token " << t;
    }
  }
}

// On CUDA (batch-invariant forwards): a verify chunk beside other sequences' rows gives the bits
// it gives alone, so each request's tokens, greedy and seeded, are its drafting session's.
TEST(CudaSpeculativeScheduler, EachRequestGivesItsTokensAlone) {
  G4_SKIP_OR_FAIL_WITHOUT_GPU(test::cuda_backend_or_null());
  auto engine = drafting_engine(8, "cuda");
  const std::vector<SchedulerRequest> rs = requests();
  std::vector<RequestId> ids;
  const Batch b = run(*engine, rs, ids);
  for (size_t i = 0; i < rs.size(); ++i) EXPECT_EQ(b.tokens.at(ids[i]), alone(*engine, rs[i], true)) << "request " << i;
}

TEST(SpeculativeScheduler, ARoundTooWideForTheRunnerIsAClearError) {
  auto engine = drafting_engine(2);
  SchedulerOptions so;
  so.draft = DraftOptions{engine->draft_options().assistant, kMaxDraftTokens};
  EXPECT_THROW(
      {
        try {
          Scheduler scheduler(engine->runner(), so);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("verifies 17 rows in one forward"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  so.draft.draft_tokens = 0;
  EXPECT_THROW(Scheduler(engine->runner(), so), Error);
}

}  // namespace
}  // namespace g4
