// What every sequence of one model shares (docs/DESIGN.md §7): the model, the backend, the KV
// pool, and the workspace of a forward (activations, inputs, logits and sampling rows), reserved
// up front so that no forward — and so no graph capture — allocates. Its forward runs the tokens
// of one or many sequences at once; Session (one sequence) and Scheduler (many) are built on it.
// Single-threaded: one forward at a time.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/gemma4.h"
#include "runtime/draw_mask.h"
#include "runtime/kv_pool.h"
#include "sampling/sampling_params.h"

namespace g4 {

struct RunnerOptions {
  int64_t max_seq_len = 0;          // a sequence's context; 0 = ModelConfig::default_max_seq_len()
  int64_t max_prefill_chunk = 0;    // rows of one forward; 0 = ModelConfig::max_prefill_chunk(max_seq_len)
  int64_t max_batch_sequences = 1;  // sequences whose logits one forward computes (a decode batch)
  // The KV pool's budget (0 = the caches of kv_budget_sequences sequences of max_seq_len), at most
  // what the device has free once the weights and the forward's workspaces are allocated.
  size_t kv_budget_bytes = 0;
  int64_t kv_budget_sequences = 1;
  KvTypes kv_types;  // the caches' row types by layer kind
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
  // Copies a step's result `t` to the host once the step is done. A split model's step ends early,
  // its sums unreduced, when its group failed: then this throws PeerFailure instead of returning
  // garbage.
  void download_result(const Tensor& t, void* out) const;
  KvPool& kv_pool() { return pool_; }
  const KvPool& kv_pool() const { return pool_; }
  int64_t max_seq_len() const { return max_seq_len_; }
  int64_t max_prefill_chunk() const { return buffers_.max_tokens; }
  int64_t max_batch_sequences() const { return buffers_.max_outputs; }
  // Throws (naming the problem) unless `tokens` can run from position `start` in a sequence of
  // max_seq_len positions: at least one token, every id in the vocabulary, the context large enough.
  void check_tokens(std::span<const int32_t> tokens, int64_t start, int64_t max_seq_len) const;

  // Runs the chunks in one forward (at most max_prefill_chunk tokens, max_batch_sequences output
  // rows): uploads their ids and positions, then enqueue(); appends each chunk's tokens to its
  // sequence. Output rows land in `out` in chunk order. forward_and_sample below also draws.
  void forward(std::span<const SequenceChunk> chunks, const LogitsOutput& out);
  // The forward of `sequences` over ids and positions already in backend memory, with the logits
  // of every output row into `out`, in row order. Enqueues only: it uploads, reads back and
  // allocates nothing (a graph capture records it).
  void enqueue(std::span<const SequenceRows> sequences, const Tensor& ids, const Tensor& positions,
               const LogitsOutput& out);
  // One forward of `chunks` whose output rows (params.size() of them, in chunk order) are drawn on
  // the backend, row r with params[r]: uploads the ids, positions and parameters, then calls
  // run(work), where `work` enqueues the forward (its logits into workspace_logits(n)) and the
  // draws, and `run` calls it or replays a recording of it (DecodeBatchGraphs); then reads back the
  // tokens and appends each chunk's tokens to its sequence. The logits stay in the workspace.
  // `adjustments`: empty, or per output row its logit bias and penalties (sampling/logit_penalties.h),
  // applied on the backend before the draws. `masks`: empty, or per output row its grammar's mask
  // (null: none), computed on the host after the forward is enqueued and applied after the
  // adjustments.
  std::vector<int32_t> forward_and_sample(std::span<const SequenceChunk> chunks,
                                          std::span<const SamplingParams> params,
                                          std::span<const std::vector<LogitAdjustment>> adjustments,
                                          std::span<const DrawMask* const> masks,
                                          const std::function<void(const std::function<void()>& work)>& run);
  // Uploads per-row logit adjustments into the runner's buffer (grown as a call needs), valid until
  // the next call; rows 0 (nothing to apply) when every list is empty.
  AdjustmentRows stage_adjustments(std::span<const std::vector<LogitAdjustment>> rows);
  // Uploads per-row token masks (null: none; at most max_batch_sequences rows) into the runner's
  // buffer, computing each on the host; rows 0 (nothing to apply) when every row is null.
  TokenMaskRows stage_masks(std::span<const DrawMask* const> rows);
  // The workspace's first `rows` logits rows (rows <= max_batch_sequences).
  LogitsOutput workspace_logits(int64_t rows) const;

 private:
  // A forward's inputs, uploaded: its sequences' rows and the ids and positions of its tokens.
  struct StagedInputs {
    std::vector<SequenceRows> rows;
    Tensor ids, positions;
  };
  StagedInputs stage_inputs(std::span<const SequenceChunk> chunks);

  const Gemma4& model_;
  Backend& backend_;
  int64_t max_seq_len_;
  KvPool pool_;
  ForwardBuffers buffers_;
  Tensor ids_, positions_, logits_, tokens_;
  SamplingRows params_;  // one row per output row
  // Per output row, the logit adjustments of a forward_and_sample; entries grow with the longest list.
  AdjustmentRows adjustments_;
  // Per output row, the token masks of a forward_and_sample; allocated at the first constrained draw.
  TokenMaskRows masks_;
  std::vector<uint32_t> mask_words_;  // their host staging
};

}  // namespace g4
