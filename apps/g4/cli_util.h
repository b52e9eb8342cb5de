// Small helpers shared by the g4 sub-commands.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "model/loader.h"
#include "runtime/engine.h"
#include "model/kv_types.h"
#include "tokenizer/tokenizer.h"

namespace g4::cli {

// The demo model (models/demo.gguf at build time), linked into the g4 executable, so that it runs
// from any directory and from a copied or installed binary.
ModelImage demo_model();
// The model the sub-commands run: `model_path`, or the embedded demo model when it is empty.
void use_model_or_demo(EngineOptions& options, const std::string& model_path);
// The demo model's MTP assistant (models/demo-assistant.gguf at build time), linked in beside it.
ModelImage demo_assistant();
// What --draft_model names for the embedded demo assistant instead of a path.
inline constexpr const char* kDemoDraftModel = "demo";
// The assistant the sub-commands draft with: `draft_model` (none when empty), or the embedded demo
// assistant when it is kDemoDraftModel.
void use_draft_model(EngineOptions& options, const std::string& draft_model);

// The tensor types of a GGUF file: per type the tensor count, weights and bytes, and the file's
// bits per weight (g4 inspect prints them; g4 run and chat say which types they load).
struct TypeUse {
  int tensors = 0;
  uint64_t weights = 0, bytes = 0;
};
struct WeightTypes {
  std::map<std::string, TypeUse> by_type;
  double bits_per_weight = 0;
  std::string summary() const;  // "Q4_K x41, Q8_0 x1, F32 x44 (5.25 bits per weight)"
};
WeightTypes weight_types(const GgufFile& file);

// The tokenizer of a tokenizer.json (when tokenizer_path is given), else of the model at
// model_path (the embedded demo model when that is empty too); throws when the model has none.
Tokenizer open_tokenizer_of(const std::string& tokenizer_path, const std::string& model_path);

// --kv_type and --kv_sliding_type (model/kv_types.h), on every command that runs the model and on
// g4 export (which records them in the file as the caches runs take by default).
struct KvTypeFlags {
  std::string full, sliding;  // empty: the model file's (bf16 unless g4 export recorded others)
  KvTypeChoice choice() const;
};
void add_kv_type_flags(CLI::App& cmd, KvTypeFlags& flags);
// --bf16_weight_copies (EngineOptions::bf16_weight_copies).
void add_bf16_weight_copies_flag(CLI::App& cmd, bool& on);
// "KV caches: full layers tq4, 20800 bytes a token; sliding layers bf16, 819200 bytes a token (of
// the window); pages of 532480 bytes" (g4 run's report).
std::string describe_kv_caches(const KvPool& pool);

// "drafting: 4 tokens a round; 37 rounds, 52 of 148 drafts accepted (35.1 %), 2.41 tokens a
// round; draft 0.123 s, verify 0.456 s" (runtime/speculation.h).
std::string describe_drafting(const SpeculationStats& stats, int64_t draft_tokens);

// Parses "1,2,3" into ids; throws g4::Error naming the bad element.
std::vector<int32_t> parse_id_list(const std::string& text);

// The bytes of a file named on the command line; "-" reads standard input to its end.
std::string read_input(const std::string& path);

}  // namespace g4::cli
