#include "model/gemma4.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "model/tensor_parallel.h"
#include "util/error.h"

namespace g4 {

ForwardBuffers::ForwardBuffers(const ModelConfig& c, Backend& be, int64_t max_tokens, int64_t max_outputs)
    : max_tokens(max_tokens), max_outputs(max_outputs) {
  const DType a = be.activation_dtype();
  x = be.alloc(a, max_tokens, c.hidden_size);
  normed = be.alloc(a, max_tokens, c.hidden_size);
  q = be.alloc(a, max_tokens, c.max_q_cols());
  k = be.alloc(a, max_tokens, c.max_kv_cols());
  v = be.alloc(a, max_tokens, c.max_kv_cols());
  attn = be.alloc(a, max_tokens, c.max_q_cols());
  proj = be.alloc(a, max_tokens, c.hidden_size);
  gate = be.alloc(a, max_tokens, c.intermediate_size);
  out_normed = be.alloc(a, max_outputs, c.hidden_size);
  logits_act = be.alloc(a, max_outputs, c.vocab_size);
}

Gemma4::Gemma4(ModelConfig config, ModelWeights weights, Communicator& comm)
    : config_(std::move(config)),
      rank_config_(g4::rank_config(config_, comm.size())),
      weights_(std::move(weights)),
      comm_(&comm) {}

// First T rows of `t`, seen as [T, cols].
static Tensor head(const Tensor& t, int64_t T, int64_t cols) { return t.rows_view(0, T).reshaped(T, cols); }
// Rows [first, first + n) of `t` seen as rows of `cols` values.
static Tensor rows(const Tensor& t, int64_t first, int64_t n, int64_t cols) {
  return head(t, first + n, cols).rows_view(first, n);
}

QkvProjections Gemma4::qkv_projections(const Backend& be, ForwardBuffers& buf, int layer, int64_t T,
                                       int64_t first) const {
  const LayerConfig& l = rank_config_.layers[size_t(layer)];
  const LayerWeights& w = weights_.layers[size_t(layer)];
  const int64_t q_cols = rank_config_.num_heads * l.head_dim, kv_cols = l.kv_heads * l.head_dim;
  QkvProjections p;
  // Queries are read only for rows [first, T); keys and values for all T. Up to the backend's
  // batch_invariant_rows() the three are one launch whatever `first` (q for every row): a backend
  // may slice a launch's matrices by their rows together (CUDA's Q4_0 records, docs/DESIGN.md §7),
  // so k and v launched without q would get other bits in a prefill step than in a decode step.
  p.one_launch = first == 0 || T <= be.batch_invariant_rows();
  p.count = l.k_eq_v ? 2 : 3;
  p.ws[0] = w.q_proj, p.ws[1] = w.k_proj, p.ws[2] = w.v_proj;
  p.ys[0] = head(buf.q, T, q_cols), p.ys[1] = head(buf.k, T, kv_cols), p.ys[2] = head(buf.v, T, kv_cols);
  return p;
}

BlockEnd Gemma4::block_end(const Tensor& a, const Tensor& w, const Tensor& o, const Tensor& x,
                           const Tensor& post_weight, const Tensor& scalar, float eps, const Tensor& next_weight,
                           const Tensor& next_out, Readers next) const {
  BlockEnd e{a, w, o, x, post_weight, scalar, eps, next_weight, next_out, next, {}};
  if (comm_) e.complete_o = [this](const Tensor& partial) { reduce_partial(partial); };
  return e;
}

void Gemma4::attention_block(Backend& be, ForwardBuffers& buf, int layer, std::span<const SequenceRows> sequences,
                             const Tensor& positions, int64_t T, int64_t first, bool projected) const {
  // This rank's heads (all of them on one device).
  const LayerConfig& l = rank_config_.layers[size_t(layer)];
  const LayerWeights& w = weights_.layers[size_t(layer)];
  const float eps = float(config_.rms_norm_eps);
  const int64_t H = config_.hidden_size, hd = l.head_dim, out_rows = T - first;
  const int64_t heads = rank_config_.num_heads, q_cols = heads * hd, kv_cols = l.kv_heads * hd;
  Tensor x = head(buf.x, T, H), h = head(buf.normed, T, H);
  const QkvProjections qkv = qkv_projections(be, buf, layer, T, first);
  Tensor q = head(buf.q, qkv.one_launch ? T : out_rows, q_cols), k = head(buf.k, T, kv_cols), v = head(buf.v, T, kv_cols);
  if (qkv.one_launch) {
    if (!projected) be.matmuls(h, std::span(qkv.ws, qkv.count), std::span(qkv.ys, qkv.count));
    q = q.rows_view(first, out_rows);
  } else {
    G4_CHECK(!projected, "attention block: q, k and v projected apart cannot run as the previous block's readers");
    if (out_rows > 0) be.matmul(h.rows_view(first, out_rows), w.q_proj, q);
    const Tensor ws[] = {w.k_proj, w.v_proj}, ys[] = {k, v};
    be.matmuls(h, std::span(ws, l.k_eq_v ? 1 : 2), std::span(ys, l.k_eq_v ? 1 : 2));
  }

  // Attention runs per sequence, over that sequence's cache and positions: its rows [a, a + n) of
  // k/v, and its query rows [max(a, first), a + n), which sit at q row max(a, first) - first. The
  // backend gets all sequences at once (a decode batch may run in one launch).
  std::vector<HeadNorms> norms;
  std::vector<AttentionArgs> args;
  norms.reserve(sequences.size());
  args.reserve(sequences.size());
  for (const SequenceRows& s : sequences) {
    const int64_t a = s.first_row, n = s.rows, q_from = std::max(a, first), nq = a + n - q_from;
    const Tensor seq_q = q.rows_view(q_from - first, nq), seq_k = k.rows_view(a, n), seq_v = v.rows_view(a, n);
    const Tensor seq_positions = positions.rows_view(a, n);
    Tensor q_heads = seq_q.reshaped(nq * heads, hd);
    Tensor k_heads = seq_k.reshaped(n * l.kv_heads, hd), v_heads = seq_v.reshaped(n * l.kv_heads, hd);
    HeadNorms& norm = norms.emplace_back(HeadNorms{q_heads, w.q_norm, k_heads, w.k_norm, v_heads, v_heads,
                                                   seq_positions, w.rope_inv_freq, eps, q_from - a});
    if (l.k_eq_v) norm.v_in = k_heads;  // V = v_norm(k_proj(x)), before k_norm/RoPE

    AttentionArgs& arg = args.emplace_back();
    arg.q = seq_q;
    arg.k_new = seq_k;
    arg.v_new = seq_v;
    arg.cache = &(*s.caches)[size_t(layer)];
    arg.positions = seq_positions;
    arg.heads = int(heads);
    arg.kv_heads = l.kv_heads;
    arg.head_dim = l.head_dim;
    arg.window = l.sliding ? config_.sliding_window : 0;
    arg.scale = 1.0f;  // Gemma 4: q/k norms replace the 1/sqrt(d) scaling
    arg.out = head(buf.attn, out_rows, q_cols).rows_view(q_from - first, nq);
    arg.q_first = q_from - a;
    arg.last_position = s.last_position;
    arg.rows_as_decode_steps = s.out_rows == s.rows;
  }
  if (out_rows == 0) return be.normed_attention_batch(norms, args);

  // The attention's output projected and added to the residual; the MLP's normed input then read
  // by its gate and up projections.
  const int64_t I = rank_config_.intermediate_size;
  const Tensor mlp_in = h.rows_view(first, out_rows), gate_up[] = {w.gate_proj, w.up_proj},
               gated[] = {rows(buf.gate, first, out_rows, I)};
  be.normed_attention_then(norms, args,
                           block_end(head(buf.attn, out_rows, q_cols), w.o_proj, rows(buf.proj, first, out_rows, H),
                                     x.rows_view(first, out_rows), w.post_attn_norm, Tensor{}, eps, w.ffn_norm, mlp_in,
                                     Readers{gate_up, gated, true}));
}

void Gemma4::mlp_block(Backend& be, ForwardBuffers& buf, int layer, int64_t first, int64_t n,
                       const QkvProjections* next) const {
  const LayerWeights& w = weights_.layers[size_t(layer)];
  const int64_t H = config_.hidden_size, I = rank_config_.intermediate_size;
  Tensor x = rows(buf.x, first, n, H), h = rows(buf.normed, first, n, H);
  Tensor gate = rows(buf.gate, first, n, I), o = rows(buf.proj, first, n, H);
  // The last layer leaves x un-normed: logits() applies the final norm.
  const bool last = layer + 1 == config_.num_layers();
  be.end_block(block_end(gate, w.down_proj, o, x, w.post_ffn_norm, w.layer_scalar, float(config_.rms_norm_eps),
                         last ? Tensor{} : weights_.layers[size_t(layer) + 1].attn_norm, last ? Tensor{} : h,
                         next ? next->readers() : Readers{}));
}

void Gemma4::forward_batch(Backend& be, ForwardBuffers& buf, std::span<const SequenceRows> sequences,
                           const Tensor& ids, const Tensor& positions) const {
  const int64_t T = ids.rows;
  G4_CHECK(T >= 1 && T <= buf.max_tokens, "a forward of " + std::to_string(T) + " rows exceeds the buffers (" +
                                              std::to_string(buf.max_tokens) + ")");
  G4_CHECK(positions.rows == T, "forward: one position per token");
  // The first row any sequence reads: the last layer computes its outputs from there on.
  int64_t next_row = 0, first_read = T;
  for (const SequenceRows& s : sequences) {
    G4_CHECK(s.caches && int64_t(s.caches->size()) == config_.num_layers(), "forward: one KV cache per layer");
    G4_CHECK(s.first_row == next_row && s.rows >= 1, "forward: sequences must cover the rows in order");
    G4_CHECK(s.out_rows >= 0 && s.out_rows <= s.rows, "forward: " + std::to_string(s.out_rows) +
                                                          " output rows asked of a sequence of " +
                                                          std::to_string(s.rows) + " rows");
    if (s.out_rows > 0) first_read = std::min(first_read, s.first_row + s.rows - s.out_rows);
    next_row += s.rows;
  }
  G4_CHECK(next_row == T, "forward: the sequences cover " + std::to_string(next_row) + " of " + std::to_string(T) +
                              " rows");
  const Tensor x = head(buf.x, T, config_.hidden_size);
  be.embed(weights_.embed, ids, float(std::sqrt(double(config_.hidden_size))), x);
  // Each block ends with residual_norm, which also writes the next block's normed input into
  // buf.normed; only the first layer's input norm is an op of its own.
  if (config_.num_layers() > 0)
    be.rms_norm(x, weights_.layers[0].attn_norm, float(config_.rms_norm_eps), head(buf.normed, T, config_.hidden_size));
  // The last layer still projects and stores every position's K/V, but computes the rest (queries,
  // o_proj, MLP) only for the rows whose hidden states the caller reads.
  // A layer's q/k/v run at the previous MLP block's end when they are one launch over all T rows.
  bool projected = false;
  for (int i = 0; i < config_.num_layers(); ++i) {
    const int64_t first = i + 1 == config_.num_layers() ? first_read : 0;
    attention_block(be, buf, i, sequences, positions, T, first, projected);
    projected = false;
    if (first >= T) continue;
    const bool next_layer = i + 1 < config_.num_layers();
    const int64_t next_first = i + 2 == config_.num_layers() ? first_read : 0;
    const QkvProjections next = next_layer ? qkv_projections(be, buf, i + 1, T, next_first) : QkvProjections{};
    // The MLP covers every row when a next layer follows (first = 0 below the last layer).
    projected = next.one_launch;
    mlp_block(be, buf, i, first, T - first, projected ? &next : nullptr);
  }
}

void Gemma4::forward_layers(Backend& be, ForwardBuffers& buf, const std::vector<KvCache>& caches, const Tensor& ids,
                            const Tensor& positions, int64_t out_rows) const {
  const SequenceRows one{&caches, 0, ids.rows, out_rows};
  forward_batch(be, buf, std::span(&one, 1), ids, positions);
}

void Gemma4::logits(Backend& be, const Tensor& hidden, const Tensor& normed, const Tensor& scratch,
                    const Tensor& logits) const {
  be.rms_norm(hidden, weights_.final_norm, float(config_.rms_norm_eps), normed);
  if (!comm_) {
    be.matmul(normed, weights_.lm_head, scratch);
  } else {
    // The shard's rows [n, V/N] in the activation dtype go to the front of `logits`' memory (F32
    // [n, V], at least as many bytes, only written by the soft-cap below), and are gathered into
    // `scratch` as whole rows. The soft-cap is per element, so soft-capping after the gather gives
    // the bits of one device's LM head; the gather moves activation-dtype rows (bf16 on CUDA: half
    // of F32's bytes). docs/DESIGN.md, "Tensor parallel".
    Tensor shard = logits;
    shard.dtype = scratch.dtype;
    shard.cols = weights_.lm_head.rows;
    be.matmul(normed, weights_.lm_head, shard);
    comm_->all_gather_cols(shard, scratch);
  }
  be.softcap(scratch, float(config_.final_logit_softcap), logits);
}

}  // namespace g4
