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
  const int pairs = std::max(head_dim, 0) / 2;
  // validate_config keeps rope_partial in (0, 1]; the clamp keeps a config that skipped it inside
  // the array and the float-to-int conversion defined.
  const double partial = std::isfinite(rope_partial) ? std::clamp(rope_partial, 0.0, 1.0) : 0.0;
  const int rotating = std::min(int(partial * head_dim) / 2, pairs);
  std::vector<float> inv(size_t(pairs), 0.0f);
  // transformers' float32 formula, 1 / theta^(2i/d) with each step rounded to float32: a third of
  // the pairs differ by one ulp from the correctly rounded theta^(-2i/d), which moves a position-4 000
  // angle by ~1e-4 rad (docs/DESIGN.md, "RoPE precision").
  for (int i = 0; i < rotating; ++i)
    inv[size_t(i)] = 1.0f / std::pow(float(rope_theta), float(2 * i) / float(head_dim));
  return inv;
}

namespace {

// An integer config value in [lo, hi]. nlohmann's get<int> converts a float or an out-of-range
// integer with a cast (undefined for 1e30), so the JSON type and the range are checked first.
int64_t integer_in(const json& v, const std::string& key, int64_t lo, int64_t hi) {
  const std::string range = " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  G4_CHECK(v.is_number_integer(), "config.json: '" + key + "'" + range + ", got " + v.dump());
  const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(hi) : true;
  G4_CHECK(fits && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi,
           "config.json: '" + key + "'" + range + ", got " + v.dump());
  return v.get<int64_t>();
}

int64_t required_int(const json& j, const char* key, int64_t lo, int64_t hi) {
  G4_CHECK(j.contains(key) && !j[key].is_null(), std::string("config.json: missing '") + key + "'");
  return integer_in(j[key], key, lo, hi);
}

int64_t optional_int(const json& j, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  return integer_in(j[key], key, lo, hi);
}

// A finite real config value (integers are accepted too).
double optional_real(const json& j, const char* key, double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  G4_CHECK(j[key].is_number(), std::string("config.json: '") + key + "' must be a number, got " + j[key].dump());
  const double v = j[key].get<double>();
  G4_CHECK(std::isfinite(v), std::string("config.json: '") + key + "' must be finite");
  return v;
}

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

void reject_unsupported(const json& t, ModelRole role) {
  G4_REQUIRE(kUnsupported, !optional<bool>(t, "enable_moe_block", false),
           "config.json: 'enable_moe_block' (mixture of experts) is not supported yet");
  G4_REQUIRE(kUnsupported, optional_int(t, "hidden_size_per_layer_input", 0, 0, INT64_MAX) == 0,
           "config.json: 'hidden_size_per_layer_input' > 0 (per-layer embeddings) is not supported yet");
  if (role == ModelRole::kTarget) {
    G4_REQUIRE(kUnsupported, optional_int(t, "num_kv_shared_layers", 0, 0, INT64_MAX) == 0,
               "config.json: 'num_kv_shared_layers' > 0 (shared KV layers) is not supported yet");
  } else {
    const int64_t layers = required_int(t, "num_hidden_layers", 1, kMaxLayers);
    G4_REQUIRE(kUnsupported, optional_int(t, "num_kv_shared_layers", layers, 0, INT64_MAX) == layers,
               "config.json: an assistant's layers must all read the target's KV caches ('num_kv_shared_layers' = "
               "'num_hidden_layers')");
  }
  G4_REQUIRE(kUnsupported, !optional<bool>(t, "use_double_wide_mlp", false),
           "config.json: 'use_double_wide_mlp' is not supported yet");
  G4_REQUIRE(kUnsupported, !optional<bool>(t, "attention_bias", false), "config.json: 'attention_bias' is not supported yet");
  std::string act = optional<std::string>(t, "hidden_activation", "gelu_pytorch_tanh");
  G4_REQUIRE(kUnsupported, act == "gelu_pytorch_tanh", "config.json: 'hidden_activation' " + act + " is not supported yet");
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
  spec.theta = optional_real(r, "rope_theta", spec.theta);
  std::string kind = optional<std::string>(r, "rope_type", "default");
  if (kind == "default") {
    spec.partial = 1.0;
  } else if (kind == "proportional") {
    spec.partial = optional_real(r, "partial_rotary_factor", 1.0);
  } else {
    throw Error(ErrorKind::kUnsupported, "config.json: rope_type '" + kind + "' is not supported yet");
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

ModelRole hf_config_role(const json& root) {
  const bool nested = root.is_object() && root.contains("text_config") && root["text_config"].is_object();
  const bool assistant =
      root.is_object() && (root.contains("backbone_hidden_size") || (nested && root["text_config"].contains("backbone_hidden_size")));
  return assistant ? ModelRole::kAssistant : ModelRole::kTarget;
}

ModelConfig parse_hf_config(const json& root, ModelRole role) {
  G4_CHECK(root.is_object(), "config.json: not a JSON object");
  G4_REQUIRE(kUnsupported, role == ModelRole::kAssistant || hf_config_role(root) == ModelRole::kTarget,
             "config.json describes a Gemma 4 MTP assistant (backbone_hidden_size), not a model of its own: give it "
             "as --draft_model beside the model it drafts for");
  const json& t = root.contains("text_config") && root["text_config"].is_object() ? root["text_config"] : root;
  std::string model_type = optional<std::string>(t, "model_type", "gemma4_text");
  const bool known = role == ModelRole::kTarget ? model_type == "gemma4_text" || model_type == "gemma4"
                                                : model_type.rfind("gemma4", 0) == 0;
  G4_REQUIRE(kUnsupported, known, "config.json: model_type '" + model_type + "' is not a Gemma 4 text model");
  reject_unsupported(t, role);

  ModelConfig c;
  // Bounds on everything read: the caps keep products such as vocab * hidden and
  // heads * head_dim far from overflow; validate_config checks the resolved model below.
  c.vocab_size = required_int(t, "vocab_size", 1, kMaxVocab);
  c.hidden_size = required_int(t, "hidden_size", 1, kMaxHidden);
  c.intermediate_size = required_int(t, "intermediate_size", 1, kMaxIntermediate);
  c.num_heads = int(required_int(t, "num_attention_heads", 1, kMaxHeads));
  c.rms_norm_eps = optional_real(t, "rms_norm_eps", 1e-6);
  c.final_logit_softcap = optional_real(t, "final_logit_softcapping", 0.0);
  c.sliding_window = int(required_int(t, "sliding_window", 1, kMaxPositions));
  c.max_position_embeddings = optional_int(t, "max_position_embeddings", 131072, 2, kMaxPositions);
  c.tie_word_embeddings = optional<bool>(t, "tie_word_embeddings", optional<bool>(root, "tie_word_embeddings", true));
  c.bos_id = int(optional_int(t, "bos_token_id", 2, 0, c.vocab_size - 1));
  c.pad_id = int(optional_int(t.contains("pad_token_id") ? t : root, "pad_token_id", 0, 0, c.vocab_size - 1));
  const json& eos = t.contains("eos_token_id") ? t["eos_token_id"] : root.value("eos_token_id", json(1));
  c.eos_ids.clear();
  if (eos.is_array()) {
    for (const json& id : eos) c.eos_ids.push_back(int(integer_in(id, "eos_token_id", 0, c.vocab_size - 1)));
  } else {
    c.eos_ids.push_back(eos.is_null() ? 1 : int(integer_in(eos, "eos_token_id", 0, c.vocab_size - 1)));
  }

  if (role == ModelRole::kAssistant)
    c.backbone_hidden_size = required_int(t.contains("backbone_hidden_size") ? t : root, "backbone_hidden_size", 1,
                                          kMaxHidden);
  const int n = int(required_int(t, "num_hidden_layers", 1, kMaxLayers));
  const int head_dim = int(required_int(t, "head_dim", 2, kMaxHeadDim));
  const int kv_heads = int(optional_int(t, "num_key_value_heads", c.num_heads, 1, kMaxHeads));
  const bool k_eq_v = optional<bool>(t, "attention_k_eq_v", false);
  const int global_head_dim = int(optional_int(t, "global_head_dim", head_dim, 2, kMaxHeadDim));
  const int global_kv_heads =
      k_eq_v ? int(optional_int(t, "num_global_key_value_heads", kv_heads, 1, kMaxHeads)) : kv_heads;

  const auto types = layer_types(t, n);
  for (int i = 0; i < n; ++i) {
    LayerConfig l;
    l.sliding = types[size_t(i)] == "sliding_attention";
    l.head_dim = l.sliding ? head_dim : global_head_dim;
    l.kv_heads = l.sliding ? kv_heads : global_kv_heads;
    l.k_eq_v = !l.sliding && k_eq_v;
    if (const json* o = per_layer_override(t, i)) {
      l.head_dim = int(optional_int(*o, "head_dim", l.head_dim, 2, kMaxHeadDim));
      l.kv_heads = int(optional_int(*o, "num_key_value_heads", l.kv_heads, 1, kMaxHeads));
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
  validate_config(c, "config.json");
  return c;
}

void validate_config(const ModelConfig& c, const std::string& source) {
  auto check_int = [&](int64_t v, int64_t lo, int64_t hi, const std::string& what) {
    G4_CHECK(v >= lo && v <= hi, source + ": " + what + " " + std::to_string(v) + " must be in [" +
                                     std::to_string(lo) + ", " + std::to_string(hi) + "]");
  };
  check_int(c.num_layers(), 1, kMaxLayers, "number of layers");
  check_int(c.vocab_size, 1, kMaxVocab, "vocab_size");
  check_int(c.hidden_size, 1, kMaxHidden, "hidden_size");
  check_int(c.intermediate_size, 1, kMaxIntermediate, "intermediate_size");
  check_int(c.backbone_hidden_size, 0, kMaxHidden, "backbone hidden size");
  check_int(c.num_heads, 1, kMaxHeads, "number of attention heads");
  check_int(c.sliding_window, 1, kMaxPositions, "sliding_window");
  check_int(c.max_position_embeddings, 2, kMaxPositions, "max_position_embeddings");
  check_int(c.bos_id, 0, c.vocab_size - 1, "bos token id");
  check_int(c.pad_id, 0, c.vocab_size - 1, "pad token id");
  for (int id : c.eos_ids) check_int(id, 0, c.vocab_size - 1, "eos token id");
  // Written as negated comparisons so that NaN fails them.
  G4_CHECK(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0 && c.rms_norm_eps < 1,
           source + ": rms_norm_eps " + std::to_string(c.rms_norm_eps) + " must be in (0, 1)");
  G4_CHECK(std::isfinite(c.final_logit_softcap) && c.final_logit_softcap >= 0,
           source + ": final_logit_softcapping " + std::to_string(c.final_logit_softcap) +
               " must be finite and >= 0 (0 = none)");
  for (int i = 0; i < c.num_layers(); ++i) {
    const LayerConfig& l = c.layers[size_t(i)];
    const std::string layer = "layer " + std::to_string(i);
    check_int(l.head_dim, 2, kMaxHeadDim, layer + " head_dim");
    G4_CHECK(l.head_dim % 2 == 0, source + ": " + layer + " head_dim must be even");
    check_int(l.kv_heads, 1, c.num_heads, layer + " kv heads");
    G4_CHECK(c.num_heads % l.kv_heads == 0, source + ": " + layer + " has " + std::to_string(l.kv_heads) +
                                                " kv heads, which must divide num_attention_heads");
    G4_CHECK(std::isfinite(l.rope_theta) && l.rope_theta > 0,
             source + ": " + layer + " rope_theta " + std::to_string(l.rope_theta) + " must be finite and > 0");
    G4_CHECK(std::isfinite(l.rope_partial) && l.rope_partial > 0 && l.rope_partial <= 1,
             source + ": " + layer + " partial_rotary_factor " + std::to_string(l.rope_partial) +
                 " must be in (0, 1]");
  }
}

ModelConfig load_hf_config(const std::string& path, ModelRole role) {
  G4_REQUIRE(kNotFound, std::filesystem::exists(path), "missing config: '" + path + "' does not exist");
  return parse_hf_config(read_json_file(path), role);
}

ModelConfig gemma4_31b_config() {
  ModelConfig c;
  c.vocab_size = 262144;
  c.hidden_size = 5376;
  c.intermediate_size = 21504;
  c.num_heads = 32;
  c.rms_norm_eps = 1e-6;
  c.final_logit_softcap = 30.0;
  c.sliding_window = 1024;
  c.max_position_embeddings = 262144;
  c.tie_word_embeddings = true;
  for (int i = 0; i < 60; ++i) {
    LayerConfig l;
    l.sliding = i % 6 != 5;
    l.head_dim = l.sliding ? 256 : 512;
    l.kv_heads = l.sliding ? 16 : 4;
    l.k_eq_v = !l.sliding;
    l.rope_theta = l.sliding ? 1e4 : 1e6;
    l.rope_partial = l.sliding ? 1.0 : 0.25;
    c.layers.push_back(l);
  }
  return c;
}

ModelConfig gemma4_31b_assistant_config() {
  const ModelConfig target = gemma4_31b_config();
  ModelConfig c = target;
  c.hidden_size = 1024;
  c.intermediate_size = 8192;
  c.backbone_hidden_size = target.hidden_size;
  c.final_logit_softcap = 0.0;  // the assistant's logits are not soft-capped
  c.layers = {target.layers[0], target.layers[0], target.layers[0], target.layers[5]};
  return c;
}

}  // namespace g4
