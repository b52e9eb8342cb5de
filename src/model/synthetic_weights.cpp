#include "model/synthetic_weights.h"

#include <cmath>

#include "model/gguf_export.h"
#include "util/error.h"

namespace g4 {

namespace {

class RandomFiller {
 public:
  RandomFiller(Backend& backend, uint64_t seed) : backend_(backend), seed_(seed) {}

  Tensor matrix(DType dtype, int64_t out, int64_t in) {
    Tensor t = backend_.alloc(dtype, out, in);
    backend_.fill_uniform(t, 0.0f, std::sqrt(3.0f / float(in)), next_seed());
    return t;
  }
  Tensor vector(int64_t n, float center, float spread) {
    Tensor t = backend_.alloc(DType::F32, 1, n);
    backend_.fill_uniform(t, center, spread, next_seed());
    return t;
  }
  Tensor norm(int64_t n) { return vector(n, 1.0f, 0.2f); }

 private:
  uint64_t next_seed() { return seed_ * 1000003ull + counter_++; }
  Backend& backend_;
  uint64_t seed_, counter_ = 0;
};

// The type of each matrix (checkpoint names, as requested_dtype knows them).
class SyntheticTypes {
 public:
  SyntheticTypes(const std::string& weights, const ModelConfig& c) : layers_(c.num_layers()) {
    for (const LayerConfig& l : c.layers) v_count_ += l.k_eq_v ? 0 : 1;
    if (weights == "bf16") return;
    options_.q4_k_m = weights == "q4_k_m";
    options_.weights = options_.q4_k_m ? DType::Q4_K : parse_weight_dtype(weights);
    G4_CHECK(is_block_quantized(*options_.weights),
             "synthetic weights: bf16, q4_k_m or a block type (q8_0, q4_0, q4_k, ...), not '" + weights + "'");
  }

  // `v_index`: the tensor's place among the v_proj tensors (llama.cpp's attn_v count).
  DType of(const std::string& name, const std::vector<int64_t>& shape, int v_index = 0) const {
    if (!options_.weights) return DType::BF16;
    std::string note;  // the export's fallbacks for rows no multiple of the block; the embedding keeps its type
    return stored_dtype(shape, DType::BF16, requested_dtype(name, options_, layers_, v_index, v_count_), &note);
  }

 private:
  ExportOptions options_;
  int layers_ = 0, v_count_ = 0;
};

}  // namespace

ModelWeights synthetic_weights(const ModelConfig& whole, Backend& backend, uint64_t seed, const std::string& weights,
                               TpShard shard) {
  const SyntheticTypes types(weights, whole);
  // Each rank its own values; rank 0 (and an unsplit model) those of `seed`.
  RandomFiller fill(backend, seed + uint64_t(shard.rank) * 0x9E3779B97F4A7C15ull);
  const ModelConfig c = shard.split() ? rank_config(whole, shard.size) : whole;  // this rank's heads and MLP
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  auto matrix = [&](const std::string& name, int64_t out, int64_t in, int v_index = 0) {
    return fill.matrix(types.of(name, {out, in}, v_index), out, in);
  };
  ModelWeights w;
  w.embed = matrix("embed_tokens.weight", c.vocab_size, H);
  if (c.tie_word_embeddings && !shard.split()) {
    w.lm_head = w.embed;
  } else {  // a split LM head is the rank's vocabulary rows, typed as the embedding it stands for
    const std::string name = c.tie_word_embeddings ? "embed_tokens.weight" : "lm_head.weight";
    w.lm_head = matrix(name, c.vocab_size / shard.size, H);
  }
  w.final_norm = fill.norm(H);
  int v_index = 0;
  for (int i = 0; i < c.num_layers(); ++i) {
    const LayerConfig& l = c.layers[size_t(i)];
    const std::string p = "layers." + std::to_string(i) + ".";
    const int64_t q_cols = int64_t(c.num_heads) * l.head_dim, kv_cols = int64_t(l.kv_heads) * l.head_dim;
    LayerWeights lw;
    lw.attn_norm = fill.norm(H);
    lw.q_proj = matrix(p + "self_attn.q_proj.weight", q_cols, H);
    if (!c.is_assistant()) {  // an assistant reads its target's caches
      lw.k_proj = matrix(p + "self_attn.k_proj.weight", kv_cols, H);
      if (!l.k_eq_v) lw.v_proj = matrix(p + "self_attn.v_proj.weight", kv_cols, H, v_index++);
      lw.k_norm = fill.norm(l.head_dim);
    }
    lw.o_proj = matrix(p + "self_attn.o_proj.weight", H, q_cols);
    lw.q_norm = fill.norm(l.head_dim);
    lw.post_attn_norm = fill.norm(H);
    lw.ffn_norm = fill.norm(H);
    lw.gate_proj = matrix(p + "mlp.gate_proj.weight", I, H);
    lw.up_proj = matrix(p + "mlp.up_proj.weight", I, H);
    lw.down_proj = matrix(p + "mlp.down_proj.weight", H, I);
    lw.post_ffn_norm = fill.norm(H);
    lw.layer_scalar = fill.vector(1, 1.0f, 0.0f);
    lw.rope_inv_freq = upload_rope_inv_freq(l, backend);
    w.layers.push_back(std::move(lw));
  }
  if (c.is_assistant()) {
    const int64_t B = c.backbone_hidden_size;
    w.pre_projection = matrix("pre_projection.weight", H, 2 * B);
    w.post_projection = matrix("post_projection.weight", B, H);
  }
  backend.synchronize();
  return w;
}

}  // namespace g4
