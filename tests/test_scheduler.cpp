// Continuous batching (docs/DESIGN.md §7): a sequence's tokens do not depend on what else is in
// the batch — alone, or among 2, 5, 8 or 13 sequences, in any slot, with different prefill chunk
// sizes and arrival orders (CPU; on CUDA for decode batches, Q4_0 records among them) — every running sequence decodes in
// one batched forward (batch_invariant = false: whole forwards past the backend's invariant rows),
// recorded decode steps (cuda_graphs) give the tokens of eager ones,
// the KV budget bounds admission, cancel frees memory at once, a finished sequence's caches serve
// the next turn, 10 000 requests cancelled at every stage leave the pool empty, a NaN in one
// sequence's logits fails that sequence alone, and bad requests are clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend_factory.h"
#include "backend/cpu/cpu_backend.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "runtime/scheduler.h"
#include "support/demo_engine.h"
#include "support/fixtures.h"
#include "util/error.h"

namespace g4 {
namespace {

constexpr int64_t kMaxSeqLen = 128;

std::unique_ptr<Engine> demo_engine(int64_t sequences, const std::string& backend = "cpu") {
  return test::demo_engine_for(sequences, kMaxSeqLen, backend);
}

// Thirteen different requests: prompts of 3 to 39 tokens, greedy and sampled, their own seeds.
std::vector<SchedulerRequest> requests() {
  std::vector<SchedulerRequest> out;
  for (int i = 0; i < 13; ++i) {
    SchedulerRequest r;
    r.prompt = {2};
    for (int t = 1; t < 3 + 3 * i; ++t) r.prompt.push_back(int32_t((101 * i + 37 * t) % 4000 + 10));
    r.sampling = i % 4 == 0 ? SamplingParams{.temperature = 0.0f}
                            : SamplingParams{.temperature = 0.7f + 0.05f * float(i % 5), .top_p = 0.9f,
                                             .top_k = 20 + i, .seed = uint64_t(1000 + 7 * i)};
    r.max_new_tokens = 6 + i % 5;
    r.stop_ids = {};
    out.push_back(r);
  }
  return out;
}

// The request as one session generates it (with graph: through a decode graph).
GenerationRequest generation_of(const SchedulerRequest& r, bool graph = false) {
  GenerationRequest g;
  g.prompt = r.prompt;
  g.sampler = Sampler(r.sampling);
  g.max_new_tokens = r.max_new_tokens;
  g.stop_ids = r.stop_ids;
  g.graph = graph;
  return g;
}

// Each request alone in a session: the reference. With fresh_pool, every run starts from an empty
// pool (no earlier sequence's prefix is reused).
std::vector<std::vector<int32_t>> alone(Engine& engine, const std::vector<SchedulerRequest>& rs,
                                        bool fresh_pool = false) {
  std::vector<std::vector<int32_t>> out;
  for (const SchedulerRequest& r : rs) {
    if (fresh_pool) engine.kv_pool().drop_cached();
    out.push_back(generate(*engine.create_session(), generation_of(r)).tokens);
  }
  return out;
}

struct Run {
  std::map<RequestId, std::vector<int32_t>> tokens;
  int64_t widest_decode = 0;  // the most decode rows one step ran
  int64_t widest_decode_forwards = 0;  // the forwards that step took
  int64_t widest_decode_only = 0;      // the most decode rows of a step without prefill rows
  int64_t widest_decode_only_forwards = 0;
  int64_t replayed_forwards = 0;       // forwards that replayed a recording, over all steps
};

// Adds requests[order[k]] after arrival_step[k] steps; steps until idle.
Run run(Scheduler& scheduler, const std::vector<SchedulerRequest>& rs, const std::vector<size_t>& order,
        const std::vector<int>& arrival_step, std::vector<RequestId>* ids) {
  Run result;
  ids->assign(rs.size(), 0);
  size_t next = 0;
  for (int step = 0; next < order.size() || !scheduler.idle(); ++step) {
    for (; next < order.size() && arrival_step[next] <= step; ++next)
      (*ids)[order[next]] = scheduler.add(rs[order[next]]);
    for (const SequenceEvent& e : scheduler.step()) {
      EXPECT_NE(e.drawn.stop, StopReason::kStopToken);
      result.tokens[e.id].push_back(e.drawn.token);
    }
    result.replayed_forwards += scheduler.last_step().replayed_forwards;
    const StepStats& last = scheduler.last_step();
    if (last.decode_rows > result.widest_decode) {
      result.widest_decode = last.decode_rows;
      result.widest_decode_forwards = last.decode_forwards;
    }
    if (last.prefill_rows == 0 && last.decode_rows > result.widest_decode_only) {
      result.widest_decode_only = last.decode_rows;
      result.widest_decode_only_forwards = last.decode_forwards;
    }
    EXPECT_LT(step, 1000) << "the scheduler never went idle";
    if (step >= 1000) break;
  }
  return result;
}

// The batch-invariance check over batch sizes, slots, chunk sizes and arrival orders. With
// fresh_pool, no run reuses an earlier run's prefixes (see KvPool::drop_cached); with cuda_graphs,
// the schedulers replay recorded decode steps, and every run must have replayed some.
void expect_batch_invariance(Engine& engine, const std::vector<int64_t>& chunks, bool fresh_pool = false,
                             bool cuda_graphs = false) {
  const std::vector<SchedulerRequest> all = requests();
  const std::vector<std::vector<int32_t>> want = alone(engine, all, fresh_pool);
  for (size_t batch : {2u, 5u, 8u, 13u}) {
    const std::vector<SchedulerRequest> rs(all.begin(), all.begin() + int64_t(batch));
    for (int64_t chunk : chunks) {
      for (int arrival = 0; arrival < 3; ++arrival) {
        // 0: all at once in order; 1: all at once reversed (other slots); 2: staggered, reversed.
        std::vector<size_t> order(batch);
        for (size_t i = 0; i < batch; ++i) order[i] = arrival == 0 ? i : batch - 1 - i;
        std::vector<int> when(batch, 0);
        if (arrival == 2)
          for (size_t i = 0; i < batch; ++i) when[i] = int(i % 4);
        if (fresh_pool) engine.kv_pool().drop_cached();
        Scheduler scheduler(engine.runner(),
                            SchedulerOptions{.prefill_tokens_per_step = chunk, .cuda_graphs = cuda_graphs});
        std::vector<RequestId> ids;
        const auto got = run(scheduler, rs, order, when, &ids);
        for (size_t i = 0; i < batch; ++i)
          EXPECT_EQ(got.tokens.at(ids[i]), want[i])
              << "request " << i << " in a batch of " << batch << ", chunk " << chunk << ", arrival " << arrival;
        if (arrival == 0 && engine.backend().batch_invariant_rows() >= int64_t(batch))
          EXPECT_EQ(got.widest_decode_forwards, 1) << "every decode row of a step in one forward";
        EXPECT_GE(got.widest_decode, int64_t(std::min<size_t>(batch, 2)));
        if (cuda_graphs) EXPECT_GT(got.replayed_forwards, 0) << "batch " << batch << ", arrival " << arrival;
      }
    }
  }
}

TEST(Scheduler, TokensDoNotDependOnTheBatch) {
  auto engine = demo_engine(13);
  expect_batch_invariance(*engine, {7, 40, 127});
}

TEST(Scheduler, DecodeBatchesAreInvariantOnCuda) {
  G4_SKIP_OR_FAIL_WITHOUT_GPU(cuda_available());
  auto engine = demo_engine(13, "cuda");
  // One chunk size that holds every prompt: each prompt prefills in one chunk, as alone, and
  // chunks share a forward only within the 256 rows the GEMV computes row by row (the decode
  // batch is one forward: expect_batch_invariance checks it). Every run starts from an empty pool:
  // a reused prefix (even the BOS alone) holds K/V that another sequence's prefill computed, by
  // cuBLAS when its chunk had more than 64 rows, which a fresh prefill would not reproduce bit for
  // bit.
  expect_batch_invariance(*engine, {127}, /*fresh_pool=*/true);
}

// A KV budget larger than the device (a billion sequences' caches) becomes what the device has
// free once the weights and workspaces are allocated (docs/DESIGN.md §7): the engine loads, and
// requests run to the end instead of failing when the pool outgrows the memory. On the CPU the
// device is the host: its pages are mapped zeros that cost memory only once written.
// This process's resident memory (/proc/self/status VmRSS).
size_t resident_bytes() {
  std::ifstream in("/proc/self/status");
  std::string key;
  size_t kib = 0;
  while (in >> key)
    if (key == "VmRSS:" && in >> kib) return kib * 1024;
  return 0;
}

void expect_kv_budget_beyond_the_device_is_what_it_holds(const std::string& backend) {
  auto engine = demo_engine(1'000'000'000, backend);
  const size_t budget = engine->kv_pool().budget_bytes();
  EXPECT_LT(budget, size_t(1'000'000'000) * engine->kv_pool().sequence_bytes(kMaxSeqLen));
  EXPECT_EQ(budget, size_t(engine->kv_pool().pages_total()) * engine->kv_pool().page_bytes());
  EXPECT_GE(engine->backend().free_memory_bytes(), size_t(512) << 20) << "the pages leave room for what comes later";
  Scheduler scheduler(engine->runner());
  std::vector<RequestId> ids;
  const std::vector<SchedulerRequest> rs = requests();
  std::vector<size_t> order(rs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto got = run(scheduler, rs, order, std::vector<int>(rs.size(), 0), &ids);
  for (size_t i = 0; i < rs.size(); ++i) EXPECT_EQ(int64_t(got.tokens.at(ids[i]).size()), rs[i].max_new_tokens);
  if (backend == "cpu") EXPECT_LT(resident_bytes(), budget / 2) << "the pages no sequence wrote cost no memory";
}

TEST(Scheduler, AKvBudgetBeyondTheHostIsWhatTheHostHolds) { expect_kv_budget_beyond_the_device_is_what_it_holds("cpu"); }

TEST(Scheduler, AKvBudgetBeyondTheDeviceIsWhatTheDeviceHoldsOnCuda) {
  G4_SKIP_OR_FAIL_WITHOUT_GPU(cuda_available());
  expect_kv_budget_beyond_the_device_is_what_it_holds("cuda");
}

// With cuda_graphs, a step that only decodes replays the recording for its batch size, recorded
// again (the CUDA graph updated in place) as sequences join and leave: every sequence still draws
// the tokens it draws alone, in batches of 2 to 13, staggered arrivals included.
TEST(Scheduler, RecordedDecodeStepsAreInvariantOnCuda) {
  G4_SKIP_OR_FAIL_WITHOUT_GPU(cuda_available());
  auto engine = demo_engine(13, "cuda");
  expect_batch_invariance(*engine, {127}, /*fresh_pool=*/true, /*cuda_graphs=*/true);
}

// Q4_0 matrices (llama.cpp's Q4_0 demo file: a Q6_K embedding beside them) run as records once
// batch invariance is asked for (docs/DESIGN.md §7): one arithmetic for 1 to 256 rows, so every
// sequence draws its tokens alone in any batch, eager and replayed. Invariance is asked for before
// the reference sessions run, so that they run the records too.
TEST(Scheduler, Q4_0RecordsKeepDecodeBatchesInvariantOnCuda) {
  G4_SKIP_OR_FAIL_WITHOUT_GPU(cuda_available());
  auto engine =
      test::demo_engine_for(13, kMaxSeqLen, "cuda", std::string(G4_FIXTURES_DIR) + "/llamacpp/demo-q4_0.gguf");
  ASSERT_EQ(engine->model().weights().layers[0].gate_proj.dtype, DType::Q4_0);
  engine->backend().set_batch_invariant(true);
  expect_batch_invariance(*engine, {127}, /*fresh_pool=*/true);
  expect_batch_invariance(*engine, {127}, /*fresh_pool=*/true, /*cuda_graphs=*/true);
}

// Past 64 sequences, up to the backend's batch_invariant_rows() (256; the demo's forwards hold at
// most its 127-row workspace): 120 requests of the Q4_0 demo file decode in one invariant forward a
// step — the records' block of 128 tokens — and each draws the tokens it draws alone. The prompts
// differ from their second token on, so no two share a page, and every run starts from an empty pool.
TEST(Scheduler, Q4_0RecordsKeepDecodeBatchesPast64InvariantOnCuda) {
  G4_SKIP_OR_FAIL_WITHOUT_GPU(cuda_available());
  constexpr size_t kRequests = 120;
  auto engine = test::demo_engine_for(int64_t(kRequests), kMaxSeqLen, "cuda",
                                      std::string(G4_FIXTURES_DIR) + "/llamacpp/demo-q4_0.gguf", int64_t(kRequests));
  engine->backend().set_batch_invariant(true);
  ASSERT_GE(engine->backend().batch_invariant_rows(), int64_t(kRequests));
  const std::vector<SchedulerRequest> base = requests();
  std::vector<SchedulerRequest> rs;
  for (size_t i = 0; i < kRequests; ++i) {
    SchedulerRequest r = base[i % base.size()];
    r.prompt.insert(r.prompt.begin() + 1, int32_t(3900 + i));
    r.sampling.seed += i;
    r.max_new_tokens = 24;
    rs.push_back(r);
  }
  const std::vector<std::vector<int32_t>> want = alone(*engine, rs, /*fresh_pool=*/true);
  engine->kv_pool().drop_cached();
  Scheduler scheduler(engine->runner(), SchedulerOptions{});
  std::vector<size_t> order(kRequests);
  for (size_t i = 0; i < kRequests; ++i) order[i] = i;
  std::vector<RequestId> ids;
  const auto got = run(scheduler, rs, order, std::vector<int>(kRequests, 0), &ids);
  for (size_t i = 0; i < kRequests; ++i) EXPECT_EQ(got.tokens.at(ids[i]), want[i]) << "request " << i;
  EXPECT_GT(got.widest_decode_only, 64) << "no step decoded more than 64 sequences alone";
  EXPECT_EQ(got.widest_decode_only_forwards, 1) << "every decode row of a step in one forward";
}

// Fusion off (Backend::set_fusion: every fused op run as its separate ops) gives the same tokens
// in decode batches as fusion on — the batched decode attention launch, quantizing alongside, the
// Q4_0 records' GELU-mul and residual norm —, for the bf16 demo and the Q4_0 file, invariant or not.
std::vector<std::vector<int32_t>> tokens_with_fusion(Engine& engine, bool fusion, bool invariant) {
  engine.kv_pool().drop_cached();
  engine.backend().set_fusion(fusion);
  Scheduler scheduler(engine.runner(), SchedulerOptions{.batch_invariant = invariant});
  const std::vector<SchedulerRequest> rs = requests();
  std::vector<size_t> order(rs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::vector<RequestId> ids;
  const Run r = run(scheduler, rs, order, std::vector<int>(rs.size(), 0), &ids);
  engine.backend().set_fusion(true);
  std::vector<std::vector<int32_t>> out;
  for (RequestId id : ids) out.push_back(r.tokens.at(id));
  return out;
}

TEST(Scheduler, FusionOffGivesTheSameDecodeBatchesOnCuda) {
  G4_SKIP_OR_FAIL_WITHOUT_GPU(cuda_available());
  for (const std::string& path : {test::fortune_demo_path(), std::string(G4_FIXTURES_DIR) + "/llamacpp/demo-q4_0.gguf"}) {
    auto engine = test::demo_engine_for(13, kMaxSeqLen, "cuda", path);
    for (bool invariant : {true, false}) {
      SCOPED_TRACE(path + (invariant ? ", invariant" : ", not invariant"));
      EXPECT_EQ(tokens_with_fusion(*engine, false, invariant), tokens_with_fusion(*engine, true, invariant));
    }
  }
}

// Logit bias and penalties (sampling/logit_penalties.h): a greedy request draws, at every step, the
// argmax of its logits changed as OpenAI and transformers define them — computed here from a plain
// session's logits — and the unchanged request draws other tokens.
TEST(Scheduler, PenaltiesDrawTheArgmaxOfTheAdjustedLogits) {
  auto engine = demo_engine(2);
  SchedulerRequest r = requests()[4];
  r.sampling = SamplingParams{.temperature = 0.0f};
  r.max_new_tokens = 16;
  auto draw = [&](const SchedulerRequest& request) {
    Scheduler scheduler(engine->runner());
    scheduler.add(request);
    std::vector<int32_t> out;
    while (!scheduler.idle())
      for (const SequenceEvent& e : scheduler.step()) out.push_back(e.drawn.token);
    return out;
  };
  const std::vector<int32_t> plain = draw(r);
  r.penalties = LogitPenalties{.presence = 0.5f, .frequency = 1.5f, .repetition = 1.3f,
                               .bias = {{plain[0], -5.0f}, {plain[1], 2.5f}}};
  const std::vector<int32_t> penalized = draw(r);
  EXPECT_NE(penalized, plain);
  GenerationRequest alone = generation_of(r);
  alone.penalties = r.penalties;
  EXPECT_EQ(generate(*engine->create_session(), alone).tokens, penalized) << "a session draws what the scheduler draws";
  SchedulerRequest seeded = r;
  seeded.sampling = SamplingParams{.temperature = 0.9f, .top_k = 40, .seed = 11};
  GenerationRequest seeded_alone = generation_of(seeded);
  seeded_alone.penalties = r.penalties;
  EXPECT_EQ(generate(*engine->create_session(), seeded_alone).tokens, draw(seeded)) << "seeded";

  auto session = engine->create_session();
  session->prefill(r.prompt);
  std::map<int32_t, int> counts;
  for (size_t i = 0; i < penalized.size(); ++i) {
    std::vector<float> logits = session->last_logits_host();
    for (size_t t = 0; t < logits.size(); ++t) {
      const int32_t token = int32_t(t);
      for (const auto& [biased, bias] : r.penalties.bias)
        if (biased == token) logits[t] += bias;
      const bool seen = counts.count(token) || std::find(r.prompt.begin(), r.prompt.end(), token) != r.prompt.end();
      if (seen) logits[t] = logits[t] > 0 ? logits[t] / r.penalties.repetition : logits[t] * r.penalties.repetition;
      if (counts.count(token)) logits[t] -= r.penalties.frequency * float(counts[token]) + r.penalties.presence;
    }
    const int32_t want = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    ASSERT_EQ(penalized[i], want) << "token " << i;
    ++counts[want];
    if (i + 1 < penalized.size()) session->decode(want);
  }
}

// Out-of-range penalties and biased tokens outside the vocabulary are clear errors naming them.
TEST(Scheduler, BadPenaltiesAreClearErrors) {
  auto engine = demo_engine(1);
  Scheduler scheduler(engine->runner());
  auto error = [&](LogitPenalties p) {
    SchedulerRequest r = requests()[0];
    r.penalties = std::move(p);
    return test::error_of([&] { scheduler.add(r); });
  };
  EXPECT_EQ(error({.frequency = 3.0f}), "frequency_penalty must be in [-2, 2], got 3");
  EXPECT_EQ(error({.repetition = 0.0f}), "repetition_penalty must be in (0, 2], got 0");
  EXPECT_EQ(error({.bias = {{int32_t(engine->config().vocab_size), 1.0f}}}).rfind("logit_bias names token", 0), 0u);
}

TEST(Scheduler, RecordedDecodeStepsNeedABackendWithGraphs) {
  auto engine = demo_engine(1);
  EXPECT_EQ(test::error_of([&] { Scheduler scheduler(engine->runner(), SchedulerOptions{.cuda_graphs = true}); }),
            "CUDA graph decoding (--cuda_graph) needs a backend with graphs (--backend cuda); the cpu backend has none");
}

// A CPU backend that promises row-by-row equality only up to `rows` rows, as CUDA's GEMV does up
// to 8: what SchedulerOptions::batch_invariant decides between. (Its arithmetic is the CPU's, which
// is the same for a row at any row count.)
class CpuBackendInvariantToRows : public CpuBackend {
 public:
  explicit CpuBackendInvariantToRows(int64_t rows) : rows_(rows) {}
  int64_t batch_invariant_rows() const override { return rows_; }

 private:
  int64_t rows_;
};

// The same, recording for every matmul launch which weights it multiplies together and over how
// many rows.
class CpuBackendRecordingLaunches : public CpuBackendInvariantToRows {
 public:
  using CpuBackendInvariantToRows::CpuBackendInvariantToRows;
  void matmul(const Tensor& x, const Tensor& w, const Tensor& y) override {
    if (!inside_matmuls_) launches.push_back({{w.data}, x.rows});
    CpuBackendInvariantToRows::matmul(x, w, y);
  }
  void matmuls(const Tensor& x, std::span<const Tensor> ws, std::span<const Tensor> ys) override {
    Launch launch{{}, x.rows};
    for (const Tensor& w : ws) launch.weights.push_back(w.data);
    launches.push_back(launch);
    inside_matmuls_ = true;
    CpuBackendInvariantToRows::matmuls(x, ws, ys);
    inside_matmuls_ = false;
  }
  struct Launch {
    std::vector<const void*> weights;
    int64_t rows;
    bool has(const void* w) const { return std::find(weights.begin(), weights.end(), w) != weights.end(); }
  };
  std::vector<Launch> launches;

 private:
  bool inside_matmuls_ = false;
};

// A backend may slice the matrices of one launch by their rows together (CUDA's Q4_0 records), so
// up to its batch_invariant_rows() the model launches every layer's k and v with q — also in the
// last layer of a prefill step, whose queries are read only for the rows that give logits — else
// their bits would depend on whether another sequence decodes in the same step. Past those rows
// the last layer launches q for the read rows alone, and the tokens are the same either way.
TEST(Scheduler, KeysAndValuesLaunchWithTheQueriesUpToTheInvariantRows) {
  auto engine = demo_engine(4);
  const std::vector<SchedulerRequest> all = requests();
  const std::vector<SchedulerRequest> rs(all.begin() + 8, all.begin() + 12);  // prompts of 27 to 36 tokens
  const std::vector<std::vector<int32_t>> want = alone(*engine, rs);
  const auto& layers = engine->model().weights().layers;
  for (int64_t invariant_rows : {64, 4}) {
    CpuBackendRecordingLaunches backend(invariant_rows);
    ModelRunner runner(engine->model(), backend,
                       RunnerOptions{.max_seq_len = kMaxSeqLen, .max_batch_sequences = 4, .kv_budget_sequences = 4});
    Scheduler scheduler(runner, SchedulerOptions{.prefill_tokens_per_step = 16, .batch_invariant = false});
    std::vector<size_t> order = {0, 1, 2, 3};
    std::vector<RequestId> ids;
    const auto got = run(scheduler, rs, order, {0, 1, 2, 3}, &ids);
    for (size_t i = 0; i < rs.size(); ++i)
      EXPECT_EQ(got.tokens.at(ids[i]), want[i]) << "request " << i << ", invariant rows " << invariant_rows;
    int64_t k_launches = 0, k_without_q = 0;
    for (const auto& launch : backend.launches) {
      for (const auto& layer : layers) {
        if (!launch.has(layer.k_proj.data)) continue;
        ++k_launches;
        if (!launch.has(layer.q_proj.data)) {
          ++k_without_q;
          EXPECT_GT(launch.rows, invariant_rows) << "k_proj launched without q_proj over " << launch.rows << " rows";
        }
      }
    }
    EXPECT_GT(k_launches, 0);
    if (invariant_rows == 4) EXPECT_GT(k_without_q, 0) << "the last layer's own q launch, past the invariant rows";
  }
}

TEST(Scheduler, BatchInvariantFalseFillsWholeForwards) {
  auto engine = demo_engine(1);
  CpuBackendInvariantToRows backend(4);
  ModelRunner runner(engine->model(), backend,
                     RunnerOptions{.max_seq_len = kMaxSeqLen, .max_batch_sequences = 13, .kv_budget_sequences = 13});
  const std::vector<SchedulerRequest> rs = requests();
  const std::vector<std::vector<int32_t>> want = alone(*engine, rs);
  std::vector<size_t> order(rs.size());
  for (size_t i = 0; i < rs.size(); ++i) order[i] = i;
  for (bool invariant : {true, false}) {
    Scheduler scheduler(runner, SchedulerOptions{.batch_invariant = invariant});
    std::vector<RequestId> ids;
    const auto got = run(scheduler, rs, order, std::vector<int>(rs.size(), 0), &ids);
    for (size_t i = 0; i < rs.size(); ++i) EXPECT_EQ(got.tokens.at(ids[i]), want[i]) << "request " << i;
    EXPECT_EQ(got.widest_decode, 13);
    EXPECT_EQ(got.widest_decode_forwards, invariant ? 4 : 1) << "batch_invariant " << invariant;
  }
}

// On CUDA without batch invariance: the decode batch in one forward (the packed tensor-core matmul
// over the demo's quantized weights, the batched decode attention), each request generating all
// its tokens. Its tokens are not compared with alone: that matmul rounds a row differently from
// the GEMV, which is what batch_invariant trades. Replaying recorded decode steps gives the tokens
// of eager steps (the same kernels on the same rows).
TEST(Scheduler, BatchInvariantFalseRunsTheDecodeBatchInOneForwardOnCuda) {
  G4_SKIP_OR_FAIL_WITHOUT_GPU(cuda_available());
  auto engine = demo_engine(13, "cuda");
  const std::vector<SchedulerRequest> rs = requests();
  std::vector<size_t> order(rs.size());
  for (size_t i = 0; i < rs.size(); ++i) order[i] = i;
  std::vector<std::vector<int32_t>> eager;
  for (bool graphs : {false, true}) {
    engine->kv_pool().drop_cached();
    Scheduler scheduler(engine->runner(), SchedulerOptions{.batch_invariant = false, .cuda_graphs = graphs});
    std::vector<RequestId> ids;
    const auto got = run(scheduler, rs, order, std::vector<int>(rs.size(), 0), &ids);
    for (size_t i = 0; i < rs.size(); ++i) {
      const std::vector<int32_t>& tokens = got.tokens.at(ids[i]);
      EXPECT_EQ(int64_t(tokens.size()), rs[i].max_new_tokens);
      if (graphs) EXPECT_EQ(tokens, eager[i]) << "request " << i << ": replayed steps against eager ones";
      if (!graphs) eager.push_back(tokens);
    }
    EXPECT_EQ(got.widest_decode, 13);
    EXPECT_EQ(got.widest_decode_forwards, 1);
    EXPECT_EQ(got.replayed_forwards > 0, graphs);
  }
}

// A recording also reads the backend's scratch buffers, which a longer forward replaces: here a
// late request's long prompt (it asks one token, so it ends at its prefill and the decoding batch
// keeps its sequences) grows them between two pure-decode steps of the same batch. The batch must
// record again, and every request draws the tokens of eager steps, invariant or not.
TEST(Scheduler, RecordedDecodeStepsOutliveReplacedScratchBuffersOnCuda) {
  G4_SKIP_OR_FAIL_WITHOUT_GPU(cuda_available());
  auto engine = demo_engine(7, "cuda");
  std::vector<SchedulerRequest> rs = requests();
  rs.resize(6);  // prompts of 3 to 18 tokens: one first forward of 63 rows
  for (SchedulerRequest& r : rs) r.max_new_tokens = 12;
  SchedulerRequest late;
  late.prompt = {2};
  for (int t = 1; t < 120; ++t) late.prompt.push_back(int32_t((53 * t) % 4000 + 10));
  late.sampling = SamplingParams{.temperature = 0.0f};
  late.max_new_tokens = 1;
  late.stop_ids = {};
  rs.push_back(late);
  std::vector<size_t> order(rs.size());
  for (size_t i = 0; i < rs.size(); ++i) order[i] = i;
  std::vector<int> when(rs.size(), 0);
  when.back() = 4;  // after the 6-row batch's first replays
  for (bool invariant : {true, false}) {
    std::vector<std::vector<int32_t>> eager;
    for (bool graphs : {false, true}) {
      engine->kv_pool().drop_cached();
      Scheduler scheduler(engine->runner(), SchedulerOptions{.batch_invariant = invariant, .cuda_graphs = graphs});
      std::vector<RequestId> ids;
      const auto got = run(scheduler, rs, order, when, &ids);
      for (size_t i = 0; i < rs.size(); ++i) {
        if (!graphs) eager.push_back(got.tokens.at(ids[i]));
        if (graphs) EXPECT_EQ(got.tokens.at(ids[i]), eager[i]) << "request " << i << ", batch_invariant " << invariant;
      }
      EXPECT_EQ(got.replayed_forwards > 0, graphs);
    }
  }
}

// A request arriving while another decodes: the step runs the decode row and the new prompt's
// chunk in one forward (the CPU computes every row alone, so one forward holds any rows).
TEST(Scheduler, DecodeRowsAndArrivingPromptsShareAForward) {
  auto engine = demo_engine(2);
  const std::vector<SchedulerRequest> rs = requests();
  const std::vector<std::vector<int32_t>> want = alone(*engine, {rs[3], rs[4]});
  Scheduler scheduler(engine->runner());
  std::map<RequestId, std::vector<int32_t>> got;
  const RequestId a = scheduler.add(rs[3]);
  for (int i = 0; i < 2; ++i)
    for (const SequenceEvent& e : scheduler.step()) got[e.id].push_back(e.drawn.token);
  const RequestId b = scheduler.add(rs[4]);
  for (const SequenceEvent& e : scheduler.step()) got[e.id].push_back(e.drawn.token);
  const StepStats& mixed = scheduler.last_step();
  EXPECT_EQ(mixed.decode_rows, 1);
  EXPECT_EQ(mixed.prefill_rows, int64_t(rs[4].prompt.size()));
  EXPECT_EQ(mixed.forwards, 1);
  EXPECT_EQ(got[b].size(), 1u) << "the new prompt's first token is drawn in the same step";
  while (!scheduler.idle())
    for (const SequenceEvent& e : scheduler.step()) got[e.id].push_back(e.drawn.token);
  EXPECT_EQ(got[a], want[0]);
  EXPECT_EQ(got[b], want[1]);
}

void expect_nan_failure(const SequenceEvent& e) {
  EXPECT_EQ(e.drawn.stop, StopReason::kFailed);
  EXPECT_EQ(e.drawn.token, -1);
  EXPECT_EQ(e.error, "model produced NaN logits");
  EXPECT_FALSE(e.logprobs) << "no log-probabilities from NaN logits";
}

// A NaN in one sequence's logits fails that sequence alone. The fault is real: one
// token's embedding row is NaN (test::nan_embedding_demo_path), the token that the greedy "drawer"
// draws first on the clean model, so that it fails at the decode that feeds it, and that the
// "reader" holds in its prompt, so that it fails at its first draw. Alone, each fails with the
// session's error (eagerly and, with `graphs`, through a decode graph); in a batch, with an error
// event and no token, its KV memory back at once and nothing kept, while every other request,
// greedy and sampled, one with log-probabilities, draws exactly its tokens alone.
void expect_a_nan_fails_only_its_sequence(const std::string& backend, bool graphs) {
  const std::vector<SchedulerRequest> all = requests();
  const SchedulerRequest drawer = all[8];
  ASSERT_TRUE(is_greedy(drawer.sampling));
  SchedulerRequest first_token_only = drawer;
  first_token_only.max_new_tokens = 1;
  const int32_t poisoned = alone(*test::demo_engine_for(1, kMaxSeqLen, backend), {first_token_only})[0][0];
  ASSERT_EQ(std::count(drawer.prompt.begin(), drawer.prompt.end(), poisoned), 0);
  SchedulerRequest reader = all[3];
  reader.prompt.insert(reader.prompt.begin() + 2, poisoned);
  reader.top_logprobs = 3;
  std::vector<SchedulerRequest> good = {all[0], all[1], all[2], all[4]};
  good[1].top_logprobs = 3;

  auto engine = test::demo_engine_for(int64_t(good.size()) + 2, kMaxSeqLen, backend,
                                      test::nan_embedding_demo_path(poisoned));
  const std::vector<bool> decode_graph = graphs ? std::vector<bool>{false, true} : std::vector<bool>{false};
  for (const SchedulerRequest& r : {drawer, reader})
    for (bool graph : decode_graph)
      EXPECT_EQ(test::error_of([&] { generate(*engine->create_session(), generation_of(r, graph)); }),
                "model produced NaN logits")
          << "alone, graph " << graph;
  const std::vector<std::vector<int32_t>> want = alone(*engine, good, /*fresh_pool=*/true);

  KvPool& pool = engine->kv_pool();
  pool.drop_cached();
  // Each prompt in one chunk, as alone (on CUDA prefill is not invariant to chunking, §7); where
  // the backend has graphs, steps that only decode replay recordings.
  Scheduler scheduler(engine->runner(), SchedulerOptions{.prefill_tokens_per_step = 127, .cuda_graphs = graphs});
  const RequestId drawer_id = scheduler.add(drawer);
  std::vector<RequestId> good_ids = {scheduler.add(good[0]), scheduler.add(good[1])};
  const RequestId reader_id = scheduler.add(reader);
  good_ids.push_back(scheduler.add(good[2]));
  good_ids.push_back(scheduler.add(good[3]));
  std::map<RequestId, std::vector<SequenceEvent>> events;
  while (!scheduler.idle()) {
    for (SequenceEvent& e : scheduler.step()) events[e.id].push_back(std::move(e));
    EXPECT_EQ(pool.pages_in_use() > 0, scheduler.running() > 0) << "only running sequences hold KV pages";
  }

  ASSERT_EQ(events[reader_id].size(), 1u);
  expect_nan_failure(events[reader_id][0]);
  ASSERT_EQ(events[drawer_id].size(), 2u);
  EXPECT_EQ(events[drawer_id][0].drawn.token, poisoned);
  EXPECT_EQ(events[drawer_id][0].error, "");
  expect_nan_failure(events[drawer_id][1]);
  for (size_t i = 0; i < good.size(); ++i) {
    std::vector<int32_t> tokens;
    for (const SequenceEvent& e : events[good_ids[i]]) {
      EXPECT_EQ(e.error, "") << "request " << i;
      EXPECT_EQ(e.logprobs.has_value(), good[i].top_logprobs >= 0) << "request " << i;
      tokens.push_back(e.drawn.token);
    }
    EXPECT_EQ(tokens, want[i]) << "request " << i;
  }
  EXPECT_EQ(pool.pages_in_use(), 0);
}

TEST(Scheduler, ANanInOneSequenceFailsOnlyThatSequence) {
  expect_a_nan_fails_only_its_sequence("cpu", /*graphs=*/false);
}

TEST(Scheduler, ANanInOneSequenceFailsOnlyThatSequenceOnCuda) {
  G4_SKIP_OR_FAIL_WITHOUT_GPU(cuda_available());
  expect_a_nan_fails_only_its_sequence("cuda", /*graphs=*/true);
}

// A request waits while the pool cannot hold its prompt beside the running sequences; cancelling
// gives pages back at once.
TEST(Scheduler, ThePagesBoundAdmissionAndCancelFreesThem) {
  auto engine = demo_engine(1);
  const std::vector<SchedulerRequest> rs = requests();
  const std::vector<std::vector<int32_t>> want = alone(*engine, {rs[1]});
  KvPool& pool = engine->kv_pool();
  Scheduler scheduler(engine->runner());
  const RequestId a = scheduler.add(rs[1]), b = scheduler.add(rs[2]);
  std::map<RequestId, std::vector<int32_t>> got;
  auto step = [&] {
    for (const SequenceEvent& e : scheduler.step()) got[e.id].push_back(e.drawn.token);
  };
  step();
  EXPECT_EQ(scheduler.running(), 2u);
  const int64_t both = pool.pages_in_use();
  const int64_t pages_of_b = pool.pages_for_positions(kMaxSeqLen, int64_t(rs[2].prompt.size()));
  // A third request's prompt does not fit beside them: it waits.
  SchedulerRequest big = rs[3];
  while (pool.pages_for_positions(kMaxSeqLen, int64_t(big.prompt.size()) + 1) <= pool.pages_available())
    big.prompt.push_back(big.prompt.back() % 4000 + 11);
  ASSERT_LE(int64_t(big.prompt.size()), kMaxSeqLen - big.max_new_tokens);
  const RequestId c = scheduler.add(big), d = scheduler.add(rs[5]);
  step();
  EXPECT_EQ(scheduler.running(), 2u) << "c waits for pages";
  EXPECT_EQ(scheduler.waiting(), 2u);
  // Cancelling a running request gives its pages back at once; the waiting one then starts.
  EXPECT_TRUE(scheduler.cancel(b));
  EXPECT_FALSE(scheduler.cancel(b));
  EXPECT_LE(pool.pages_in_use(), both - pages_of_b + int64_t(engine->config().layers.size()));
  EXPECT_TRUE(scheduler.cancel(d)) << "a waiting request can be cancelled too";
  while (!scheduler.idle()) step();
  EXPECT_EQ(got[a], want[0]);
  EXPECT_EQ(got[c], alone(*demo_engine(1), {big})[0]);
  EXPECT_EQ(got.count(d), 0u);
  EXPECT_EQ(pool.pages_in_use(), 0);
}

// Ten thousand requests come and go — cancelled while waiting, while prefilling and while
// decoding — and nothing is left behind: no sequence holds a page at the end.
TEST(Scheduler, TenThousandRequestsAddedAndCancelledLeaveThePoolEmpty) {
  auto engine = demo_engine(2);
  KvPool& pool = engine->kv_pool();
  Scheduler scheduler(engine->runner(), SchedulerOptions{.max_waiting = 8});
  const std::vector<SchedulerRequest> rs = requests();
  std::deque<RequestId> live;
  for (int i = 0; i < 10000; ++i) {
    SchedulerRequest r = rs[size_t(i) % rs.size()];
    r.max_new_tokens = 1000;  // none finishes on its own: every one is cancelled
    live.push_back(scheduler.add(r));
    if (i % 32 == 31) scheduler.step();
    for (; live.size() > 6; live.pop_front()) EXPECT_TRUE(scheduler.cancel(live.front()));
  }
  for (RequestId id : live) EXPECT_TRUE(scheduler.cancel(id));
  EXPECT_TRUE(scheduler.idle());
  EXPECT_EQ(scheduler.running(), 0u);
  EXPECT_EQ(scheduler.waiting(), 0u);
  EXPECT_EQ(pool.pages_in_use(), 0);
}

TEST(Scheduler, AFinishedSequenceServesTheNextTurn) {
  auto engine = demo_engine(2);
  Scheduler scheduler(engine->runner());
  SchedulerRequest first = requests()[6];
  const int64_t unit = engine->kv_pool().share_unit();
  while (int64_t(first.prompt.size()) < 2 * unit + 3) first.prompt.push_back(first.prompt.back() % 4000 + 17);
  const RequestId id = scheduler.add(first);
  std::vector<int32_t> reply;
  while (!scheduler.idle())
    for (const SequenceEvent& e : scheduler.step()) reply.push_back(e.drawn.token);
  ASSERT_EQ(reply.size(), size_t(first.max_new_tokens));
  (void)id;
  SchedulerRequest next = first;
  next.prompt.insert(next.prompt.end(), reply.begin(), reply.end());
  const std::vector<int32_t> turn = {105, 2364, 107, 400, 401};
  next.prompt.insert(next.prompt.end(), turn.begin(), turn.end());
  // The finished sequence's whole pages are cached: the next turn begins with all whole share units.
  const int64_t cached = engine->kv_pool().cached_prefix(kMaxSeqLen, next.prompt);
  EXPECT_EQ(cached, int64_t(first.prompt.size() + reply.size() - 1) / unit * unit);
  scheduler.add(next);
  std::vector<int32_t> got;
  int64_t prefilled = 0;
  while (!scheduler.idle()) {
    for (const SequenceEvent& e : scheduler.step()) got.push_back(e.drawn.token);
    prefilled += scheduler.last_step().prefill_rows;
  }
  EXPECT_EQ(prefilled, int64_t(next.prompt.size()) - cached);
  EXPECT_EQ(got, alone(*demo_engine(1), {next})[0]);
}

TEST(Scheduler, BadRequestsAreClearErrors) {
  auto engine = demo_engine(1);
  Scheduler scheduler(engine->runner(), SchedulerOptions{.max_waiting = 1});
  SchedulerRequest r = requests()[0];
  auto error = [&](SchedulerRequest bad) { return test::error_of([&] { scheduler.add(bad); }); };
  SchedulerRequest empty = r;
  empty.prompt.clear();
  EXPECT_NE(error(empty).find("empty prompt"), std::string::npos);
  SchedulerRequest bad_id = r;
  bad_id.prompt[1] = -3;
  EXPECT_NE(error(bad_id).find("token id -3 at index 1 is out of range"), std::string::npos);
  SchedulerRequest long_prompt = r;
  long_prompt.prompt.assign(129, 5);
  EXPECT_NE(error(long_prompt).find("context full (128 tokens)"), std::string::npos);
  SchedulerRequest bad_sampling = r;
  bad_sampling.sampling.temperature = 3.0f;
  EXPECT_NE(error(bad_sampling).find("temperature must be in [0, 2] or -1"), std::string::npos);
  SchedulerRequest no_tokens = r;
  no_tokens.max_new_tokens = 0;
  EXPECT_NE(error(no_tokens).find("max_new_tokens must be >= 1, got 0"), std::string::npos);
  EXPECT_TRUE(scheduler.idle()) << "rejected requests leave nothing behind";
  scheduler.add(r);
  EXPECT_NE(error(r).find("busy: 1 requests are waiting"), std::string::npos);
  EXPECT_NE(test::error_of([&] { Scheduler(engine->runner(), SchedulerOptions{.prefill_tokens_per_step = 1000}); })
                .find("exceeds the forward workspace"),
            std::string::npos);
}

// Log-probabilities (docs/DESIGN.md §8) are the log-softmax of the model's own logits at the
// position each token was drawn from — checked against the full logits of the whole sequence
// computed afresh by a session (`g4 logits`' path), in a batch beside a request without them.
TEST(Scheduler, LogprobsAreTheLogSoftmaxOfTheModelsLogits) {
  auto engine = demo_engine(3);
  Scheduler scheduler(engine->runner());
  std::vector<SchedulerRequest> rs = requests();
  rs[1].top_logprobs = 5;
  rs[2].top_logprobs = 0;
  rs[3].top_logprobs = -1;
  std::map<RequestId, std::vector<SequenceEvent>> events;
  std::vector<RequestId> ids;
  for (int i = 1; i <= 3; ++i) ids.push_back(scheduler.add(rs[size_t(i)]));
  while (!scheduler.idle())
    for (SequenceEvent& e : scheduler.step()) events[e.id].push_back(std::move(e));
  for (const SequenceEvent& e : events[ids[2]]) EXPECT_FALSE(e.logprobs) << "not asked for";

  const int64_t vocab = engine->runner().model().config().vocab_size;
  for (int k = 0; k < 2; ++k) {
    const SchedulerRequest& r = rs[size_t(k + 1)];
    std::vector<int32_t> sequence = r.prompt;
    for (const SequenceEvent& e : events[ids[size_t(k)]]) sequence.push_back(e.drawn.token);
    sequence.pop_back();  // the last drawn token is never fed
    const std::vector<float> logits = engine->create_session()->logits_all(sequence);
    const auto& drawn = events[ids[size_t(k)]];
    ASSERT_EQ(drawn.size(), size_t(r.max_new_tokens));
    for (size_t j = 0; j < drawn.size(); ++j) {
      ASSERT_TRUE(drawn[j].logprobs);
      const float* row = logits.data() + (r.prompt.size() - 1 + j) * size_t(vocab);
      double max = row[0], sum = 0.0;
      for (int64_t v = 0; v < vocab; ++v) max = std::max(max, double(row[v]));
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - max);
      const double log_z = max + std::log(sum);
      EXPECT_NEAR(drawn[j].logprobs->logprob, row[drawn[j].drawn.token] - log_z, 1e-4) << "token " << j;
      ASSERT_EQ(drawn[j].logprobs->top.size(), size_t(r.top_logprobs));
      for (size_t t = 0; t < drawn[j].logprobs->top.size(); ++t) {
        const auto [id, logprob] = drawn[j].logprobs->top[t];
        EXPECT_NEAR(logprob, row[id] - log_z, 1e-4);
        if (t > 0) EXPECT_GE(drawn[j].logprobs->top[t - 1].second, logprob) << "most likely first";
      }
      if (!drawn[j].logprobs->top.empty()) {
        const float* best = std::max_element(row, row + vocab);
        EXPECT_EQ(drawn[j].logprobs->top[0].first, int32_t(best - row)) << "the argmax leads";
      }
    }
  }
  SchedulerRequest too_many = rs[0];
  too_many.top_logprobs = 21;
  EXPECT_NE(test::error_of([&] { scheduler.add(too_many); }).find("top_logprobs must be in [0, 20]"), std::string::npos);
}

}  // namespace
}  // namespace g4
