#include "model/weights.h"

#include <cstdio>
#include <optional>

#include "quant/quantize.h"
#include "util/error.h"
#include "util/progress.h"

namespace g4 {

namespace {

std::string shape_string(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string layer_prefix(int i) { return "layers." + std::to_string(i) + "."; }

// Besides the weights a backend needs workspaces (cuBLAS, staging, the packed GEMV's scratch, about
// 0.1 GiB) and a session's KV cache and activations: the margin covers a short context; a longer
// context's session (31B: ~2 GiB at 4 096 tokens) reports its own allocation failure clearly.
constexpr uint64_t kLoadMarginBytes = uint64_t(1) << 30;

// Fails before anything is allocated when the weights cannot fit in the backend's free memory.
void check_weights_fit(uint64_t weight_bytes, const Backend& backend) {
  const uint64_t free_bytes = backend.free_memory_bytes();
  if (weight_bytes == 0 || weight_bytes + kLoadMarginBytes <= free_bytes) return;
  auto gib = [](uint64_t bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f GiB", double(bytes) / double(uint64_t(1) << 30));
    return std::string(text);
  };
  throw Error(ErrorKind::kResourceExhausted, "the model's weights need " + gib(weight_bytes) + " of " + backend.name() + " memory (plus " +
              gib(kLoadMarginBytes) + " for workspaces and the KV cache), but only " + gib(free_bytes) +
              " are free");
}

}  // namespace

std::vector<TensorSpec> expected_tensors(const ModelConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  std::vector<TensorSpec> specs{{"embed_tokens.weight", {c.vocab_size, H}}, {"norm.weight", {H}}};
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", {c.vocab_size, H}});
  if (c.is_assistant()) {
    specs.push_back({"pre_projection.weight", {H, 2 * c.backbone_hidden_size}});
    specs.push_back({"post_projection.weight", {c.backbone_hidden_size, H}});
  }
  for (int i = 0; i < c.num_layers(); ++i) {
    const LayerConfig& l = c.layers[size_t(i)];
    const std::string p = layer_prefix(i);
    const int64_t q = int64_t(c.num_heads) * l.head_dim, kv = int64_t(l.kv_heads) * l.head_dim;
    std::vector<TensorSpec> layer{
        {p + "input_layernorm.weight", {H}},
        {p + "self_attn.q_proj.weight", {q, H}},
        {p + "self_attn.o_proj.weight", {H, q}},
        {p + "self_attn.q_norm.weight", {l.head_dim}},
        {p + "post_attention_layernorm.weight", {H}},
        {p + "pre_feedforward_layernorm.weight", {H}},
        {p + "mlp.gate_proj.weight", {I, H}},
        {p + "mlp.up_proj.weight", {I, H}},
        {p + "mlp.down_proj.weight", {H, I}},
        {p + "post_feedforward_layernorm.weight", {H}},
        {p + "layer_scalar", {1}},
    };
    if (!c.is_assistant()) {
      layer.push_back({p + "self_attn.k_proj.weight", {kv, H}});
      layer.push_back({p + "self_attn.k_norm.weight", {l.head_dim}});
      if (!l.k_eq_v) layer.push_back({p + "self_attn.v_proj.weight", {kv, H}});
    }
    specs.insert(specs.end(), layer.begin(), layer.end());
  }
  return specs;
}

void validate_tensors(const ModelConfig& c, const TensorSource& source) {
  for (const auto& spec : expected_tensors(c)) {
    const HostTensor* t = source.find(spec.name);
    G4_CHECK(t, "missing tensor '" + spec.name + "' (expected shape " + shape_string(spec.shape) + ")");
    G4_CHECK(t->shape == spec.shape, "tensor '" + spec.name + "' has shape " + shape_string(t->shape) +
                                         ", the config implies " + shape_string(spec.shape));
    G4_CHECK(t->dtype == DType::F32 || t->dtype == DType::BF16 || t->dtype == DType::F16 || is_block_quantized(t->dtype),
             "tensor '" + spec.name + "' has unsupported dtype " + dtype_name(t->dtype));
    G4_CHECK(!is_block_quantized(t->dtype) || t->shape.size() == 2,
             "tensor '" + spec.name + "': " + dtype_name(t->dtype) + " is only supported for matrices, not norms");
    if (is_block_quantized(t->dtype)) {
      const int64_t bad = first_nonfinite_block(t->dtype, t->data, t->numel());
      G4_CHECK(bad < 0, "tensor '" + spec.name + "': block " + std::to_string(bad) + " has a NaN or infinite scale");
    }
  }
}

std::map<DType, uint64_t> weight_bytes_by_type(const ModelWeights& w) {
  std::map<DType, uint64_t> bytes;
  auto add = [&](const Tensor& t) {
    if (!t.empty()) bytes[t.dtype] += t.bytes();
  };
  add(w.embed);
  if (w.lm_head.data != w.embed.data) add(w.lm_head);
  add(w.final_norm);
  add(w.pre_projection);
  add(w.post_projection);
  for (const LayerWeights& l : w.layers)
    for (const Tensor* t : {&l.attn_norm, &l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.q_norm, &l.k_norm,
                            &l.post_attn_norm, &l.ffn_norm, &l.gate_proj, &l.up_proj, &l.down_proj, &l.post_ffn_norm,
                            &l.layer_scalar, &l.rope_inv_freq})
      add(*t);
  return bytes;
}

std::string describe_weight_bytes(const std::map<DType, uint64_t>& bytes_by_type) {
  std::string out;
  for (const auto& [type, bytes] : bytes_by_type) {
    const bool gib = bytes >= uint64_t(1) << 30;
    char text[64];
    std::snprintf(text, sizeof text, "%s%s %.2f %s", out.empty() ? "" : ", ", dtype_name(type).c_str(),
                  double(bytes) / double(uint64_t(1) << (gib ? 30 : 20)), gib ? "GiB" : "MiB");
    out += text;
  }
  return out;
}

Tensor upload_rope_inv_freq(const LayerConfig& layer, Backend& backend) {
  const std::vector<float> inv = layer.rope_inv_freq();
  Tensor t = backend.alloc(DType::F32, int64_t(inv.size()), 1);
  backend.upload(inv.data(), t);
  return t;
}

// Weights below this size load in well under a second: no progress line for them.
constexpr uint64_t kProgressThresholdBytes = uint64_t(1) << 30;

namespace {

// The tensors a shard uploads, in load order: the config's, plus its vocabulary rows of a tied
// embedding as its own LM head when the model is split.
std::vector<std::string> tensors_to_load(const ModelConfig& c, TpShard shard) {
  std::vector<std::string> names;
  for (const auto& spec : expected_tensors(c)) names.push_back(spec.name);
  if (c.tie_word_embeddings && shard.split()) names.push_back("lm_head.weight");
  return names;
}

// The file's tensor behind `name`: a tied LM head is the embedding.
const HostTensor& file_tensor(const ModelConfig& c, const TensorSource& source, const std::string& name) {
  return *source.find(c.tie_word_embeddings && name == "lm_head.weight" ? "embed_tokens.weight" : name);
}

}  // namespace

ModelWeights load_weights(const ModelConfig& c, const TensorSource& source, Backend& backend, TpShard shard) {
  validate_tensors(c, source);
  if (shard.split()) check_tensor_parallel(c, shard.size);
  uint64_t total = 0, on_backend = 0;
  for (const std::string& name : tensors_to_load(c, shard)) {
    const HostTensor& t = file_tensor(c, source, name);
    G4_CHECK(backend.runs_weight_dtype(t.dtype), "tensor '" + name + "' is " + dtype_name(t.dtype) +
                                                     ", which the " + backend.name() +
                                                     " backend does not run yet (the cpu backend does)");
    // Sized from the slice's shape (no bytes copied): also checks every slice before any upload.
    const HostTensor part = slice_host_tensor(t, rank_slice(c, name, shard), true);
    total += part.bytes;
    on_backend += backend.weight_bytes_on_backend(part);
  }
  check_weights_fit(on_backend, backend);
  std::optional<Progress> progress;
  if (total >= kProgressThresholdBytes && shard.rank == 0) progress.emplace("loading weights (" + backend.name() + ")", total, "B");
  auto get = [&](const std::string& name) {
    const HostTensor t = slice_host_tensor(file_tensor(c, source, name), rank_slice(c, name, shard));
    Tensor uploaded = backend.upload_weight(t);
    if (progress) progress->advance(t.bytes);
    return uploaded;
  };
  ModelWeights w;
  w.embed = get("embed_tokens.weight");
  w.lm_head = c.tie_word_embeddings && !shard.split() ? w.embed : get("lm_head.weight");
  w.final_norm = get("norm.weight");
  if (c.is_assistant()) {
    w.pre_projection = get("pre_projection.weight");
    w.post_projection = get("post_projection.weight");
  }
  for (int i = 0; i < c.num_layers(); ++i) {
    const LayerConfig& l = c.layers[size_t(i)];
    const std::string p = layer_prefix(i);
    LayerWeights lw;
    lw.attn_norm = get(p + "input_layernorm.weight");
    lw.q_proj = get(p + "self_attn.q_proj.weight");
    if (!c.is_assistant()) {
      lw.k_proj = get(p + "self_attn.k_proj.weight");
      if (!l.k_eq_v) lw.v_proj = get(p + "self_attn.v_proj.weight");
      lw.k_norm = get(p + "self_attn.k_norm.weight");
    }
    lw.o_proj = get(p + "self_attn.o_proj.weight");
    lw.q_norm = get(p + "self_attn.q_norm.weight");
    lw.post_attn_norm = get(p + "post_attention_layernorm.weight");
    lw.ffn_norm = get(p + "pre_feedforward_layernorm.weight");
    lw.gate_proj = get(p + "mlp.gate_proj.weight");
    lw.up_proj = get(p + "mlp.up_proj.weight");
    lw.down_proj = get(p + "mlp.down_proj.weight");
    lw.post_ffn_norm = get(p + "post_feedforward_layernorm.weight");
    lw.layer_scalar = get(p + "layer_scalar");
    lw.rope_inv_freq = upload_rope_inv_freq(l, backend);
    w.layers.push_back(std::move(lw));
  }
  return w;
}

}  // namespace g4
