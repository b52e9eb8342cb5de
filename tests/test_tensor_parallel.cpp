// Tensor parallelism (docs/DESIGN.md "Tensor parallel"): a model split over N ranks gives
// one device's logits within rule (a) of docs/DESIGN.md §6, and the same tokens, greedy and seeded;
// a bad N and a failing rank give clear errors on every rank, never a hang. On the CPU the ranks are
// threads over the in-process communicator; the CUDA tests need two GPUs and skip without them.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "backend/backend_factory.h"
#include "backend/comm/communicator.h"
#include "model/gguf_export.h"
#include "model/hf_checkpoint.h"
#include "model/tensor_parallel.h"
#include "quant/quantize.h"
#include "runtime/generator.h"
#include "runtime/rank_inputs.h"
#include "runtime/scheduler.h"
#include "runtime/tensor_parallel.h"
#include "support/demo_engine.h"
#include "support/fixtures.h"
#include "util/error.h"
#include "util/half.h"

namespace g4 {
namespace {

// The fortune demo (bf16, 4 query heads, 2 KV heads, 1 on the full layer): the shapes these tests
// check (test::fortune_demo_path, tests/support/demo_engine.h).
const std::string& demo() { return test::fortune_demo_path(); }
// docs/DESIGN.md §6, rule (a): relative L2 over all positions' logits, on a trained model.
constexpr double kRuleA = 1e-2;

EngineOptions demo_options(int tp, const std::string& backend = "cpu", const std::string& path = demo()) {
  EngineOptions o;
  o.model_path = path;
  o.backend = backend;
  o.tp = tp;
  return o;
}

// What `work` returns on each rank, in rank order.
template <typename T>
std::vector<T> on_every_rank(const EngineOptions& o, const std::function<T(Engine&)>& work) {
  std::vector<T> out(size_t(o.tp));
  run_tensor_parallel(o, [&](Engine& engine) { out[size_t(engine.tp_rank())] = work(engine); });
  return out;
}

std::vector<int32_t> demo_tokens(size_t n) {
  std::vector<int32_t> t = test::load_demo_reference().tokens;
  t.resize(std::min(n, t.size()));
  return t;
}

std::vector<float> all_logits(Engine& engine, const std::vector<int32_t>& tokens, int64_t chunk = 0) {
  return engine.create_session()->logits_all(tokens, chunk);
}

GenerationRequest demo_request(float temperature, uint64_t seed) {
  GenerationRequest r;
  r.prompt = demo_tokens(12);
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = 40;
  p.top_p = 0.95f;
  p.seed = seed;
  r.sampler = Sampler(p);
  r.max_new_tokens = 40;
  r.stop_ids = {};  // the full length: more tokens compared
  return r;
}

std::vector<int32_t> generated(Engine& engine, const GenerationRequest& r) {
  return generate(*engine.create_session(), r).tokens;
}

// ---- the communicator ----

TEST(CpuCommunicator, SumsInRankOrderAndGathersColumnBlocks) {
  constexpr int kRanks = 3;
  auto group = make_cpu_comm_group(kRanks);
  std::vector<std::vector<float>> sums(kRanks), gathered(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      auto backend = make_backend("cpu");
      auto comm = group->join(r, *backend);
      // Values whose float sum depends on the order: 1e8 + 1 - 1e8 is 0 in float, not 1.
      const float mine[3] = {r == 0 ? 1e8f : r == 1 ? 1.0f : -1e8f, float(r), 0.5f};
      Tensor t = backend->alloc(DType::F32, 1, 3);
      backend->upload(mine, t);
      comm->all_reduce_sum(t);
      sums[size_t(r)].resize(3);
      backend->download(t, sums[size_t(r)].data());
      // local [2, 2] = {10r, 10r+1; 10r+2, 10r+3}
      const float local[4] = {10.0f * r, 10.0f * r + 1, 10.0f * r + 2, 10.0f * r + 3};
      Tensor l = backend->alloc(DType::F32, 2, 2), out = backend->alloc(DType::F32, 2, 2 * kRanks);
      backend->upload(local, l);
      comm->all_gather_cols(l, out);
      gathered[size_t(r)].resize(size_t(out.numel()));
      backend->download(out, gathered[size_t(r)].data());
    });
  for (auto& t : threads) t.join();
  const float in_order = ((1e8f + 1.0f) + -1e8f);  // rank 0 + rank 1 + rank 2, as the contract says
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(sums[size_t(r)][0], in_order) << "rank " << r;
    EXPECT_EQ(sums[size_t(r)][1], 3.0f);
    EXPECT_EQ(sums[size_t(r)][2], 1.5f);
    EXPECT_EQ(gathered[size_t(r)], (std::vector<float>{0, 1, 10, 11, 20, 21, 2, 3, 12, 13, 22, 23})) << "rank " << r;
  }
}

TEST(CpuCommunicator, AbortEndsEveryWaitWithTheReason) {
  auto group = make_cpu_comm_group(3);
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      auto backend = make_backend("cpu");
      auto comm = group->join(r, *backend);
      if (r == 2) return comm->abort("out of memory (simulated)");
      errors[size_t(r)] = test::error_of([&] { comm->barrier(); });
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(errors[size_t(r)], "tensor parallel: rank 2 failed: out of memory (simulated)") << "rank " << r;
  EXPECT_EQ(group->first_failed_rank(), 2);
}

TEST(CpuCommunicator, APeerThatNeverComesTimesOut) {
  auto group = make_cpu_comm_group(2, std::chrono::milliseconds(200));
  auto backend = make_backend("cpu");
  auto comm = group->join(0, *backend);  // rank 1 never joins
  const auto start = std::chrono::steady_clock::now();
  const std::string error = test::error_of([&] { comm->barrier(); });
  EXPECT_NE(error.find("rank 0 waited 200 ms in a collective for its peers"), std::string::npos) << error;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(group->first_failed_rank(), -1);  // nobody failed by itself
}

// ---- splitting the model ----

TEST(TensorParallel, NMustSplitTheHeadsAndWidths) {
  const ModelConfig c = gemma4_31b_config();
  for (int ok : {1, 2, 4, 8, 16, 32}) EXPECT_NO_THROW(check_tensor_parallel(c, ok)) << ok;
  EXPECT_EQ(test::error_of([&] { check_tensor_parallel(c, 3); }), "--tp 3: 32 query heads are not divisible by 3");
  EXPECT_EQ(test::error_of([&] { check_tensor_parallel(c, 0); }), "--tp must be at least 1, got 0");
  ModelConfig odd_kv = c;
  odd_kv.layers[5].kv_heads = 6;
  EXPECT_EQ(test::error_of([&] { check_tensor_parallel(odd_kv, 4); }),
            "--tp 4: the full layers' 6 KV heads are neither divisible by 4 nor a divisor of it");
  ModelConfig odd_mlp = c;
  odd_mlp.intermediate_size = 21506;
  EXPECT_EQ(test::error_of([&] { check_tensor_parallel(odd_mlp, 4); }),
            "--tp 4: 21506 MLP columns (intermediate_size) are not divisible by 4");
  // What each rank holds at tp 8: 4 query heads, 2 of the 16 sliding KV heads, and one of the 4 full
  // layers' KV heads, shared with the next rank (ranks 2r and 2r + 1 hold KV head r).
  const ModelConfig r = rank_config(c, 8);
  EXPECT_EQ(r.num_heads, 4);
  EXPECT_EQ(r.layers[0].kv_heads, 2);
  EXPECT_EQ(r.layers[5].kv_heads, 1);
  EXPECT_EQ(r.intermediate_size, 21504 / 8);
  EXPECT_EQ(kv_heads_of_rank(4, {5, 8}).first, 2);
  EXPECT_EQ(kv_heads_of_rank(16, {5, 8}).first, 10);
}

TEST(TensorParallel, BadNIsAClearErrorBeforeAnythingRuns) {
  EXPECT_EQ(test::error_of([] { run_tensor_parallel(demo_options(3), [](Engine&) {}); }),
            "--tp 3: 4 query heads are not divisible by 3");
  EXPECT_EQ(test::error_of([] { run_tensor_parallel(demo_options(0), [](Engine&) {}); }),
            "--tp must be at least 1, got 0");
  // More CUDA ranks than GPUs (a build without CUDA has none).
  const int gpus = cuda_devices(), n = std::max(2, gpus + 1);
  const std::string more = test::error_of([&] { run_tensor_parallel(demo_options(n, "cuda"), [](Engine&) {}); });
  EXPECT_EQ(more, "--tp " + std::to_string(n) + " needs " + std::to_string(n) + " CUDA GPUs, and " +
                      std::to_string(gpus) + (gpus == 1 ? " is" : " are") + " present");
}

// Only a build without NCCL has this answer to give (compiled out otherwise, so that no GPU check
// counts it as skipped).
#if !G4_HAVE_NCCL
TEST(TensorParallel, CudaWithoutNcclSaysSo) {
  ASSERT_FALSE(nccl_available());
  EXPECT_NE(test::error_of([] { make_nccl_comm_group(2); }).find("--tp 2 on CUDA needs NCCL, and this g4 was built without it"),
            std::string::npos);
}
#endif

TEST(TensorParallel, QuantizedColumnSlicesMustFallOnBlocks) {
  // tiny-31b-style's MLP is 160 wide: 80 columns per rank is not a whole number of Q8_0's 32-blocks.
  const std::string path = test::shared_artifact("tp-tiny-q8_0.gguf", [](const std::string& out) {
    ExportOptions o;
    o.weights = DType::Q8_0;
    export_gguf(HfCheckpoint(test::fixture_dir("tiny-31b-style")), out, o);
  });
  const std::string error = test::error_of([&] { run_tensor_parallel(demo_options(2, "cpu", path), [](Engine&) {}); });
  EXPECT_NE(error.find("tensor 'layers.0.mlp.down_proj.weight' (Q8_0, blocks of 32 columns) cannot be split by its "
                       "160 input columns into slices of 80"),
            std::string::npos)
      << error;
}

// ---- the split model computes what one device computes ----

TEST(TensorParallel, DemoLogitsMatchOneRankOnEveryRank) {
  const std::vector<int32_t> tokens = demo_tokens(150);  // past 2 × the window of 64: the ring wraps
  Engine one(demo_options(1));
  const std::vector<float> want = all_logits(one, tokens, 50);
  for (int tp : {2, 4}) {
    const auto got = on_every_rank<std::vector<float>>(demo_options(tp), [&](Engine& e) {
      EXPECT_EQ(e.tp_size(), tp);
      EXPECT_EQ(e.model().rank_config().num_heads, 4 / tp);
      // The rank holds only its slices: [out / tp, in] or [out, in / tp]; the embedding whole.
      const LayerWeights& l = e.model().weights().layers[0];
      EXPECT_EQ(l.q_proj.rows, 4 * 64 / tp);
      EXPECT_EQ(l.k_proj.rows, 64);  // one of the 2 KV heads (shared by two ranks at tp 4)
      EXPECT_EQ(l.o_proj.cols, 4 * 64 / tp);
      EXPECT_EQ(l.gate_proj.rows, 768 / tp);
      EXPECT_EQ(l.down_proj.cols, 768 / tp);
      EXPECT_EQ(e.model().weights().lm_head.rows, 4096 / tp);
      EXPECT_EQ(e.model().weights().embed.rows, 4096);
      return all_logits(e, tokens, 50);
    });
    const double rel = test::relative_l2(got[0], want);
    EXPECT_LE(rel, kRuleA) << "tp " << tp;
    // Both run float32 arithmetic; only the order of the split sums differs.
    EXPECT_LE(test::max_abs_diff(got[0], want), 1e-3) << "tp " << tp << " (relative L2 " << rel << ")";
    for (int r = 1; r < tp; ++r) EXPECT_EQ(got[size_t(r)], got[0]) << "tp " << tp << ": rank " << r << " differs";
  }
}

TEST(TensorParallel, RandomFixtureLogitsMatchOneRank) {
  // A checkpoint directory (F32), 1 KV head on the full layer: at tp 2 both ranks share it.
  const test::Reference ref = test::load_reference("tiny-31b-style");
  const std::string dir = test::fixture_dir("tiny-31b-style");
  Engine one(demo_options(1, "cpu", dir));
  const std::vector<float> want = all_logits(one, ref.tokens);
  const auto got = on_every_rank<std::vector<float>>(demo_options(2, "cpu", dir),
                                                     [&](Engine& e) { return all_logits(e, ref.tokens); });
  EXPECT_LE(test::max_abs_diff(got[0], want), 1e-3);
  EXPECT_EQ(got[1], got[0]);
}

TEST(TensorParallel, QuantizedDemoLogitsMatchOneRank) {
  const std::string path = test::shared_artifact("tp-demo-q8_0.gguf", [](const std::string& out) {
    ExportOptions o;
    o.weights = DType::Q8_0;
    export_gguf(HfCheckpoint(std::string(G4_FIXTURES_DIR) + "/demo/hf"), out, o);
  });
  const std::vector<int32_t> tokens = demo_tokens(40);
  Engine one(demo_options(1, "cpu", path));
  const std::vector<float> want = all_logits(one, tokens);
  for (int tp : {2, 4}) {
    const auto got = on_every_rank<std::vector<float>>(demo_options(tp, "cpu", path),
                                                       [&](Engine& e) { return all_logits(e, tokens); });
    EXPECT_LE(test::relative_l2(got[0], want), kRuleA) << "tp " << tp;
    EXPECT_LE(test::max_abs_diff(got[0], want), 1e-3) << "tp " << tp;
  }
}

TEST(TensorParallel, GreedyAndSeededGenerationsEqualOneRank) {
  Engine one(demo_options(1));
  for (const GenerationRequest& r : {demo_request(0.0f, 0), demo_request(1.0f, 7), demo_request(0.8f, 12345)}) {
    const std::vector<int32_t> want = generated(one, r);
    ASSERT_EQ(want.size(), 40u);
    for (int tp : {2, 4}) {
      const auto got =
          on_every_rank<std::vector<int32_t>>(demo_options(tp), [&](Engine& e) { return generated(e, r); });
      for (int rank = 0; rank < tp; ++rank)
        EXPECT_EQ(got[size_t(rank)], want) << "tp " << tp << ", rank " << rank << ", temperature "
                                           << r.sampler.params().temperature;
    }
  }
}

// Continuous batching split: rank 0 plans every step and publishes its inputs and plan; the other
// ranks run rank 0's plan (follow_scheduler) — with scheduler options of their own that would plan
// other steps, so a rank that re-derived the plan would run other forwards than rank 0's. The
// batched forwards, their all-reduces and the per-row draws give each sequence the tokens it gets
// on one rank.
std::vector<SchedulerRequest> scheduled_requests() {
  std::vector<SchedulerRequest> out;
  for (size_t i = 0; i < 6; ++i) {
    SchedulerRequest r;
    r.prompt = demo_tokens(8 + 7 * i);
    r.sampling = demo_request(i % 2 ? 0.9f : 0.0f, 100 + i).sampler.params();
    r.max_new_tokens = 12;
    r.stop_ids = {};
    out.push_back(r);
  }
  return out;
}

constexpr SchedulerOptions kRankZeroScheduling{.prefill_tokens_per_step = 24};

// Steps `scheduler` until idle; with `ranks`, publishes each step's inputs and plan first.
std::vector<std::vector<int32_t>> scheduled(Engine& engine, ScheduledRanks* ranks = nullptr) {
  Scheduler scheduler(engine.runner(), kRankZeroScheduling);
  std::map<RequestId, size_t> index;
  SchedulerInputs inputs;
  for (const SchedulerRequest& r : scheduled_requests()) {
    const RequestId id = scheduler.add(r);
    const size_t i = index.size();
    index[id] = i;
    inputs.added.push_back(r);
  }
  std::vector<std::vector<int32_t>> tokens(index.size());
  while (!scheduler.idle()) {
    const StepPlan plan = scheduler.plan();
    inputs.plan = plan;
    if (ranks) ranks->inputs.publish(std::exchange(inputs, {}));
    for (const SequenceEvent& e : scheduler.execute(plan)) tokens[index[e.id]].push_back(e.drawn.token);
  }
  if (ranks) ranks->inputs.publish(SchedulerInputs{.stop = true});
  return tokens;
}

TEST(TensorParallel, FollowersRunRankZerosPlanAndEqualOneRank) {
  EngineOptions one = demo_options(1);
  one.kv_budget_bytes = size_t(64) << 20;
  one.max_batch_sequences = 8;
  Engine engine(one);
  const auto want = scheduled(engine);
  EngineOptions split = one;
  split.tp = 2;
  ScheduledRanks ranks(2);
  std::vector<std::vector<int32_t>> got;
  run_with_inputs<SchedulerInputs>(split, ranks.inputs, [&](Engine& e) {
    if (e.tp_rank() == 0) {
      got = scheduled(e, &ranks);
    } else {
      follow_scheduler(e, SchedulerOptions{.prefill_tokens_per_step = 5}, ranks);
      EXPECT_EQ(e.kv_pool().pages_in_use(), 0) << "the follower freed every sequence rank 0 freed";
    }
  });
  EXPECT_EQ(got, want);
}

// ---- inputs from rank 0 (docs/DESIGN.md §9, "Front ends") ----

TEST(RankInputs, EveryRankTakesEveryEventInOrder) {
  RankInputs<int> inputs(4);
  std::vector<std::vector<int>> seen(4);
  std::vector<std::thread> followers;
  for (int r = 1; r < 4; ++r)
    followers.emplace_back([&, r] {
      for (int e; (e = inputs.next(r)) >= 0;) seen[size_t(r)].push_back(e);
    });
  for (int e = 0; e < 1000; ++e) inputs.publish(e);
  inputs.publish(-1);
  for (auto& t : followers) t.join();
  std::vector<int> want(1000);
  for (int e = 0; e < 1000; ++e) want[size_t(e)] = e;
  for (int r = 1; r < 4; ++r) EXPECT_EQ(seen[size_t(r)], want) << "rank " << r;
}

TEST(RankInputs, AbortReleasesEveryWaitingRankWithTheReason) {
  RankInputs<int> inputs(3);
  std::string hooked;
  inputs.on_abort([&](const std::string& what) { hooked = what; });
  std::vector<std::string> errors(3);
  std::vector<std::thread> followers;
  for (int r = 1; r < 3; ++r)
    followers.emplace_back([&, r] { errors[size_t(r)] = test::error_of([&] { inputs.next(r); }); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // both are waiting (or about to)
  inputs.abort(0, "stdin went away");
  inputs.abort(1, "a later echo");  // the first failure stays
  for (auto& t : followers) t.join();
  EXPECT_EQ(errors[1], "tensor parallel: rank 0 failed: stdin went away");
  EXPECT_EQ(errors[2], errors[1]);
  EXPECT_EQ(hooked, "stdin went away");
  inputs.publish(7);  // events after the failure are never taken
  EXPECT_EQ(test::error_of([&] { inputs.next(1); }), errors[1]);
}

TEST(RankInputs, AFailingRankReleasesPeersWaitingForInput) {
  // Rank 0 fails before it publishes anything: rank 1, waiting for an input, gets its reason.
  RankInputs<int> inputs(2);
  std::string peer;
  const std::string error = test::error_of([&] {
    run_with_inputs<int>(demo_options(2), inputs, [&](Engine& engine) {
      if (engine.tp_rank() == 0) throw Error("simulated failure reading stdin");
      peer = test::error_of([&] { inputs.next(1); });
      throw PeerFailure(peer);
    });
  });
  EXPECT_EQ(error, "simulated failure reading stdin");
  EXPECT_EQ(peer, "tensor parallel: rank 0 failed: simulated failure reading stdin");
}

// ---- failures: a clear error from every rank, no hang ----

TEST(TensorParallel, ARankThatFailsToLoadStopsEveryRank) {
  // The ranks as run_tensor_parallel makes them, except that rank 1 is given a file that is not there.
  auto group = make_cpu_comm_group(2, std::chrono::seconds(60));
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      EngineOptions o = demo_options(2, "cpu", r == 1 ? "/nonexistent/model.gguf" : demo());
      o.tp_group = group.get();
      o.tp_rank = r;
      errors[size_t(r)] = test::error_of([&] { Engine engine(o); });
    });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(errors[1], "model path '/nonexistent/model.gguf' does not exist");
  EXPECT_EQ(errors[0], "tensor parallel: rank 1 failed: model path '/nonexistent/model.gguf' does not exist");
}

TEST(TensorParallel, ARankThatFailsAfterJoiningStopsEveryRank) {
  // Rank 1 loads, then fails building its runner (a context below the sliding window): its
  // communicator is destroyed by the error before anything aborted the group.
  auto group = make_cpu_comm_group(2, std::chrono::seconds(30));
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      EngineOptions o = demo_options(2);
      o.max_seq_len = r == 1 ? 8 : 0;
      o.tp_group = group.get();
      o.tp_rank = r;
      errors[size_t(r)] = test::error_of([&] { Engine engine(o); });
    });
  for (auto& t : ranks) t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10)) << "rank 0 waited for the timeout";
  EXPECT_NE(errors[1].find("max_seq_len 8 is below what the model needs"), std::string::npos) << errors[1];
  EXPECT_EQ(errors[0], "tensor parallel: rank 1 failed: an error unwound this rank (its own message says which)");
  EXPECT_EQ(group->first_failed_rank(), 1);
}

TEST(TensorParallel, ARankThatFailsMidGenerationStopsEveryRank) {
  std::atomic<int> peers_stopped{0};
  const std::string error = test::error_of([&] {
    run_tensor_parallel(demo_options(2), [&](Engine& engine) {
      if (engine.tp_rank() == 1) throw Error("simulated failure on rank 1");
      try {
        generated(engine, demo_request(0.0f, 0));  // waits for rank 1 at its first collective
      } catch (const PeerFailure& e) {
        EXPECT_EQ(std::string(e.what()), "tensor parallel: rank 1 failed: simulated failure on rank 1");
        ++peers_stopped;
        throw;
      }
    });
  });
  EXPECT_EQ(error, "simulated failure on rank 1");  // the root cause, not the peers' echo of it
  EXPECT_EQ(peers_stopped.load(), 1);
}

// ---- the command line ----

// The output of g4 `arguments`, which must succeed, up to its report (timings differ run to run).
std::string output_of(const std::string& arguments) {
  const test::CommandResult r = test::run_g4(arguments);
  EXPECT_EQ(r.exit_code, 0) << arguments << ": " << r.output;
  return r.output.substr(0, r.output.find("--- report ---"));
}

TEST(TensorParallelCli, RunPrintsTheTokensOfOneRank) {
  for (const std::string sampling : {"--temperature 0", "--temperature 1 --top_k 50 --seed 3"}) {
    const std::string base = "run --model_path " + demo() + " --prompt 'The fox' -n 24 --print_token_ids " + sampling;
    const std::string want = output_of(base);
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(output_of(base + " --tp 2"), want) << sampling;  // printed once: by rank 0
    EXPECT_EQ(output_of(base + " --tp 4"), want) << sampling;
  }
}

TEST(TensorParallelCli, ARandomSeedIsDrawnOnceForEveryRank) {
  // Ranks that drew seeds of their own would feed different tokens into the shared sums: the text
  // would match no single seed's.
  const test::CommandResult split = test::run_g4("run --model_path " + demo() + " --prompt 'The fox' -n 24 --print_token_ids --temperature 1 --tp 2");
  ASSERT_EQ(split.exit_code, 0) << split.output;
  const std::string key = "Sampling base seed: ";
  const size_t at = split.output.find(key);
  ASSERT_NE(at, std::string::npos) << split.output;
  EXPECT_EQ(split.output.find(key, at + 1), std::string::npos) << "printed by every rank: " << split.output;
  const std::string seed = split.output.substr(at + key.size(), split.output.find('\n', at) - at - key.size());
  const std::string ids = split.output.substr(split.output.find('\n', at) + 1);
  EXPECT_EQ(ids.substr(0, ids.find('\n')),
            output_of("run --model_path " + demo() + " --prompt 'The fox' -n 24 --print_token_ids --temperature 1 --seed " + seed).substr(0, ids.find('\n')));
}

// g4 chat over `lines` (one per line on standard input), its whole output: rank 0 prints the
// replies and the per-turn reports, whose timings are cut.
std::string chat_of(const std::string& arguments, const std::string& lines) {
  const std::string input = test::temp_dir("tp-chat") + "/input.txt";
  std::ofstream(input) << lines;
  const test::CommandResult r = test::run_g4("chat " + arguments + " < " + input);
  EXPECT_EQ(r.exit_code, 0) << arguments << ": " << r.output;
  std::string out;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);)
    out += line.rfind("[prefilled", 0) == 0 ? line.substr(0, line.find(" in ")) + "\n" : line + "\n";
  return out;
}

TEST(TensorParallelCli, ChatTranscriptsEqualOneRank) {
  // Three turns, a reset and an unknown command: every rank must run the same turns, in the same
  // order, from rank 0's standard input.
  const std::string lines = "Tell me a fortune\nAnother one\n/oops\n/reset\nAnd one more\n";
  for (const std::string sampling : {"--temperature 0", "--temperature 1 --top_k 50 --seed 3"}) {
    const std::string base = "--model_path " + demo() + " -n 12 " + sampling;
    const std::string want = chat_of(base, lines);
    ASSERT_NE(want.find("[conversation reset]"), std::string::npos) << want;
    EXPECT_EQ(chat_of(base + " --tp 2", lines), want) << sampling;
    EXPECT_EQ(chat_of(base + " --tp 4", lines), want) << sampling;
  }
  // The embedded chat model splits in two; its Q4_K blocks do not fall on a quarter of its MLP.
  const std::string want = chat_of("-n 16 --temperature 0", "Hello\nWhat can you do?\n");
  EXPECT_EQ(chat_of("-n 16 --temperature 0 --tp 2", "Hello\nWhat can you do?\n"), want);
  const test::CommandResult four = test::run_g4("chat -n 4 --tp 4 < /dev/null");
  EXPECT_NE(four.exit_code, 0);
  EXPECT_NE(four.output.find("cannot be split"), std::string::npos) << four.output;
}

// g4 chat `tp` on the embedded demo, with a turn that rambles (temperature 2, seed 1: 469 tokens)
// and a Ctrl-C once its first text is out, then a second turn: its output and exit status.
test::CommandResult chat_interrupted(const std::string& tp) {
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) return {-1, "pipe failed"};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(out[1], 2);
    close(in[1]);
    close(out[0]);
    execl(G4_BINARY, G4_BINARY, "chat", "-n", "100000", "--temperature", "2", "--top_k", "0", "--top_p", "1",
          "--min_p", "0", "--seed", "1", "--tp", tp.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  const std::string first = "Tell me a story\n", second = "Hi\n";
  (void)!write(in[1], first.data(), first.size());
  test::CommandResult r{-1, ""};
  char buffer[4096];
  // The header line (stderr), then the reply's first text: the reply is running.
  for (ssize_t n; (n = read(out[0], buffer, sizeof buffer)) > 0;) {
    r.output.append(buffer, size_t(n));
    const size_t header_end = r.output.find('\n');
    if (header_end != std::string::npos && r.output.size() > header_end + 1) break;
  }
  kill(pid, SIGINT);
  (void)!write(in[1], second.data(), second.size());
  close(in[1]);
  for (ssize_t n; (n = read(out[0], buffer, sizeof buffer)) > 0;) r.output.append(buffer, size_t(n));
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(TensorParallelCli, CtrlCStopsAChatReplyOnEveryRank) {
  // Every rank must stop at the token rank 0 saw the Ctrl-C at: a rank that went on would feed
  // its next token into the shared sums alone, and the next turn would hang or differ.
  for (const std::string tp : {"1", "2"}) {
    const test::CommandResult r = chat_interrupted(tp);
    EXPECT_EQ(r.exit_code, 0) << "--tp " << tp << ": " << r.output;
    const size_t first_report = r.output.find("[prefilled");
    ASSERT_NE(first_report, std::string::npos) << r.output;
    const std::string report = r.output.substr(first_report, r.output.find('\n', first_report) - first_report);
    EXPECT_NE(report.find("; stopped"), std::string::npos) << "--tp " << tp << ": " << report;
    EXPECT_NE(r.output.find("[prefilled", first_report + 1), std::string::npos) << "the second turn did not run: " << r.output;
  }
}

TEST(TensorParallelCli, BadTpAndUnsupportedFrontEndsAreClearErrors) {
  auto error_of = [](const std::string& arguments) {
    const test::CommandResult r = test::run_g4(arguments);
    EXPECT_NE(r.exit_code, 0) << arguments;
    return r.output;
  };
  EXPECT_NE(error_of("run -p x --tp 3").find("--tp 3: 8 query heads are not divisible by 3"), std::string::npos);
  EXPECT_NE(error_of("run -p x --tp 2 --cuda_graph").find("--cuda_graph needs --backend cuda"), std::string::npos);
  if (cuda_devices() < 2)
    EXPECT_NE(error_of("bench --synthetic 31b --tp 2").find("--tp 2 needs 2 CUDA GPUs, and " +
                                                            std::to_string(cuda_devices())),
              std::string::npos);
}

TEST(TensorParallelCli, BenchReportsTheCollectivesShare) {
  const std::string out =
      output_of("bench --model_path " + demo() + " --backend cpu --tp 2 --prompt_len 16 --gen 4");
  for (const char* key : {"\"tp\": 2", "\"decode_greedy_tok_s\"", "\"prefill_s_median\"", "\"all_reduce_pct_of_step\""})
    EXPECT_NE(out.find(key), std::string::npos) << key << " in " << out;
}

// Every rank runs the same requests through its own scheduler, in step: every sequence ends (here
// with whole forwards, --batch_invariant false).
TEST(TensorParallelCli, BenchConcurrencyRunsSplit) {
  const nlohmann::json j = nlohmann::json::parse(
      output_of("bench --model_path " + demo() +
                " --backend cpu --tp 2 --concurrency 1,3 --prompt_len 8 --gen 4 --batch_invariant false 2>/dev/null"));
  EXPECT_EQ(j["tp"].get<int>(), 2);
  EXPECT_FALSE(j["batch_invariant"].get<bool>());
  ASSERT_EQ(j["runs"].size(), 2u);
  for (const auto& run : j["runs"])
    EXPECT_EQ(run["generated_tokens"].get<int64_t>(), 4 * run["concurrency"].get<int64_t>());
}

// ---- CUDA: two GPUs (skips with the count found) ----

int usable_gpus() { return cuda_devices(); }

// Even with G4_REQUIRE_GPU=1: a one-GPU machine cannot run these; the count says why they skipped.
#define G4_SKIP_WITHOUT_TWO_GPUS()                                                             \
  do {                                                                                         \
    if (usable_gpus() < 2) GTEST_SKIP() << "needs 2 CUDA GPUs for --tp 2, found " << usable_gpus(); \
  } while (0)

// bf16 values that add exactly, so every rank must see exactly these sums and blocks.
TEST(TensorParallelCuda, NcclSumsAndGathersOnEveryRank) {
  G4_SKIP_WITHOUT_TWO_GPUS();
  auto group = make_nccl_comm_group(2, std::chrono::seconds(60));
  std::vector<std::vector<float>> sums(2), gathered(2);
  run_rank_threads(*group, [&](int r) {
    auto backend = make_backend("cuda", r);
    auto comm = group->join(r, *backend);
    std::vector<uint8_t> bytes(64);
    auto upload = [&](const std::vector<float>& values, int64_t rows, int64_t cols) {
      Tensor t = backend->alloc(DType::BF16, rows, cols);
      encode_row(DType::BF16, values.data(), rows * cols, bytes.data());
      backend->upload(bytes.data(), t);
      return t;
    };
    auto download = [&](const Tensor& t) {
      std::vector<float> values(size_t(t.numel()));
      backend->download(t, bytes.data());
      decode_row(DType::BF16, bytes.data(), t.numel(), values.data());
      return values;
    };
    const Tensor x = upload({1.0f + r, 2.0f * r, -4.0f}, 1, 3);
    comm->all_reduce_sum(x);
    sums[size_t(r)] = download(x);
    const float b = 10.0f * r;  // local [2, 2] = {b, b+1; b+2, b+3}: the two-row path
    const Tensor local = upload({b, b + 1, b + 2, b + 3}, 2, 2), out = backend->alloc(DType::BF16, 2, 4);
    comm->all_gather_cols(local, out);
    gathered[size_t(r)] = download(out);
    comm->barrier();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(sums[size_t(r)], (std::vector<float>{3, 2, -8})) << "rank " << r;
    EXPECT_EQ(gathered[size_t(r)], (std::vector<float>{0, 1, 10, 11, 2, 3, 12, 13})) << "rank " << r;
  }
}

// Rank 0 runs `wait` (a collective) while rank 1 either fails after `fail_after` (abort) or never
// comes to it (the 3 s timeout): rank 0's wait ends with the right error either way, never a hang.
void expect_abort_and_timeout_end_the_wait(const std::function<void(Backend&, Communicator&)>& wait,
                                           std::chrono::milliseconds fail_after) {
  for (const bool rank1_aborts : {true, false}) {
    auto group = make_nccl_comm_group(2, std::chrono::seconds(3));
    const auto start = std::chrono::steady_clock::now();
    const std::string error = test::error_of([&] {
      run_rank_threads(*group, [&](int r) {
        auto backend = make_backend("cuda", r);
        auto comm = group->join(r, *backend);
        if (r == 1) {
          std::this_thread::sleep_for(rank1_aborts ? fail_after : std::chrono::milliseconds(8000));
          if (rank1_aborts) throw Error("out of memory (simulated)");
          return;
        }
        wait(*backend, *comm);
      });
    });
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
    if (rank1_aborts)
      EXPECT_EQ(error, "out of memory (simulated)");
    else
      EXPECT_NE(error.find("did not complete in 3000 ms (a peer stopped responding)"), std::string::npos) << error;
  }
}

TEST(TensorParallelCuda, NcclAbortAndTimeoutEndTheWait) {
  G4_SKIP_WITHOUT_TWO_GPUS();
  expect_abort_and_timeout_end_the_wait([](Backend&, Communicator& comm) { comm.barrier(); }, std::chrono::milliseconds(0));
}

float bf16_round(float v) { return bf16_to_f32(f32_to_bf16(v)); }

// Rank r's values of a [rows, cols] bf16 tensor: distinct per rank, position and round.
std::vector<float> rank_values(int r, int64_t rows, int64_t cols, int round) {
  std::vector<float> v(size_t(rows * cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(int((i * 7919 + size_t(r) * 104729 + size_t(round) * 31) % 2001) - 1000) / 64.0f;
  return v;
}

// What every rank must hold after summing rank_values of `size` ranks: the float32 sum in rank
// order, rounded to bf16 once.
std::vector<uint8_t> expected_bf16_sum(int size, int64_t rows, int64_t cols, int round) {
  std::vector<float> sum(size_t(rows * cols), 0.0f);
  for (int r = 0; r < size; ++r) {
    const std::vector<float> v = rank_values(r, rows, cols, round);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += bf16_round(v[i]);
  }
  std::vector<uint8_t> bytes(sum.size() * 2);
  encode_row(DType::BF16, sum.data(), int64_t(sum.size()), bytes.data());
  return bytes;
}

// The peer-memory all-reduce gives every rank the exact rank-order sum: a decode row, a batch of
// rows, a prefill chunk larger than one piece, many times over (both inbox halves, every epoch
// parity), and F32 too; the group says it took that path.
TEST(TensorParallelCuda, PeerAllReduceSumsExactlyAtEverySize) {
  G4_SKIP_WITHOUT_TWO_GPUS();
  auto group = make_nccl_comm_group(2, std::chrono::seconds(60));
  std::vector<std::string> paths(2), failures(2);
  run_rank_threads(*group, [&](int r) {
    auto backend = make_backend("cuda", r);
    auto comm = group->join(r, *backend);
    paths[size_t(r)] = comm->all_reduce_path();
    std::vector<uint8_t> bytes;
    int round = 0;
    for (const auto& [rows, repeats] : std::vector<std::pair<int64_t, int>>{{1, 300}, {64, 5}, {2048, 2}, {3, 5}}) {
      const int64_t cols = 5376;
      Tensor t = backend->alloc(DType::BF16, rows, cols);
      bytes.resize(t.bytes());
      for (int i = 0; i < repeats; ++i, ++round) {
        encode_row(DType::BF16, rank_values(r, rows, cols, round).data(), rows * cols, bytes.data());
        backend->upload(bytes.data(), t);
        comm->all_reduce_sum(t);
        backend->download(t, bytes.data());
        if (bytes != expected_bf16_sum(2, rows, cols, round) && failures[size_t(r)].empty())
          failures[size_t(r)] = "rows " + std::to_string(rows) + ", round " + std::to_string(round);
      }
    }
    const Tensor f = backend->alloc(DType::F32, 2, 4);
    const std::vector<float> mine{1.5f * float(r + 1), -2.0f, 1e-3f, 3.0f, 0.25f, 1e8f, -1e8f, float(r)};
    backend->upload(mine.data(), f);
    comm->all_reduce_sum(f);
    std::vector<float> got(8);
    backend->download(f, got.data());
    if (got != std::vector<float>{4.5f, -4.0f, 2e-3f, 6.0f, 0.5f, 2e8f, -2e8f, 1.0f}) failures[size_t(r)] += " f32";
    comm->barrier();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(paths[size_t(r)], "peer memory") << "rank " << r << ": the GPUs should reach each other's memory";
    EXPECT_EQ(failures[size_t(r)], "") << "rank " << r;
  }
}

// Collectives recorded in a CUDA graph (as a split decode step records them) sum each replay's
// inputs: the epochs live in device memory, so every replay is a new exchange.
TEST(TensorParallelCuda, RecordedCollectivesSumEveryReplay) {
  G4_SKIP_WITHOUT_TWO_GPUS();
  for (const CudaAllReduce kind : {CudaAllReduce::kPeerWhenReachable, CudaAllReduce::kNccl}) {
    auto group = make_nccl_comm_group(2, std::chrono::seconds(60), kind);
    std::vector<std::string> failures(2);
    run_rank_threads(*group, [&](int r) {
      auto backend = make_backend("cuda", r);
      auto comm = group->join(r, *backend);
      const int64_t cols = 5376;
      const Tensor a = backend->alloc(DType::BF16, 1, cols), b = backend->alloc(DType::BF16, 1, cols);
      const Tensor shard = backend->alloc(DType::BF16, 1, 8), whole = backend->alloc(DType::BF16, 1, 16);
      comm->all_gather_cols(shard, whole);  // the first gather of a size runs eagerly
      std::unique_ptr<Backend::RecordedStep> step;
      backend->begin_capture();
      for (int i = 0; i < 7; ++i) comm->all_reduce_sum(i % 2 ? b : a);  // a summed 4 times, b 3 times
      comm->all_gather_cols(shard, whole);
      backend->end_capture(step);
      std::vector<uint8_t> bytes(size_t(a.bytes()));
      for (int round = 0; round < 5; ++round) {
        encode_row(DType::BF16, rank_values(r, 1, cols, round).data(), cols, bytes.data());
        backend->upload(bytes.data(), a);
        backend->upload(bytes.data(), b);
        backend->replay(*step);
        // Each all-reduce doubles the two ranks' common sum: a = 8 × (sum of both), b = 4 × that.
        std::vector<float> got(static_cast<size_t>(cols));
        const std::vector<float> x0 = rank_values(0, 1, cols, round), x1 = rank_values(1, 1, cols, round);
        backend->download(b, bytes.data());
        decode_row(DType::BF16, bytes.data(), cols, got.data());
        for (int64_t i = 0; i < cols; ++i) {
          const float s = bf16_round(bf16_round(x0[size_t(i)]) + bf16_round(x1[size_t(i)]));
          if (got[size_t(i)] != bf16_round(4.0f * s) && failures[size_t(r)].empty())
            failures[size_t(r)] = "round " + std::to_string(round) + ", column " + std::to_string(i);
        }
      }
      comm->barrier();
    });
    for (int r = 0; r < 2; ++r)
      EXPECT_EQ(failures[size_t(r)], "") << "rank " << r << (kind == CudaAllReduce::kNccl ? " (nccl)" : " (peer)");
  }
}

// A peer that never comes to an all-reduce over peer memory, or fails while rank 0's kernel waits,
// ends the waiting kernel.
TEST(TensorParallelCuda, PeerAllReduceAbortAndTimeoutEndTheWait) {
  G4_SKIP_WITHOUT_TWO_GPUS();
  expect_abort_and_timeout_end_the_wait(
      [](Backend& backend, Communicator& comm) {
        comm.all_reduce_sum(backend.alloc(DType::BF16, 1, 5376));
        backend.synchronize();
        comm.barrier();
      },
      std::chrono::milliseconds(500));
}

TEST(TensorParallelCuda, DemoLogitsMatchOneGpu) {
  G4_SKIP_WITHOUT_TWO_GPUS();
  const std::vector<int32_t> tokens = demo_tokens(150);
  Engine one(demo_options(1, "cuda"));
  const std::vector<float> want = all_logits(one, tokens, 50);
  Engine cpu(demo_options(1, "cpu"));
  const std::vector<float> oracle = all_logits(cpu, tokens, 50);
  const auto got = on_every_rank<std::vector<float>>(demo_options(2, "cuda"),
                                                     [&](Engine& e) { return all_logits(e, tokens, 50); });
  EXPECT_LE(test::relative_l2(got[0], oracle), kRuleA);
  EXPECT_LE(test::relative_l2(got[0], want), kRuleA);
  EXPECT_EQ(got[1], got[0]) << "the ranks hold different logits";
}

// The index of the first generated token whose one-GPU top-2 margin is below `margin` logits (the
// tokens before it are decided clearly enough that bf16 rounding of the split sums cannot flip them).
size_t first_near_tie(Engine& engine, const std::vector<int32_t>& prompt, const std::vector<int32_t>& tokens,
                      float margin) {
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), tokens.begin(), tokens.end());
  const std::vector<float> logits = all_logits(engine, all);
  const size_t V = size_t(engine.config().vocab_size);
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::vector<float> row(logits.begin() + long((prompt.size() - 1 + i) * V),
                           logits.begin() + long((prompt.size() + i) * V));
    std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
    if (row[0] - row[1] < margin) return i;
  }
  return tokens.size();
}

TEST(TensorParallelCuda, GreedyGenerationsEqualOneGpuWhereTheLogitsAgree) {
  G4_SKIP_WITHOUT_TWO_GPUS();
  const GenerationRequest r = demo_request(0.0f, 0);
  Engine one(demo_options(1, "cuda"));
  const std::vector<int32_t> want = generated(one, r);
  const auto got = on_every_rank<std::vector<int32_t>>(demo_options(2, "cuda"), [&](Engine& e) { return generated(e, r); });
  EXPECT_EQ(got[0], got[1]) << "the ranks drew different tokens";
  // Equal up to the first near-tie (0.1 logits; rule (a)'s bf16 differences are far smaller).
  const size_t clear = first_near_tie(one, r.prompt, want, 0.1f);
  EXPECT_GE(clear, 8u) << "the demo's greedy text should not be tied so early";
  EXPECT_EQ(std::vector<int32_t>(got[0].begin(), got[0].begin() + long(clear)),
            std::vector<int32_t>(want.begin(), want.begin() + long(clear)));
}

// A split decode step replayed from a CUDA graph (its all-reduces and gather recorded) draws the
// eager split decode's tokens, greedy and seeded, on every rank.
TEST(TensorParallelCuda, GraphDecodeEqualsEagerOnEveryRank) {
  G4_SKIP_WITHOUT_TWO_GPUS();
  for (const float temperature : {0.0f, 1.0f}) {
    const GenerationRequest eager = demo_request(temperature, 11);
    GenerationRequest graph = eager;
    graph.graph = true;
    const auto got = on_every_rank<std::vector<int32_t>>(demo_options(2, "cuda"), [&](Engine& e) {
      std::vector<int32_t> both = generated(e, eager);
      const std::vector<int32_t> replayed = generated(e, graph);
      both.insert(both.end(), replayed.begin(), replayed.end());
      return both;
    });
    for (int r = 0; r < 2; ++r) {
      const std::vector<int32_t>& g = got[size_t(r)];
      ASSERT_EQ(g.size(), 80u) << "rank " << r;
      EXPECT_EQ(std::vector<int32_t>(g.begin(), g.begin() + 40), std::vector<int32_t>(g.begin() + 40, g.end()))
          << "rank " << r << ", temperature " << temperature;
    }
    EXPECT_EQ(got[0], got[1]);
  }
}

TEST(TensorParallelCuda, SeededGenerationsEqualOnEveryRank) {
  G4_SKIP_WITHOUT_TWO_GPUS();
  const GenerationRequest r = demo_request(1.0f, 7);
  const auto got = on_every_rank<std::vector<int32_t>>(demo_options(2, "cuda"), [&](Engine& e) { return generated(e, r); });
  EXPECT_EQ(got[0], got[1]);
  EXPECT_EQ(got[0].size(), 40u);
}

}  // namespace
}  // namespace g4
