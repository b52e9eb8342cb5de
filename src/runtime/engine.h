// The engine: a loaded program (docs/DESIGN.md §3) on a backend, with one session. A sampling program's
// forward returns the token sampled on the backend (only 8 bytes reach the host); a logits
// program returns the last position's logits and the caller samples on the host with the same
// sampler, so both give the same token for the same logits and seed.
#pragma once
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/loader.h"
#include "runtime/session.h"
#include "sampling/sampling_params.h"

namespace g4 {

struct EngineOptions {
  std::string model_path;
  std::optional<ModelImage> model_image;  // loaded instead of model_path when set
  std::string backend = "cpu";
  int64_t max_seq_len = 0;        // 0 = the program's g4.max_seq_len
  int64_t max_prefill_chunk = 0;  // 0 = the program's g4.max_prefill_chunk
  int threads = 0;                // CPU backend worker threads; 0 = one per hardware thread
};

struct ForwardResult {
  int64_t token = -1;         // sampling program: the sampled token
  std::vector<float> logits;  // logits program: the last position's logits [vocab]
};

class Engine {
 public:
  explicit Engine(const EngineOptions& options);

  const ModelConfig& config() const { return loaded_.model->config(); }
  const Gemma4& model() const { return *loaded_.model; }
  const ProgramFlags& program() const { return loaded_.program; }
  bool use_sampling() const { return loaded_.program.use_sampling; }
  const std::optional<std::string>& tokenizer_json() const { return loaded_.tokenizer_json; }
  const GenerationDefaults& generation_defaults() const { return loaded_.generation; }
  const std::optional<std::string>& chat_template() const { return loaded_.chat_template; }
  Backend& backend() { return *backend_; }
  Session& session() { return *session_; }

  // forward(tokens[T], input_pos[T], sampling scalars): input_pos must continue the session
  // (input_pos[0] == position()) or restart it (input_pos[0] == 0). Parameters, ids and the
  // context are checked before anything runs, so a rejected call leaves the state unchanged.
  ForwardResult forward(std::span<const int32_t> tokens, std::span<const int32_t> input_pos,
                        const SamplingParams& params);
  // The token a forward result stands for: the program's own, or sampled on the host.
  int64_t token_of(const ForwardResult& result, const SamplingParams& params) const;

 private:
  std::unique_ptr<Backend> backend_;
  LoadedProgram loaded_;
  std::unique_ptr<Session> session_;
};

}  // namespace g4
