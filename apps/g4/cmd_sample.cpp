// g4 sample: the sampler alone on one row of logits, so anyone can check its statistics and its
// reproducibility from outside (docs/DESIGN.md §4). Draw j uses seed S + j, the runner's seed schedule.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/backend_factory.h"
#include "commands.h"
#include "sampling/sampler.h"
#include "util/error.h"


namespace g4::cli {
namespace {

struct SampleOptions {
  std::string logits_path;
  int64_t vocab = 0;  // 0 = from the file size
  SamplingParams params;
  std::string seed = "0";  // uint64, or -1 = random
  int64_t draws = 1;
  std::string backend = "cpu";
};

std::vector<float> read_logits(const std::string& path, int64_t vocab) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  G4_CHECK(file.good(), "cannot open logits file '" + path + "'");
  const int64_t bytes = int64_t(file.tellg());
  G4_CHECK(bytes > 0 && bytes % 4 == 0,
           "logits file '" + path + "' must hold float32 values (" + std::to_string(bytes) + " bytes)");
  G4_CHECK(vocab == 0 || bytes == vocab * 4, "logits file '" + path + "' has " + std::to_string(bytes) +
                                                 " bytes, expected " + std::to_string(vocab * 4) + " for --vocab " +
                                                 std::to_string(vocab));
  std::vector<float> logits(size_t(bytes / 4));
  file.seekg(0);
  file.read(reinterpret_cast<char*>(logits.data()), bytes);
  G4_CHECK(file.good(), "cannot read logits file '" + path + "'");
  return logits;
}

uint64_t parse_seed(const std::string& text) {
  if (text == "-1") {
    const uint64_t seed = (uint64_t(std::random_device{}()) << 32) | std::random_device{}();
    std::fprintf(stderr, "Sampling base seed: %llu\n", static_cast<unsigned long long>(seed));
    return seed;
  }
  G4_CHECK(!text.empty() && text.find_first_not_of("0123456789") == std::string::npos,
           "--seed must be an unsigned 64-bit integer or -1, got '" + text + "'");
  try {
    return std::stoull(text);
  } catch (const std::out_of_range&) {
    throw Error("--seed must be an unsigned 64-bit integer or -1, got '" + text + "'");
  }
}

std::vector<int64_t> draw_on_cpu(const std::vector<float>& logits, const Sampler& sampler, int64_t draws) {
  std::vector<int64_t> tokens(static_cast<size_t>(draws));
  for (int64_t j = 0; j < draws; ++j) tokens[size_t(j)] = sampler.sample_host(logits.data(), int64_t(logits.size()), j);
  return tokens;
}

#ifdef G4_HAVE_CUDA
// Every draw is a row of one batch sampling the same logits row (the backend's one shared row);
// row j carries seed S + j.
std::vector<int64_t> draw_on_cuda(const std::vector<float>& logits, const Sampler& sampler, int64_t draws) {
  G4_CHECK(cuda_available(), "--backend cuda: no CUDA GPU is available");
  const std::unique_ptr<Backend> backend = make_backend("cuda");
  const int64_t vocab = int64_t(logits.size());
  constexpr int64_t kRowsPerLaunch = 4096;
  std::vector<SamplingParams> row_params(size_t(std::min(draws, kRowsPerLaunch)));
  std::vector<int64_t> tokens(static_cast<size_t>(draws));
  const Tensor device_logits = backend->alloc(DType::F32, 1, vocab);
  const SamplingRows device_params = backend->alloc_sampling_rows(int64_t(row_params.size()));
  const Tensor device_tokens = backend->alloc(DType::I64, int64_t(row_params.size()), 1);
  backend->upload(logits.data(), device_logits);
  for (int64_t done = 0; done < draws; done += kRowsPerLaunch) {
    const int64_t rows = std::min(kRowsPerLaunch, draws - done);
    for (int64_t r = 0; r < rows; ++r) row_params[size_t(r)] = sampler.for_token(done + r);
    const SamplingRows batch_params = device_params.first(rows);
    const Tensor batch_tokens = device_tokens.rows_view(0, rows);
    backend->upload_sampling_rows(std::span(row_params).first(size_t(rows)), batch_params);
    backend->sample(device_logits, batch_params, batch_tokens);
    backend->download(batch_tokens, tokens.data() + done);
    checked_token(tokens[size_t(done)]);  // every row draws from the same logits: NaN in all or none
  }
  return tokens;
}
#endif

void run_sample(SampleOptions options) {
  G4_CHECK(options.backend == "cpu" || options.backend == "cuda",
           "--backend must be cpu or cuda, got '" + options.backend + "'");
  G4_CHECK(options.draws >= 1, "--draws must be >= 1");
  // A bad parameter fails before a random seed is drawn and printed; the seed flag then moves the
  // schedule from options.params.seed (no flag sets it: 0) to the chosen seed.
  const Sampler unseeded(options.params);
  const Sampler sampler = unseeded.starting_at(int64_t(parse_seed(options.seed)));
  const std::vector<float> logits = read_logits(options.logits_path, options.vocab);

  std::vector<int64_t> tokens;
  if (options.backend == "cpu") {
    tokens = draw_on_cpu(logits, sampler, options.draws);
  } else {
#ifdef G4_HAVE_CUDA
    tokens = draw_on_cuda(logits, sampler, options.draws);
#else
    throw Error(ErrorKind::kUnsupported, "--backend cuda: this g4 was built without CUDA");
#endif
  }
  std::string text;
  for (const int64_t token : tokens) text += std::to_string(token) + '\n';
  std::fwrite(text.data(), 1, text.size(), stdout);
}

}  // namespace

void add_sample_command(CLI::App& app) {
  auto options = std::make_shared<SampleOptions>();
  CLI::App* sub = app.add_subcommand("sample", "Sample token ids from one float32 row of logits (one id per line)");
  sub->add_option("--logits", options->logits_path, "File of float32 logits (one row)")->required();
  sub->add_option("--vocab", options->vocab, "Expected number of logits (checked against the file size)");
  sub->add_option("--temperature", options->params.temperature, "0..2; 0 or -1 = greedy")->capture_default_str();
  sub->add_option("--top_k,--top-k", options->params.top_k, "Keep the k most likely tokens; 0 = off")->capture_default_str();
  sub->add_option("--top_p,--top-p", options->params.top_p, "Nucleus mass in (0, 1]; 1 = off")->capture_default_str();
  sub->add_option("--min_p,--min-p", options->params.min_p, "Keep p >= min_p * max p; 0 = off")->capture_default_str();
  sub->add_option("--seed", options->seed, "Seed of the first draw (draw j uses seed + j); -1 = random")->capture_default_str();
  sub->add_option("--draws", options->draws, "Number of tokens to draw")->capture_default_str();
  sub->add_option("--backend", options->backend, "cpu or cuda")->capture_default_str();
  sub->callback([options] { run_sample(*options); });
}

}  // namespace g4::cli
