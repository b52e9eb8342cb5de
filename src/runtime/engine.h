// The engine (docs/DESIGN.md §7): a loaded program (docs/DESIGN.md §3) on a backend, with the
// runner its sessions share — the forward workspace and a KV pool with a byte budget.
// create_session() gives one sequence; a Scheduler batches many over runner().
#pragma once
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/comm/communicator.h"
#include "model/loader.h"
#include "runtime/model_runner.h"
#include "runtime/session.h"
#include "sampling/sampler.h"

namespace g4 {

struct EngineOptions {
  std::string model_path;
  std::optional<ModelImage> model_image;  // loaded instead of model_path when set
  std::string backend = "cpu";
  int64_t max_seq_len = 0;        // 0 = the program's g4.max_seq_len
  int64_t max_prefill_chunk = 0;  // 0 = the program's g4.max_prefill_chunk
  int threads = 0;                // CPU backend worker threads; 0 = one per hardware thread
  // Bytes of KV caches for all sequences and cached prefixes together; 0 = one sequence of
  // max_seq_len (what g4 run and g4 chat use).
  size_t kv_budget_bytes = 0;
  // When kv_budget_bytes is 0: the budget is this many sequences of max_seq_len (a server's
  // --max_sessions), counted in this rank's KV heads, so each rank of a split model sizes its own.
  int64_t kv_budget_sequences = 1;
  KvTypeChoice kv_types;  // the KV caches' row types (--kv_type, --kv_sliding_type); unset: the program's
  // An MTP assistant (model/assistant.h) that drafts draft_tokens tokens a round for this engine's
  // sessions (runtime/speculation.h) and schedulers (SchedulerOptions::draft); empty: none. The
  // runner then draws at least draft_tokens + 1 rows a forward.
  std::string draft_model;
  std::optional<ModelImage> draft_image;  // loaded instead of draft_model when set
  int64_t draft_tokens = 0;  // 0: the assistant's num_assistant_tokens, else kDefaultDraftTokens
  int64_t max_batch_sequences = 16;  // sequences one forward samples (a scheduler's decode batch)
  // Tensor parallel (docs/DESIGN.md, "Tensor parallel"): the model split over `tp` ranks, one
  // thread and one device each (CUDA: GPU r; CPU: threads / tp workers each). An engine of a split
  // model is one rank: run_tensor_parallel (runtime/tensor_parallel.h) makes one per rank, setting
  // tp_group and tp_rank.
  int tp = 1;
  CommGroup* tp_group = nullptr;
  int tp_rank = 0;
  CudaAllReduce tp_all_reduce = CudaAllReduce::kPeerWhenReachable;  // how CUDA ranks sum
  // A bf16 copy of every block-quantized weight beside it (Backend::set_bf16_weight_copies): large
  // batches and prefill multiply the copies.
  bool bf16_weight_copies = false;
};

// The backend an engine of `options` runs on: rank tp_rank's device (CUDA), or its share of the
// CPU worker threads (threads / tp each, so that the ranks do not oversubscribe the cores), asked
// for bf16 weight copies when the options are.
std::unique_ptr<Backend> make_engine_backend(const EngineOptions& options);

// What the reference design's program returns for a forward.
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
  // The assistant and draft count of EngineOptions::draft_model (no assistant without one).
  DraftOptions draft_options() const { return DraftOptions{assistant_.get(), draft_tokens_}; }
  Backend& backend() { return *backend_; }
  // This engine's rank of a split model (0 of 1 unsplit), and its communicator (nullptr unsplit).
  int tp_rank() const { return comm_ ? comm_->rank() : 0; }
  int tp_size() const { return comm_ ? comm_->size() : 1; }
  Communicator* communicator() const { return comm_.get(); }
  ModelRunner& runner() { return *runner_; }
  KvPool& kv_pool() { return runner_->kv_pool(); }
  const KvPool& kv_pool() const { return runner_->kv_pool(); }

  // A new, empty sequence; its caches come from the KV pool when it first runs tokens (see
  // Session). Sessions must not outlive the engine.
  std::unique_ptr<Session> create_session(SessionOptions options = {});

  // The program contract, forward(tokens[T], input_pos[T], sampling) on `session`: input_pos must
  // continue the session (input_pos[0] == position()) or restart it (input_pos[0] == 0). Ids and
  // the context are checked before anything runs, so a rejected call leaves the session unchanged.
  // A sampling program returns token j of `sampler`, a logits program the last logits.
  ForwardResult forward(Session& session, std::span<const int32_t> tokens, std::span<const int32_t> input_pos,
                        const Sampler& sampler, int64_t j = 0);
  // The token a forward result stands for: the program's own, or token j of `sampler` drawn on
  // the host from the logits.
  int64_t token_of(const ForwardResult& result, const Sampler& sampler, int64_t j = 0) const;

 private:
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Communicator> comm_;  // before loaded_: the model keeps a reference
  LoadedProgram loaded_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Gemma4Assistant> assistant_;
  int64_t draft_tokens_ = 0;
};

}  // namespace g4
