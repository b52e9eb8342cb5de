#include "model/gguf_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>

#include "model/gguf_tokenizer.h"
#include "util/error.h"

namespace g4 {

namespace {

// Per-layer tensors: canonical suffix after "layers.N." <-> GGUF suffix after "blk.N.".
const std::pair<const char*, const char*> kLayerTensors[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"post_attention_layernorm.weight", "post_attention_norm.weight"},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
    {"layer_scalar", "layer_output_scale.weight"},
};

const std::pair<const char*, const char*> kGlobalTensors[] = {
    {"embed_tokens.weight", "token_embd.weight"},
    {"norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
    {"pre_projection.weight", "nextn.pre_projection.weight"},  // an assistant's (model/assistant.h)
    {"post_projection.weight", "nextn.post_projection.weight"},
};

// Factors at or above this never rotate within any reachable position (llama.cpp writes 1e30).
constexpr float kFixedPairFactor = 1e20f;
constexpr float kWrittenFixedPairFactor = 1e30f;

// "prefix<N>.<rest>" -> (N, rest); nullopt when `name` has another form.
std::optional<std::pair<int, std::string>> split_layer_name(const std::string& name, const std::string& prefix) {
  if (name.rfind(prefix, 0) != 0) return std::nullopt;
  size_t at = prefix.size(), end = at;
  while (end < name.size() && end - at < 9 && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
  // One spelling per index: "blk.07" would alias "blk.7".
  if (end == at || end >= name.size() || name[end] != '.' || (name[at] == '0' && end - at > 1)) return std::nullopt;
  return std::make_pair(std::stoi(name.substr(at, end - at)), name.substr(end + 1));
}

std::optional<std::string> lookup(const std::string& name, bool from_canonical) {
  for (const auto& [canonical, gguf] : kGlobalTensors)
    if (name == (from_canonical ? canonical : gguf)) return from_canonical ? gguf : canonical;
  auto layer = split_layer_name(name, from_canonical ? "layers." : "blk.");
  if (!layer) return std::nullopt;
  for (const auto& [canonical, gguf] : kLayerTensors)
    if (layer->second == (from_canonical ? canonical : gguf))
      return (from_canonical ? "blk." : "layers.") + std::to_string(layer->first) + "." +
             (from_canonical ? gguf : canonical);
  return std::nullopt;
}

// The one value a per-layer-type property has; throws when layers of that type disagree.
template <typename T, typename Get>
T shared_value(const ModelConfig& c, bool sliding, Get get, const std::string& what) {
  std::optional<T> value;
  for (const LayerConfig& l : c.layers) {
    if (l.sliding != sliding) continue;
    if (value && *value != get(l))
      throw Error(std::string("llama.cpp's gemma4 GGUF layout holds one ") + what + " per layer type, but the " +
                  (sliding ? "sliding" : "full") + " layers differ");
    value = get(l);
  }
  return value.value_or(T{});
}

int rotating_pairs(const LayerConfig& l) {
  const auto inv = l.rope_inv_freq();
  return int(std::count_if(inv.begin(), inv.end(), [](float f) { return f != 0.0f; }));
}

// A per-layer integer that GGUF may hold as a scalar or as an array of one value per layer.
std::vector<int64_t> per_layer_ints(const GgufMetadata& m, const std::string& k, int layers) {
  const GgufValue& v = m.get(k);
  if (v.type() != GgufType::ARRAY) return std::vector<int64_t>(size_t(layers), v.to_int(k));
  std::vector<int64_t> values = m.get_int_array(k);
  G4_CHECK(int(values.size()) == layers, "GGUF metadata '" + k + "' has " + std::to_string(values.size()) +
                                             " entries for " + std::to_string(layers) + " layers");
  return values;
}

// A per-layer integer g4 needs to be the same in every layer.
int64_t uniform_int(const GgufMetadata& m, const std::string& k, int layers) {
  const auto values = per_layer_ints(m, k, layers);
  G4_CHECK(std::all_of(values.begin(), values.end(), [&](int64_t v) { return v == values.front(); }),
           "GGUF metadata '" + k + "' differs between layers, which g4 does not support yet");
  return values.front();
}

int64_t optional_int(const GgufMetadata& m, const std::string& k, int64_t fallback) {
  return m.find(k) ? m.get_int(k) : fallback;
}

std::string key(const std::string& arch, const char* suffix) { return arch + "." + suffix; }

// An assistant (ModelRole::kAssistant) has no KV of its own: its layers all read the target's.
void reject_unsupported(const GgufMetadata& m, const std::string& arch, ModelRole role, int layers) {
  for (const char* feature : {"embedding_length_per_layer_input", "expert_count"})
    G4_REQUIRE(kUnsupported, optional_int(m, key(arch, feature), 0) == 0,
               "GGUF metadata '" + key(arch, feature) + "' > 0 is not supported yet");
  const int64_t shared = optional_int(m, key(arch, "attention.shared_kv_layers"), 0);
  const std::string shared_key = key(arch, "attention.shared_kv_layers");
  const std::string shared_rule = role == ModelRole::kTarget
                                      ? "GGUF metadata '" + shared_key + "' > 0 is not supported yet"
                                      : "GGUF metadata '" + shared_key +
                                            "': an assistant's layers must all read the target's KV caches";
  G4_REQUIRE(kUnsupported, shared == (role == ModelRole::kTarget ? 0 : layers), shared_rule);
  G4_REQUIRE(kUnsupported, m.get_int(key(arch, "rope.dimension_count")) == m.get_int(key(arch, "attention.key_length")) &&
               m.get_int(key(arch, "rope.dimension_count_swa")) == m.get_int(key(arch, "attention.key_length_swa")),
           "GGUF: RoPE over part of the head (rope.dimension_count below the key length) is not supported yet");
  for (const char* suffix : {"", "_swa"})
    G4_CHECK(optional_int(m, key(arch, "attention.value_length") + suffix,
                          m.get_int(key(arch, "attention.key_length") + suffix)) ==
                 m.get_int(key(arch, "attention.key_length") + suffix),
             "GGUF: value_length" + std::string(suffix) + " differs from key_length" + suffix + ", not supported");
}

// Fraction of the full head that rotates, from rope_freqs: a prefix of 1.0 factors, then fixed pairs.
double rope_partial_from_factors(const GgufFile& file, int head_dim) {
  const GgufTensorInfo* info = file.find_tensor(kRopeFreqsTensor);
  if (!info) return 1.0;
  const HostTensor t = file.tensor(*info);
  G4_CHECK(t.dtype == DType::F32 && t.numel() == head_dim / 2,
           std::string("GGUF tensor '") + kRopeFreqsTensor + "' must be F32 with " + std::to_string(head_dim / 2) +
               " values (half the full-layer head size)");
  G4_CHECK(head_dim > 0, std::string("GGUF tensor '") + kRopeFreqsTensor + "' needs a positive full-layer head size");
  // general.alignment may be 1, so the floats are copied out rather than read through a cast.
  std::vector<float> factors(size_t(head_dim / 2));
  std::memcpy(factors.data(), t.data, factors.size() * sizeof(float));
  int rotating = 0;
  while (rotating < head_dim / 2 && factors[size_t(rotating)] == 1.0f) ++rotating;
  for (int i = rotating; i < head_dim / 2; ++i)
    G4_CHECK(factors[size_t(i)] >= kFixedPairFactor, std::string("GGUF tensor '") + kRopeFreqsTensor + "' value " +
                                                 std::to_string(factors[size_t(i)]) + " at " + std::to_string(i) +
                                                 " is not supported (g4 reads 1 = rotating, >= 1e20 = fixed)");
  // LayerConfig::rope_inv_freq rotates int(partial * head_dim) / 2 pairs; round up so that the
  // product cannot land just below 2 * rotating.
  double partial = 2.0 * rotating / head_dim;
  if (int(partial * head_dim) < 2 * rotating) partial = std::nextafter(partial, 2.0);
  return partial;
}

void check_sizes(const ModelConfig& c) {
  G4_CHECK(c.num_layers() > 0 && c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 &&
               c.num_heads > 0 && c.sliding_window > 0 && c.max_position_embeddings > 1,
           "GGUF gemma4 metadata: sizes must be positive");
  for (int i = 0; i < c.num_layers(); ++i) {
    const LayerConfig& l = c.layers[size_t(i)];
    G4_CHECK(l.head_dim > 0 && l.head_dim % 2 == 0, "GGUF gemma4 metadata: layer " + std::to_string(i) +
                                                        " head size " + std::to_string(l.head_dim) +
                                                        " must be positive and even");
    G4_CHECK(l.kv_heads > 0 && c.num_heads % l.kv_heads == 0,
             "GGUF gemma4 metadata: layer " + std::to_string(i) + " has " + std::to_string(l.kv_heads) +
                 " kv heads, which must divide the " + std::to_string(c.num_heads) + " query heads");
  }
}

int to_int32(int64_t v, const std::string& what) {
  G4_CHECK(v >= 0 && v <= INT32_MAX, "GGUF metadata '" + what + "' value " + std::to_string(v) + " is out of range");
  return int(v);
}

uint32_t u32(int64_t v, const std::string& what) {
  G4_CHECK(v >= 0 && v <= int64_t(UINT32_MAX), what + " " + std::to_string(v) + " does not fit GGUF's u32");
  return uint32_t(v);
}

}  // namespace

ProgramFlags default_program_flags(const ModelConfig& c, bool use_sampling, int64_t max_seq_len) {
  ProgramFlags f;
  f.use_sampling = use_sampling;
  f.max_seq_len = max_seq_len > 0 ? max_seq_len : c.default_max_seq_len();
  G4_CHECK(f.max_seq_len >= 2 && f.max_seq_len <= c.max_position_embeddings,
           "max_seq_len " + std::to_string(f.max_seq_len) + " must be in [2, " +
               std::to_string(c.max_position_embeddings) + "] (the model's max_position_embeddings)");
  f.max_prefill_chunk = c.max_prefill_chunk(f.max_seq_len);
  f.min_prefill_chunk = 1;
  return f;
}

std::vector<float> rope_freq_factors(const ModelConfig& c) {
  const int head_dim = shared_value<int>(c, false, [](const LayerConfig& l) { return l.head_dim; }, "head size");
  if (head_dim == 0) return {};
  const int rotating =
      shared_value<int>(c, false, [&](const LayerConfig& l) { return rotating_pairs(l); }, "RoPE fraction");
  std::vector<float> factors(size_t(head_dim / 2), kWrittenFixedPairFactor);
  std::fill(factors.begin(), factors.begin() + rotating, 1.0f);
  return factors;
}

GgufMetadata gemma4_metadata(const ModelConfig& c, const ProgramFlags& flags) {
  auto full_value = [&](auto get, const char* what) { return shared_value<decltype(get(c.layers[0]))>(c, false, get, what); };
  auto swa_value = [&](auto get, const char* what) { return shared_value<decltype(get(c.layers[0]))>(c, true, get, what); };
  const int head_dim = full_value([](const LayerConfig& l) { return l.head_dim; }, "head size");
  const int head_dim_swa = swa_value([](const LayerConfig& l) { return l.head_dim; }, "head size");
  const double theta = full_value([](const LayerConfig& l) { return l.rope_theta; }, "RoPE base");
  const double theta_swa = swa_value([](const LayerConfig& l) { return l.rope_theta; }, "RoPE base");
  rope_freq_factors(c);  // checks that the full layers share one RoPE fraction
  for (const LayerConfig& l : c.layers)
    G4_CHECK(!l.sliding || rotating_pairs(l) == l.head_dim / 2,
             "llama.cpp's gemma4 GGUF layout rotates the whole head on sliding layers; this config does not");

  std::vector<int32_t> kv_heads;
  std::vector<bool> sliding;
  for (const LayerConfig& l : c.layers) {
    kv_heads.push_back(l.kv_heads);
    sliding.push_back(l.sliding);
  }
  // An assistant is written as llama.cpp's converter writes one: gemma4's keys under its own
  // architecture, every layer reading the target's KV, and the target's width.
  const std::string arch = c.is_assistant() ? kGemma4AssistantArchitecture : kGemma4Architecture;
  auto key = [&](const char* suffix) { return g4::key(arch, suffix); };
  GgufMetadata m;
  m.set(gguf_key::kArchitecture, arch);
  m.set(key("vocab_size"), u32(c.vocab_size, "vocab_size"));
  m.set(key("context_length"), u32(c.max_position_embeddings, "max_position_embeddings"));
  m.set(key("embedding_length"), u32(c.hidden_size, "hidden_size"));
  m.set(key("block_count"), u32(c.num_layers(), "num_hidden_layers"));
  m.set(key("feed_forward_length"), u32(c.intermediate_size, "intermediate_size"));
  m.set(key("attention.head_count"), u32(c.num_heads, "num_attention_heads"));
  m.set(key("attention.head_count_kv"), GgufValue::array_of(kv_heads));
  m.set(key("attention.key_length"), uint32_t(head_dim));
  m.set(key("attention.value_length"), uint32_t(head_dim));
  m.set(key("attention.key_length_swa"), uint32_t(head_dim_swa));
  m.set(key("attention.value_length_swa"), uint32_t(head_dim_swa));
  m.set(key("rope.dimension_count"), uint32_t(head_dim));
  m.set(key("rope.dimension_count_swa"), uint32_t(head_dim_swa));
  m.set(key("rope.freq_base"), float(theta));
  m.set(key("rope.freq_base_swa"), float(theta_swa));
  m.set(key("attention.sliding_window"), u32(c.sliding_window, "sliding_window"));
  m.set(key("attention.sliding_window_pattern"), GgufValue::array_of(sliding));
  m.set(key("attention.layer_norm_rms_epsilon"), float(c.rms_norm_eps));
  m.set(key("final_logit_softcapping"), float(c.final_logit_softcap));
  m.set(key("attention.shared_kv_layers"), uint32_t(c.is_assistant() ? c.num_layers() : 0));
  if (c.is_assistant()) {
    m.set(key("embedding_length_out"), u32(c.backbone_hidden_size, "backbone_hidden_size"));
    m.set(key("nextn_predict_layers"), u32(c.num_layers(), "num_hidden_layers"));
  }
  m.set(key("embedding_length_per_layer_input"), uint32_t(0));
  m.set("tokenizer.ggml.bos_token_id", u32(c.bos_id, "bos_token_id"));
  if (!c.eos_ids.empty()) m.set("tokenizer.ggml.eos_token_id", u32(c.eos_ids.front(), "eos_token_id"));
  m.set("tokenizer.ggml.padding_token_id", u32(c.pad_id, "pad_token_id"));
  m.set(gguf_key::kEosTokenIds, GgufValue::array_of(std::vector<int32_t>(c.eos_ids.begin(), c.eos_ids.end())));
  m.set(gguf_key::kUseSampling, flags.use_sampling);
  m.set(gguf_key::kMaxSeqLen, u32(flags.max_seq_len, "max_seq_len"));
  m.set(gguf_key::kMaxPrefillChunk, u32(flags.max_prefill_chunk, "max_prefill_chunk"));
  m.set(gguf_key::kMinPrefillChunk, u32(flags.min_prefill_chunk, "min_prefill_chunk"));
  if (flags.kv_types != KvTypes{}) {  // files with bf16 caches keep llama.cpp's key set and g4's earlier one
    m.set(gguf_key::kKvType, kv_type_name(flags.kv_types.full));
    m.set(gguf_key::kKvSlidingType, kv_type_name(flags.kv_types.sliding));
  }
  return m;
}

ModelConfig gemma4_config(const GgufFile& file, ModelRole role) {
  const GgufMetadata& m = file.metadata();
  const std::string arch = role == ModelRole::kTarget ? kGemma4Architecture : kGemma4AssistantArchitecture;
  auto key = [&](const char* suffix) { return g4::key(arch, suffix); };
  const std::string found = m.get_string(gguf_key::kArchitecture);
  G4_REQUIRE(kUnsupported, found != kGemma4AssistantArchitecture || role == ModelRole::kAssistant,
             "GGUF file '" + file.name() + "' is a Gemma 4 MTP assistant, not a model of its own: give it as "
             "--draft_model beside the model it drafts for");
  G4_REQUIRE(kUnsupported, found == arch, "GGUF architecture '" + found + "' is not supported here (g4 runs '" +
                                              arch + "')");
  ModelConfig c;
  const int n = to_int32(m.get_int(key("block_count")), key("block_count"));
  G4_CHECK(n > 0 && n <= 4096, "GGUF metadata '" + key("block_count") + "' must be in [1, 4096]");
  reject_unsupported(m, arch, role, n);
  c.hidden_size = m.get_int(key("embedding_length"));
  if (role == ModelRole::kAssistant) c.backbone_hidden_size = m.get_int(key("embedding_length_out"));
  c.intermediate_size = uniform_int(m, key("feed_forward_length"), n);
  c.num_heads = to_int32(uniform_int(m, key("attention.head_count"), n), key("attention.head_count"));
  c.max_position_embeddings = m.get_int(key("context_length"));
  c.sliding_window = to_int32(m.get_int(key("attention.sliding_window")), key("attention.sliding_window"));
  c.rms_norm_eps = m.get_float(key("attention.layer_norm_rms_epsilon"));
  c.final_logit_softcap = m.find(key("final_logit_softcapping")) ? m.get_float(key("final_logit_softcapping")) : 0.0;

  const GgufTensorInfo* embed = file.find_tensor(gguf_tensor_name("embed_tokens.weight"));
  G4_CHECK(embed && embed->dims.size() == 2, "GGUF file '" + file.name() + "' has no 2-D token_embd.weight");
  c.vocab_size = int64_t(embed->dims[1]);
  G4_CHECK(optional_int(m, key("vocab_size"), c.vocab_size) == c.vocab_size,
           "GGUF metadata '" + key("vocab_size") + "' disagrees with token_embd.weight");
  c.tie_word_embeddings = file.find_tensor(gguf_tensor_name("lm_head.weight")) == nullptr;
  c.bos_id = to_int32(optional_int(m, "tokenizer.ggml.bos_token_id", c.bos_id), "tokenizer.ggml.bos_token_id");
  c.pad_id = to_int32(optional_int(m, "tokenizer.ggml.padding_token_id", c.pad_id), "tokenizer.ggml.padding_token_id");
  if (m.find(gguf_key::kEosTokenIds)) {
    c.eos_ids.clear();
    for (int64_t id : m.get_int_array(gguf_key::kEosTokenIds)) c.eos_ids.push_back(to_int32(id, gguf_key::kEosTokenIds));
  } else if (m.find("tokenizer.ggml.eos_token_id")) {
    c.eos_ids = {to_int32(m.get_int("tokenizer.ggml.eos_token_id"), "tokenizer.ggml.eos_token_id")};
  }

  const auto kv_heads = per_layer_ints(m, key("attention.head_count_kv"), n);
  const std::vector<bool> sliding = m.get_bool_array(key("attention.sliding_window_pattern"));
  G4_CHECK(int(sliding.size()) == n, "GGUF metadata '" + key("attention.sliding_window_pattern") + "' has " +
                                         std::to_string(sliding.size()) + " entries for " + std::to_string(n) +
                                         " layers");
  const int head_dim = to_int32(m.get_int(key("attention.key_length")), key("attention.key_length"));
  const int head_dim_swa = to_int32(m.get_int(key("attention.key_length_swa")), key("attention.key_length_swa"));
  const double partial = rope_partial_from_factors(file, head_dim);
  for (int i = 0; i < n; ++i) {
    LayerConfig l;
    l.sliding = sliding[size_t(i)];
    l.head_dim = l.sliding ? head_dim_swa : head_dim;
    l.kv_heads = to_int32(kv_heads[size_t(i)], key("attention.head_count_kv"));
    l.k_eq_v = file.find_tensor(gguf_tensor_name("layers." + std::to_string(i) + ".self_attn.v_proj.weight")) == nullptr;
    l.rope_theta = m.get_float(key(l.sliding ? "rope.freq_base_swa" : "rope.freq_base"));
    l.rope_partial = l.sliding ? 1.0 : partial;
    c.layers.push_back(l);
  }
  check_sizes(c);
  validate_config(c, "GGUF " + arch + " metadata");
  return c;
}

// A KV type the file records under `key`, bf16 where it records none.
static KvType recorded_kv_type(const GgufMetadata& m, const char* key, bool sliding) {
  if (!m.find(key)) return KvType::kBf16;
  try {
    return parse_kv_type(m.get_string(key), sliding);
  } catch (const Error& e) {
    throw Error(ErrorKind::kInvalidArgument, std::string("GGUF metadata '") + key + "': " + e.what());
  }
}

ProgramFlags program_flags(const GgufMetadata& m, const ModelConfig& c) {
  if (!m.find(gguf_key::kUseSampling)) return default_program_flags(c, false);
  ProgramFlags f;
  f.use_sampling = m.get_bool(gguf_key::kUseSampling);
  f.max_seq_len = m.get_int(gguf_key::kMaxSeqLen);
  f.max_prefill_chunk = m.get_int(gguf_key::kMaxPrefillChunk);
  f.min_prefill_chunk = m.get_int(gguf_key::kMinPrefillChunk);
  f.kv_types = {recorded_kv_type(m, gguf_key::kKvType, false), recorded_kv_type(m, gguf_key::kKvSlidingType, true)};
  G4_CHECK(f.max_seq_len >= 2 && f.max_seq_len <= c.max_position_embeddings,
           std::string("GGUF metadata '") + gguf_key::kMaxSeqLen + "' must be in [2, context_length]");
  G4_CHECK(f.min_prefill_chunk >= 1 && f.min_prefill_chunk <= f.max_prefill_chunk &&
               f.max_prefill_chunk <= f.max_seq_len - 1,
           std::string("GGUF metadata: need 1 <= ") + gguf_key::kMinPrefillChunk + " <= " + gguf_key::kMaxPrefillChunk +
               " < " + gguf_key::kMaxSeqLen);
  return f;
}

std::string gguf_tensor_name(const std::string& canonical) {
  auto name = lookup(canonical, true);
  G4_CHECK(name, "tensor '" + canonical + "' has no GGUF name (not part of the Gemma 4 text model)");
  return *name;
}

std::string canonical_tensor_name(const std::string& gguf_name) { return lookup(gguf_name, false).value_or(""); }

GgufModel::GgufModel(const std::string& path, ModelRole role) : GgufModel(GgufFile(path), role) {}

// The embedded tokenizer.json, else the one the tokenizer.ggml.* keys describe (what llama.cpp's
// converter writes).
static std::optional<std::string> file_tokenizer_json(const GgufFile& file) {
  if (file.metadata().find(gguf_key::kTokenizerJson)) return file.metadata().get_string(gguf_key::kTokenizerJson);
  try {
    return tokenizer_json_from_ggml(file.metadata());
  } catch (const Error& e) {
    throw Error("GGUF file '" + file.name() + "': " + e.what());
  }
}

GgufModel::GgufModel(GgufFile file, ModelRole role) : file_(std::move(file)) {
  config_ = gemma4_config(file_, role);
  program_ = program_flags(file_.metadata(), config_);
  // An assistant runs with its target's tokenizer.
  if (role == ModelRole::kTarget) tokenizer_json_ = file_tokenizer_json(file_);
  for (const GgufTensorInfo& info : file_.tensors()) {
    const std::string canonical = canonical_tensor_name(info.name);
    if (canonical.empty()) continue;
    HostTensor t = file_.tensor(info);
    t.name = canonical;
    tensors_.emplace(canonical, std::move(t));
  }
}

const HostTensor* GgufModel::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> GgufModel::names() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : tensors_) out.push_back(name);
  return out;
}

}  // namespace g4
