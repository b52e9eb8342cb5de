// Paged KV caches (docs/DESIGN.md §7): attention through a page table gives the bits of attention
// over one contiguous cache, on the CPU and on CUDA; a sequence's pages follow its length (a
// sliding layer's only its window); a sequence's tokens do not depend on where its pages lie; kept
// prefixes give their pages back, least recently used first, when a live sequence needs them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend_factory.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "runtime/scheduler.h"
#include "support/build_kind.h"
#include "support/demo_engine.h"
#include "support/fixtures.h"
#include "util/error.h"
#include "util/half.h"

namespace g4 {
namespace {

constexpr int64_t kMaxSeqLen = 1024;  // a context well past the sliding ring


std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// A backend tensor holding `values` in the backend's activation type (bf16 on CUDA).
Tensor activation(Backend& be, int64_t rows, int64_t cols, const std::vector<float>& values) {
  Tensor t = be.alloc(be.activation_dtype(), rows, cols);
  if (t.dtype == DType::F32) {
    be.upload(values.data(), t);
  } else {
    std::vector<uint16_t> h(values.size());
    for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_bf16(values[i]);
    be.upload(h.data(), t);
  }
  return t;
}

std::vector<uint8_t> bytes_of(Backend& be, const Tensor& t) {
  std::vector<uint8_t> out(t.bytes());
  be.download(t, out.data());
  return out;
}

// One layer's attention, chunk after chunk (a prompt in pieces, then decode steps), over a paged
// cache whose pages lie in shuffled order with a ring of `slots` pages, and over one contiguous
// cache: every chunk's output must be the same bits.
void expect_paged_equals_contiguous(const std::string& backend_name, int window) {
  std::unique_ptr<Backend> be = make_backend(backend_name);
  const int heads = 4, kv_heads = 2, head_dim = 64, page_positions = 8;
  const int64_t kv_cols = int64_t(kv_heads) * head_dim, q_cols = int64_t(heads) * head_dim;
  const std::vector<int64_t> chunks = {5, 19, 1, 1, 40, 1, 1, 1, 33, 1, 1};
  const int64_t total = std::accumulate(chunks.begin(), chunks.end(), int64_t(0));
  const int64_t largest = *std::max_element(chunks.begin(), chunks.end());
  // The pool's rule (kv_page_layout): a ring holds the window and the largest chunk.
  const int64_t slots = window ? (window + largest + page_positions - 1) / page_positions + 1
                               : (total + page_positions - 1) / page_positions;
  const int64_t pages = 3 * slots;  // more pages than the table names: others lie between
  const int64_t stride = 2 * page_positions;
  Tensor arena = be->alloc(be->activation_dtype(), pages * stride, kv_cols);
  KvCache paged{arena, arena.rows_view(page_positions, arena.rows - page_positions),
                be->alloc(DType::I32, slots, 1), page_positions, stride};
  std::vector<int32_t> order(static_cast<size_t>(pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  std::vector<int32_t> table(order.begin(), order.begin() + slots);
  be->upload(table.data(), paged.table);
  const KvCache contiguous = one_page_kv_cache(*be, be->activation_dtype(), window ? 3 * window : total, kv_cols);

  int64_t pos = 0;
  uint32_t seed = 1;
  for (int64_t T : chunks) {
    std::vector<int32_t> p(static_cast<size_t>(T));
    std::iota(p.begin(), p.end(), int32_t(pos));
    Tensor positions = be->alloc(DType::I32, T, 1);
    be->upload(p.data(), positions);
    const Tensor q = activation(*be, T, q_cols, random_floats(size_t(T * q_cols), seed++));
    const Tensor k = activation(*be, T, kv_cols, random_floats(size_t(T * kv_cols), seed++));
    const Tensor v = activation(*be, T, kv_cols, random_floats(size_t(T * kv_cols), seed++));
    std::vector<uint8_t> outs[2];
    for (int i = 0; i < 2; ++i) {
      AttentionArgs a;
      a.q = q, a.k_new = k, a.v_new = v, a.positions = positions;
      a.cache = i == 0 ? &paged : &contiguous;
      a.heads = heads, a.kv_heads = kv_heads, a.head_dim = head_dim, a.window = window;
      a.scale = 0.125f;
      a.out = be->alloc(be->activation_dtype(), T, q_cols);
      be->attention(a);
      outs[i] = bytes_of(*be, a.out);
    }
    ASSERT_EQ(outs[0], outs[1]) << backend_name << ", window " << window << ": the chunk of " << T << " at " << pos;
    pos += T;
  }
}

TEST(KvPages, PagedAttentionIsContiguousAttentionBitForBit) {
  for (int window : {0, 24}) expect_paged_equals_contiguous("cpu", window);
}

TEST(KvPages, PagedAttentionIsContiguousAttentionBitForBitOnCuda) {
  G4_SKIP_OR_FAIL_WITHOUT_GPU(cuda_available());
  for (int window : {0, 24}) expect_paged_equals_contiguous("cuda", window);
}

// A sequence holds the pages of the positions it stored: every full layer's up to its length, a
// sliding layer's from the window of its last forward on; given back with no tokens, all of them.
TEST(KvPages, ASequencesPagesFollowItsLength) {
  auto engine = test::demo_engine_for(2, kMaxSeqLen, "cpu", test::embedded_demo_path());
  const ModelConfig& c = engine->config();
  KvPool& pool = engine->kv_pool();
  const KvPageLayout layout = kv_page_layout(c, pool.layer_dtypes(), kMaxSeqLen);
  auto expected_pages = [&](int64_t length, int64_t last_forward_at) {
    int64_t pages = 0;
    for (size_t i = 0; i < c.layers.size(); ++i) {
      const int64_t B = layout.page_positions[i];
      const int64_t first = c.layers[i].sliding ? std::max<int64_t>(0, last_forward_at - c.sliding_window + 1) / B : 0;
      pages += (length - 1) / B - first + 1;
    }
    return pages;
  };
  KvSequence kv = pool.acquire(kMaxSeqLen);
  EXPECT_EQ(kv.pages_held(), 0);
  ModelRunner& runner = engine->runner();
  const std::vector<int32_t> tokens = test::demo_prompt(3, 230);
  int64_t at = 0;
  for (int64_t n : {10, 90, 1, 1, 128}) {
    const SequenceChunk chunk{&kv, std::span(tokens).subspan(size_t(at), size_t(n)), 1};
    runner.forward(std::span(&chunk, 1), runner.workspace_logits(1));
    EXPECT_EQ(kv.pages_held(), expected_pages(at + n, at)) << "after " << at + n << " tokens";
    at += n;
  }
  EXPECT_LT(kv.pages_held() * int64_t(pool.page_bytes()), int64_t(kv.reserved_bytes())) << "less than its reservation";
  const int64_t available_before = pool.pages_available();
  kv.give_back();
  EXPECT_EQ(pool.pages_in_use(), 0);
  EXPECT_EQ(pool.pages_available(), pool.pages_total());
  EXPECT_GT(pool.pages_cached(), 0) << "its written pages stay cached";
  pool.drop_cached();
  EXPECT_EQ(pool.pages_free(), pool.pages_total());
  EXPECT_GT(pool.pages_free(), available_before);
}

// Greedy and seeded tokens of a request alone in a fresh engine, and in an engine whose pages
// other sessions scattered first (held, kept, released): the same.
TEST(KvPages, TokensDoNotDependOnWherePagesLie) {
  const std::vector<int32_t> prompt = test::demo_prompt(11, 150);
  auto generate_in = [&](Engine& engine, uint64_t seed) {
    GenerationRequest r;
    r.prompt = prompt;
    r.sampler = Sampler(seed ? SamplingParams{.temperature = 1.0f, .top_k = 40, .seed = seed}
                             : SamplingParams{.temperature = 0.0f});
    r.max_new_tokens = 40;
    r.stop_ids = {};
    return generate(*engine.create_session(), r).tokens;
  };
  for (uint64_t seed : {0u, 42u}) {
    auto fresh = test::demo_engine_for(4, kMaxSeqLen, "cpu", test::embedded_demo_path());
    const std::vector<int32_t> alone = generate_in(*fresh, seed);
    auto busy = test::demo_engine_for(4, kMaxSeqLen, "cpu", test::embedded_demo_path());
    auto a = busy->create_session(), b = busy->create_session();
    a->start(test::demo_prompt(5, 70));
    b->start(test::demo_prompt(6, 200));
    a.reset();  // kept: its pages stay between b's
    auto c = busy->create_session();
    c->start(test::demo_prompt(7, 33));
    EXPECT_EQ(generate_in(*busy, seed), alone) << "seed " << seed;
  }
}

// Cached pages are held by no sequence: a pool full of them gives them to a new sequence, least
// recently released first.
TEST(KvPages, CachedPagesGiveWayLeastRecentlyReleasedFirst) {
  auto engine = test::demo_engine_for(1, kMaxSeqLen, "cpu", test::embedded_demo_path());
  KvPool& pool = engine->kv_pool();
  // Finished sequences of 200 tokens, no two with a common prefix, until the next would not fit in
  // the free pages.
  auto unrelated = [](int32_t first) {
    std::vector<int32_t> p = test::demo_prompt(first, 200);
    p[0] = 100 + first;
    return p;
  };
  int32_t first = 20;
  std::vector<std::vector<int32_t>> cached;
  while (true) {
    auto s = engine->create_session();
    const std::vector<int32_t> p = unrelated(first++);
    s->start(p);
    cached.push_back(p);
    if (pool.pages_free() < s->kv().pages_held()) break;
  }
  ASSERT_GE(cached.size(), 2u) << "the pool caches at least two sequences of 200 tokens";
  const int64_t unit = pool.share_unit();
  ASSERT_LE(unit, 150);
  auto next_of = [](std::vector<int32_t> p) {
    p.push_back(7);
    return p;
  };
  EXPECT_EQ(pool.cached_prefix(kMaxSeqLen, next_of(cached.front())), 200 / unit * unit);
  EXPECT_EQ(pool.pages_in_use(), 0);
  auto s = engine->create_session();
  s->start(unrelated(first));
  EXPECT_GT(pool.pages_in_use(), 0);
  // The oldest went first: the newest is still there, and a prompt continuing it reuses it.
  EXPECT_EQ(pool.cached_prefix(kMaxSeqLen, next_of(cached.back())), 200 / unit * unit);
  EXPECT_EQ(pool.cached_prefix(kMaxSeqLen, next_of(cached.front())), 0);
}

// Requests of the demo model through a scheduler: greedy and seeded, each `gen` tokens.
std::vector<SchedulerRequest> chats(const std::vector<std::vector<int32_t>>& prompts, int64_t gen) {
  std::vector<SchedulerRequest> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SchedulerRequest r;
    r.prompt = prompts[i];
    r.sampling = i % 2 ? SamplingParams{.temperature = 0.9f, .top_k = 30, .seed = 500 + i}
                       : SamplingParams{.temperature = 0.0f};
    r.max_new_tokens = gen;
    r.stop_ids = {};
    out.push_back(r);
  }
  return out;
}

// Each request alone on a fresh engine.
std::vector<std::vector<int32_t>> alone(const std::vector<SchedulerRequest>& rs, const std::string& backend = "cpu",
                                        int64_t max_seq_len = kMaxSeqLen) {
  std::vector<std::vector<int32_t>> out;
  for (const SchedulerRequest& r : rs) {
    auto engine = test::demo_engine_for(1, max_seq_len, backend, test::embedded_demo_path());
    Scheduler scheduler(engine->runner());
    scheduler.add(r);
    std::vector<int32_t>& tokens = out.emplace_back();
    while (!scheduler.idle())
      for (const SequenceEvent& e : scheduler.step()) tokens.push_back(e.drawn.token);
  }
  return out;
}

// Two chats with the same system prompt: the second, arriving while the first decodes, begins with
// the first's pages (shared, held once) and both give the tokens each gives alone.
TEST(KvPages, TwoChatsSharingASystemPromptHoldItOnce) {
  auto engine = test::demo_engine_for(2, kMaxSeqLen, "cpu", test::embedded_demo_path());
  KvPool& pool = engine->kv_pool();
  const int64_t unit = pool.share_unit();
  const std::vector<int32_t> system = test::demo_prompt(41, int(2 * unit + 9));
  std::vector<int32_t> a = system, b = system;
  for (int32_t t : {300, 301, 302}) a.push_back(t);
  for (int32_t t : {400, 401}) b.push_back(t);
  const std::vector<SchedulerRequest> rs = chats({a, b}, 24);
  const std::vector<std::vector<int32_t>> want = alone(rs);

  Scheduler scheduler(engine->runner());
  std::map<RequestId, std::vector<int32_t>> got;
  auto step = [&] {
    for (const SequenceEvent& e : scheduler.step()) got[e.id].push_back(e.drawn.token);
  };
  const RequestId first = scheduler.add(rs[0]);
  for (int i = 0; i < 3; ++i) step();
  const RequestId second = scheduler.add(rs[1]);
  step();
  // The system prompt's whole shared units are held once: every layer's pages of 2 * unit positions.
  int64_t shared = 0;
  const KvPageLayout layout = kv_page_layout(engine->config(), engine->kv_pool().layer_dtypes(), kMaxSeqLen);
  for (int64_t b_positions : layout.page_positions) shared += 2 * unit / b_positions;
  EXPECT_EQ(pool.pages_shared(), shared);
  EXPECT_LT(pool.pages_in_use(), 2 * pool.pages_for_positions(kMaxSeqLen, int64_t(b.size()) + 1))
      << "less than two unshared sequences";
  while (!scheduler.idle()) step();
  EXPECT_EQ(got[first], want[0]);
  EXPECT_EQ(got[second], want[1]);
  EXPECT_EQ(pool.pages_in_use(), 0);
  EXPECT_EQ(pool.pages_shared(), 0);
}

// More sequences than the pool holds at their full length: running ones outgrow the pool, the
// youngest is preempted (its pages to host memory) and resumes later; every request gives the tokens
// it gives alone (on CUDA too: a swapped page comes back with its bits, and the batch-invariant
// scheduler's batches do not change a row), and the pool is empty at the end.
void expect_preempted_sequences_give_their_tokens_alone(const std::string& backend) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(test::demo_prompt(60 + 13 * i, 30 + 7 * i));
  const int64_t gen = 100, context = 256;
  const std::vector<SchedulerRequest> rs = chats(prompts, gen);
  const std::vector<std::vector<int32_t>> want = alone(rs, backend, context);

  // A pool of two sequences' most pages: every request fits alone, six at full length do not.
  auto engine = test::demo_engine_for(2, context, backend, test::embedded_demo_path());
  KvPool& pool = engine->kv_pool();
  ASSERT_LT(pool.pages_total(), 6 * pool.pages_for_positions(context, 30 + gen));
  Scheduler scheduler(engine->runner());
  std::map<RequestId, std::vector<int32_t>> got;
  std::vector<RequestId> ids;
  for (const SchedulerRequest& r : rs) ids.push_back(scheduler.add(r));
  int64_t steps = 0, most_running = 0;
  while (!scheduler.idle() && steps++ < 5000) {
    for (const SequenceEvent& e : scheduler.step()) got[e.id].push_back(e.drawn.token);
    most_running = std::max(most_running, int64_t(scheduler.running()));
  }
  EXPECT_GT(scheduler.preemptions(), 0) << "the pool was outgrown";
  EXPECT_GE(most_running, 3) << "admission by the pages needed now runs more than the pool's full-length count";
  for (size_t i = 0; i < rs.size(); ++i) EXPECT_EQ(got[ids[i]], want[i]) << "request " << i;
  EXPECT_EQ(pool.pages_in_use(), 0);
}

TEST(KvPages, PreemptedSequencesGiveTheirTokensAlone) { expect_preempted_sequences_give_their_tokens_alone("cpu"); }

TEST(KvPages, PreemptedSequencesGiveTheirTokensAloneOnCuda) {
  G4_SKIP_OR_FAIL_WITHOUT_GPU(cuda_available());
  expect_preempted_sequences_give_their_tokens_alone("cuda");
}

// A swapped-out sequence is host data: swapped in twice, it gives two sequences of their own, and in
// one forward each goes on as the original would (with a table shared between them, the forward
// would read one copy's pages for both).
TEST(KvPages, CopiesOfASwappedSequenceGoOnAlone) {
  auto engine = test::demo_engine_for(3, kMaxSeqLen, "cpu", test::embedded_demo_path(), 2);
  ModelRunner& runner = engine->runner();
  KvPool& pool = runner.kv_pool();
  const int64_t vocab = engine->config().vocab_size;
  const std::vector<int32_t> prompt = test::demo_prompt(7, 200);  // one forward
  auto prefilled = [&] {
    KvSequence kv = pool.start(kMaxSeqLen, prompt);
    const SequenceChunk chunk{&kv, std::span<const int32_t>(prompt).subspan(size_t(kv.position())), 0};
    runner.forward(std::span(&chunk, 1), runner.workspace_logits(1));
    return kv;
  };
  const std::vector<int32_t> next = {300, 400};
  // The next logits of the chunks' sequences, one row each.
  auto next_logits = [&](std::span<const SequenceChunk> chunks) {
    const LogitsOutput out = runner.workspace_logits(int64_t(chunks.size()));
    runner.forward(chunks, out);
    std::vector<float> logits(chunks.size() * size_t(vocab));
    runner.download_result(out.logits, logits.data());
    return logits;
  };
  std::vector<float> want;
  for (size_t i = 0; i < next.size(); ++i) {
    KvSequence alone = prefilled();
    const SequenceChunk chunk{&alone, std::span(&next[i], 1), 1};
    const std::vector<float> row = next_logits(std::span(&chunk, 1));
    want.insert(want.end(), row.begin(), row.end());
  }
  pool.drop_cached();  // the copies' pages come from the image, not from the prefix cache

  const SwappedSequence image = pool.swap_out(prefilled());
  EXPECT_EQ(pool.pages_in_use(), 0);
  KvSequence a = pool.swap_in(image), b = pool.swap_in(image);
  EXPECT_EQ(a.position(), int64_t(prompt.size()));
  const std::vector<SequenceChunk> chunks = {{&a, std::span(&next[0], 1), 1}, {&b, std::span(&next[1], 1), 1}};
  EXPECT_EQ(next_logits(chunks), want);
  EXPECT_EQ(pool.pages_in_use(), a.pages_held() + b.pages_held());
}

// 1 024 requests queued at once on a pool of a few sequences: all finish, and the pool is empty.
TEST(KvPages, AThousandQueuedRequestsAllFinish) {
  const int n = test::kSanitizerBuild ? 256 : 1024;
  auto engine = test::demo_engine_for(4, kMaxSeqLen, "cpu", test::embedded_demo_path());
  KvPool& pool = engine->kv_pool();
  Scheduler scheduler(engine->runner(), SchedulerOptions{.max_waiting = size_t(n)});
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) prompts.push_back(test::demo_prompt(i, 3 + i % 40));
  std::map<RequestId, int64_t> tokens;
  for (const SchedulerRequest& r : chats(prompts, 3)) scheduler.add(r);
  int64_t steps = 0;
  while (!scheduler.idle() && steps++ < 20000)
    for (const SequenceEvent& e : scheduler.step()) {
      EXPECT_EQ(e.error, "");
      ++tokens[e.id];
    }
  EXPECT_TRUE(scheduler.idle());
  EXPECT_EQ(tokens.size(), size_t(n));
  for (const auto& [id, count] : tokens) EXPECT_EQ(count, 3) << "request " << id;
  EXPECT_EQ(pool.pages_in_use(), 0);
  EXPECT_EQ(pool.pages_available(), pool.pages_total());
}

// Every request that fits the context fits the pool: a pool smaller than one sequence of
// max_seq_len is refused when the engine is made, naming the bytes.
TEST(KvPages, APoolSmallerThanOneSequenceIsAClearError) {
  EngineOptions o;
  o.model_path = test::embedded_demo_path();
  o.max_seq_len = kMaxSeqLen;
  const size_t one = Engine(o).kv_pool().sequence_bytes(kMaxSeqLen);
  o.kv_budget_bytes = one - 1;
  const std::string error = test::error_of([&] { Engine engine(o); });
  EXPECT_NE(error.find("out of KV memory"), std::string::npos) << error;
  EXPECT_NE(error.find(std::to_string(one) + " bytes"), std::string::npos) << error;
  EXPECT_EQ(test::error_kind_of([&] { Engine engine(o); }), ErrorKind::kResourceExhausted);
}

}  // namespace
}  // namespace g4
