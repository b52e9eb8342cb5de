// Sampling benchmark (docs/PERF.md): median microseconds per call at V = 262144 for batch 1, 8, 64 and
// greedy / top-k 50 / top-p 0.9 / all filters / the four mixed row by row. CUDA: one call per graph
// replay, timed with events around graphs of kCallsPerGraph calls (launch gaps included, as in a
// decode loop), and how many of a batch-64 call's rows the whole-row cluster kernel sampled. CPU:
// the host sampler, row by row, one thread.
// Usage: bench_sampling [BATCHES [CONFIG]]: BATCHES a comma list (default 1,8,64), CONFIG a part of a
// configuration's name (default all); e.g. `bench_sampling 64 top-k` for a profiler.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "sampling/cpu_sampler.h"
#include "sampling/sampling_params.h"

#ifdef G4_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/cuda_sampler.h"
#endif

namespace {

constexpr int64_t kVocab = 262144;
constexpr int64_t kMaxBatch = 64;  // rows of logits made

// A configuration: the parameters of each row (row r uses params[r % size]).
struct Config {
  const char* name;
  std::vector<g4::SamplingParams> params;
};

std::vector<Config> configs() {
  g4::SamplingParams greedy, top_k, top_p, all;
  greedy.temperature = 0.0f;
  top_k.temperature = 1.0f, top_k.top_k = 50;
  top_p.temperature = 1.0f, top_p.top_p = 0.9f;
  all.temperature = 0.8f, all.top_k = 64, all.top_p = 0.95f, all.min_p = 0.05f;
  return {{"greedy", {greedy}},
          {"top-k 50", {top_k}},
          {"top-p 0.9", {top_p}},
          {"T+top-k 64+top-p 0.95+min-p", {all}},
          {"mixed (the four, row by row)", {greedy, top_k, top_p, all}}};
}

// The parameters of `rows` rows, seeds 1, 2, ...
std::vector<g4::SamplingParams> row_params(const Config& c, int64_t rows) {
  std::vector<g4::SamplingParams> params;
  for (int64_t r = 0; r < rows; ++r) {
    params.push_back(c.params[size_t(r) % c.params.size()]);
    params.back().seed = uint64_t(r + 1);
  }
  return params;
}

// Logits shaped like a language model's: a soft-capped normal bulk with a few strong candidates.
std::vector<float> make_logits(int64_t rows) {
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(size_t(rows * kVocab));
  for (float& z : logits) z = 30.0f * std::tanh(normal(rng) / 30.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int j = 0; j < 20; ++j) logits[size_t(r * kVocab) + rng() % kVocab] = 15.0f + float(j) * 0.3f;
  }
  return logits;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double cpu_median_us(const std::vector<float>& logits, int64_t rows, const Config& c) {
  const std::vector<g4::SamplingParams> params = row_params(c, rows);
  std::vector<double> times;
  for (int rep = 0; rep < 15; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t r = 0; r < rows; ++r) g4::sample_row(logits.data() + r * kVocab, kVocab, params[size_t(r)]);
    times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  return median(times);
}

#ifdef G4_HAVE_CUDA
void check(cudaError_t err) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(err));
    std::exit(1);
  }
}

struct CudaResult {
  double us;             // median per call
  int64_t cluster_rows;  // rows of the last call that the whole-row cluster kernel sampled
};

CudaResult cuda_median_us(g4::CudaSampler& sampler, const float* logits, int64_t rows, const Config& c,
                          cudaStream_t stream) {
  constexpr int kCallsPerGraph = 20;
  g4::SamplingParams* params = nullptr;
  int64_t* tokens = nullptr;
  const std::vector<g4::SamplingParams> host_params = row_params(c, rows);
  check(cudaMalloc(&params, size_t(rows) * sizeof(g4::SamplingParams)));
  check(cudaMalloc(&tokens, size_t(rows) * sizeof(int64_t)));
  check(cudaMemcpy(params, host_params.data(), size_t(rows) * sizeof(g4::SamplingParams), cudaMemcpyHostToDevice));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int c = 0; c < kCallsPerGraph; ++c) sampler.sample({logits, kVocab, rows, kVocab, params, tokens, true}, stream);
  check(cudaStreamEndCapture(stream, &graph));
  check(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t begin, end;
  check(cudaEventCreate(&begin));
  check(cudaEventCreate(&end));
  for (int warm = 0; warm < 5; ++warm) check(cudaGraphLaunch(exec, stream));
  std::vector<double> times;
  for (int rep = 0; rep < 50; ++rep) {
    check(cudaEventRecord(begin, stream));
    check(cudaGraphLaunch(exec, stream));
    check(cudaEventRecord(end, stream));
    check(cudaEventSynchronize(end));
    float ms = 0;
    check(cudaEventElapsedTime(&ms, begin, end));
    times.push_back(double(ms) * 1000.0 / kCallsPerGraph);
  }
  const int64_t cluster_rows = sampler.cluster_kernel_rows(stream);
  check(cudaGraphExecDestroy(exec));
  check(cudaGraphDestroy(graph));
  check(cudaEventDestroy(begin));
  check(cudaEventDestroy(end));
  check(cudaFree(params));
  check(cudaFree(tokens));
  return {median(times), cluster_rows};
}

bool gpu_present() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}
#endif

std::vector<int64_t> parse_batches(const char* text) {
  std::vector<int64_t> batches;
  for (const char* p = text; *p != '\0';) {
    char* end = nullptr;
    const long long b = std::strtoll(p, &end, 10);
    if (end == p || b < 1 || b > kMaxBatch) {
      std::fprintf(stderr, "bench_sampling: batches must be a comma list of 1..%lld, got '%s'\n",
                   static_cast<long long>(kMaxBatch), text);
      std::exit(2);
    }
    batches.push_back(b);
    p = *end == ',' ? end + 1 : end;
  }
  return batches;
}

std::vector<Config> chosen_configs(const char* part) {
  std::vector<Config> chosen;
  for (Config& c : configs()) {
    if (part == nullptr || std::string(c.name).find(part) != std::string::npos) chosen.push_back(std::move(c));
  }
  if (chosen.empty()) {
    std::fprintf(stderr, "bench_sampling: no configuration's name contains '%s'\n", part);
    std::exit(2);
  }
  return chosen;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<int64_t> batches = parse_batches(argc > 1 ? argv[1] : "1,8,64");
  const std::vector<Config> chosen = chosen_configs(argc > 2 ? argv[2] : nullptr);
  const std::vector<float> logits = make_logits(kMaxBatch);
  std::printf("sampling, V = %lld, median us per call (batch of rows)\n", static_cast<long long>(kVocab));
#ifdef G4_HAVE_CUDA
  if (gpu_present()) {
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0));
    float* device_logits = nullptr;
    check(cudaMalloc(&device_logits, logits.size() * sizeof(float)));
    check(cudaMemcpy(device_logits, logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaStream_t stream;
    check(cudaStreamCreate(&stream));
    g4::CudaSampler sampler(kVocab);
    std::printf("\nCUDA (%s), graph replays\n%-30s", prop.name, "config");
    for (int64_t b : batches) std::printf(" %10s", ("batch " + std::to_string(b)).c_str());
    std::printf(" %14s\n", "cluster rows");
    for (const Config& c : chosen) {
      std::printf("%-30s", c.name);
      int64_t cluster_rows = 0;  // of the last (largest) batch
      for (int64_t b : batches) {
        const CudaResult result = cuda_median_us(sampler, device_logits, b, c, stream);
        std::printf(" %10.2f", result.us);
        cluster_rows = result.cluster_rows;
      }
      std::printf(" %14lld\n", static_cast<long long>(cluster_rows));
    }
    check(cudaStreamDestroy(stream));
    check(cudaFree(device_logits));
  } else {
    std::printf("\nCUDA: no GPU present, skipped\n");
  }
#endif
  std::printf("\nCPU (host sampler, one thread)\n%-30s", "config");
  for (int64_t b : batches) std::printf(" %10s", ("batch " + std::to_string(b)).c_str());
  std::printf("\n");
  for (const Config& c : chosen) {
    std::printf("%-30s", c.name);
    for (int64_t b : batches) std::printf(" %10.1f", cpu_median_us(logits, b, c));
    std::printf("\n");
  }
  return 0;
}
