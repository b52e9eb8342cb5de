// Many sessions on one engine (docs/DESIGN.md §7): sessions never share state, the KV pool keeps
// its byte budget and gives memory back, a conversation's next turn prefills only its new tokens
// (and a partial prefix is reused only when every sliding layer still holds the window before
// it), a new session begins with the cached prefix of its prompt, generation ends for the documented reasons, cancel works, NaN logits fail the call with the
// error users know, bad input is a clear error.
// On the demo model (CPU always; the no-bleed check also on CUDA when a GPU is present).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "backend/backend_factory.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "support/demo_engine.h"
#include "support/fixtures.h"
#include "util/error.h"

namespace g4 {
namespace {

constexpr int64_t kMaxSeqLen = 256;  // the demo's window is 64: the sliding ring holds 128

// The demo engine with room for `sequences` sequences of kMaxSeqLen.
std::unique_ptr<Engine> demo_engine(int64_t sequences, const std::string& backend = "cpu") {
  return test::demo_engine_for(sequences, kMaxSeqLen, backend);
}

SamplingParams sampled(uint64_t seed) {
  return SamplingParams{.temperature = 1.0f, .top_p = 0.95f, .top_k = 40, .seed = seed};
}


GenerationRequest request(std::vector<int32_t> prompt, uint64_t seed, int64_t n) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampler = Sampler(sampled(seed));
  r.max_new_tokens = n;
  r.stop_ids = {};
  return r;
}

std::vector<int32_t> alone(Engine& engine, const GenerationRequest& r) {
  auto session = engine.create_session();
  return generate(*session, r).tokens;
}

// Sessions A and B decoded token by token in turn give exactly what each gives alone.
void expect_no_bleed(Engine& engine) {
  const GenerationRequest a = request(test::demo_prompt(1, 12), 5, 24), b = request(test::demo_prompt(2, 20), 9, 24);
  const std::vector<int32_t> want_a = alone(engine, a), want_b = alone(engine, b);
  ASSERT_NE(want_a, want_b);
  auto sa = engine.create_session(), sb = engine.create_session();
  sa->start(a.prompt);
  sb->start(b.prompt);
  sa->begin_generation(a.sampler, {a.max_new_tokens, {}});
  sb->begin_generation(b.sampler, {b.max_new_tokens, {}});
  std::vector<int32_t> got_a, got_b;
  for (int i = 0; i < 24; ++i) {
    got_a.push_back(sa->next().token);
    got_b.push_back(sb->next().token);
  }
  EXPECT_EQ(got_a, want_a);
  EXPECT_EQ(got_b, want_b);
}

TEST(Sessions, InterleavedSessionsNeverShareState) {
  auto engine = demo_engine(2);
  expect_no_bleed(*engine);
}

TEST(Sessions, InterleavedSessionsNeverShareStateOnCuda) {
  G4_SKIP_OR_FAIL_WITHOUT_GPU(cuda_available());
  auto engine = demo_engine(2, "cuda");
  expect_no_bleed(*engine);
}

TEST(Sessions, KvBudgetIsEnforcedAndMemoryComesBack) {
  auto engine = demo_engine(2);
  KvPool& pool = engine->kv_pool();
  const size_t one = pool.sequence_bytes(kMaxSeqLen);
  const int64_t layers = int64_t(engine->config().layers.size());
  auto s1 = engine->create_session(), s2 = engine->create_session(), s3 = engine->create_session();
  EXPECT_EQ(pool.bytes_reserved(), 0u) << "a session takes its caches when it first runs tokens";
  s1->start(test::demo_prompt(3, 10));
  s2->start(test::demo_prompt(4, 10));
  EXPECT_EQ(pool.bytes_reserved(), 2 * one);
  EXPECT_EQ(pool.pages_in_use(), 2 * layers) << "10 tokens: a page a layer each";
  const std::string error = test::error_of([&] { s3->start(test::demo_prompt(5, 10)); });
  EXPECT_NE(error.find("out of KV memory: " + std::to_string(one) + " bytes requested, " + std::to_string(2 * one) +
                       " of " + std::to_string(2 * one) + " reserved"),
            std::string::npos)
      << error;
  // A destroyed session's memory comes back at once: its reservation, and its pages (none whole:
  // nothing cached).
  s1.reset();
  EXPECT_EQ(pool.bytes_reserved(), one);
  EXPECT_EQ(pool.pages_in_use(), layers);
  EXPECT_EQ(pool.pages_cached(), 0);
  s3->start(test::demo_prompt(5, 10));
  EXPECT_EQ(pool.bytes_reserved(), 2 * one);
  // reset() gives the pages back and keeps the reservation; destroying gives that back too.
  s3->reset();
  EXPECT_EQ(pool.pages_in_use(), layers) << "s2's pages";
  EXPECT_EQ(pool.bytes_reserved(), 2 * one);
  s3.reset();
  EXPECT_EQ(pool.bytes_reserved(), one);
  EXPECT_EQ(pool.pages_free(), pool.pages_total() - layers) << "s2's pages";
  // A sequence larger than the whole budget is refused by name.
  auto small_engine = demo_engine(1);
  auto large = small_engine->create_session(SessionOptions{.max_seq_len = 1024});
  EXPECT_NE(test::error_of([&] { large->start(test::demo_prompt(5, 10)); }).find("more than the whole budget"),
            std::string::npos);
}

TEST(Sessions, NextTurnPrefillsOnlyTheNewTokensAndMatchesAFreshSession) {
  auto engine = demo_engine(1);
  const std::vector<int32_t> first = test::demo_prompt(4, 16);
  auto session = engine->create_session();
  const GenerationResult one = generate(*session, request(first, 21, 10));
  std::vector<int32_t> whole = first;
  whole.insert(whole.end(), one.tokens.begin(), one.tokens.end());
  const std::vector<int32_t> turn = test::demo_prompt(5, 9);
  whole.insert(whole.end(), turn.begin(), turn.end());
  const GenerationResult second = generate(*session, request(whole, 31, 12));
  EXPECT_EQ(second.prefilled, int64_t(turn.size()) + 1) << "the new turn and the reply's last token";
  auto fresh_engine = demo_engine(1);
  auto fresh = fresh_engine->create_session();
  const GenerationResult want = generate(*fresh, request(whole, 31, 12));
  EXPECT_EQ(want.prefilled, int64_t(whole.size()));
  EXPECT_EQ(second.tokens, want.tokens);
}

// A new session whose prompt begins with a finished one's tokens begins with its cached pages: all
// whole share units of them (KvPool::share_unit), and gives a fresh session's tokens.
TEST(Sessions, ANewSessionBeginsWithTheCachedPrefix) {
  auto engine = demo_engine(1);
  const int64_t unit = engine->kv_pool().share_unit();
  const std::vector<int32_t> first = test::demo_prompt(4, int(2 * unit + 5));
  std::vector<int32_t> whole = first;
  {
    auto session = engine->create_session();
    const GenerationResult one = generate(*session, request(first, 21, 10));
    whole.insert(whole.end(), one.tokens.begin(), one.tokens.end() - 1);  // the last one was not fed
  }
  whole.push_back(9);
  const int64_t cached = int64_t(whole.size() - 1) / unit * unit;
  EXPECT_EQ(engine->kv_pool().cached_prefix(kMaxSeqLen, whole), cached);
  const GenerationResult got = generate(*engine->create_session(), request(whole, 31, 12));
  EXPECT_EQ(got.prefilled, int64_t(whole.size()) - cached);
  auto fresh_engine = demo_engine(1);
  EXPECT_EQ(got.tokens, alone(*fresh_engine, request(whole, 31, 12)));
}

TEST(Sessions, DroppedPrefixesAreNotReused) {
  auto engine = demo_engine(1);
  const std::vector<int32_t> first = test::demo_prompt(4, int(2 * engine->kv_pool().share_unit() + 5));
  generate(*engine->create_session(), request(first, 21, 10));
  std::vector<int32_t> longer = first;
  longer.push_back(7);
  ASSERT_GT(engine->kv_pool().cached_prefix(kMaxSeqLen, longer), 0);
  engine->kv_pool().drop_cached();
  EXPECT_EQ(engine->kv_pool().cached_prefix(kMaxSeqLen, longer), 0);
  EXPECT_EQ(engine->kv_pool().pages_cached(), 0);
  EXPECT_EQ(generate(*engine->create_session(), request(longer, 21, 4)).prefilled, int64_t(longer.size()));
}

TEST(Sessions, PartialPrefixIsReusedOnlyWhileThePagesHoldTheWindow) {
  auto engine = demo_engine(1);
  KvPool& pool = engine->kv_pool();
  const int64_t window = engine->config().sliding_window;
  ASSERT_EQ(window, 64);
  const std::vector<int32_t> cached = test::demo_prompt(6, 200);
  // Diverging at p: the prompt's last token always runs.
  auto diverging_at = [&](int64_t p) {
    std::vector<int32_t> prompt(cached.begin(), cached.begin() + p);
    for (int i = 0; i < 20; ++i) prompt.push_back(int32_t(4000 + i));
    return prompt;
  };
  {
    // Prefilled in chunks of 2 * window: the last forward, at 128, freed the sliding pages wholly
    // before its window (128 - 64 + 1 = 65), so the first held position is 65 rounded down to a page.
    KvSequence kv = pool.acquire(kMaxSeqLen);
    ModelRunner& runner = engine->runner();
    for (int64_t at = 0; at < 200; at += 128) {
      const SequenceChunk chunk{&kv, std::span(cached).subspan(size_t(at), size_t(std::min<int64_t>(128, 200 - at))), 1};
      runner.forward(std::span(&chunk, 1), runner.workspace_logits(1));
    }
    const KvPageLayout layout = kv_page_layout(engine->config(), runner.kv_pool().layer_dtypes(), kMaxSeqLen);
    int64_t first_held = 0;
    for (size_t i = 0; i < layout.page_positions.size(); ++i)
      if (engine->config().layers[i].sliding)
        first_held = std::max(first_held, 65 / layout.page_positions[i] * layout.page_positions[i]);
    const int64_t first_usable = first_held + window - 1;
    EXPECT_EQ(pool.usable_prefix(kv, diverging_at(first_usable)), first_usable) << "first held " << first_held;
    EXPECT_EQ(pool.usable_prefix(kv, diverging_at(first_usable - 1)), 0) << "its window starts before the pages held";
    EXPECT_EQ(pool.usable_prefix(kv, cached), 199) << "the last token is prefilled for its logits";
    EXPECT_EQ(pool.usable_prefix(kv, std::vector<int32_t>{cached[0]}), 0);
  }

  // A session continuing from its own tokens: at 150 it keeps them, at 100 it cannot (it may still
  // begin with cached pages); either way the tokens are a fresh prefill's.
  for (int64_t p : {150, 100}) {
    pool.drop_cached();  // the session prefills `cached` itself, in chunks from 0 as above
    auto session = engine->create_session();
    session->start(cached);
    const std::vector<int32_t> prompt = diverging_at(p);
    const GenerationResult got = generate(*session, request(prompt, 41, 8));
    if (p == 150) EXPECT_EQ(got.prefilled, int64_t(prompt.size()) - p);
    else EXPECT_GT(got.prefilled, int64_t(prompt.size()) - p);
    auto fresh_engine = demo_engine(1);
    EXPECT_EQ(got.tokens, alone(*fresh_engine, request(prompt, 41, 8))) << "p " << p;
  }
}

TEST(Sessions, GenerationEndsForTheDocumentedReasons) {
  auto engine = demo_engine(2);
  auto session = engine->create_session();
  // Max tokens: the third token is the last.
  session->start(test::demo_prompt(7, 10));
  session->begin_generation(Sampler(sampled(1)), {3, {}});
  EXPECT_EQ(session->next().stop, StopReason::kNone);
  EXPECT_EQ(session->next().stop, StopReason::kNone);
  const DecodedToken third = session->next();
  EXPECT_EQ(third.stop, StopReason::kMaxTokens);
  EXPECT_NE(test::error_of([&] { session->next(); }).find("the generation has ended"), std::string::npos);
  // A stop id: the greedy first token, made a stop id, ends the generation at once.
  session->start(test::demo_prompt(7, 10));
  session->begin_generation(Sampler(SamplingParams{.temperature = 0.0f}), {5, {}});
  const int32_t greedy = session->next().token;
  session->start(test::demo_prompt(7, 10));
  session->begin_generation(Sampler(SamplingParams{.temperature = 0.0f}), {5, {greedy}});
  EXPECT_EQ(session->next().stop, StopReason::kStopToken);
  // Context full: 60 prompt tokens in a context of 64 leave room to feed four drawn tokens.
  auto small = engine->create_session(SessionOptions{.max_seq_len = 64});
  small->start(test::demo_prompt(8, 60));
  small->begin_generation(Sampler(sampled(2)), {100, {}});
  int drawn = 1;
  while (small->next().stop == StopReason::kNone) ++drawn;
  EXPECT_EQ(drawn, 5);
  EXPECT_EQ(small->position(), 64);
}

TEST(Sessions, CancelStopsBeforeTheNextToken) {
  auto engine = demo_engine(1);
  auto session = engine->create_session();
  session->start(test::demo_prompt(9, 10));
  session->begin_generation(Sampler(sampled(3)), {50, {}});
  session->next();
  session->next();
  const int64_t position = session->position();
  session->cancel();
  const DecodedToken cancelled = session->next();
  EXPECT_EQ(cancelled.stop, StopReason::kCancelled);
  EXPECT_EQ(cancelled.token, -1);
  EXPECT_EQ(session->position(), position) << "nothing ran after the cancel";
  // A new generation is not cancelled.
  session->start(test::demo_prompt(9, 10));
  session->begin_generation(Sampler(sampled(3)), {2, {}});
  EXPECT_EQ(session->next().stop, StopReason::kNone);
}

// A NaN in a single sequence's logits fails the call with the error users have always seen, through
// every single-sequence path (Session::next, generate, Engine::forward); the scheduler instead
// fails that sequence alone (tests/test_scheduler.cpp). The fault is real: the embedding row of a
// token in the prompt is NaN.
TEST(Sessions, NanLogitsFailTheCallWithTheSameMessage) {
  constexpr int32_t kPoisoned = 4095;
  auto engine = test::demo_engine_for(2, kMaxSeqLen, "cpu", test::nan_embedding_demo_path(kPoisoned));
  std::vector<int32_t> prompt = test::demo_prompt(3, 10);
  ASSERT_EQ(std::count(prompt.begin(), prompt.end(), kPoisoned), 0);
  EXPECT_EQ(alone(*engine, request(prompt, 1, 4)).size(), 4u) << "a prompt without the token runs";
  prompt.insert(prompt.begin() + 4, kPoisoned);
  const std::string nan_error = "model produced NaN logits";
  auto session = engine->create_session();
  session->start(prompt);
  session->begin_generation(Sampler(sampled(1)), {4, {}});
  EXPECT_EQ(test::error_of([&] { session->next(); }), nan_error);
  EXPECT_EQ(test::error_of([&] { alone(*engine, request(prompt, 1, 4)); }), nan_error);
  std::vector<int32_t> positions(prompt.size());
  std::iota(positions.begin(), positions.end(), 0);
  EXPECT_EQ(test::error_of([&] { engine->forward(*session, prompt, positions, Sampler(sampled(1))); }), nan_error);
}

TEST(Sessions, BadInputIsAClearError) {
  auto engine = demo_engine(1);
  auto session = engine->create_session();
  EXPECT_NE(test::error_of([&] { session->start({}); }).find("empty prompt"), std::string::npos);
  EXPECT_NE(test::error_of([&] { session->start(std::vector<int32_t>{2, 4096}); })
                .find("token id 4096 at index 1 is out of range [0, 4096)"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { session->start(test::demo_prompt(1, 300)); }).find("context full (256 tokens)"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { Sampler(SamplingParams{.top_p = 0.0f}); }).find("top_p must be in (0, 1]"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { session->begin_generation(Sampler(sampled(1)), {1, {}}); }).find("prefill a prompt first"),
            std::string::npos);
  session->start(test::demo_prompt(1, 5));
  EXPECT_NE(test::error_of([&] { session->begin_generation(Sampler(sampled(1)), {0, {}}); })
                .find("max_new_tokens must be >= 1, got 0"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { session->next(); }).find("no generation begun"), std::string::npos);
  EXPECT_EQ(session->position(), 5) << "rejected calls change nothing";
}

}  // namespace
}  // namespace g4
