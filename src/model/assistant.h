// Gemma 4's multi-token-prediction drafter, the "assistant" (docs/DESIGN.md, "Speculative
// decoding"): a few Gemma 4 layers that propose the target's next tokens from the target's own
// state. A draft step reads, for each sequence, a token t at position P (the position the target
// has not processed yet) and a hidden state h of the target's width:
//   x = pre_projection · [embed_target(t)·√backbone | h]
//   per layer: queries only (q_proj, q_norm, RoPE at P) over the KV cache of the target's last
//   layer of the same kind, keys below P (sliding layers within the window); o_proj, the MLP and
//   the norms and layer scalar as in the target's layers
//   logits = embed_assistant · final_norm(x) (tied, no soft-cap); h_next = post_projection · final_norm(x)
// The first step of a round takes the target's final-normed hidden state of the position that
// produced t; later steps take the previous step's h_next and its drafted token, at the same P
// (the caches hold no drafted token). This is transformers' Gemma4AssistantForCausalLM and
// llama.cpp's gemma4-assistant.
#pragma once
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/gemma4.h"
#include "model/weights.h"

namespace g4 {

// The target layer whose caches each assistant layer reads: the target's last layer of the same
// kind (sliding or full). Throws Error(kInvalidArgument) naming the mismatch when `assistant` does not
// belong to `target`: vocabulary, backbone width, head sizes, KV heads, sliding window or RoPE.
std::vector<int> assistant_cache_layers(const ModelConfig& target, const ModelConfig& assistant);

// Activations of draft steps for up to max_rows sequences at once.
struct DraftBuffers {
  DraftBuffers(const ModelConfig& assistant, Backend& backend, int64_t max_rows);
  int64_t max_rows;
  Tensor embedded, joined, x, normed, q, attn, proj, gate, logits_act;
};

// One sequence's draft step inputs: its row in the step's tensors and the target's caches.
struct DraftRow {
  const std::vector<KvCache>* target_caches = nullptr;  // one per target layer
};

// Drafts a round when neither the user nor the assistant's files say otherwise, and the most a round
// may hold (a verify forward of kMaxDraftTokens + 1 tokens).
inline constexpr int64_t kDefaultDraftTokens = 4;
inline constexpr int64_t kMaxDraftTokens = 16;
// Throws unless `draft_tokens` is 0 (the assistant's default) or in [1, kMaxDraftTokens].
void check_draft_tokens(int64_t draft_tokens);

class Gemma4Assistant {
 public:
  // Throws (assistant_cache_layers) unless the assistant belongs to `target`'s config.
  // default_draft_tokens: the drafts a round its files ask for (num_assistant_tokens).
  Gemma4Assistant(ModelConfig config, ModelWeights weights, const ModelConfig& target,
                  int64_t default_draft_tokens = kDefaultDraftTokens);
  const ModelConfig& config() const { return config_; }
  int64_t default_draft_tokens() const { return default_draft_tokens_; }
  const ModelWeights& weights() const { return weights_; }
  const std::vector<int>& cache_layers() const { return cache_layers_; }

  // One draft step for rows.size() sequences, sequence i in row i of every tensor: ids I32 [n, 1]
  // (the tokens t), positions I32 [n, 1] (P), h activation dtype [n, backbone]. Writes logits F32
  // [n, vocab] and h_next activation dtype [n, backbone] (may be h itself). `target` gives the
  // embedding the tokens are read from.
  void step(Backend& be, DraftBuffers& buf, const Gemma4& target, std::span<const DraftRow> rows, const Tensor& ids,
            const Tensor& positions, const Tensor& h, const Tensor& logits, const Tensor& h_next) const;

 private:
  void layer(Backend& be, DraftBuffers& buf, int i, std::span<const DraftRow> rows, const Tensor& positions,
             int64_t n) const;

  ModelConfig config_;
  ModelWeights weights_;
  std::vector<int> cache_layers_;
  int64_t default_draft_tokens_;
};

}  // namespace g4
