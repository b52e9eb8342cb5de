#include "model/synthetic_weights.h"

#include <cmath>

namespace g4 {

namespace {

class RandomFiller {
 public:
  RandomFiller(Backend& backend, uint64_t seed) : backend_(backend), seed_(seed) {}

  Tensor matrix(int64_t out, int64_t in) {
    Tensor t = backend_.alloc(DType::BF16, out, in);
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

}  // namespace

ModelWeights synthetic_weights(const ModelConfig& c, Backend& backend, uint64_t seed) {
  RandomFiller fill(backend, seed);
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  ModelWeights w;
  w.embed = fill.matrix(c.vocab_size, H);
  w.lm_head = c.tie_word_embeddings ? w.embed : fill.matrix(c.vocab_size, H);
  w.final_norm = fill.norm(H);
  for (const LayerConfig& l : c.layers) {
    const int64_t q_cols = int64_t(c.num_heads) * l.head_dim, kv_cols = int64_t(l.kv_heads) * l.head_dim;
    LayerWeights lw;
    lw.attn_norm = fill.norm(H);
    lw.q_proj = fill.matrix(q_cols, H);
    lw.k_proj = fill.matrix(kv_cols, H);
    if (!l.k_eq_v) lw.v_proj = fill.matrix(kv_cols, H);
    lw.o_proj = fill.matrix(H, q_cols);
    lw.q_norm = fill.norm(l.head_dim);
    lw.k_norm = fill.norm(l.head_dim);
    lw.post_attn_norm = fill.norm(H);
    lw.ffn_norm = fill.norm(H);
    lw.gate_proj = fill.matrix(I, H);
    lw.up_proj = fill.matrix(I, H);
    lw.down_proj = fill.matrix(H, I);
    lw.post_ffn_norm = fill.norm(H);
    lw.layer_scalar = fill.vector(1, 1.0f, 0.0f);
    lw.rope_inv_freq = upload_rope_inv_freq(l, backend);
    w.layers.push_back(std::move(lw));
  }
  backend.synchronize();
  return w;
}

}  // namespace g4
