// The CPU backend against transformers' own Gemma 4 logits (docs/DESIGN.md §6: max |Δlogit| <= 1e-3),
// computed three ways: one prefill, token-by-token decode, and every chunk size 1..2*window; and
// the contracts of backend ops that the fixtures alone would not pin down.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "model/hf_checkpoint.h"
#include "format/safetensors.h"
#include "model/loader.h"
#include "runtime/session.h"
#include "sampling/speculative.h"
#include "support/build_kind.h"
#include "support/draft_cases.h"
#include "support/fixtures.h"
#include "support/row_copies.h"

namespace g4 {
namespace {

constexpr double kTolerance = 1e-3;

class CpuReference : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ref_ = test::load_reference(GetParam());
    model_ = load_model(ref_.dir, backend_);
  }
  Session new_session() {
    SessionOptions o;
    o.max_seq_len = ref_.positions + 1;
    return Session(*model_, backend_, o);
  }
  CpuBackend backend_{2};
  test::Reference ref_;
  std::unique_ptr<Gemma4> model_;
};

TEST_P(CpuReference, OnePrefillMatchesEveryPosition) {
  Session s = new_session();
  EXPECT_LE(test::max_abs_diff(s.logits_all(ref_.tokens), ref_.logits), kTolerance);
}

TEST_P(CpuReference, TokenByTokenDecodeMatches) {
  Session s = new_session();
  std::vector<float> got;
  for (int32_t id : ref_.tokens) {
    s.decode(id);
    auto row = s.last_logits_host();
    got.insert(got.end(), row.begin(), row.end());
  }
  EXPECT_LE(test::max_abs_diff(got, ref_.logits), kTolerance);
}

TEST_P(CpuReference, EveryChunkSizeMatches) {
  const int64_t max_chunk = 2 * model_->config().sliding_window;
  for (int64_t chunk = 1; chunk <= max_chunk; ++chunk) {
    Session s = new_session();
    ASSERT_EQ(s.max_prefill_chunk(), max_chunk);
    EXPECT_LE(test::max_abs_diff(s.logits_all(ref_.tokens, chunk), ref_.logits), kTolerance) << "chunk " << chunk;
  }
}

TEST_P(CpuReference, ChunkedPrefillLeavesTheLastLogits) {
  Session s = new_session();
  s.prefill(ref_.tokens);
  auto last = s.last_logits_host();
  std::vector<float> want(ref_.logits.end() - ref_.vocab, ref_.logits.end());
  EXPECT_LE(test::max_abs_diff(last, want), kTolerance);
  s.reset();
  EXPECT_EQ(s.position(), 0);
  s.prefill(ref_.tokens);
  EXPECT_LE(test::max_abs_diff(s.last_logits_host(), want), kTolerance) << "after reset";
  // prefill runs the earlier chunks for their K/V only and the last layer for one row only: the
  // same last row as a forward that computes every position.
  Session all = new_session();
  const std::vector<float> every = all.logits_all(ref_.tokens, s.max_prefill_chunk());
  EXPECT_LE(test::max_abs_diff(last, std::vector<float>(every.end() - ref_.vocab, every.end())), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CpuReference,
                         ::testing::Values("tiny-31b-style", "tiny-31b-style-bf16", "published-layout",
                                           "real-head-dims"));

// Backend::matmuls (the q/k/v projections of one input) equals one matmul per weight, and a
// missing output is an error, not an out-of-range write.
// Attention of the chunk's last queries only (AttentionArgs::q_first): the same rows as with every
// query, the same K/V stored; q or out of another length is an error.
TEST(CpuBackendOps, AttentionOfTheChunksLastQueries) {
  CpuBackend be(2);
  const int64_t T = 6, heads = 2, hd = 4, cap = 8;
  std::vector<float> qv(static_cast<size_t>(T * heads * hd)), kv(static_cast<size_t>(T * hd)),
      vv(static_cast<size_t>(T * hd));
  for (size_t i = 0; i < qv.size(); ++i) qv[i] = std::sin(0.37f * float(i));
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = std::cos(0.23f * float(i)), vv[i] = std::sin(0.11f * float(i) + 1.0f);
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) pos[size_t(i)] = int32_t(i);
  auto tensor = [&](DType dtype, int64_t rows, int64_t cols, const void* data) {
    Tensor t = be.alloc(dtype, rows, cols);
    be.upload(data, t);
    return t;
  };
  const Tensor q = tensor(DType::F32, T, heads * hd, qv.data()), k = tensor(DType::F32, T, hd, kv.data());
  const Tensor v = tensor(DType::F32, T, hd, vv.data()), positions = tensor(DType::I32, T, 1, pos.data());
  // Attention of queries `queries` (the chunk's tokens [q_first, T)) over a sliding window of 4.
  auto args_for = [&](int64_t q_first, const Tensor& queries, KvCache& cache) {
    AttentionArgs a;
    a.q = queries;
    a.k_new = k;
    a.v_new = v;
    a.cache = &cache;
    a.positions = positions;
    a.heads = int(heads);
    a.kv_heads = 1;
    a.head_dim = int(hd);
    a.window = 4;
    a.out = be.alloc(DType::F32, queries.rows, heads * hd);
    a.q_first = q_first;
    return a;
  };
  auto new_cache = [&] { return one_page_kv_cache(be, DType::F32, cap, hd); };
  // out and the cache's keys, to compare.
  auto run = [&](int64_t q_first, std::vector<float>& out, std::vector<float>& cache_k) {
    KvCache cache = new_cache();
    const AttentionArgs a = args_for(q_first, q.rows_view(q_first, T - q_first), cache);
    be.attention(a);
    out.resize(size_t(a.out.numel()));
    if (!out.empty()) be.download(a.out, out.data());
    cache_k.resize(static_cast<size_t>(cap * hd));
    be.download(cache.k, cache_k.data());
  };
  std::vector<float> all, all_cache, last, last_cache, none, none_cache;
  run(0, all, all_cache);
  run(T - 2, last, last_cache);
  run(T, none, none_cache);
  EXPECT_EQ(last, std::vector<float>(all.end() - 2 * heads * hd, all.end()));
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(last_cache, all_cache);
  EXPECT_EQ(none_cache, all_cache);

  KvCache cache = new_cache();
  EXPECT_THROW(be.attention(args_for(T - 2, q, cache)), Error);  // all T rows, but q_first says the last 2
}

// A draft chain's drawn tokens become the next step's ids; a row that drew none feeds id 0; the
// types are checked.
TEST(CpuBackendOps, TokensToIdsFeedZeroForAFailedDraw) {
  CpuBackend be(1);
  const std::vector<int64_t> tokens = {5, kNanLogitsToken, 262143};
  Tensor t = be.alloc(DType::I64, 3, 1), ids = be.alloc(DType::I32, 3, 1);
  be.upload(tokens.data(), t);
  be.tokens_to_ids(t, ids);
  std::vector<int32_t> got(3);
  be.download(ids, got.data());
  EXPECT_EQ(got, (std::vector<int32_t>{5, 0, 262143}));
  EXPECT_THROW(be.tokens_to_ids(ids, t), Error);
  EXPECT_THROW(be.tokens_to_ids(t, be.alloc(DType::I32, 2, 1)), Error);
}

TEST(CpuBackendOps, RowCopiesLandInTheirRows) {
  CpuBackend be(1);
  EXPECT_EQ(test::row_copy_mismatches(be, 9, 5, {7, 0, 3, 8, 4}), 0);
}

// The CPU backend's verdict is judge_drafts's on the drafts gathered from a drafter's rows (here
// request 2 of 3); drafts the rule cannot judge are judge_drafts's errors.
TEST(CpuBackendOps, JudgeDraftsIsTheReferenceVerdictOnADraftersRows) {
  CpuBackend be(1);
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  int stood = 0, fell = 0;
  for (uint32_t s = 0; s < 30; ++s) {
    p.seed = 77 + 10 * s;
    const test::DraftCase c = test::make_draft_case(4, 300, 2, 3, p, 0.6f, s);
    std::vector<int32_t> drafts;
    std::vector<float> q;
    for (int64_t i = 0; i < c.k; ++i) {
      const int64_t row = c.first + i * c.step;
      drafts.push_back(int32_t(c.draft_tokens[size_t(row)]));
      q.insert(q.end(), c.draft_logits.begin() + row * c.vocab, c.draft_logits.begin() + (row + 1) * c.vocab);
    }
    const DraftVerdict want = judge_drafts(c.target, q, drafts, c.vocab, p);
    EXPECT_EQ(test::judge_on(be, c), (test::DraftCaseVerdict{want.accepted, want.token})) << "seed " << p.seed;
    ++(want.accepted == c.k ? stood : fell);
  }
  EXPECT_GT(stood, 0);
  EXPECT_GT(fell, 0);
  test::DraftCase nan = test::make_draft_case(2, 50, 0, 1, p, 0.6f, 1);
  nan.draft_logits[7] = std::nanf("");
  EXPECT_NE(test::error_of([&] { test::judge_on(be, nan); }).find("the drafter's logits hold a NaN"), std::string::npos);
  EXPECT_THROW(be.judge_drafts(be.alloc(DType::F32, 2, 50), DraftRows{be.alloc(DType::I64, 2, 1), be.alloc(DType::F32, 2, 50), 0, 1, 2},
                               be.alloc_sampling_rows(3), be.alloc(DType::I64, 2, 1)),
               Error) << "K + 1 target rows";
}

TEST(CpuBackendOps, MatmulsAreOneMatmulPerWeight) {
  CpuBackend be(2);
  const std::vector<float> xv = {1, 2, 3, 4, -1, 0.5f, 2, -3};  // x [2, 4]
  const std::vector<float> w1v = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 1};  // [3, 4]
  const std::vector<float> w2v = {1, 1, 1, 1};  // [1, 4]
  Tensor x = be.alloc(DType::F32, 2, 4), w1 = be.alloc(DType::F32, 3, 4), w2 = be.alloc(DType::F32, 1, 4);
  be.upload(xv.data(), x);
  be.upload(w1v.data(), w1);
  be.upload(w2v.data(), w2);
  Tensor y1 = be.alloc(DType::F32, 2, 3), y2 = be.alloc(DType::F32, 2, 1);
  const Tensor ws[] = {w1, w2}, ys[] = {y1, y2};
  be.matmuls(x, ws, ys);
  std::vector<float> got1(6), got2(2);
  be.download(y1, got1.data());
  be.download(y2, got2.data());
  EXPECT_EQ(got1, (std::vector<float>{1, 2, 7, -1, 0.5f, -1}));
  EXPECT_EQ(got2, (std::vector<float>{10, -1.5f}));
  EXPECT_THROW(be.matmuls(x, ws, std::span<const Tensor>(ys, 1)), Error);
}

// The matmul kernel takes rows four at a time and K in blocks of eight: each row's product is the
// bits of the same row multiplied alone, and within float rounding of the double-precision sum, for
// row counts and a K that leave every remainder.
TEST(CpuBackendOps, MatmulRowsTakenTogetherAreEachRowAlone) {
  CpuBackend be(2);
  constexpr int64_t T = 7, K = 21, N = 5;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::vector<float> xv(T * K), wv(N * K), gate_v(N * K);
  for (float& v : xv) v = normal(rng);
  for (float& v : wv) v = normal(rng);
  for (float& v : gate_v) v = normal(rng);
  Tensor x = be.alloc(DType::F32, T, K), w = be.alloc(DType::F32, N, K), gate = be.alloc(DType::F32, N, K);
  be.upload(xv.data(), x);
  be.upload(wv.data(), w);
  be.upload(gate_v.data(), gate);
  Tensor y = be.alloc(DType::F32, T, N), g = be.alloc(DType::F32, T, N);
  be.matmul(x, w, y);
  be.gated_gelu(x, gate, w, g);
  std::vector<float> all(T * N), all_gated(T * N), one(N), one_gated(N);
  be.download(y, all.data());
  be.download(g, all_gated.data());
  for (int64_t t = 0; t < T; ++t) {
    Tensor y1 = be.alloc(DType::F32, 1, N), g1 = be.alloc(DType::F32, 1, N);
    be.matmul(x.rows_view(t, 1), w, y1);
    be.gated_gelu(x.rows_view(t, 1), gate, w, g1);
    be.download(y1, one.data());
    be.download(g1, one_gated.data());
    for (int64_t n = 0; n < N; ++n) {
      double want = 0;
      for (int64_t k = 0; k < K; ++k) want += double(xv[size_t(t * K + k)]) * wv[size_t(n * K + k)];
      EXPECT_NEAR(all[size_t(t * N + n)], want, 1e-6 * std::max(1.0, std::abs(want))) << "row " << t << ", col " << n;
      EXPECT_EQ(all[size_t(t * N + n)], one[size_t(n)]) << "row " << t << ", col " << n;
      EXPECT_EQ(all_gated[size_t(t * N + n)], one_gated[size_t(n)]) << "row " << t << ", col " << n;
    }
  }
}

// The matmul kernel is built without per-access sanitizer checks (backend/cpu/hot_loop.h); under
// ASan it checks its ranges itself, so an output tensor larger than its buffer still aborts.
TEST(CpuBackendOpsDeathTest, AMatmulPastItsOutputBufferIsCaughtUnderAsan) {
  if (!test::kSanitizerBuild) GTEST_SKIP() << "needs the AddressSanitizer build (tools/ci/sanitize.sh)";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  CpuBackend be(1);
  constexpr int64_t T = 3, K = 16, N = 8;
  Tensor x = be.alloc(DType::F32, T, K), w = be.alloc(DType::F32, N, K);
  Tensor y = be.alloc(DType::F32, 1, N);
  y.rows = T;  // a view of three rows over one row's buffer
  EXPECT_DEATH(be.matmul(x, w, y), "AddressSanitizer");
}

TEST(Checkpoint, PublishedLayoutSkipsTheVisionTower) {
  HfCheckpoint ckpt(test::fixture_dir("published-layout"));
  for (const auto& name : ckpt.names()) EXPECT_EQ(name.find("vision"), std::string::npos) << name;
  ASSERT_EQ(ckpt.config().num_layers(), 6);
  EXPECT_FALSE(ckpt.config().layers[5].sliding);
  EXPECT_EQ(ckpt.config().layers[5].head_dim, 32);
  EXPECT_EQ(ckpt.config().layers[5].kv_heads, 1);
  EXPECT_TRUE(ckpt.config().layers[4].sliding);
}

// Splits a fixture into two shards + model.safetensors.index.json and checks identical logits.
TEST(Checkpoint, ShardedCheckpointGivesTheSameLogits) {
  const auto ref = test::load_reference("tiny-31b-style");
  const std::string dir = test::temp_dir("sharded");
  SafetensorsFile whole(ref.dir + "/model.safetensors");
  std::vector<HostTensor> shard[2];
  nlohmann::json index = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
  int i = 0;
  for (const auto& [name, entry] : whole.entries()) {
    const int s = i++ % 2;
    shard[s].push_back(whole.tensor(name));
    index["weight_map"][name] = "model-0000" + std::to_string(s + 1) + "-of-00002.safetensors";
  }
  for (int s = 0; s < 2; ++s)
    write_safetensors(dir + "/model-0000" + std::to_string(s + 1) + "-of-00002.safetensors", shard[s]);
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump();
  std::filesystem::copy_file(ref.dir + "/config.json", dir + "/config.json");

  CpuBackend backend(2);
  auto model = load_model(dir, backend);
  SessionOptions o;
  o.max_seq_len = ref.positions + 1;
  Session s(*model, backend, o);
  EXPECT_LE(test::max_abs_diff(s.logits_all(ref.tokens), ref.logits), kTolerance);
}

}  // namespace
}  // namespace g4
