// What every sequence of one model shares (docs/DESIGN.md §7): the model, the backend, the KV
// pool, and the workspace of a forward (activations, inputs, logits and sampling rows), reserved
// up front so that no forward — and so no graph capture — allocates. Its forward runs the tokens
// of one or many sequences at once; Session (one sequence) and Scheduler (many) are built on it.
// Single-threaded: one forward at a time.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/gemma4.h"
#include "runtime/kv_pool.h"
#include "sampling/sampling_params.h"

namespace g4 {

struct RunnerOptions {
  int64_t max_seq_len = 0;          // a sequence's context; 0 = ModelConfig::default_max_seq_len()
  int64_t max_prefill_chunk = 0;    // rows of one forward; 0 = ModelConfig::max_prefill_chunk(max_seq_len)
  int64_t max_batch_sequences = 1;  // sequences whose logits one forward computes (a decode batch)
  size_t kv_budget_bytes = 0;       // 0 = the caches of kv_budget_sequences sequences of max_seq_len
  int64_t kv_budget_sequences = 1;
};

// The smallest context a sequence of this model accepts (2, or the sliding window if larger).
int64_t min_max_seq_len(const ModelConfig& c);
// Throws "max_seq_len N is below what the model needs" / "exceeds the model's context length".
void check_max_seq_len(const ModelConfig& c, int64_t max_seq_len);

// One sequence's part of a forward: `tokens` at the sequence's next positions, the logits of its
// last out_rows tokens computed.
struct SequenceChunk {
  KvSequence* kv = nullptr;
  std::span<const int32_t> tokens;
  int64_t out_rows = 0;
};

// Where a forward's logits go: F32 `logits` [n, vocab], with the final-normed hidden rows
// `normed` [n, hidden] and the activation-dtype logits `act` [n, vocab] as scratch.
struct LogitsOutput {
  Tensor normed, act, logits;
};

class ModelRunner {
 public:
  ModelRunner(const Gemma4& model, Backend& backend, RunnerOptions options);

  const Gemma4& model() const { return model_; }
  const ModelConfig& config() const { return model_.config(); }
  Backend& backend() const { return backend_; }
  KvPool& kv_pool() { return pool_; }
  int64_t max_seq_len() const { return max_seq_len_; }
  int64_t max_prefill_chunk() const { return buffers_.max_tokens; }
  int64_t max_batch_sequences() const { return buffers_.max_outputs; }
  // Throws (naming the problem) unless `tokens` can run from position `start` in a sequence of
  // max_seq_len positions: at least one token, every id in the vocabulary, the context large enough.
  void check_tokens(std::span<const int32_t> tokens, int64_t start, int64_t max_seq_len) const;

  // Runs the chunks in one forward (at most max_prefill_chunk tokens, max_batch_sequences output
  // rows): uploads their ids and positions, then enqueue(); appends each chunk's tokens to its
  // sequence. Output rows land in `out` in chunk order.
  void forward(std::span<const SequenceChunk> chunks, const LogitsOutput& out);
  // The forward of `sequences` over ids and positions already in backend memory, with the logits
  // of every output row into `out`, in row order. Enqueues only: it uploads, reads back and
  // allocates nothing (a graph capture records it).
  void enqueue(std::span<const SequenceRows> sequences, const Tensor& ids, const Tensor& positions,
               const LogitsOutput& out);
  // The workspace's first `rows` logits rows (rows <= max_batch_sequences).
  LogitsOutput workspace_logits(int64_t rows) const;
  // Draws row r of F32 `logits` [n, vocab] with params[r], on the backend (one launch).
  std::vector<int32_t> sample(const Tensor& logits, std::span<const SamplingParams> params);

  // The backend keeps one recorded graph; a DecodeGraph notes that it recorded it, and records
  // again when another graph has replaced it since.
  const void* graph_owner() const { return graph_owner_; }
  void set_graph_owner(const void* owner) { graph_owner_ = owner; }

 private:
  const Gemma4& model_;
  Backend& backend_;
  int64_t max_seq_len_;
  KvPool pool_;
  ForwardBuffers buffers_;
  Tensor ids_, positions_, logits_, params_, tokens_;
  const void* graph_owner_ = nullptr;
};

}  // namespace g4
