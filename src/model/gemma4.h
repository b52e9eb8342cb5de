// The Gemma 4 text forward (docs/DESIGN.md §2), written once against the Backend interface.
#pragma once
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/weights.h"

namespace g4 {

// Activation buffers for chunks of up to max_tokens tokens, allocated once per session.
struct ForwardBuffers {
  ForwardBuffers(const ModelConfig& c, Backend& backend, int64_t max_tokens);
  int64_t max_tokens;
  Tensor x, normed, q, k, v, attn, proj, gate;
  Tensor last_hidden;  // [1, hidden]: the last position's normed hidden state
  Tensor logits_act;   // [1, vocab] in the activation dtype (before the soft-cap)
};

class Gemma4 {
 public:
  Gemma4(ModelConfig config, ModelWeights weights) : config_(std::move(config)), weights_(std::move(weights)) {}
  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }

  // Runs T = ids.rows tokens at contiguous `positions` through every layer, reading and extending
  // `caches` (one per layer). Leaves the final hidden states of the last `out_rows` positions in
  // buf.x rows [T - out_rows, T); the other rows hold the last layer's input. out_rows = 0 (a chunk
  // whose logits nobody reads) only fills the caches.
  void forward_layers(Backend& be, ForwardBuffers& buf, std::vector<KvCache>& caches, const Tensor& ids,
                      const Tensor& positions, int64_t out_rows) const;
  // LM head + soft-cap of hidden rows `hidden` [n, H] into F32 `logits` [n, V]. `scratch` holds
  // the activation-dtype logits [n, V].
  void logits(Backend& be, const Tensor& hidden, const Tensor& normed, const Tensor& scratch,
              const Tensor& logits) const;

 private:
  // Both blocks read their normed input from buf.normed and leave the next block's there.
  // Keys and values of all T rows; queries, o_proj and the residual only for the last out_rows.
  void attention_block(Backend& be, ForwardBuffers& buf, int layer, KvCache& cache, const Tensor& positions,
                       int64_t T, int64_t out_rows) const;
  // The MLP block over rows [first, first + n).
  void mlp_block(Backend& be, ForwardBuffers& buf, int layer, int64_t first, int64_t n) const;

  ModelConfig config_;
  ModelWeights weights_;
};

}  // namespace g4
