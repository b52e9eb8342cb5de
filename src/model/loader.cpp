#include "model/loader.h"

#include <algorithm>
#include <filesystem>

#include "model/hf_checkpoint.h"
#include "model/gguf_model.h"
#include "model/generation_config.h"
#include "model/gguf_tokenizer.h"
#include "util/error.h"
#include "util/files.h"

namespace g4 {

namespace {

std::unique_ptr<Gemma4> load_from(const ModelConfig& config, const TensorSource& source, Backend& backend,
                                  Communicator* comm) {
  if (!comm) return std::make_unique<Gemma4>(config, load_weights(config, source, backend));
  ModelWeights shard = load_weights(config, source, backend, TpShard{comm->rank(), comm->size()});
  return std::make_unique<Gemma4>(config, std::move(shard), *comm);
}

LoadedProgram load_gguf(const GgufModel& file, Backend& backend, Communicator* comm) {
  LoadedProgram out;
  out.model = load_from(file.config(), file, backend, comm);
  out.program = file.program();
  out.tokenizer_json = file.tokenizer_json();
  out.generation = read_generation_defaults(file.file().metadata());
  if (file.file().metadata().find(gguf_key::kChatTemplate))
    out.chat_template = file.file().metadata().get_string(gguf_key::kChatTemplate);
  return out;
}

}  // namespace

// A directory is a Hugging Face checkpoint; any other path must be a GGUF model file.
LoadedProgram load_program(const std::string& path, Backend& backend, Communicator* comm) {
  G4_REQUIRE(kNotFound, std::filesystem::exists(path), "model path '" + path + "' does not exist");
  LoadedProgram out;
  if (std::filesystem::is_directory(path)) {
    HfCheckpoint checkpoint(path);
    out.model = load_from(checkpoint.config(), checkpoint, backend, comm);
    out.program = default_program_flags(checkpoint.config(), false);
    out.tokenizer_json = read_file_if_exists((std::filesystem::path(path) / "tokenizer.json").string());
    out.generation = read_generation_config(path);
    out.chat_template = read_chat_template(path);
    return out;
  }
  return load_gguf(GgufModel(path), backend, comm);
}

LoadedProgram load_program(const ModelImage& image, Backend& backend, Communicator* comm) {
  return load_gguf(GgufModel(GgufFile(image.bytes, nullptr, image.name)), backend, comm);
}

std::optional<std::string> model_tokenizer_json(const std::string& path) {
  G4_REQUIRE(kNotFound, std::filesystem::exists(path), "model path '" + path + "' does not exist");
  if (std::filesystem::is_directory(path))
    return read_file_if_exists((std::filesystem::path(path) / "tokenizer.json").string());
  return GgufModel(path).tokenizer_json();
}

std::optional<std::string> model_tokenizer_json(const ModelImage& image) {
  return GgufModel(GgufFile(image.bytes, nullptr, image.name)).tokenizer_json();
}

namespace {

// The assistant of `config` from `source`; `draft_tokens`: its files' drafts a round, kept within
// what a round may hold.
std::unique_ptr<Gemma4Assistant> assistant_from(const ModelConfig& config, const TensorSource& source,
                                                std::optional<int64_t> draft_tokens, Backend& backend,
                                                const ModelConfig& target) {
  assistant_cache_layers(target, config);  // before any weight is read
  return std::make_unique<Gemma4Assistant>(config, load_weights(config, source, backend), target,
                                           std::min(draft_tokens.value_or(kDefaultDraftTokens), kMaxDraftTokens));
}

std::unique_ptr<Gemma4Assistant> assistant_from(const GgufModel& file, Backend& backend, const ModelConfig& target) {
  return assistant_from(file.config(), file, read_num_assistant_tokens(file.file().metadata()), backend, target);
}

}  // namespace

std::unique_ptr<Gemma4Assistant> load_assistant(const std::string& path, Backend& backend, const ModelConfig& target) {
  G4_REQUIRE(kNotFound, std::filesystem::exists(path), "assistant path '" + path + "' does not exist");
  if (std::filesystem::is_directory(path)) {
    const HfCheckpoint checkpoint(path, ModelRole::kAssistant);
    return assistant_from(checkpoint.config(), checkpoint, read_num_assistant_tokens(path), backend, target);
  }
  return assistant_from(GgufModel(path, ModelRole::kAssistant), backend, target);
}

std::unique_ptr<Gemma4Assistant> load_assistant(const ModelImage& image, Backend& backend, const ModelConfig& target) {
  return assistant_from(GgufModel(GgufFile(image.bytes, nullptr, image.name), ModelRole::kAssistant), backend, target);
}

std::unique_ptr<Gemma4> load_model(const std::string& path, Backend& backend) {
  return std::move(load_program(path, backend).model);
}

}  // namespace g4
