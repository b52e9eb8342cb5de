// The Gemma 4 text model's hyper-parameters, resolved per layer (docs/DESIGN.md §2), from either layout of
// Hugging Face config.json (text-only with per_layer_config, or published with nested text_config).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "util/dtype.h"

namespace g4 {

struct LayerConfig {
  bool sliding = true;
  int head_dim = 0;
  int kv_heads = 0;
  bool k_eq_v = false;          // no v_proj: V is k_proj's output before k_norm/RoPE
  double rope_theta = 10000.0;
  double rope_partial = 1.0;    // fraction of head_dim that rotates ("proportional" RoPE)

  // RoPE inverse frequencies: theta^(-2i/head_dim) for the rotating pairs, 0 after. Always float32,
  // whatever the checkpoint's dtype (docs/DESIGN.md, "RoPE precision").
  std::vector<float> rope_inv_freq() const;
};

struct ModelConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int num_heads = 0;
  double rms_norm_eps = 1e-6;
  double final_logit_softcap = 0.0;  // 0 = none
  int sliding_window = 0;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = true;
  int bos_id = 2;
  std::vector<int> eos_ids{1};
  int pad_id = 0;  // the padding token (pad_token_id): llama.cpp's tokenizer.ggml.padding_token_id
  std::vector<LayerConfig> layers;
  // An MTP assistant's (model/assistant.h): the hidden size of the target it drafts for, which its
  // input and output projections map from and to; 0 for a model of its own. An assistant's layers
  // project queries only, and read the caches of the target's layers (kv_heads, head_dim).
  int64_t backbone_hidden_size = 0;
  bool is_assistant() const { return backbone_hidden_size > 0; }
  int num_layers() const { return int(layers.size()); }
  int max_head_dim() const;
  int64_t max_q_cols() const;   // max over layers of heads*head_dim
  int64_t max_kv_cols() const;  // max over layers of kv_heads*head_dim
  // The context a session allocates unless told otherwise: min(max_position_embeddings, 4096).
  int64_t default_max_seq_len() const;
  // docs/DESIGN.md §3: min(max_seq_len - 1, 2 * sliding_window), at least 1 (the sliding ring holds 2 windows).
  int64_t max_prefill_chunk(int64_t max_seq_len) const;
};

// Gemma 4 31B's shape (docs/DESIGN.md §2: full attention every 6th layer, K=V and proportional
// RoPE on full layers): g4 bench's synthetic model and the tensor-parallel checks' example.
ModelConfig gemma4_31b_config();
// An MTP assistant of the 31B's shape for benchmarks (docs/DESIGN.md §7, "Speculative decoding"):
// 4 layers (3 sliding, 1 full) of width 1 024, MLP 8 192, 32 query heads over the 31B's caches,
// about 0.94 GB in bf16 as published for gemma-4-31B-it-assistant.
ModelConfig gemma4_31b_assistant_config();

// Upper bounds on model sizes read from a file (config.json or GGUF): far above any Gemma 4
// model, low enough that products of them (vocab * hidden, heads * head_dim * positions) fit int64.
inline constexpr int64_t kMaxLayers = 4096;
inline constexpr int64_t kMaxVocab = int64_t(1) << 24;
inline constexpr int64_t kMaxHidden = int64_t(1) << 18;
inline constexpr int64_t kMaxIntermediate = int64_t(1) << 20;
inline constexpr int64_t kMaxHeads = 1024;
inline constexpr int64_t kMaxHeadDim = 8192;
inline constexpr int64_t kMaxPositions = int64_t(1) << 24;

// Throws g4::Error (prefixed by `source`) unless every size is within the bounds above, the token
// ids are inside the vocabulary, eps/softcap/RoPE base are finite and in range and every
// partial_rotary_factor is in (0, 1].
void validate_config(const ModelConfig& c, const std::string& source);

// What a text config describes: a model of its own, or an MTP assistant (model/assistant.h), whose
// layers have no KV projections and read the target's caches (num_kv_shared_layers = every layer).
enum class ModelRole { kTarget, kAssistant };

// Parses config.json text (either layout). Throws g4::Error naming the key on missing values or
// unsupported features (MoE, per-layer embeddings, shared KV layers outside an assistant).
ModelConfig parse_hf_config(const nlohmann::json& root, ModelRole role = ModelRole::kTarget);
// What a config.json describes: an assistant when it names backbone_hidden_size.
ModelRole hf_config_role(const nlohmann::json& root);
ModelConfig load_hf_config(const std::string& path, ModelRole role = ModelRole::kTarget);

}  // namespace g4
