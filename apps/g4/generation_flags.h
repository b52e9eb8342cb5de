// The flags g4 run and g4 chat share (model, backend, sampling, stop ids, context), defined once,
// with the checks that run before anything is loaded and the steps from flags to a running engine.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli_util.h"
#include "runtime/engine.h"
#include "sampling/logit_penalties.h"
#include "sampling/sampler.h"
#include "sampling/sampling_settings.h"
#include "tokenizer/tokenizer.h"

namespace g4::cli {

struct GenerationFlags {
  std::string model_path, tokenizer_path, seed = "-1", backend = "cpu";
  float temperature = 0.8f, top_p = 1.0f, min_p = 0.0f;
  int32_t top_k = 0;
  float presence_penalty = 0.0f, frequency_penalty = 0.0f, repetition_penalty = 1.0f;
  std::string logit_bias;  // "id:bias,id:bias"
  int64_t max_new_tokens = 128, max_seq_len = 0;
  int32_t bos_id = 2, eos_id = 1;
  int threads = 0;
  int tp = 1;  // ranks of a split model (docs/DESIGN.md, "Tensor parallel")
  bool cuda_graph = false;
  bool bf16_weight_copies = false;  // EngineOptions::bf16_weight_copies
  KvTypeFlags kv;
  std::string draft_model;  // an MTP assistant (--draft_model)
  int64_t draft_tokens = 0;  // 0: the assistant's num_assistant_tokens, else 4
  // The base seed --seed -1 drew before the ranks of a split model started (each rank must use the
  // same one); unset: effective_sampling draws it.
  std::optional<uint64_t> drawn_seed;
  // Set by add_generation_flags: a sampling flag the user did not give takes the model's value.
  CLI::Option *temperature_flag = nullptr, *top_k_flag = nullptr, *top_p_flag = nullptr, *min_p_flag = nullptr;
};

// Adds the shared flags to `cmd`; `flags` must outlive the parse (its defaults are shown in --help).
void add_generation_flags(CLI::App& cmd, GenerationFlags& flags);

// --presence_penalty, --frequency_penalty, --repetition_penalty and --logit_bias as penalties
// (sampling/logit_penalties.h); a malformed --logit_bias is a clear error.
LogitPenalties flag_penalties(const GenerationFlags& flags);

// Everything that can be judged without the model, so that a bad flag fails before loading.
void check_generation_flags(const GenerationFlags& flags);

// --seed -1 with --tp > 1: draws the base seed now, once for every rank (drawn_seed).
void draw_seed_for_ranks(GenerationFlags& flags);

// What the flags ask to load: the model (the demo model when no --model_path), backend, context.
EngineOptions engine_options(const GenerationFlags& flags);
// Loads engine_options(flags) and checks the token flags against it.
std::unique_ptr<Engine> open_engine(const GenerationFlags& flags);
// Checks bos/eos ids against the loaded model's vocabulary.
void check_token_flags(const GenerationFlags& flags, const Engine& engine);

// The sampling settings in effect (resolve_sampling): flags the user gave win, the others take the
// model's generation config, else g4 run's defaults. The base seed is --seed, or drawn_seed, or
// drawn now (random_seed says it was not given); with `announce` a drawn one is printed, unless
// decoding is greedy (no seed is used).
ResolvedSampling effective_sampling(const GenerationFlags& flags, const GenerationDefaults& model_defaults,
                                    bool announce = true);
// One line for a report: "sampling: temperature 0.8 (default), top_k 64 (model), ..., seed 42".
std::string describe_sampling(const ResolvedSampling& sampling);

// --tokenizer_path, else the model's own; nullopt when neither exists.
std::optional<Tokenizer> open_tokenizer(const GenerationFlags& flags, const Engine& engine);

// Prints a note on stderr when the model carries a chat template that is not Gemma 4's format
// (no "<|turn>"): g4 formats conversations in Gemma 4's format whatever the file says.
void note_foreign_chat_template(const Engine& engine);

// The ids that end a reply: --eos_id, Gemma 4's <turn|> and <|tool_response>, the model's own.
std::vector<int32_t> stop_ids(const GenerationFlags& flags, const Engine& engine);

// Peak resident host memory of this process so far, in MiB.
double peak_host_mib();

}  // namespace g4::cli
