// Opens a model for running: a Hugging Face checkpoint directory or a GGUF model file.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "backend/backend.h"
#include "backend/comm/communicator.h"
#include "model/assistant.h"
#include "model/gemma4.h"
#include "model/generation_config.h"
#include "model/gguf_model.h"
#include "format/tensor_source.h"

namespace g4 {

// Loads and validates the model at `path` (a checkpoint directory or a .gguf file) onto `backend`.
std::unique_ptr<Gemma4> load_model(const std::string& path, Backend& backend);

// A model ready to run with what its file says about running it (docs/DESIGN.md §3).
struct LoadedProgram {
  std::unique_ptr<Gemma4> model;
  ProgramFlags program;  // a checkpoint directory is a logits (non-sample) program
  std::optional<std::string> tokenizer_json;  // embedded, or the directory's tokenizer.json
  GenerationDefaults generation;              // the checkpoint's sampling defaults
  // The file's tokenizer.chat_template (or the directory's chat template). g4 renders Gemma 4's
  // chat format natively; the template says whether a file expects that format (docs/DESIGN.md §5).
  std::optional<std::string> chat_template;
};
// With `comm`, loads rank comm->rank()'s shard of the model for a tensor-parallel group
// (docs/DESIGN.md, "Tensor parallel"); `comm` must outlive the model.
LoadedProgram load_program(const std::string& path, Backend& backend, Communicator* comm = nullptr);

// The tokenizer.json text of the model at `path` (embedded in a .gguf, or the checkpoint
// directory's tokenizer.json) without loading its weights; nullopt when it has none.
std::optional<std::string> model_tokenizer_json(const std::string& path);

// Loads the MTP assistant (model/assistant.h) at `path`, a checkpoint directory or a GGUF file in
// llama.cpp's gemma4-assistant layout, for a target of config `target`. Throws naming the mismatch
// when it does not belong to that target, before any weight is read.
std::unique_ptr<Gemma4Assistant> load_assistant(const std::string& path, Backend& backend, const ModelConfig& target);

// A GGUF model file's bytes in memory for the life of the program (e.g. linked into the executable).
struct ModelImage {
  std::span<const uint8_t> bytes;
  std::string name;  // names the model in messages
};
LoadedProgram load_program(const ModelImage& image, Backend& backend, Communicator* comm = nullptr);
std::optional<std::string> model_tokenizer_json(const ModelImage& image);
std::unique_ptr<Gemma4Assistant> load_assistant(const ModelImage& image, Backend& backend, const ModelConfig& target);

}  // namespace g4
