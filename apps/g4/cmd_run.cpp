// g4 run: generate text from a prompt (the reference design's runner, SPEC §5).
#include <sys/resource.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>

#include "cli_util.h"
#include "commands.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "sampling/sampling_params.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/files.h"
#include "util/progress.h"

namespace g4::cli {

namespace {

struct RunOptions {
  // The sampling flags the user gave; the others come from the model's generation defaults.
  CLI::Option *temperature_flag = nullptr, *top_k_flag = nullptr, *top_p_flag = nullptr, *min_p_flag = nullptr;
  std::string model_path, tokenizer_path, prompt, prompt_file, prompt_tokens, seed = "-1", backend = "cpu";
  float temperature = 0.8f, top_p = 1.0f, min_p = 0.0f;
  int32_t top_k = 0;
  int64_t max_new_tokens = 128, max_seq_len = 0;
  int32_t bos_id = 2, eos_id = 1;
  bool raw_prompt = false, cuda_graph = false, print_token_ids = false;
};

// "-1" draws a random base seed (and says which); anything else must be a uint64.
uint64_t resolve_seed(const std::string& text) {
  if (text == "-1") {
    std::random_device rd;
    const uint64_t seed = (uint64_t(rd()) << 32) ^ rd();
    std::fprintf(stderr, "Sampling base seed: %llu\n", static_cast<unsigned long long>(seed));
    return seed;
  }
  uint64_t seed = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, seed);  // no sign, no overflow
  G4_CHECK(!text.empty() && error == std::errc() && stop == end,
           "--seed must be -1 (random) or an integer in [0, 2^64), got '" + text + "'");
  return seed;
}

std::optional<Tokenizer> open_tokenizer(const RunOptions& o, const Engine& engine) {
  if (!o.tokenizer_path.empty()) return Tokenizer::from_file(o.tokenizer_path);
  if (engine.tokenizer_json()) return Tokenizer::from_json(*engine.tokenizer_json());
  return std::nullopt;
}

std::vector<int32_t> prompt_ids(const RunOptions& o, const std::optional<Tokenizer>& tokenizer) {
  if (!o.prompt_tokens.empty()) return parse_id_list(o.prompt_tokens);
  G4_CHECK(tokenizer, "no tokenizer: the model has none embedded; pass --tokenizer_path or --prompt_tokens");
  const std::string text = o.prompt_file.empty() ? o.prompt : read_file(o.prompt_file);
  return encode_prompt(*tokenizer, text, o.raw_prompt, o.bos_id);
}

double peak_host_mib() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_maxrss) / 1024.0;
}

void print_report(const std::vector<int32_t>& prompt, const GenerationResult& r, const Backend& backend) {
  const double prefill_tps = r.prefill_seconds > 0 ? double(prompt.size()) / r.prefill_seconds : 0;
  const double decode_tps =
      r.decode_seconds > 0 && r.tokens.size() > 1 ? double(r.tokens.size() - 1) / r.decode_seconds : 0;
  std::fprintf(stderr,
               "\n--- report ---\nprompt tokens: %zu\ngenerated tokens: %zu%s\ntime to first token: %.3f s\n"
               "prefill: %.1f tok/s\ndecode: %.1f tok/s\npeak host memory: %.1f MiB\npeak %s backend memory: %.1f MiB\n",
               prompt.size(), r.tokens.size(),
               r.stop_token >= 0 ? " (stopped at a stop token)" : r.context_full ? " (context full)" : "",
               r.prefill_seconds, prefill_tps, decode_tps, peak_host_mib(), backend.name().c_str(),
               double(backend.peak_memory_bytes()) / double(1 << 20));
}

SamplingParams sampling_flags(const RunOptions& o) {
  SamplingParams params;
  params.temperature = o.temperature;
  params.top_k = o.top_k;
  params.top_p = o.top_p;
  params.min_p = o.min_p;
  return params;
}

// Flags the user did not give take the model's generation_config values (SPEC §4).
void apply_model_defaults(const RunOptions& o, const GenerationDefaults& d, SamplingParams& p) {
  if (d.temperature && !o.temperature_flag->count()) p.temperature = *d.temperature;
  if (d.top_k && !o.top_k_flag->count()) p.top_k = *d.top_k;
  if (d.top_p && !o.top_p_flag->count()) p.top_p = *d.top_p;
  if (d.min_p && !o.min_p_flag->count()) p.min_p = *d.min_p;
  validate_sampling_params(p);
}

void run(const RunOptions& o) {
  SamplingParams params = sampling_flags(o);
  validate_sampling_params(params);  // before any loading: a bad flag fails fast
  G4_CHECK(o.max_new_tokens >= 0, "--max_new_tokens must be >= 0");
  G4_CHECK(o.prompt.empty() || o.prompt_file.empty(), "give --prompt or --prompt_file, not both");
  params.seed = resolve_seed(o.seed);

  EngineOptions eo;
  use_model_or_demo(eo, o.model_path);
  eo.backend = o.backend;
  eo.max_seq_len = o.max_seq_len;
  Engine engine(eo);
  apply_model_defaults(o, engine.generation_defaults(), params);
  const std::optional<Tokenizer> tokenizer = open_tokenizer(o, engine);

  GenerationRequest request;
  request.prompt = prompt_ids(o, tokenizer);
  request.params = params;
  request.max_new_tokens = o.max_new_tokens;
  request.stop_ids = {o.eos_id, 106, 50};
  for (int id : engine.config().eos_ids) request.stop_ids.push_back(id);
  request.graph = o.cuda_graph;

  std::optional<StreamDecoder> text;
  if (tokenizer && !o.print_token_ids) text.emplace(*tokenizer, true);
  // When the text goes to a file or pipe, a terminal still sees how fast tokens come.
  std::optional<Progress> progress;
  if (!isatty(STDOUT_FILENO) && Progress::stderr_is_terminal())
    progress.emplace("generating", uint64_t(o.max_new_tokens), "tokens");
  GenerationResult result = generate(engine, request, [&](int32_t id) {
    if (progress) progress->advance(1);
    if (!text) return;
    std::fputs(text->push(id).c_str(), stdout);
    std::fflush(stdout);
  });
  if (progress) progress->finish();
  if (text) std::printf("%s\n", text->flush().c_str());
  if (o.print_token_ids) {
    std::string line;
    for (int32_t id : result.tokens) line += (line.empty() ? "" : ",") + std::to_string(id);
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);  // the text before the report, also when stdout is a pipe
  print_report(request.prompt, result, engine.backend());
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text from a prompt");
  cmd->add_option("--model_path,--model-path", o->model_path,
                  "Model file (.gguf from g4 export) or Hugging Face checkpoint directory (default: the demo model)");
  cmd->add_option("--tokenizer_path,--tokenizer-path", o->tokenizer_path, "tokenizer.json (default: the model's own)");
  cmd->add_option("--prompt", o->prompt, "The prompt text");
  cmd->add_option("--prompt_file,--prompt-file", o->prompt_file, "Read the prompt from this file");
  cmd->add_option("--prompt_tokens,--prompt-tokens", o->prompt_tokens, "Prompt as token ids (1,2,3), no tokenizer needed");
  o->temperature_flag = cmd->add_option("--temperature", o->temperature,
                                        "0 = greedy (-1 also means greedy); up to 2 (default: the model's, else 0.8)");
  o->top_k_flag = cmd->add_option("--top_k,--top-k", o->top_k, "Keep the k most likely tokens (0 = off; default: the model's, else 0)");
  o->top_p_flag = cmd->add_option("--top_p,--top-p", o->top_p, "Nucleus sampling mass in (0, 1] (1 = off; default: the model's, else 1)");
  o->min_p_flag = cmd->add_option("--min_p,--min-p", o->min_p, "Drop tokens below min_p * max probability (0 = off)");
  cmd->add_option("--seed", o->seed, "Base seed; token j uses seed + j (-1 = random, printed)")->capture_default_str();
  cmd->add_option("--max_new_tokens,--max-new-tokens", o->max_new_tokens, "Tokens to generate at most")->capture_default_str();
  cmd->add_option("--max_seq_len,--max-seq-len", o->max_seq_len, "Context size (default: the model file's)");
  cmd->add_option("--bos_id,--bos-id", o->bos_id, "Beginning-of-sequence id put before the prompt")->capture_default_str();
  cmd->add_option("--eos_id,--eos-id", o->eos_id, "End-of-sequence id (generation also stops on <turn|>)")->capture_default_str();
  cmd->add_flag("--raw_prompt,--raw-prompt", o->raw_prompt, "Do not apply the chat template");
  cmd->add_flag("--cuda_graph,--cuda-graph", o->cuda_graph, "Replay a captured CUDA graph per decode step");
  cmd->add_flag("--print_token_ids,--print-token-ids", o->print_token_ids, "Print the generated ids (one line) instead of text");
  cmd->add_option("--backend", o->backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd->callback([o] { run(*o); });
}

}  // namespace g4::cli
