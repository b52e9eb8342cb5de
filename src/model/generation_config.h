// A checkpoint's sampling defaults (Hugging Face generation_config.json), which `g4 run` uses for
// any sampling flag the user does not give (docs/DESIGN.md §3). Model files keep them under
// llama.cpp's general.sampling.* keys (g4.generation.* in files of earlier g4 versions, still read).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "format/gguf.h"
#include "sampling/sampling_settings.h"

namespace g4 {

// The model's layer of resolve_sampling.
using GenerationDefaults = SamplingChoices;

// Reads DIR/generation_config.json; all fields empty when the file is absent. `do_sample: false`
// means greedy (temperature 0). Throws g4::Error for malformed JSON.
GenerationDefaults read_generation_config(const std::string& dir);

void write_generation_defaults(const GenerationDefaults& d, GgufMetadata& metadata);
GenerationDefaults read_generation_defaults(const GgufMetadata& metadata);

// An MTP assistant's drafts a round (transformers' num_assistant_tokens in DIR/generation_config.json;
// in a model file, g4.num_assistant_tokens): empty when absent. Throws g4::Error for a value that
// is not a positive integer.
std::optional<int64_t> read_num_assistant_tokens(const std::string& dir);
std::optional<int64_t> read_num_assistant_tokens(const GgufMetadata& metadata);
void write_num_assistant_tokens(int64_t tokens, GgufMetadata& metadata);

}  // namespace g4
