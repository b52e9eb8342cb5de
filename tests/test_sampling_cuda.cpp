// The CUDA sampler against the CPU sampler: the same token for the same logits, parameters and
// seed; the same distributions; NaN rows (kNanLogitsToken); CUDA-graph replays that advance the seed.
// Skipped (with the reason) when CUDA is not compiled in or no GPU is present; G4_REQUIRE_GPU=1 fails instead.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "sampling/cpu_sampler.h"
#include "sampling/sampling_params.h"
#include "support/fixtures.h"
#include "support/sampling_reference.h"
#include "util/error.h"

#ifdef G4_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/cuda_sampler.h"
#endif

namespace g4 {
namespace {

#ifndef G4_HAVE_CUDA

TEST(CudaSampler, NeedsACudaBuild) { G4_SKIP_OR_FAIL_WITHOUT_GPU(false); }

#else

bool gpu_present() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}

void check(cudaError_t err) { ASSERT_EQ(err, cudaSuccess) << cudaGetErrorString(err); }

template <class T>
struct DeviceArray {
  T* data = nullptr;
  size_t size = 0;
  explicit DeviceArray(size_t n) : size(n) { check(cudaMalloc(&data, n * sizeof(T))); }
  ~DeviceArray() { cudaFree(data); }
  void upload(const std::vector<T>& host) {
    ASSERT_LE(host.size(), size);
    check(cudaMemcpy(data, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download(size_t n) const {
    std::vector<T> host(n);
    check(cudaMemcpy(host.data(), data, n * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
};

constexpr int64_t kMaxVocab = 262144;
constexpr float kInf = std::numeric_limits<float>::infinity();

class CudaSamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    G4_SKIP_OR_FAIL_WITHOUT_GPU(gpu_present());
    sampler_ = std::make_unique<CudaSampler>(kMaxVocab);
  }
  std::unique_ptr<CudaSampler> sampler_;
};

// Logits with the shapes that stress the sampler: smooth, with exact ties, with -inf, all equal,
// huge, one dominant token.
std::vector<float> random_row(std::mt19937_64& rng, int64_t vocab) {
  std::uniform_int_distribution<int> kind(0, 5);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  const float scale = 0.1f + 6.0f * uniform(rng);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> row(static_cast<size_t>(vocab));
  const int shape = kind(rng);
  for (float& z : row) {
    z = normal(rng);
    if (shape == 1) z = std::round(z * 2.0f) / 2.0f;  // many exact ties
    if (shape == 2 && uniform(rng) < 0.3f) z = -kInf;
    if (shape == 3) z = 1.5f;
    if (shape == 4) z *= 1e4f;
  }
  if (shape == 5) row[size_t(rng() % uint64_t(vocab))] = 40.0f;
  return row;
}

SamplingParams random_params(std::mt19937_64& rng, int64_t vocab) {
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  SamplingParams p;
  const float pick = uniform(rng);
  p.temperature = pick < 0.1f ? 0.0f : pick < 0.15f ? -1.0f : 0.05f + 1.95f * uniform(rng);
  const uint64_t k = rng() % 6;
  p.top_k = k == 0 ? 0 : k == 1 ? 1 : k == 2 ? 50 : k == 3 ? int32_t(vocab + 3) : int32_t(rng() % uint64_t(vocab + 1));
  const uint64_t top_p = rng() % 4;
  p.top_p = top_p == 0 ? 1.0f : top_p == 1 ? 1e-6f : std::max(1e-3f, uniform(rng));
  p.min_p = rng() % 3 == 0 ? 0.3f * uniform(rng) : 0.0f;
  p.seed = rng();
  return p;
}

// The CUDA sampler's tokens for rows of `vocab` logits (one row per parameter set).
std::vector<int64_t> sample_on_gpu(CudaSampler& sampler, const std::vector<float>& logits,
                                   const std::vector<SamplingParams>& params, int64_t vocab) {
  DeviceArray<float> device_logits(logits.size());
  DeviceArray<SamplingParams> device_params(params.size());
  DeviceArray<int64_t> device_tokens(params.size());
  device_logits.upload(logits);
  device_params.upload(params);
  const int64_t rows = int64_t(params.size());
  sampler.sample({device_logits.data, vocab, rows, vocab, device_params.data, device_tokens.data, false}, nullptr);
  return device_tokens.download(params.size());
}

// Samples `rows` random (logits, params, seed) cases of one vocabulary size on both samplers.
int64_t expect_same_tokens(CudaSampler& sampler, std::mt19937_64& rng, int64_t vocab, int64_t rows) {
  std::vector<float> logits;
  logits.reserve(size_t(vocab * rows));
  std::vector<SamplingParams> params;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> row = random_row(rng, vocab);
    logits.insert(logits.end(), row.begin(), row.end());
    params.push_back(random_params(rng, vocab));
  }
  const std::vector<int64_t> tokens = sample_on_gpu(sampler, logits, params, vocab);
  int64_t mismatches = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t expected = sample_row(logits.data() + r * vocab, vocab, params[size_t(r)]);
    if (tokens[size_t(r)] != expected && ++mismatches <= 5) {
      const SamplingParams& p = params[size_t(r)];
      ADD_FAILURE() << "V=" << vocab << " row " << r << ": cuda " << tokens[size_t(r)] << ", cpu " << expected
                    << " (T=" << p.temperature << " k=" << p.top_k << " p=" << p.top_p << " min_p=" << p.min_p
                    << " seed=" << p.seed << ")";
    }
  }
  EXPECT_EQ(mismatches, 0) << "V = " << vocab;
  return rows;
}

TEST_F(CudaSamplerTest, SameTokenAsTheCpuSampler) {
  std::mt19937_64 rng(2026);
  int64_t cases = 0;
  for (int64_t vocab : {1, 2, 3, 5, 8, 17, 64, 300, 1000}) {
    for (int batch = 0; batch < 3; ++batch) cases += expect_same_tokens(*sampler_, rng, vocab, 4096);
  }
  cases += expect_same_tokens(*sampler_, rng, 4097, 4096);
  cases += expect_same_tokens(*sampler_, rng, 50001, 512);
  for (int batch = 0; batch < 4; ++batch) cases += expect_same_tokens(*sampler_, rng, kMaxVocab, 64);
  EXPECT_GE(cases, 100000);
}

// Batches around the sampler's chunks of 128 rows and its segment counts, odd vocabularies (rows
// not 16-byte aligned, partial 32-logit lines), random shapes and parameters per row.
TEST_F(CudaSamplerTest, BatchSizesAndOddVocabularies) {
  std::mt19937_64 rng(77);
  const std::pair<int64_t, int64_t> cases[] = {{262143, 17}, {100003, 65}, {8193, 129}, {33, 300}, {4096, 3}, {262144, 1}};
  for (const auto& [vocab, rows] : cases) expect_same_tokens(*sampler_, rng, vocab, rows);
}

// `rows` rows of logits shaped like a language model's (bench/bench_sampling.cpp): a soft-capped
// normal bulk and a few strong candidates.
std::vector<float> model_like_rows(std::mt19937_64& rng, int64_t vocab, int64_t rows) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(size_t(vocab * rows));
  for (float& z : logits) z = 30.0f * std::tanh(normal(rng) / 30.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int j = 0; j < 20; ++j) logits[size_t(r * vocab) + rng() % uint64_t(vocab)] = 15.0f + float(j) * 0.3f;
  }
  return logits;
}

// Parameter sets side by side in one batch: greedy rows beside top-k, top-p, min-p and unfiltered
// rows (the last two take the cluster kernel).
SamplingParams mixed_params(int64_t row, uint64_t seed) {
  SamplingParams p;
  p.seed = seed;
  switch (row % 10) {
    case 0: p.temperature = 0.0f; break;
    case 1: p.top_k = 50; break;
    case 2: p.top_p = 0.9f; break;
    case 3: p.temperature = 0.8f, p.top_k = 64, p.top_p = 0.95f, p.min_p = 0.05f; break;
    case 4: break;  // no filter
    case 5: p.min_p = 0.1f; break;
    case 6: p.top_k = 1; break;
    case 7: p.temperature = 1.7f, p.top_p = 0.5f; break;
    case 8: p.temperature = 0.5f, p.top_k = 1000, p.top_p = 0.99f; break;
    default: p.temperature = 1.2f, p.top_p = 1e-6f, p.min_p = 0.2f; break;
  }
  return p;
}

TEST_F(CudaSamplerTest, MixedParametersPerRow) {
  std::mt19937_64 rng(5);
  const int64_t vocab = kMaxVocab;
  for (int64_t rows : {1, 3, 8, 17, 64, 65, 129}) {
    const std::vector<float> logits = model_like_rows(rng, vocab, rows);
    std::vector<SamplingParams> params;
    for (int64_t r = 0; r < rows; ++r) params.push_back(mixed_params(r, rng()));
    const std::vector<int64_t> tokens = sample_on_gpu(*sampler_, logits, params, vocab);
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_EQ(tokens[size_t(r)], sample_row(logits.data() + r * vocab, vocab, params[size_t(r)]))
          << "batch " << rows << ", row " << r << " (parameter set " << r % 10 << ")";
    }
  }
}

// The rows of the benchmark's configurations are decided by their candidates: none is left to the
// whole-row cluster kernel (which would be correct, but slow).
TEST_F(CudaSamplerTest, ModelLikeRowsWithACutTakeTheSegmentPath) {
  std::mt19937_64 rng(6);
  const int64_t vocab = kMaxVocab, rows = 64;
  const std::vector<float> logits = model_like_rows(rng, vocab, rows);
  for (int set : {0, 1, 2, 3, 6, 8}) {
    std::vector<SamplingParams> params;
    for (int64_t r = 0; r < rows; ++r) params.push_back(mixed_params(set, rng()));
    const std::vector<int64_t> tokens = sample_on_gpu(*sampler_, logits, params, vocab);
    EXPECT_EQ(sampler_->cluster_kernel_rows(nullptr), 0) << "parameter set " << set;
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_EQ(tokens[size_t(r)], sample_row(logits.data() + r * vocab, vocab, params[size_t(r)])) << "set " << set;
    }
  }
}

// The segment path lists each segment's (with more than 8 rows: each warp's) few best tokens of a
// row with a small top-k cut (docs/DESIGN.md §4). When a row's best tokens crowd a few lanes (here
// the best 40 are the ids of two 128-byte lines, which two warps hold), those lists cannot prove the
// top-k set: the row must still get sample_row's token, from the cluster kernel. Rows beside it are
// decided as usual.
TEST_F(CudaSamplerTest, TopKRowsWhoseBestTokensCrowdOneWarpStillMatch) {
  std::mt19937_64 rng(9);
  const int64_t vocab = kMaxVocab;
  for (int64_t rows : {1, 8, 9, 64}) {
    std::vector<float> logits = model_like_rows(rng, vocab, rows);
    for (int j = 0; j < 40; ++j) logits[size_t(1024 + j)] = 20.0f + 0.1f * float(j);  // row 0: ids 1024..1063
    std::vector<SamplingParams> params;
    for (int64_t r = 0; r < rows; ++r) {
      SamplingParams p;
      p.temperature = 0.9f, p.top_k = r % 2 == 0 ? 32 : 128, p.top_p = r % 3 == 0 ? 0.9f : 1.0f, p.seed = rng();
      params.push_back(p);
    }
    const std::vector<int64_t> tokens = sample_on_gpu(*sampler_, logits, params, vocab);
    EXPECT_EQ(sampler_->cluster_kernel_rows(nullptr), 1) << "only the crowded row needs the cluster kernel";
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_EQ(tokens[size_t(r)], sample_row(logits.data() + r * vocab, vocab, params[size_t(r)]))
          << "batch " << rows << ", row " << r;
    }
  }
}

// A NaN in one row of a large mixed batch: that row gets kNanLogitsToken (sample_row's answer too),
// the others their tokens.
TEST_F(CudaSamplerTest, NanInOneRowOfABatch) {
  std::mt19937_64 rng(8);
  const int64_t vocab = kMaxVocab, rows = 65, bad_row = 37;
  std::vector<float> logits = model_like_rows(rng, vocab, rows);
  std::vector<SamplingParams> params;
  for (int64_t r = 0; r < rows; ++r) params.push_back(mixed_params(r, rng()));
  logits[size_t(bad_row * vocab + 200000)] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<int64_t> tokens = sample_on_gpu(*sampler_, logits, params, vocab);
  EXPECT_EQ(tokens[size_t(bad_row)], kNanLogitsToken);
  for (int64_t r = 0; r < rows; ++r)
    EXPECT_EQ(tokens[size_t(r)], sample_row(logits.data() + r * vocab, vocab, params[size_t(r)])) << "row " << r;
}

// Every row samples the same logits row (stride 0) with seeds first_seed + row.
std::vector<int64_t> count_gpu_draws(CudaSampler& sampler, const std::vector<float>& logits, SamplingParams p,
                                     int64_t draws) {
  const int64_t vocab = int64_t(logits.size());
  DeviceArray<float> device_logits(logits.size());
  device_logits.upload(logits);
  constexpr int64_t kRows = 50000;
  DeviceArray<SamplingParams> device_params(kRows);
  DeviceArray<int64_t> device_tokens(kRows);
  std::vector<int64_t> counts(logits.size(), 0);
  for (int64_t done = 0; done < draws; done += kRows) {
    const int64_t rows = std::min(kRows, draws - done);
    std::vector<SamplingParams> params(size_t(rows), p);
    for (int64_t r = 0; r < rows; ++r) params[size_t(r)].seed = p.seed + uint64_t(done + r);
    device_params.upload(params);
    sampler.sample({device_logits.data, 0, rows, vocab, device_params.data, device_tokens.data, false}, nullptr);
    for (int64_t token : device_tokens.download(size_t(rows))) ++counts[size_t(token)];
  }
  return counts;
}

TEST_F(CudaSamplerTest, DrawsFollowTheKeptDistribution) {
  struct Mix {
    const char* name;
    float temperature;
    int32_t top_k;
    float top_p, min_p;
    size_t vocab;
    float scale;
  };
  const Mix mixes[] = {
      {"plain", 1.0f, 0, 1.0f, 0.0f, 24, 1.5f},         {"cold top-k", 0.7f, 5, 1.0f, 0.0f, 30, 1.0f},
      {"hot top-p", 1.3f, 0, 0.8f, 0.0f, 40, 2.0f},     {"all filters", 1.0f, 10, 0.9f, 0.05f, 32, 1.5f},
      {"min-p", 2.0f, 0, 1.0f, 0.1f, 20, 3.0f},         {"sharp top-p", 0.2f, 0, 0.95f, 0.0f, 50, 0.5f},
      {"all equal", 0.8f, 0, 1.0f, 0.0f, 37, 0.0f},
  };
  std::mt19937_64 rng(4321);
  for (const Mix& mix : mixes) {
    SamplingParams p;
    p.temperature = mix.temperature, p.top_k = mix.top_k, p.top_p = mix.top_p, p.min_p = mix.min_p, p.seed = 77;
    std::normal_distribution<float> normal(0.0f, std::max(mix.scale, 1e-6f));
    std::vector<float> logits(mix.vocab, 0.5f);
    for (double margin = 0; mix.scale > 0 && margin <= 1e-4;) {
      for (float& z : logits) z = normal(rng);
      testing::reference_distribution(logits, p, &margin);
    }
    testing::expect_distribution(count_gpu_draws(*sampler_, logits, p, 100000),
                                 testing::reference_distribution(logits, p), mix.name);
  }
}

// Every kind of NaN row — greedy, with a top-k cut (every segment scans it), without a cut — draws
// kNanLogitsToken and advances its seed in a graph like any row; the rows beside them draw theirs.
TEST_F(CudaSamplerTest, NanRowsDrawTheNanToken) {
  const int64_t vocab = 1000, rows = 5;
  std::vector<float> logits(size_t(rows * vocab), 0.0f);
  for (int64_t i = 0; i < rows * vocab; ++i) logits[size_t(i)] = float(i % 17) * 0.1f;
  for (int64_t r : {1, 2, 3}) logits[size_t(r * vocab + 123 * r)] = std::numeric_limits<float>::quiet_NaN();
  std::vector<SamplingParams> params(rows);
  params[1].temperature = 0.0f;
  params[2].top_k = 20;
  params[4].temperature = 0.0f;
  for (int64_t r = 0; r < rows; ++r) params[size_t(r)].seed = uint64_t(100 + r);
  DeviceArray<float> device_logits(logits.size());
  DeviceArray<SamplingParams> device_params(rows);
  DeviceArray<int64_t> device_tokens(rows);
  device_logits.upload(logits);
  device_params.upload(params);
  sampler_->sample({device_logits.data, vocab, rows, vocab, device_params.data, device_tokens.data, true}, nullptr);
  const std::vector<int64_t> tokens = device_tokens.download(rows);
  const std::vector<SamplingParams> advanced = device_params.download(rows);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(tokens[size_t(r)], sample_row(logits.data() + r * vocab, vocab, params[size_t(r)])) << "row " << r;
    if (r >= 1 && r <= 3) EXPECT_EQ(tokens[size_t(r)], kNanLogitsToken) << "row " << r;
    EXPECT_EQ(advanced[size_t(r)].seed, params[size_t(r)].seed + 1) << "row " << r;
  }
}

TEST_F(CudaSamplerTest, GraphReplaysAdvanceTheSeed) {
  std::mt19937_64 rng(9);
  const int64_t vocab = kMaxVocab, rows = 3;
  std::vector<float> logits;
  std::vector<SamplingParams> params;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> row = random_row(rng, vocab);
    logits.insert(logits.end(), row.begin(), row.end());
    SamplingParams p;
    p.temperature = 0.9f, p.top_k = r == 0 ? 64 : 0, p.top_p = r == 1 ? 0.95f : 1.0f, p.min_p = r == 2 ? 0.01f : 0.0f;
    p.seed = rng();
    params.push_back(p);
  }
  DeviceArray<float> device_logits(logits.size());
  DeviceArray<SamplingParams> device_params(params.size());
  DeviceArray<int64_t> device_tokens(params.size());
  device_logits.upload(logits);
  device_params.upload(params);

  cudaStream_t stream;
  check(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  sampler_->sample({device_logits.data, vocab, rows, vocab, device_params.data, device_tokens.data, true}, stream);
  check(cudaStreamEndCapture(stream, &graph));
  check(cudaGraphInstantiate(&exec, graph, 0));
  constexpr int kReplays = 40;
  for (int j = 0; j < kReplays; ++j) {
    check(cudaGraphLaunch(exec, stream));
    check(cudaStreamSynchronize(stream));
    const std::vector<int64_t> tokens = device_tokens.download(size_t(rows));
    for (int64_t r = 0; r < rows; ++r) {
      SamplingParams expected = params[size_t(r)];
      expected.seed += uint64_t(j);
      EXPECT_EQ(tokens[size_t(r)], sample_row(logits.data() + r * vocab, vocab, expected)) << "replay " << j;
    }
  }
  const std::vector<SamplingParams> advanced = device_params.download(size_t(rows));
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(advanced[size_t(r)].seed, params[size_t(r)].seed + kReplays);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_F(CudaSamplerTest, CommandLineBackendsAgree) {
  std::mt19937_64 rng(11);
  const std::string file = test::write_floats(random_row(rng, 5000), "g4_cuda_cli.f32");
  const std::string flags = " --temperature 0.9 --top_k 100 --top_p 0.9 --min_p 0.01 --seed 123 --draws 300";
  const test::CommandResult cpu = test::run_g4("sample --logits " + file + flags + " --backend cpu");
  const test::CommandResult cuda = test::run_g4("sample --logits " + file + flags + " --backend cuda");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  ASSERT_EQ(cuda.exit_code, 0) << cuda.output;
  EXPECT_EQ(cpu.output, cuda.output);
}

#endif

}  // namespace
}  // namespace g4
