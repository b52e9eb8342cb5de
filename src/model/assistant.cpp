#include "model/assistant.h"

#include <cmath>
#include <string>

#include "util/error.h"

namespace g4 {

namespace {

// First n rows of `t`, seen as [n, cols].
Tensor head(const Tensor& t, int64_t n, int64_t cols) { return t.rows_view(0, n).reshaped(n, cols); }

void check_fits(bool ok, const std::string& what) {
  G4_CHECK(ok, "the assistant does not belong to this model: " + what);
}

}  // namespace

std::vector<int> assistant_cache_layers(const ModelConfig& target, const ModelConfig& a) {
  check_fits(a.is_assistant(), "it is a model of its own, not an MTP assistant");
  check_fits(a.vocab_size == target.vocab_size, "its vocabulary has " + std::to_string(a.vocab_size) +
                                                    " tokens, the model's " + std::to_string(target.vocab_size));
  check_fits(a.backbone_hidden_size == target.hidden_size,
             "it reads hidden states of width " + std::to_string(a.backbone_hidden_size) + ", the model's are " +
                 std::to_string(target.hidden_size));
  std::vector<int> layers;
  for (int i = 0; i < a.num_layers(); ++i) {
    const LayerConfig& l = a.layers[size_t(i)];
    const std::string kind = l.sliding ? "sliding" : "full";
    int j = target.num_layers() - 1;
    while (j >= 0 && target.layers[size_t(j)].sliding != l.sliding) --j;
    const std::string layer = "its layer " + std::to_string(i) + " (" + kind + " attention)";
    check_fits(j >= 0, layer + " has no " + kind + " attention layer of the model to read");
    const LayerConfig& t = target.layers[size_t(j)];
    const std::string of = " of the model's layer " + std::to_string(j);
    check_fits(l.head_dim == t.head_dim, layer + " has head size " + std::to_string(l.head_dim) + ", the " +
                                             std::to_string(t.head_dim) + of);
    check_fits(l.kv_heads == t.kv_heads, layer + " reads " + std::to_string(l.kv_heads) + " KV heads, not the " +
                                             std::to_string(t.kv_heads) + of);
    check_fits(l.rope_theta == t.rope_theta && l.rope_partial == t.rope_partial,
               layer + " rotates its queries with another RoPE than the keys" + of);
    check_fits(!l.sliding || a.sliding_window == target.sliding_window,
               layer + " has a sliding window of " + std::to_string(a.sliding_window) + ", the model " +
                   std::to_string(target.sliding_window));
    layers.push_back(j);
  }
  return layers;
}

DraftBuffers::DraftBuffers(const ModelConfig& c, Backend& be, int64_t max_rows) : max_rows(max_rows) {
  const DType a = be.activation_dtype();
  const int64_t B = c.backbone_hidden_size, H = c.hidden_size;
  embedded = be.alloc(a, max_rows, B);
  joined = be.alloc(a, max_rows, 2 * B);
  x = be.alloc(a, max_rows, H);
  normed = be.alloc(a, max_rows, H);
  q = be.alloc(a, max_rows, c.max_q_cols());
  attn = be.alloc(a, max_rows, c.max_q_cols());
  proj = be.alloc(a, max_rows, H);
  gate = be.alloc(a, max_rows, c.intermediate_size);
  logits_act = be.alloc(a, max_rows, c.vocab_size);
}

void check_draft_tokens(int64_t draft_tokens) {
  G4_CHECK(draft_tokens >= 0 && draft_tokens <= kMaxDraftTokens,
           "--draft_tokens must be in [1, " + std::to_string(kMaxDraftTokens) +
               "] (0: the assistant's num_assistant_tokens, else " + std::to_string(kDefaultDraftTokens) + "), got " +
               std::to_string(draft_tokens));
}

Gemma4Assistant::Gemma4Assistant(ModelConfig config, ModelWeights weights, const ModelConfig& target,
                                 int64_t default_draft_tokens)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      cache_layers_(assistant_cache_layers(target, config_)),
      default_draft_tokens_(default_draft_tokens) {}

void Gemma4Assistant::layer(Backend& be, DraftBuffers& buf, int i, std::span<const DraftRow> rows,
                            const Tensor& positions, int64_t n) const {
  const LayerConfig& l = config_.layers[size_t(i)];
  const LayerWeights& w = weights_.layers[size_t(i)];
  const float eps = float(config_.rms_norm_eps);
  const int64_t H = config_.hidden_size, I = config_.intermediate_size, q_cols = int64_t(config_.num_heads) * l.head_dim;
  const Tensor x = head(buf.x, n, H), normed = head(buf.normed, n, H), q = head(buf.q, n, q_cols),
               attn = head(buf.attn, n, q_cols), proj = head(buf.proj, n, H), gate = head(buf.gate, n, I);
  be.matmul(normed, w.q_proj, q);
  HeadNorms norms;
  norms.q = q.reshaped(n * config_.num_heads, l.head_dim);
  norms.q_weight = w.q_norm;
  norms.positions = positions;
  norms.inv_freq = w.rope_inv_freq;
  norms.eps = eps;
  be.head_norms(norms);
  for (size_t s = 0; s < rows.size(); ++s) {
    AttentionArgs arg;
    arg.q = q.rows_view(int64_t(s), 1);
    arg.cache = &(*rows[s].target_caches)[size_t(cache_layers_[size_t(i)])];
    arg.positions = positions.rows_view(int64_t(s), 1);
    arg.heads = config_.num_heads;
    arg.kv_heads = l.kv_heads;
    arg.head_dim = l.head_dim;
    arg.window = l.sliding ? config_.sliding_window : 0;
    arg.scale = 1.0f;  // q_norm replaces the 1/sqrt(d) scaling, as in the target
    arg.out = attn.rows_view(int64_t(s), 1);
    arg.reads_cache_only = true;
    be.attention(arg);
  }
  const Tensor gate_up[] = {w.gate_proj, w.up_proj}, gated[] = {gate};
  be.end_block(BlockEnd{attn, w.o_proj, proj, x, w.post_attn_norm, Tensor{}, eps, w.ffn_norm, normed,
                        Readers{gate_up, gated, true}, {}});
  // The last layer's end norms for the output: the final norm.
  const bool last = i + 1 == config_.num_layers();
  be.end_block(BlockEnd{gate, w.down_proj, proj, x, w.post_ffn_norm, w.layer_scalar, eps,
                        last ? weights_.final_norm : weights_.layers[size_t(i) + 1].attn_norm, normed, Readers{}, {}});
}

void Gemma4Assistant::step(Backend& be, DraftBuffers& buf, const Gemma4& target, std::span<const DraftRow> rows,
                           const Tensor& ids, const Tensor& positions, const Tensor& h, const Tensor& logits,
                           const Tensor& h_next) const {
  const int64_t n = ids.rows, B = config_.backbone_hidden_size, H = config_.hidden_size;
  G4_CHECK(n >= 1 && n <= buf.max_rows && int64_t(rows.size()) == n && positions.rows == n && h.rows == n &&
               logits.rows == n && h_next.rows == n,
           "draft step: one row per sequence in every tensor, at most " + std::to_string(buf.max_rows));
  for (const DraftRow& r : rows)
    G4_CHECK(r.target_caches && int64_t(r.target_caches->size()) == target.config().num_layers(),
             "draft step: one target KV cache per target layer");
  const Tensor embedded = head(buf.embedded, n, B), joined = head(buf.joined, n, 2 * B), x = head(buf.x, n, H),
               normed = head(buf.normed, n, H);
  be.embed(target.weights().embed, ids, float(std::sqrt(double(B))), embedded);
  const Tensor parts[] = {embedded, h};
  be.concat_cols(parts, joined);
  be.matmul(joined, weights_.pre_projection, x);
  be.rms_norm(x, weights_.layers[0].attn_norm, float(config_.rms_norm_eps), normed);
  for (int i = 0; i < config_.num_layers(); ++i) layer(be, buf, i, rows, positions, n);
  const Tensor logits_act = head(buf.logits_act, n, config_.vocab_size);
  be.matmul(normed, weights_.lm_head, logits_act);
  be.softcap(logits_act, float(config_.final_logit_softcap), logits);
  be.matmul(normed, weights_.post_projection, h_next);
}

}  // namespace g4
