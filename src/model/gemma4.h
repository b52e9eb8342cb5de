// The Gemma 4 text forward (docs/DESIGN.md §2), written once against the Backend interface.
#pragma once
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/comm/communicator.h"
#include "model/config.h"
#include "model/weights.h"

namespace g4 {

// Activation buffers for forwards of up to max_tokens rows, of which up to max_outputs have
// their logits computed; allocated once, before any graph capture.
struct ForwardBuffers {
  ForwardBuffers(const ModelConfig& c, Backend& backend, int64_t max_tokens, int64_t max_outputs = 1);
  int64_t max_tokens, max_outputs;
  Tensor x, normed, q, k, v, attn, proj, gate;
  Tensor out_normed;  // [max_outputs, hidden]: the output rows' final-normed hidden states
  Tensor logits_act;  // [max_outputs, vocab] in the activation dtype (before the soft-cap)
};

// One sequence's rows in a batched forward: rows [first_row, first_row + rows) of ids/positions
// are its tokens at contiguous positions, attending over (and extending) its `caches`, one per
// layer; the hidden states of its last `out_rows` rows are read.
struct SequenceRows {
  const std::vector<KvCache>* caches = nullptr;
  int64_t first_row = 0, rows = 0, out_rows = 0;
  int64_t last_position = -1;  // the position of the sequence's last row, when the host knows it
};

// A layer's q, k and v projections as one launch over a forward's T rows (Gemma4::qkv_projections):
// the readers of the layer's normed input. K=V layers have no v_proj: count 2.
struct QkvProjections {
  Tensor ws[3], ys[3];
  size_t count = 0;
  bool one_launch = false;
  Readers readers() const { return Readers{std::span(ws, count), std::span(ys, count)}; }
};

class Gemma4 {
 public:
  Gemma4(ModelConfig config, ModelWeights weights)
      : config_(std::move(config)), rank_config_(config_), weights_(std::move(weights)) {}
  // One rank of a tensor-parallel group (docs/DESIGN.md, "Tensor parallel"): `weights` are the
  // rank's shard (load_weights with its TpShard); `comm` sums the split projections and gathers
  // the LM head's vocabulary shards, and must outlive the model.
  Gemma4(ModelConfig config, ModelWeights weights, Communicator& comm);
  // The whole model's config (vocabulary, ids, context): what callers check against.
  const ModelConfig& config() const { return config_; }
  // What this rank computes: its query and KV heads and MLP columns (config() unless split).
  // Activation buffers and KV caches are sized by it.
  const ModelConfig& rank_config() const { return rank_config_; }
  const ModelWeights& weights() const { return weights_; }
  // The tensor-parallel group; nullptr for a model on one device.
  Communicator* communicator() const { return comm_; }

  // Runs the rows of several sequences (`sequences`, in row order, covering ids.rows rows) through
  // every layer in one forward: every projection, norm and MLP over all rows at once, attention per
  // sequence over its own caches (docs/DESIGN.md §7). Leaves each sequence's final hidden states of
  // its out_rows rows in the same rows of buf.x; a sequence with out_rows = 0 (a chunk whose logits
  // nobody reads) only fills its caches. The last layer computes queries, o_proj and the MLP from
  // the first row any sequence reads to the end, so other rows there hold unread values.
  void forward_batch(Backend& be, ForwardBuffers& buf, std::span<const SequenceRows> sequences, const Tensor& ids,
                     const Tensor& positions) const;
  // forward_batch of one sequence: T = ids.rows tokens at contiguous `positions`, the last
  // out_rows of them read.
  void forward_layers(Backend& be, ForwardBuffers& buf, const std::vector<KvCache>& caches, const Tensor& ids,
                      const Tensor& positions, int64_t out_rows) const;
  // LM head + soft-cap of hidden rows `hidden` [n, H] into F32 `logits` [n, V]. `scratch` holds
  // the activation-dtype logits [n, V]. A rank of a split model computes its vocabulary shard and
  // gathers the whole rows from the others first, so that every rank holds the same logits.
  void logits(Backend& be, const Tensor& hidden, const Tensor& normed, const Tensor& scratch,
              const Tensor& logits) const;

 private:
  // Both blocks read their normed input from buf.normed and leave the next block's there; each
  // block's end also runs the matrices that read the next block's input (Backend::end_block), so
  // that a backend may hand that input over in another form as well.
  // Keys and values of all T rows; queries, o_proj and the residual only for rows [first, T), whose
  // normed MLP input the gate and up projections then read. `projected`: the previous block's end
  // projected q, k and v already (qkv_projections).
  void attention_block(Backend& be, ForwardBuffers& buf, int layer, std::span<const SequenceRows> sequences,
                       const Tensor& positions, int64_t T, int64_t first, bool projected) const;
  // The MLP block's end over rows [first, first + n) (its gate and up ran at the attention block's
  // end); with the next layer's q/k/v projections as readers when `next` holds them.
  void mlp_block(Backend& be, ForwardBuffers& buf, int layer, int64_t first, int64_t n,
                 const QkvProjections* next) const;
  // Layer `layer`'s q/k/v projections of a T-row forward whose queries start at row `first`, when
  // they run as one launch over all T rows (else q of rows [first, T) and k/v of all run apart).
  QkvProjections qkv_projections(const Backend& be, ForwardBuffers& buf, int layer, int64_t T, int64_t first) const;
  // The residual block end o = a · w^T, residual norm into next_out (a Backend::BlockEnd; split over
  // ranks, o is summed over them in between), read by `next`.
  BlockEnd block_end(const Tensor& a, const Tensor& w, const Tensor& o, const Tensor& x, const Tensor& post_weight,
                     const Tensor& scalar, float eps, const Tensor& next_weight, const Tensor& next_out,
                     Readers next) const;
  // After a projection split by its input (o_proj, down_proj): the sum of every rank's partial
  // output. Nothing on one device.
  void reduce_partial(const Tensor& partial) const {
    if (comm_) comm_->all_reduce_sum(partial);
  }

  ModelConfig config_, rank_config_;
  ModelWeights weights_;
  Communicator* comm_ = nullptr;
};

}  // namespace g4
