// The Gemma 4 text forward (SPEC §1), written once against the Backend interface.
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
  // `caches` (one per layer). Leaves the final hidden states in buf.x.
  void forward_layers(Backend& be, ForwardBuffers& buf, std::vector<KvCache>& caches, const Tensor& ids,
                      const Tensor& positions) const;
  // LM head + soft-cap of hidden rows `hidden` [n, H] into F32 `logits` [n, V]. `scratch` holds
  // the activation-dtype logits [n, V].
  void logits(Backend& be, const Tensor& hidden, const Tensor& normed, const Tensor& scratch,
              const Tensor& logits) const;

 private:
  // Both blocks read their normed input from buf.normed and leave the next block's there.
  void attention_block(Backend& be, ForwardBuffers& buf, int layer, KvCache& cache, const Tensor& positions,
                       int64_t T) const;
  void mlp_block(Backend& be, ForwardBuffers& buf, int layer, int64_t T) const;

  ModelConfig config_;
  ModelWeights weights_;
};

}  // namespace g4
