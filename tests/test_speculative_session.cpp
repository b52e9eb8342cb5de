// Draft-and-verify generation on a Session (runtime/speculation.h) with the random assistant of the
// fortune demo (tests/fixtures/assistant): greedy text is the target's own whatever the drafts;
// seeded text is reproducible; after every round the caches hold exactly the returned tokens —
// the next logits equal those of a fresh session fed the same tokens; and sampled text has the
// target's distribution (a chi-square test of drafted against plain runs over thousands of seeds).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "backend/backend_factory.h"
#include "backend/cpu/cpu_backend.h"
#include "model/loader.h"
#include "model/kv_types.h"
#include "runtime/drafter.h"
#include "runtime/session.h"
#include "support/cuda_vs_cpu.h"
#include "support/demo_engine.h"
#include "support/fixtures.h"
#include "support/sampling_reference.h"
#include "util/error.h"

namespace g4 {
namespace {

const std::string kAssistantDir = std::string(G4_FIXTURES_DIR) + "/assistant/hf";
const std::string kTargetDir = std::string(G4_FIXTURES_DIR) + "/demo/hf";

// The target and its assistant on a backend (by default the CPU backend of make_backend).
struct Models {
  Models() = default;
  explicit Models(std::unique_ptr<Backend> backend) : be(std::move(backend)) {}
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
                        DraftOptions draft, const LogitPenalties& penalties = {}, bool graph = false) {
  s.start(prompt);
  s.begin_generation(Sampler(params), GenerationLimits{n, {}}, graph, penalties, draft);
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

using TokenCounts = std::map<int32_t, int64_t>;  // token -> how many runs drew it

// Pearson's statistic of two samples drawn from one distribution (the null hypothesis): each bin's
// expected counts are its total split in the samples' proportions; the tokens whose expected count in
// the smaller sample is below 5 are pooled into one bin. Chi-square with bins - 1 degrees of freedom.
double two_sample_chi_square(const TokenCounts& a, const TokenCounts& b, int* bins) {
  std::map<int32_t, std::pair<double, double>> both;
  double na = 0, nb = 0;
  for (auto [token, count] : a) both[token].first = double(count), na += double(count);
  for (auto [token, count] : b) both[token].second = double(count), nb += double(count);
  double statistic = 0, pooled_a = 0, pooled_b = 0;
  *bins = 0;
  auto add = [&](double x, double y) {
    const double ex = (x + y) * na / (na + nb), ey = (x + y) * nb / (na + nb);
    statistic += (x - ex) * (x - ex) / ex + (y - ey) * (y - ey) / ey;
    ++*bins;
  };
  for (auto [token, counts] : both) {
    if ((counts.first + counts.second) * std::min(na, nb) / (na + nb) < 5) {
      pooled_a += counts.first;
      pooled_b += counts.second;
    } else {
      add(counts.first, counts.second);
    }
  }
  if (pooled_a + pooled_b > 0) add(pooled_a, pooled_b);
  return statistic;
}

// The text of draft-and-verify rounds that keep every draft whatever p and q (a wrong acceptance
// rule): each round as Speculation::round makes it — k = min(K, tokens left - 1) drafts by the
// assistant (runtime/drafter.h: draft i drawn with the seed of its token index) — then the target
// fed the pending token and the drafts, and the bonus token drawn from its logits.
std::vector<int32_t> every_draft_standing(const Models& m, Session& s, const std::vector<int32_t>& prompt,
                                          const Sampler& sampler, int64_t n, int64_t max_drafts) {
  Drafter drafter(*m.assistant, s.runner(), 1, 1, max_drafts);
  const Tensor normed = s.runner().workspace_logits(1).normed;  // the hidden row of the last draw
  std::vector<uint8_t> hidden(normed.row_size());
  s.start(prompt);
  std::vector<int32_t> text{int32_t(s.sample(sampler, 0))};
  for (int64_t j = 1; j < n;) {
    const int64_t k = std::min(max_drafts, n - j - 1);
    m.be->download(normed, hidden.data());
    const DraftRequest request{&s.kv().caches(), text.back(), s.position(), hidden, sampler.for_token(j), k};
    const std::vector<Drafts> drafts = drafter.draft(std::span(&request, 1));
    std::vector<int32_t> fed{text.back()};
    fed.insert(fed.end(), drafts[0].tokens.begin(), drafts[0].tokens.end());
    s.prefill(fed);
    text.insert(text.end(), fed.begin() + 1, fed.end());
    text.push_back(int32_t(s.sample(sampler, j + int64_t(fed.size()) - 1)));
    j += int64_t(fed.size());
  }
  return text;
}

// The tokens of speculative sampling have the target's distribution (docs/DESIGN.md §4): the token
// at each generated position, over thousands of seeds, is distributed as without drafting — a
// two-sample chi-square test of drafted runs against plain runs of other seeds, position by
// position, so that a round that kept a wrong draft, drew a wrong correction or bonus, or left the
// caches or the hidden state wrong for the next round shows as a shift of the later positions. The
// same statistic, over as many runs, rejects the text of rounds that keep every draft.
//
// The random assistant agrees with the fortune demo only where both are flat: with a top-k of 8 to
// 64 their kept sets hardly meet and next to no draft stands, so top-k is off, at temperature 1 (some
// 6% of drafts stand); the target's tokens then spread over some 500 ids, ~350 of them with enough
// draws in 10 000 runs to be bins of their own. 4 tokens after a 6-token prompt: a first round of 2
// drafts (one fewer than draft_tokens: the tokens left), then after a rejection a round of 1 and a
// plain step.
//
// Time: a run is a few forwards of ~2 ms on one core (the prompt's prefix is reused: only its last
// token runs again), so the runs are spread over worker threads, each with a one-thread CPU backend
// (the tiny demo gains nothing from the backend's thread pool) and its own models and sessions;
// 10 000 runs per arm take ~160 s on two cores (the sanitizer build leaves the test out). Each run's tokens depend only on its seed, and the
// seeds are fixed: the counts and the test are deterministic.
TEST(SpeculativeSession, SampledTextHasTheTargetsDistribution) {
  const int64_t n = 4, max_drafts = 3;
  const int runs = 10000;
  const std::vector<int32_t> prompt = test::demo_prompt(17, 6);
  // Seeds 16 apart and per arm 2^32 apart: no two tokens of the test share a seed.
  auto params = [](uint64_t arm, int run) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.seed = (arm << 32) + uint64_t(run) * 16;
    return p;
  };
  struct Tally {
    std::vector<TokenCounts> drafted, plain, standing;  // per position
    SpeculationStats stats;
    std::string error;  // what a worker threw
  };
  const int workers = int(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  std::vector<std::unique_ptr<Models>> models_of;
  for (int w = 0; w < workers; ++w) models_of.push_back(std::make_unique<Models>(std::make_unique<CpuBackend>(1)));
  std::vector<Tally> tallies(static_cast<size_t>(workers));
  const auto start = std::chrono::steady_clock::now();
  auto work = [&](int w) {
    const Models& m = *models_of[size_t(w)];
    Tally& t = tallies[size_t(w)];
    t.drafted = t.plain = t.standing = std::vector<TokenCounts>(static_cast<size_t>(n));
    auto count = [&](std::vector<TokenCounts>& c, const std::vector<int32_t>& tokens) {
      for (size_t i = 0; i < tokens.size() && i < c.size(); ++i) ++c[i][tokens[i]];
    };
    try {
      Session drafting(*m.target, *m.be), plain(*m.target, *m.be), standing(*m.target, *m.be);
      for (int r = w; r < runs; r += workers) {
        const Generated g =
            generate_with(drafting, prompt, params(0, r), n, DraftOptions{m.assistant.get(), max_drafts});
        count(t.drafted, g.tokens);
        t.stats = g.stats;  // the session's rounds so far
        count(t.plain, generate_with(plain, prompt, params(1, r), n, DraftOptions{}).tokens);
        count(t.standing, every_draft_standing(m, standing, prompt, Sampler(params(2, r)), n, max_drafts));
      }
    } catch (const std::exception& e) {
      t.error = e.what();
    }
  };
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) threads.emplace_back(work, w);
  for (std::thread& thread : threads) thread.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::vector<TokenCounts> drafted(static_cast<size_t>(n)), plain(drafted), standing(drafted);
  SpeculationStats stats;
  for (const Tally& t : tallies) {
    ASSERT_EQ(t.error, "");
    for (size_t i = 0; i < size_t(n); ++i) {
      for (auto [token, c] : t.drafted[i]) drafted[i][token] += c;
      for (auto [token, c] : t.plain[i]) plain[i][token] += c;
      for (auto [token, c] : t.standing[i]) standing[i][token] += c;
    }
    stats.rounds += t.stats.rounds;
    stats.drafted += t.stats.drafted;
    stats.accepted += t.stats.accepted;
  }
  std::printf("  %d runs per arm on %d threads in %.1f s: %lld rounds, %lld of %lld drafts accepted\n", runs, workers,
              seconds, (long long)stats.rounds, (long long)stats.accepted, (long long)stats.drafted);
  // Rounds that keep drafts and rounds that reject them both happen.
  EXPECT_GT(stats.accepted, stats.drafted / 50) << "hardly any draft accepted: the kept drafts are not exercised";
  EXPECT_LT(stats.accepted, stats.drafted / 2) << "most drafts accepted: hardly any correction exercised";

  for (size_t i = 0; i < size_t(n); ++i) {
    SCOPED_TRACE("position " + std::to_string(i));
    int64_t total[3] = {0, 0, 0};
    for (auto [token, c] : drafted[i]) total[0] += c;
    for (auto [token, c] : plain[i]) total[1] += c;
    for (auto [token, c] : standing[i]) total[2] += c;
    ASSERT_EQ(total[0], runs) << "a drafted run gave fewer tokens than asked";
    ASSERT_EQ(total[1], runs) << "a plain run gave fewer tokens than asked";
    ASSERT_EQ(total[2], runs);
    // The threshold: the chi-square quantile (Wilson–Hilferty) at the standard normal's 4.75, whose
    // upper tail is 1.0e-6; for 1 to ~600 degrees of freedom the chi-square's own tail there lies
    // between 1.6e-7 and 1.0e-6, the probability that equal distributions fail a position.
    int bins = 0, wrong_bins = 0;
    const double chi2 = two_sample_chi_square(drafted[i], plain[i], &bins);
    const double limit = testing::chi_square_quantile(bins - 1, 4.75);
    const double wrong = two_sample_chi_square(standing[i], plain[i], &wrong_bins);
    const double wrong_limit = testing::chi_square_quantile(wrong_bins - 1, 4.75);
    std::printf("  position %zu: drafted vs plain chi-square %.1f over %d bins (limit %.1f); every draft kept %.1f "
                "over %d bins (limit %.1f)\n",
                i, chi2, bins, limit, wrong, wrong_bins, wrong_limit);
    EXPECT_LT(chi2, limit) << bins << " bins";
    // Keeping every draft draws the later positions from the assistant, or from the target after
    // the assistant's tokens: the statistic must see it. Position 0 is the target's draw in every arm.
    if (i == 0) EXPECT_LT(wrong, wrong_limit) << wrong_bins << " bins";
    if (i > 0) EXPECT_GT(wrong, wrong_limit) << wrong_bins << " bins: the test cannot tell a wrong acceptance";
  }
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
  // Replayed draft steps need a backend that records them.
  EXPECT_NE(test::error_of([&] {
              s.begin_generation(Sampler(greedy()), GenerationLimits{8, {}}, true, {}, DraftOptions{m.assistant.get(), 3});
            }).find("needs a backend with graphs"),
            std::string::npos);
}

// Logit bias and penalties with drafting: verify row i is adjusted as the draw after drafts 1..i
// would be. With the drafts forced to the penalised plain text (2.5 a round), every forced draft
// stands and the text is the plain one; a row adjusted for the round's start alone would take
// other argmaxes where the drafts repeat a token.
TEST(SpeculativeSession, PenaltiesAdjustEachVerifyRowAsItsDraw) {
  Models& m = models();
  const std::vector<int32_t> prompt = test::demo_prompt(11, 12);
  LogitPenalties penalties;
  penalties.repetition = 1.6f;
  penalties.presence = 0.8f;
  penalties.frequency = 0.6f;
  penalties.bias = {{int32_t(prompt[3]), -2.0f}};
  Session plain(*m.target, *m.be), unpenalised(*m.target, *m.be);
  const Generated want = generate_with(plain, prompt, greedy(), 40, DraftOptions{}, penalties);
  ASSERT_NE(want.tokens, generate_with(unpenalised, prompt, greedy(), 40, DraftOptions{}).tokens)
      << "the penalties change nothing here: the test would not see them";
  const ForcedAcceptance forced{want.tokens, 2.5};
  Session drafted(*m.target, *m.be);
  const Generated got = generate_with(drafted, prompt, greedy(), 40, DraftOptions{m.assistant.get(), 4, &forced}, penalties);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_GE(got.stats.tokens_per_round(), 3.0) << "forced drafts fell: " << got.stats.accepted << " of "
                                               << got.stats.drafted << " stood in " << got.stats.rounds << " rounds";
  // Seeded: a seed gives one text with penalties too.
  std::vector<std::vector<int32_t>> seeded_texts;
  for (int run = 0; run < 2; ++run) {
    Session s(*m.target, *m.be);
    seeded_texts.push_back(generate_with(s, prompt, seeded(9), 30, DraftOptions{m.assistant.get(), 3}, penalties).tokens);
  }
  EXPECT_EQ(seeded_texts[1], seeded_texts[0]);
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
  // Sampled rounds judge on the device (Backend::judge_drafts; CudaOps.JudgeDraftsMatchTheCpu holds
  // it to the CPU's verdict): a seed gives one text, every token of it.
  std::vector<Generated> runs;
  for (int run = 0; run < 2; ++run) {
    Session drafted(*target, *gpu);
    runs.push_back(generate_with(drafted, prompt, seeded(42), 32, DraftOptions{assistant.get(), 4}));
  }
  EXPECT_EQ(runs[0].tokens.size(), 32u);
  EXPECT_GT(runs[0].stats.rounds, 0);
  EXPECT_EQ(runs[1].tokens, runs[0].tokens);
}

// Replayed draft steps (Drafter::replay_steps: CUDA graphs) give the eager steps' drafts and logits
// bit for bit, at every position, pending token and seed: a recording reads the inputs uploaded
// before each replay. Rounds of 4 drafts, then of 2 (another recording).
TEST(CudaSpeculativeSession, ReplayedDraftStepsGiveTheEagerDrafts) {
  auto gpu = test::cuda_backend_or_null();
  G4_SKIP_OR_FAIL_WITHOUT_GPU(gpu);
  const std::unique_ptr<Gemma4> target = load_model(kTargetDir, *gpu);
  const std::unique_ptr<Gemma4Assistant> assistant = load_assistant(kAssistantDir, *gpu, target->config());
  Session s(*target, *gpu);
  s.prefill(test::demo_prompt(5, 100));
  const Tensor last_hidden = s.runner().workspace_logits(1).normed;  // the prefill's last row
  std::vector<uint8_t> hidden(last_hidden.row_size());
  gpu->download(last_hidden, hidden.data());
  Drafter eager(*assistant, s.runner(), 1, 1, 4), replayed(*assistant, s.runner(), 1, 1, 4);
  replayed.replay_steps(true);
  const int64_t V = target->config().vocab_size;
  int round = 0;
  for (int64_t drafts : {4, 4, 4, 4, 2, 2, 2}) {
    SCOPED_TRACE("round " + std::to_string(round));
    const DraftRequest request{&s.kv().caches(), int32_t(600 + 37 * round), s.position() - 3 * round, hidden,
                               seeded(uint64_t(100 + round)), drafts};
    ++round;
    std::vector<std::vector<float>> logits;
    std::vector<std::vector<int32_t>> tokens;
    for (Drafter* d : {&eager, &replayed}) {
      const Drafts got = std::move(d->draft(std::span(&request, 1))[0]);
      tokens.push_back(got.tokens);
      logits.emplace_back(size_t(got.rows.count * V));
      for (int64_t i = 0; i < got.rows.count; ++i)
        gpu->download(got.rows.logits.rows_view(got.rows.first + i * got.rows.step, 1), logits.back().data() + i * V);
    }
    EXPECT_EQ(int64_t(tokens[0].size()), drafts);
    EXPECT_EQ(tokens[1], tokens[0]);
    EXPECT_TRUE(logits[1] == logits[0]) << "the replayed steps' logits differ from the eager steps'";
  }
  // Each key's first group runs eagerly (it sizes the buffers), the rest replay.
  EXPECT_EQ(replayed.replayed_groups(), 5);
  EXPECT_EQ(eager.replayed_groups(), 0);
}

}  // namespace
}  // namespace g4
