#include "generation_flags.h"

#include <sys/resource.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <limits>
#include <random>
#include <sstream>

#include "cli_util.h"
#include "commands.h"
#include "tokenizer/chat_template.h"
#include "util/error.h"

namespace g4::cli {

namespace {

// "-1" asks for a random base seed; anything else must be a uint64.
std::optional<uint64_t> parse_seed(const std::string& text) {
  if (text == "-1") return std::nullopt;
  uint64_t seed = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, seed);  // no sign, no overflow
  G4_CHECK(!text.empty() && error == std::errc() && stop == end,
           "--seed must be -1 (random) or an integer in [0, 2^64), got '" + text + "'");
  return seed;
}

SamplingParams flag_sampling(const GenerationFlags& f) {
  SamplingParams p;
  p.temperature = f.temperature;
  p.top_k = f.top_k;
  p.top_p = f.top_p;
  p.min_p = f.min_p;
  return p;
}

// Shortest text that reads back as the same float (0.95, not 0.949999988).
std::string number(float value) {
  char text[32];
  const auto [end, ec] = std::to_chars(text, text + sizeof(text), value);
  return ec == std::errc() ? std::string(text, end) : std::to_string(value);
}

}  // namespace

void add_generation_flags(CLI::App& cmd, GenerationFlags& f) {
  cmd.add_option("-m,--model_path,--model-path", f.model_path,
                 "Model file (.gguf from g4 export) or Hugging Face checkpoint directory (default: the demo model)");
  cmd.add_option("--tokenizer_path,--tokenizer-path", f.tokenizer_path, "tokenizer.json (default: the model's own)");
  f.temperature_flag = cmd.add_option("--temperature", f.temperature,
                                      "0 = greedy (-1 also means greedy); up to 2 (default: the model's, else 0.8)");
  f.top_k_flag = cmd.add_option("--top_k,--top-k", f.top_k, "Keep the k most likely tokens (0 = off; default: the model's, else 0)");
  f.top_p_flag = cmd.add_option("--top_p,--top-p", f.top_p, "Nucleus sampling mass in (0, 1] (1 = off; default: the model's, else 1)");
  f.min_p_flag = cmd.add_option("--min_p,--min-p", f.min_p, "Drop tokens below min_p * max probability (0 = off; default: the model's, else 0)");
  cmd.add_option("--presence_penalty,--presence-penalty", f.presence_penalty,
                 "Subtracted from the logit of every token the reply holds, in [-2, 2]")
      ->capture_default_str();
  cmd.add_option("--frequency_penalty,--frequency-penalty", f.frequency_penalty,
                 "Subtracted per occurrence in the reply, in [-2, 2]")
      ->capture_default_str();
  cmd.add_option("--repetition_penalty,--repetition-penalty", f.repetition_penalty,
                 "Divides (multiplies when negative) the logit of every token the prompt or reply holds, in (0, 2]")
      ->capture_default_str();
  cmd.add_option("--logit_bias,--logit-bias", f.logit_bias, "Added to tokens' logits: ID:BIAS[,ID:BIAS...], each in [-100, 100]");
  cmd.add_option("-s,--seed", f.seed, "Base seed; token j uses seed + j (-1 = random, printed)")->capture_default_str();
  cmd.add_option("-n,--max_new_tokens,--max-new-tokens", f.max_new_tokens, "Tokens to generate at most")->capture_default_str();
  cmd.add_option("--max_seq_len,--max-seq-len", f.max_seq_len,
                 "Context size, from the model's sliding window up to its context length (default: the model file's)");
  cmd.add_option("--bos_id,--bos-id", f.bos_id, "Beginning-of-sequence id put before the prompt")->capture_default_str();
  cmd.add_option("--eos_id,--eos-id", f.eos_id, "End-of-sequence id (generation also stops on <turn|>)")->capture_default_str();
  cmd.add_option("--backend", f.backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd.add_flag("--cuda_graph,--cuda-graph", f.cuda_graph, "Replay a captured CUDA graph per decode step (--backend cuda)");
  add_bf16_weight_copies_flag(cmd, f.bf16_weight_copies);
  cmd.add_option("-t,--threads", f.threads, "CPU backend worker threads (default: one per hardware thread)");
  cmd.add_option("--tp", f.tp,
                 "Tensor parallel: split the model over N ranks (--backend cuda: GPUs 0..N-1 with NCCL; cpu: "
                 "N groups of the worker threads)")
      ->capture_default_str();
  add_kv_type_flags(cmd, f.kv);
  cmd.add_option("--draft_model,--draft-model", f.draft_model,
                 "Gemma 4 MTP assistant (its checkpoint directory or gemma4-assistant .gguf; 'demo': the demo model's) "
                 "that drafts tokens for the model to verify: greedy text is the model's own, sampled text has its "
                 "distribution");
  cmd.add_option("--draft_tokens,--draft-tokens", f.draft_tokens,
                 "Tokens the assistant drafts a round (default: the assistant's num_assistant_tokens, else 4)");
}

LogitPenalties flag_penalties(const GenerationFlags& f) {
  LogitPenalties p{.presence = f.presence_penalty, .frequency = f.frequency_penalty, .repetition = f.repetition_penalty};
  std::stringstream items(f.logit_bias);
  for (std::string item; std::getline(items, item, ',');) {
    const size_t colon = item.find(':');
    int32_t token = -1;
    float bias = 0.0f;
    const bool whole = colon != std::string::npos &&
                       std::from_chars(item.data(), item.data() + colon, token).ptr == item.data() + colon &&
                       std::from_chars(item.data() + colon + 1, item.data() + item.size(), bias).ptr ==
                           item.data() + item.size();
    G4_CHECK(whole && colon > 0 && colon + 1 < item.size(),
             "--logit_bias takes ID:BIAS pairs separated by commas, got '" + item + "'");
    p.bias.emplace_back(token, bias);
  }
  return p;
}

void check_generation_flags(const GenerationFlags& f) {
  Sampler{flag_sampling(f)};  // the flags alone, before the model's values are known
  check_penalties(flag_penalties(f), std::numeric_limits<int32_t>::max());  // the ids once the model is known
  parse_seed(f.seed);
  G4_CHECK(f.max_new_tokens >= 0, "--max_new_tokens must be >= 0, got " + std::to_string(f.max_new_tokens));
  G4_CHECK(f.max_seq_len >= 0, "--max_seq_len must be a context size (0 = the model file's), got " +
                                   std::to_string(f.max_seq_len));
  G4_CHECK(f.bos_id >= 0, "--bos_id must be a token id (>= 0), got " + std::to_string(f.bos_id));
  G4_CHECK(f.eos_id >= 0, "--eos_id must be a token id (>= 0), got " + std::to_string(f.eos_id));
  G4_CHECK(f.threads >= 0, "--threads must be >= 0 (0 = one per hardware thread), got " + std::to_string(f.threads));
  G4_CHECK(!f.cuda_graph || f.backend == "cuda", "--cuda_graph needs --backend cuda (CUDA graphs replay GPU work)");
  G4_CHECK(!f.bf16_weight_copies || f.backend == "cuda", "--bf16_weight_copies needs --backend cuda");
  G4_CHECK(f.threads == 0 || f.backend == "cpu", "--threads applies to the CPU backend only");
  G4_CHECK(f.tp >= 1, "--tp must be at least 1, got " + std::to_string(f.tp));
  f.kv.choice();
  check_draft_tokens(f.draft_tokens);
}

void draw_seed_for_ranks(GenerationFlags& f) {
  if (f.tp == 1 || parse_seed(f.seed)) return;
  std::random_device rd;
  f.drawn_seed = (uint64_t(rd()) << 32) ^ rd();
}

EngineOptions engine_options(const GenerationFlags& f) {
  EngineOptions eo;
  use_model_or_demo(eo, f.model_path);
  eo.backend = f.backend;
  eo.max_seq_len = f.max_seq_len;
  eo.threads = f.threads;
  eo.tp = f.tp;
  eo.kv_types = f.kv.choice();
  eo.bf16_weight_copies = f.bf16_weight_copies;
  use_draft_model(eo, f.draft_model);
  eo.draft_tokens = f.draft_tokens;
  return eo;
}

std::unique_ptr<Engine> open_engine(const GenerationFlags& f) {
  auto engine = std::make_unique<Engine>(engine_options(f));
  check_token_flags(f, *engine);
  return engine;
}

void check_token_flags(const GenerationFlags& f, const Engine& engine) {
  const int64_t vocab = engine.config().vocab_size;
  G4_CHECK(f.bos_id < vocab, "--bos_id " + std::to_string(f.bos_id) + " is outside the model's vocabulary [0, " +
                                 std::to_string(vocab) + ")");
  G4_CHECK(f.eos_id < vocab, "--eos_id " + std::to_string(f.eos_id) + " is outside the model's vocabulary [0, " +
                                 std::to_string(vocab) + ")");
  check_penalties(flag_penalties(f), vocab);
}

ResolvedSampling effective_sampling(const GenerationFlags& f, const GenerationDefaults& d, bool announce) {
  SamplingChoices given;
  if (f.temperature_flag->count()) given.temperature = f.temperature;
  if (f.top_k_flag->count()) given.top_k = f.top_k;
  if (f.top_p_flag->count()) given.top_p = f.top_p;
  if (f.min_p_flag->count()) given.min_p = f.min_p;
  const std::optional<uint64_t> seed = parse_seed(f.seed);
  ResolvedSampling s = resolve_sampling(given, seed ? seed : f.drawn_seed, d, flag_sampling(f));
  s.random_seed = !seed;  // a drawn_seed was drawn for every rank before they started
  if (announce && s.random_seed && !s.sampler.greedy())
    std::fprintf(stderr, "Sampling base seed: %llu\n", static_cast<unsigned long long>(s.sampler.params().seed));
  return s;
}

// How g4 run's report names where a value came from.
const char* from_name(SettingFrom from) {
  switch (from) {
    case SettingFrom::kGiven: return "flag";
    case SettingFrom::kModel: return "model";
    default: return "default";
  }
}

std::string describe_sampling(const ResolvedSampling& s) {
  const SamplingParams& p = s.sampler.params();
  if (is_greedy(p)) return std::string("sampling: greedy (temperature ") + number(p.temperature) + ", " + from_name(s.temperature_from) + ")";
  std::ostringstream out;
  out << "sampling: temperature " << number(p.temperature) << " (" << from_name(s.temperature_from) << "), top_k "
      << p.top_k << " (" << from_name(s.top_k_from) << "), top_p " << number(p.top_p) << " ("
      << from_name(s.top_p_from) << "), min_p " << number(p.min_p) << " (" << from_name(s.min_p_from) << "), seed " << p.seed << (s.random_seed ? " (random)" : "");
  return out.str();
}

std::optional<Tokenizer> open_tokenizer(const GenerationFlags& f, const Engine& engine) {
  if (!f.tokenizer_path.empty()) return Tokenizer::from_file(f.tokenizer_path);
  if (engine.tokenizer_json()) return Tokenizer::from_json(*engine.tokenizer_json());
  return std::nullopt;
}

void note_foreign_chat_template(const Engine& engine) {
  const std::optional<std::string>& t = engine.chat_template();
  if (!t || t->find("<|turn>") != std::string::npos) return;
  std::fprintf(stderr,
               "note: the model's chat template is not Gemma 4's (it has no <|turn>); g4 formats the prompt in "
               "Gemma 4's chat format (--raw_prompt sends the text as it is)\n");
}

std::vector<int32_t> stop_ids(const GenerationFlags& f, const Engine& engine) {
  std::vector<int32_t> ids = {f.eos_id};
  ids.insert(ids.end(), kGemma4StopTokenIds.begin(), kGemma4StopTokenIds.end());
  for (int id : engine.config().eos_ids) ids.push_back(id);
  return ids;
}

double peak_host_mib() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_maxrss) / 1024.0;
}

}  // namespace g4::cli
