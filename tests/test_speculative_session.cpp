// Draft-and-verify generation on a Session (runtime/speculation.h) with the random assistant of the
// fortune demo (tests/fixtures/assistant): greedy text is the target's own whatever the drafts;
// seeded text is reproducible; and after every round the caches hold exactly the returned tokens —
// the next logits equal those of a fresh session fed the same tokens.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "backend/backend_factory.h"
#include "model/loader.h"
#include "runtime/kv_types.h"
#include "runtime/session.h"
#include "support/cuda_vs_cpu.h"
#include "support/demo_engine.h"
#include "support/fixtures.h"
#include "util/error.h"

namespace g4 {
namespace {

const std::string kAssistantDir = std::string(G4_FIXTURES_DIR) + "/assistant/hf";
const std::string kTargetDir = std::string(G4_FIXTURES_DIR) + "/demo/hf";

struct Models {
  std::unique_ptr<Backend> be = make_backend("cpu");
  std::unique_ptr<Gemma4> target = load_model(kTargetDir, *be);
  std::unique_ptr<Gemma4Assistant> assistant = load_assistant(kAssistantDir, *be, target->config());
};

Models& models() {
  static Models m;
  return m;
}

struct Generated {
  std::vector<int32_t> tokens;
  std::vector<int32_t> held;  // what the session's caches hold afterwards
  SpeculationStats stats;
};

Generated generate_with(Session& s, const std::vector<int32_t>& prompt, const SamplingParams& params, int64_t n,
                        DraftOptions draft) {
  s.start(prompt);
  s.begin_generation(Sampler(params), GenerationLimits{n, {}}, false, {}, draft);
  Generated g;
  for (DecodedToken t{}; !t.last();) {
    t = s.next();
    if (t.stop != StopReason::kStopToken && t.stop != StopReason::kCancelled) g.tokens.push_back(t.token);
  }
  g.held = s.tokens();
  if (s.speculation_stats()) g.stats = *s.speculation_stats();
  return g;
}

Generated generate(const std::vector<int32_t>& prompt, const SamplingParams& params, int64_t n, int64_t k) {
  Models& m = models();
  Session s(*m.target, *m.be);
  return generate_with(s, prompt, params, n, DraftOptions{k > 0 ? m.assistant.get() : nullptr, k});
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

SamplingParams seeded(uint64_t seed) {
  SamplingParams p;
  p.temperature = 1.5f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.seed = seed;
  return p;
}

TEST(SpeculativeSession, GreedyTextIsTheTargetsOwn) {
  const std::vector<int32_t> prompt = test::demo_prompt(7, 20);
  const Generated plain = generate(prompt, greedy(), 48, 0);
  for (int64_t k : {1, 3, 4}) {
    SCOPED_TRACE("draft tokens " + std::to_string(k));
    const Generated drafted = generate(prompt, greedy(), 48, k);
    EXPECT_EQ(drafted.tokens, plain.tokens);
    EXPECT_EQ(drafted.held, plain.held);
    EXPECT_GT(drafted.stats.rounds, 0);
    EXPECT_EQ(drafted.stats.drafted > 0, true);
  }
}

// Sampling at a high temperature, a random drafter's tokens are often accepted (min(1, p/q)), so the
// rounds below keep drafts and cut rejected ones off the caches.
TEST(SpeculativeSession, SeededRoundsAreReproducibleAndLeaveTheCachesAsFed) {
  const std::vector<int32_t> prompt = test::demo_prompt(11, 24);
  const Generated first = generate(prompt, seeded(42), 64, 4);
  const Generated again = generate(prompt, seeded(42), 64, 4);
  EXPECT_EQ(first.tokens, again.tokens);
  EXPECT_GT(first.stats.accepted, 0) << "no draft accepted: the rounds' kept drafts are not exercised";
  EXPECT_LT(first.stats.accepted, first.stats.drafted) << "every draft accepted: no rejection exercised";
  EXPECT_NE(generate(prompt, seeded(43), 64, 4).tokens, first.tokens);

  // The caches hold the prompt and every returned token but the last (not fed yet), exactly as if
  // fed one at a time: the next logits equal a fresh session's.
  std::vector<int32_t> fed = prompt;
  fed.insert(fed.end(), first.tokens.begin(), first.tokens.end() - 1);
  ASSERT_EQ(first.held, fed);
  Models& m = models();
  Session drafted(*m.target, *m.be), fresh(*m.target, *m.be);
  generate_with(drafted, prompt, seeded(42), 64, DraftOptions{m.assistant.get(), 4});
  drafted.decode(first.tokens.back());
  fresh.prefill(fed);
  fresh.decode(first.tokens.back());
  EXPECT_EQ(drafted.last_logits_host(), fresh.last_logits_host());
}

TEST(SpeculativeSession, ARoundNeverRunsPastTheTokensAskedOrTheContext) {
  const std::vector<int32_t> prompt = test::demo_prompt(3, 10);
  for (int64_t n : {1, 2, 5}) {
    const Generated g = generate(prompt, seeded(5), n, 4);
    EXPECT_EQ(int64_t(g.tokens.size()), n);
  }
  // A context of 80 positions: the last rounds shrink to fit it, and generation ends where it
  // ends without drafting, the caches full and one token drawn after them.
  Models& m = models();
  const std::vector<const Gemma4Assistant*> assistants{nullptr, m.assistant.get()};
  for (const Gemma4Assistant* assistant : assistants) {
    Session small(*m.target, *m.be, SessionOptions{.max_seq_len = 80});
    const Generated g = generate_with(small, prompt, seeded(9), 100, DraftOptions{assistant, 4});
    EXPECT_EQ(int64_t(prompt.size() + g.tokens.size()), 81);
    EXPECT_EQ(int64_t(g.held.size()), 80);
  }
}

TEST(SpeculativeSession, BadDraftSettingsAreClearErrors) {
  Models& m = models();
  Session s(*m.target, *m.be, SessionOptions{.max_seq_len = 64, .max_prefill_chunk = 4});
  s.start(test::demo_prompt(3, 6));
  EXPECT_NE(test::error_of([&] {
              s.begin_generation(Sampler(greedy()), GenerationLimits{8, {}}, false, {}, DraftOptions{m.assistant.get(), 4});
            }).find("--draft_tokens must be in [1, 3]"),
            std::string::npos);
  LogitPenalties penalties;
  penalties.presence = 0.5f;
  EXPECT_EQ(test::error_kind_of([&] {
              s.begin_generation(Sampler(greedy()), GenerationLimits{8, {}}, false, penalties,
                                 DraftOptions{m.assistant.get(), 2});
            }),
            ErrorKind::kUnsupported);
}

// On CUDA (bf16, the assistant's attention over the target's caches by the decode kernels, keys
// below the query): a draft step's logits follow the CPU's, over bf16 and quantized caches, and
// greedy drafted text is CUDA's own plain greedy text.
TEST(CudaSpeculativeSession, DraftStepsFollowTheCpuAndGreedyTextIsTheTargetsOwn) {
  auto gpu = test::cuda_backend_or_null();
  G4_SKIP_OR_FAIL_WITHOUT_GPU(gpu);
  Models& m = models();
  const std::unique_ptr<Gemma4> target = load_model(kTargetDir, *gpu);
  const std::unique_ptr<Gemma4Assistant> assistant = load_assistant(kAssistantDir, *gpu, target->config());
  const std::vector<int32_t> prompt = test::demo_prompt(5, 100);  // past the window of 64
  for (KvTypes types : {KvTypes{}, KvTypes{KvType::kTq4, KvType::kQ8_0}}) {
    SCOPED_TRACE(kv_type_name(types.full) + "/" + kv_type_name(types.sliding));
    Session cpu(*m.target, *m.be, SessionOptions{.kv_types = types}), cuda(*target, *gpu, SessionOptions{.kv_types = types});
    std::vector<std::vector<float>> logits;
    for (auto [session, model, be, drafter] : {std::tuple{&cpu, m.target.get(), m.be.get(), m.assistant.get()},
                                               std::tuple{&cuda, target.get(), gpu.get(), assistant.get()}}) {
      session->prefill(prompt);
      DraftBuffers buf(drafter->config(), *be, 1);
      Tensor ids = be->alloc(DType::I32, 1, 1), positions = be->alloc(DType::I32, 1, 1);
      Tensor h = be->alloc(be->activation_dtype(), 1, model->config().hidden_size);
      Tensor out = be->alloc(DType::F32, 1, model->config().vocab_size);
      const int32_t pos = int32_t(session->position()), id = 640;
      be->upload(&pos, positions);
      be->upload(&id, ids);
      const DraftRow rows[] = {{&session->kv().caches()}};
      drafter->step(*be, buf, *model, rows, ids, positions, session->runner().workspace_logits(1).normed, out, h);
      logits.emplace_back(size_t(out.cols));
      be->download(out, logits.back().data());
    }
    // The target's bf16 caches and hidden state (the demo's logits: ~8e-3 from the CPU's) pass
    // through a random assistant that amplifies any difference several times a step: 4.2e-2 (bf16
    // caches) and 7.3e-2 (tq4/q8_0) on an H100. A wrong layer, window or position is of order 1;
    // CudaOps.AttentionChunksOverRingAndFlatCaches holds the attention itself to 1e-2.
    EXPECT_LT(test::relative_l2(logits[1], logits[0]), 0.12);
  }
  for (int64_t k : {1, 4}) {
    Session plain(*target, *gpu), drafted(*target, *gpu);
    EXPECT_EQ(generate_with(drafted, prompt, greedy(), 32, DraftOptions{assistant.get(), k}).tokens,
              generate_with(plain, prompt, greedy(), 32, DraftOptions{}).tokens)
        << "draft tokens " << k;
  }
}

}  // namespace
}  // namespace g4
