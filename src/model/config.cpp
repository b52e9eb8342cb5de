#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/files.h"

namespace g4 {

using nlohmann::json;

int ModelConfig::max_head_dim() const {
  int m = 0;
  for (const auto& l : layers) m = std::max(m, l.head_dim);
  return m;
}

int64_t ModelConfig::max_q_cols() const {
  int64_t m = 0;
  for (const auto& l : layers) m = std::max<int64_t>(m, int64_t(num_heads) * l.head_dim);
  return m;
}

int64_t ModelConfig::max_kv_cols() const {
  int64_t m = 0;
  for (const auto& l : layers) m = std::max<int64_t>(m, int64_t(l.kv_heads) * l.head_dim);
  return m;
}

int64_t ModelConfig::default_max_seq_len() const { return std::min<int64_t>(max_position_embeddings, 4096); }

int64_t ModelConfig::max_prefill_chunk(int64_t max_seq_len) const {
  return std::max<int64_t>(1, std::min<int64_t>(max_seq_len - 1, 2 * int64_t(sliding_window)));
}

std::vector<float> LayerConfig::rope_inv_freq() const {
  const int pairs = head_dim / 2;
  const int rotating = int(rope_partial * head_dim) / 2;
  std::vector<float> inv(size_t(pairs), 0.0f);
  // transformers' float32 formula, 1 / theta^(2i/d) with each step rounded to float32: a third of
  // the pairs differ by one ulp from the correctly rounded theta^(-2i/d), which moves a position-4 000
  // angle by ~1e-4 rad (docs/DESIGN.md, "RoPE precision").
  for (int i = 0; i < rotating; ++i)
    inv[size_t(i)] = 1.0f / std::pow(float(rope_theta), float(2 * i) / float(head_dim));
  return inv;
}

namespace {

template <typename T>
T required(const json& j, const char* key) {
  G4_CHECK(j.contains(key) && !j[key].is_null(), std::string("config.json: missing '") + key + "'");
  try {
    return j[key].get<T>();
  } catch (const json::exception&) {
    throw Error(std::string("config.json: '") + key + "' has the wrong type");
  }
}

template <typename T>
T optional(const json& j, const char* key, T fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  try {
    return j[key].get<T>();
  } catch (const json::exception&) {
    throw Error(std::string("config.json: '") + key + "' has the wrong type");
  }
}

void reject_unsupported(const json& t) {
  G4_CHECK(!optional<bool>(t, "enable_moe_block", false),
           "config.json: 'enable_moe_block' (mixture of experts) is not supported yet");
  G4_CHECK(optional<int64_t>(t, "hidden_size_per_layer_input", 0) == 0,
           "config.json: 'hidden_size_per_layer_input' > 0 (per-layer embeddings) is not supported yet");
  G4_CHECK(optional<int64_t>(t, "num_kv_shared_layers", 0) == 0,
           "config.json: 'num_kv_shared_layers' > 0 (shared KV layers) is not supported yet");
  G4_CHECK(!optional<bool>(t, "use_double_wide_mlp", false),
           "config.json: 'use_double_wide_mlp' is not supported yet");
  G4_CHECK(!optional<bool>(t, "attention_bias", false), "config.json: 'attention_bias' is not supported yet");
  std::string act = optional<std::string>(t, "hidden_activation", "gelu_pytorch_tanh");
  G4_CHECK(act == "gelu_pytorch_tanh", "config.json: 'hidden_activation' " + act + " is not supported yet");
}

// Default Gemma 4 pattern: 5 sliding then 1 full, and the last layer is always full.
std::vector<std::string> layer_types(const json& t, int n) {
  std::vector<std::string> types;
  if (t.contains("layer_types") && !t["layer_types"].is_null()) {
    types = required<std::vector<std::string>>(t, "layer_types");
    G4_CHECK(int(types.size()) == n, "config.json: 'layer_types' has " + std::to_string(types.size()) +
                                         " entries for " + std::to_string(n) + " layers");
  } else {
    for (int i = 0; i < n; ++i) types.push_back((i + 1) % 6 == 0 ? "full_attention" : "sliding_attention");
    if (n > 0) types.back() = "full_attention";
  }
  for (const auto& s : types)
    G4_CHECK(s == "sliding_attention" || s == "full_attention",
             "config.json: unknown layer type '" + s + "' in 'layer_types'");
  return types;
}

struct RopeSpec {
  double theta;
  double partial;
};

RopeSpec rope_for(const json& t, const std::string& type) {
  const bool sliding = type == "sliding_attention";
  RopeSpec spec{sliding ? 10000.0 : 1000000.0, sliding ? 1.0 : 0.25};
  if (!t.contains("rope_parameters") || !t["rope_parameters"].contains(type)) return spec;
  const json& r = t["rope_parameters"][type];
  spec.theta = optional<double>(r, "rope_theta", spec.theta);
  std::string kind = optional<std::string>(r, "rope_type", "default");
  if (kind == "default") {
    spec.partial = 1.0;
  } else if (kind == "proportional") {
    spec.partial = optional<double>(r, "partial_rotary_factor", 1.0);
  } else {
    throw Error("config.json: rope_type '" + kind + "' is not supported yet");
  }
  return spec;
}

// transformers >= 5 writes full-layer overrides as per_layer_config {"5": {...}} (keys may be "05").
const json* per_layer_override(const json& t, int layer) {
  if (!t.contains("per_layer_config") || !t["per_layer_config"].is_object()) return nullptr;
  for (const auto& [key, value] : t["per_layer_config"].items()) {
    int index = -1;
    try {
      index = std::stoi(key);
    } catch (const std::exception&) {
      throw Error("config.json: per_layer_config key '" + key + "' is not a layer index");
    }
    if (index == layer) return &value;
  }
  return nullptr;
}

}  // namespace

ModelConfig parse_hf_config(const json& root) {
  G4_CHECK(root.is_object(), "config.json: not a JSON object");
  const json& t = root.contains("text_config") && root["text_config"].is_object() ? root["text_config"] : root;
  std::string model_type = optional<std::string>(t, "model_type", "gemma4_text");
  G4_CHECK(model_type == "gemma4_text" || model_type == "gemma4",
           "config.json: model_type '" + model_type + "' is not a Gemma 4 text model");
  reject_unsupported(t);

  ModelConfig c;
  c.vocab_size = required<int64_t>(t, "vocab_size");
  c.hidden_size = required<int64_t>(t, "hidden_size");
  c.intermediate_size = required<int64_t>(t, "intermediate_size");
  c.num_heads = required<int>(t, "num_attention_heads");
  c.rms_norm_eps = optional<double>(t, "rms_norm_eps", 1e-6);
  c.final_logit_softcap = optional<double>(t, "final_logit_softcapping", 0.0);
  c.sliding_window = required<int>(t, "sliding_window");
  c.max_position_embeddings = optional<int64_t>(t, "max_position_embeddings", 131072);
  c.tie_word_embeddings = optional<bool>(t, "tie_word_embeddings", optional<bool>(root, "tie_word_embeddings", true));
  c.bos_id = optional<int>(t, "bos_token_id", 2);
  const json& eos = t.contains("eos_token_id") ? t["eos_token_id"] : root.value("eos_token_id", json(1));
  c.eos_ids = eos.is_array() ? eos.get<std::vector<int>>() : std::vector<int>{eos.is_number() ? eos.get<int>() : 1};

  const int n = required<int>(t, "num_hidden_layers");
  G4_CHECK(n > 0, "config.json: 'num_hidden_layers' must be positive");
  G4_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && c.num_heads > 0 && c.sliding_window > 0,
           "config.json: sizes must be positive");
  const int head_dim = required<int>(t, "head_dim");
  const int kv_heads = optional<int>(t, "num_key_value_heads", c.num_heads);
  const bool k_eq_v = optional<bool>(t, "attention_k_eq_v", false);
  const int global_head_dim = optional<int>(t, "global_head_dim", head_dim);
  const int global_kv_heads = k_eq_v ? optional<int>(t, "num_global_key_value_heads", kv_heads) : kv_heads;

  const auto types = layer_types(t, n);
  for (int i = 0; i < n; ++i) {
    LayerConfig l;
    l.sliding = types[size_t(i)] == "sliding_attention";
    l.head_dim = l.sliding ? head_dim : global_head_dim;
    l.kv_heads = l.sliding ? kv_heads : global_kv_heads;
    l.k_eq_v = !l.sliding && k_eq_v;
    if (const json* o = per_layer_override(t, i)) {
      l.head_dim = optional<int>(*o, "head_dim", l.head_dim);
      l.kv_heads = optional<int>(*o, "num_key_value_heads", l.kv_heads);
    }
    RopeSpec rope = rope_for(t, types[size_t(i)]);
    l.rope_theta = rope.theta;
    l.rope_partial = rope.partial;
    G4_CHECK(l.head_dim > 0 && l.head_dim % 2 == 0, "config.json: layer " + std::to_string(i) + " head_dim must be even");
    G4_CHECK(l.kv_heads > 0 && c.num_heads % l.kv_heads == 0,
             "config.json: layer " + std::to_string(i) + " has " + std::to_string(l.kv_heads) +
                 " kv heads, which must divide num_attention_heads");
    c.layers.push_back(l);
  }
  return c;
}

ModelConfig load_hf_config(const std::string& path) {
  G4_CHECK(std::filesystem::exists(path), "missing config: '" + path + "' does not exist");
  return parse_hf_config(read_json_file(path));
}

}  // namespace g4
