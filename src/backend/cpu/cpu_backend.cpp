#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cpu/hot_loop.h"
#include "format/tensor_source.h"
#include "quant/quantize.h"
#include "quant/random_blocks.h"
#include "sampling/cpu_sampler.h"
#include "sampling/sampling_params.h"
#include "sampling/speculative.h"
#include "util/error.h"
#include "util/half.h"
#include "util/host_memory.h"
#include "util/uniform_hash.h"

namespace g4 {

CpuBackend::CpuBackend(int threads) : pool_(threads) {}

Tensor CpuBackend::alloc(DType dtype, int64_t rows, int64_t cols) {
  Tensor t;
  t.dtype = dtype;
  t.rows = rows;
  t.cols = cols;
  const size_t bytes = t.bytes();
  std::shared_ptr<void> block = allocate_zeroed(bytes);
  t.data = block.get();
  t.owner = memory_.track(t.data, bytes, [block = std::move(block)](void*) mutable { block.reset(); });
  return t;
}

size_t CpuBackend::free_memory_bytes() const { return host_memory_available().value_or(SIZE_MAX); }

void CpuBackend::upload(const void* host, const Tensor& dst) { std::memcpy(dst.data, host, dst.bytes()); }
void CpuBackend::download(const Tensor& src, void* host) { std::memcpy(host, src.data, src.bytes()); }

Tensor CpuBackend::upload_weight(const HostTensor& w) {
  Tensor t;
  t.dtype = w.dtype;
  t.rows = w.shape.size() >= 2 ? w.shape[0] : 1;
  t.cols = w.shape.empty() ? 1 : w.numel() / t.rows;
  G4_CHECK(t.bytes() == w.bytes, "tensor '" + w.name + "': byte size does not match its shape and dtype");
  t.data = const_cast<void*>(w.data);  // weights are read-only; the mapping stays alive through owner
  t.owner = w.owner;
  return t;
}

void widen_row(const Tensor& w, int64_t row, float* out) {
  decode_row(w.dtype, static_cast<const uint8_t*>(w.data) + size_t(row) * w.row_size(), w.cols, out);
}

static void check_f32(const Tensor& t, const char* what) {
  G4_CHECK(t.dtype == DType::F32, std::string("cpu backend: ") + what + " must be F32");
}

void CpuBackend::embed(const Tensor& table, const Tensor& ids, float scale, const Tensor& out) {
  const int32_t* id = ids.as<int32_t>();
  pool_.parallel_for(ids.rows, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* row = out.as<float>() + t * out.cols;
      widen_row(table, id[t], row);
      for (int64_t i = 0; i < out.cols; ++i) row[i] *= scale;
    }
  });
}

// A norm weight widened to float32; empty when there is none.
static std::vector<float> widen_norm_weight(const Tensor& weight, int64_t cols) {
  std::vector<float> w;
  if (!weight.empty()) {
    w.resize(size_t(cols));
    widen_row(weight, 0, w.data());
  }
  return w;
}

// out = in / sqrt(mean(in^2) + eps) * w (no weight when w is empty); out may be in.
static void rms_norm_row(const float* in, int64_t cols, const std::vector<float>& w, float eps, float* out) {
  double ss = 0;
  for (int64_t i = 0; i < cols; ++i) ss += double(in[i]) * in[i];
  const float inv = float(1.0 / std::sqrt(ss / double(cols) + eps));
  for (int64_t i = 0; i < cols; ++i) out[i] = in[i] * inv * (w.empty() ? 1.0f : w[size_t(i)]);
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  check_f32(x, "rms_norm input");
  const std::vector<float> w = widen_norm_weight(weight, x.cols);
  pool_.parallel_for(x.rows, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) rms_norm_row(x.as<float>() + r * x.cols, x.cols, w, eps, out.as<float>() + r * x.cols);
  });
}


// widen_row for the hot loops: BF16 rows (the usual weight type) are widened inline, so each
// G4_HOT_LOOP clone vectorises the conversion for its own target; other types use decode_row.
static inline void widen_weight_row(const Tensor& w, int64_t row, float* out) {
  if (w.dtype != DType::BF16) return widen_row(w, row, out);
  // memcpy: a GGUF or safetensors row may sit at an odd address; it compiles to a plain load.
  const uint8_t* in = static_cast<const uint8_t*>(w.data) + size_t(row) * w.row_size();
  for (int64_t i = 0; i < w.cols; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, sizeof h);
    out[i] = bf16_to_f32(h);
  }
}

// A float32 matrix widened to double once per op: every weight row's dot products read it (exact).
static std::vector<double> widen_to_double(const Tensor& x) {
  const float* in = x.as<float>();
  return std::vector<double>(in, in + x.rows * x.cols);
}

// out[t * out_stride] = dot(x row t, w) for the T rows of x (K doubles each), four rows at a time;
// w is one weight row in float32, widened to double into `wide` (K doubles).
G4_HOT_LOOP G4_UNCHECKED_KERNEL static void dots_all_rows(const double* x, int64_t T, int64_t K, const float* w,
                                                          double* wide, float* out, int64_t out_stride) {
  if (T == 0) return;
  cpu::check_range(x, size_t(T * K) * sizeof(double));
  cpu::check_range(w, size_t(K) * sizeof(float));
  cpu::check_range(wide, size_t(K) * sizeof(double));
  cpu::check_range(out, size_t((T - 1) * out_stride + 1) * sizeof(float));
  for (int64_t i = 0; i < K; ++i) wide[i] = w[i];
  int64_t t = 0;
  for (; t + 4 <= T; t += 4) cpu::dots<4>(x + t * K, K, wide, out + t * out_stride, out_stride);
  for (; t < T; ++t) cpu::dots<1>(x + t * K, K, wide, out + t * out_stride, out_stride);
}

// y[:, n] = x w[n]^T for the weight rows n in [b, e); x is the input widened to double.
G4_HOT_LOOP static void matmul_rows(const std::vector<double>& x, const Tensor& w, const Tensor& y, int64_t b,
                                    int64_t e) {
  const int64_t T = y.rows, K = w.cols, N = w.rows;
  std::vector<float> row(static_cast<size_t>(K));
  std::vector<double> wide(static_cast<size_t>(K));
  for (int64_t n = b; n < e; ++n) {
    widen_weight_row(w, n, row.data());
    dots_all_rows(x.data(), T, K, row.data(), wide.data(), y.as<float>() + n, N);
  }
}

void CpuBackend::matmul(const Tensor& x, const Tensor& w, const Tensor& y) {
  check_f32(x, "matmul input");
  G4_CHECK(x.cols == w.cols && y.cols == w.rows && y.rows == x.rows,
           "matmul shape mismatch: x [" + std::to_string(x.rows) + ", " + std::to_string(x.cols) + "], w [" +
               std::to_string(w.rows) + ", " + std::to_string(w.cols) + "]");
  const std::vector<double> wide = widen_to_double(x);
  pool_.parallel_for(w.rows, [&](int64_t b, int64_t e) { matmul_rows(wide, w, y, b, e); });
}

// Rotate-half RoPE of one head v[2*half] at position p. The angle is the float32 product, as
// transformers, llama.cpp and the CUDA backend compute it (docs/DESIGN.md, "RoPE precision").
static void rope_row(float* v, int64_t half, float p, const float* inv_freq) {
  for (int64_t i = 0; i < half; ++i) {
    if (inv_freq[i] == 0.0f) continue;  // identity rotation (proportional partial RoPE)
    const double angle = p * inv_freq[i];
    const float c = float(std::cos(angle)), s = float(std::sin(angle));
    const float a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = b * c + a * s;
  }
}

void CpuBackend::rms_norm_rope(const Tensor& x, const Tensor& weight, float eps, const Tensor& positions,
                               const Tensor& inv_freq) {
  check_f32(x, "rms_norm_rope input");
  if (x.rows == 0) return;
  const std::vector<float> w = widen_norm_weight(weight, x.cols);
  const int64_t heads = x.rows / positions.rows;
  const int32_t* pos = positions.as<int32_t>();
  pool_.parallel_for(x.rows, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float* v = x.as<float>() + r * x.cols;
      rms_norm_row(v, x.cols, w, eps, v);
      rope_row(v, x.cols / 2, float(pos[r / heads]), inv_freq.as<float>());
    }
  });
}

void CpuBackend::concat_cols(std::span<const Tensor> parts, const Tensor& out) {
  check_concat_cols(parts, out);
  for (int64_t r = 0; r < out.rows; ++r) {
    uint8_t* dst = out.as<uint8_t>() + size_t(r) * out.row_size();
    for (const Tensor& p : parts) {
      std::memcpy(dst, p.as<uint8_t>() + size_t(r) * p.row_size(), p.row_size());
      dst += p.row_size();
    }
  }
}

void CpuBackend::head_norms(const HeadNorms& a) {
  rms_norm_rope(a.q, a.q_weight, a.eps, a.positions.rows_view(a.q_first, a.positions.rows - a.q_first), a.inv_freq);
  if (a.k.empty()) return;  // an assistant's queries alone
  rms_norm(a.v_in, Tensor{}, a.eps, a.v);  // before k's norm: on K=V layers v_in is k before its norm
  rms_norm_rope(a.k, a.k_weight, a.eps, a.positions, a.inv_freq);
}

void CpuBackend::attention(const AttentionArgs& a) {
  const int64_t T = a.positions.rows, hd = a.head_dim, cap = a.cache->capacity();
  const int64_t pos0 = a.positions.as<int32_t>()[0];
  G4_CHECK(a.q_first >= 0 && a.q_first <= T && a.q.rows == T - a.q_first && a.out.rows == a.q.rows,
           "attention: q and out must hold the chunk's tokens [q_first, T)");
  const auto all_queries = [&] {
    pool_.parallel_for(a.q.rows * a.heads, [&](int64_t b, int64_t e) { cpu::attention_jobs(a, b, e); });
  };
  if (a.reads_cache_only) {
    G4_CHECK(pos0 >= 1 && a.k_new.empty() && a.v_new.empty(),
             "attention: queries over a cache alone need cached positions before them and no keys of their own");
    G4_CHECK(a.window == 0 || cap >= a.window, "attention: ring cache smaller than the sliding window");
    return all_queries();
  }
  const bool quantized = is_quantized_kv(a.cache->k.dtype);
  // Over a quantized cache the chunk is stored before it is read: no stored position may take the
  // slot of one a query still reads (one a window and a chunk back), unless the ring never wraps.
  G4_CHECK(a.window == 0 || cap >= (quantized ? std::min<int64_t>(a.window + T - 1, pos0 + T) : a.window),
           "attention: ring cache smaller than the sliding window" + std::string(quantized ? " and the chunk" : ""));
  G4_CHECK(a.window != 0 || cap >= pos0 + T, "attention: flat cache smaller than the context");
  const int64_t kv_cols = int64_t(a.kv_heads) * hd;
  if (quantized) {  // store the chunk first: every key is read as the cache holds it
    const DType type = a.cache->k.dtype;
    for (int64_t t = 0; t < T; ++t) {
      const size_t row = size_t(cpu::cache_row(*a.cache, pos0 + t)) * a.cache->k.row_size();
      cpu::encode_kv_row(type, a.k_new.as<float>() + t * kv_cols, a.kv_heads, a.head_dim, a.cache->k.as<uint8_t>() + row);
      cpu::encode_kv_row(type, a.v_new.as<float>() + t * kv_cols, a.kv_heads, a.head_dim, a.cache->v.as<uint8_t>() + row);
    }
    return all_queries();
  }
  all_queries();
  // Store this chunk's K/V only after every query has read the older entries.
  for (int64_t t = 0; t < T; ++t) {
    const int64_t row = cpu::cache_row(*a.cache, pos0 + t);
    std::memcpy(a.cache->k.as<float>() + row * kv_cols, a.k_new.as<float>() + t * kv_cols, size_t(kv_cols) * 4);
    std::memcpy(a.cache->v.as<float>() + row * kv_cols, a.v_new.as<float>() + t * kv_cols, size_t(kv_cols) * 4);
  }
}

// out[:, n] = gelu_tanh(x w_gate[n]^T) * (x w_up[n]^T) for the weight rows n in [b, e); x is the
// input widened to double.
G4_HOT_LOOP static void gated_gelu_rows(const std::vector<double>& x, const Tensor& w_gate, const Tensor& w_up,
                                        const Tensor& out, int64_t b, int64_t e) {
  const int64_t T = out.rows, K = w_gate.cols, N = w_gate.rows;
  const float k = float(std::sqrt(2.0 / M_PI));
  std::vector<float> row(static_cast<size_t>(K)), gate(static_cast<size_t>(T)), up(static_cast<size_t>(T));
  std::vector<double> wide(static_cast<size_t>(K));
  for (int64_t n = b; n < e; ++n) {
    widen_weight_row(w_gate, n, row.data());
    dots_all_rows(x.data(), T, K, row.data(), wide.data(), gate.data(), 1);
    widen_weight_row(w_up, n, row.data());
    dots_all_rows(x.data(), T, K, row.data(), wide.data(), up.data(), 1);
    for (int64_t t = 0; t < T; ++t) {
      const float g = gate[size_t(t)], u = up[size_t(t)];
      out.as<float>()[t * N + n] = 0.5f * g * (1.0f + std::tanh(k * (g + 0.044715f * g * g * g))) * u;
    }
  }
}

void CpuBackend::gated_gelu(const Tensor& x, const Tensor& w_gate, const Tensor& w_up, const Tensor& out) {
  check_f32(x, "gated_gelu input");
  G4_CHECK(x.cols == w_gate.cols && x.cols == w_up.cols && w_gate.rows == w_up.rows && out.cols == w_gate.rows &&
               out.rows == x.rows,
           "gated_gelu shape mismatch: x [" + std::to_string(x.rows) + ", " + std::to_string(x.cols) + "], w_gate [" +
               std::to_string(w_gate.rows) + ", " + std::to_string(w_gate.cols) + "]");
  const std::vector<double> wide = widen_to_double(x);
  pool_.parallel_for(w_gate.rows, [&](int64_t b, int64_t e) { gated_gelu_rows(wide, w_gate, w_up, out, b, e); });
}

void CpuBackend::residual_norm(const Tensor& x, const Tensor& o, const Tensor& post_weight, const Tensor& scalar,
                               float eps, const Tensor& next_weight, const Tensor& next_out) {
  check_f32(x, "residual_norm input");
  check_f32(o, "residual_norm block output");
  const int64_t cols = x.cols;
  const std::vector<float> post = widen_norm_weight(post_weight, cols), next = widen_norm_weight(next_weight, cols);
  float s = 1.0f;
  if (!scalar.empty()) widen_row(scalar, 0, &s);
  pool_.parallel_for(x.rows, [&](int64_t b, int64_t e) {
    std::vector<float> normed(static_cast<size_t>(cols));
    for (int64_t r = b; r < e; ++r) {
      float* xr = x.as<float>() + r * cols;
      rms_norm_row(o.as<float>() + r * cols, cols, post, eps, normed.data());
      for (int64_t i = 0; i < cols; ++i) xr[i] += normed[size_t(i)];
      if (!scalar.empty())
        for (int64_t i = 0; i < cols; ++i) xr[i] *= s;
      if (!next_out.empty()) rms_norm_row(xr, cols, next, eps, next_out.as<float>() + r * cols);
    }
  });
}

void CpuBackend::softcap(const Tensor& x, float cap, const Tensor& out) {
  pool_.parallel_for(x.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float z = x.as<float>()[i];
      out.as<float>()[i] = cap > 0 ? cap * std::tanh(z / cap) : z;
    }
  });
}

void CpuBackend::fill_uniform(const Tensor& t, float center, float spread, uint64_t seed) {
  if (is_block_quantized(t.dtype)) {
    G4_CHECK(center == 0.0f, "fill_uniform: block-quantized tensors are filled around 0");
    const RandomBlockScales scales = random_block_scales(t.dtype, spread);
    const size_t block = block_bytes(t.dtype);
    pool_.parallel_for(int64_t(t.bytes() / block), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) random_block(t.dtype, scales, seed, uint64_t(i), t.as<uint8_t>() + size_t(i) * block);
    });
    return;
  }
  G4_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, "fill_uniform: F32, BF16 or block-quantized tensors only");
  pool_.parallel_for(t.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float v = uniform_fill_value(seed, uint64_t(i), center, spread);
      if (t.dtype == DType::F32) {
        t.as<float>()[i] = v;
      } else {
        t.as<uint16_t>()[i] = f32_to_bf16(v);
      }
    }
  });
}

void CpuBackend::sample(const Tensor& logits, const SamplingRows& params, const Tensor& tokens) {
  G4_CHECK(logits.rows == tokens.rows || logits.rows == 1, "sample: one logits row per token, or one for all");
  G4_CHECK(params.rows >= tokens.rows, "sample: one SamplingParams per row");
  const int64_t stride = logits.rows == 1 ? 0 : logits.cols;
  for (int64_t r = 0; r < tokens.rows; ++r)
    tokens.as<int64_t>()[r] =
        sample_row(logits.as<float>() + r * stride, logits.cols, params.as<const SamplingParams>()[r]);
}

void CpuBackend::adjust_logits(const Tensor& logits, const AdjustmentRows& rows) {
  G4_CHECK(logits.dtype == DType::F32 && logits.rows == rows.rows, "adjust_logits: one F32 logits row per row");
  const int32_t* offsets = rows.offsets.as<int32_t>();
  const auto* entries = static_cast<const LogitAdjustment*>(rows.entries.data);
  for (int64_t r = 0; r < rows.rows; ++r)
    apply_adjustments(std::span(logits.as<float>() + r * logits.cols, size_t(logits.cols)),
                      std::span(entries + offsets[r], entries + offsets[r + 1]));
}

void CpuBackend::mask_logits(const Tensor& logits, const TokenMaskRows& rows) {
  G4_CHECK(logits.dtype == DType::F32 && logits.rows == rows.rows, "mask_logits: one F32 logits row per row");
  const int32_t* row_mask = rows.row_mask.as<int32_t>();
  const int64_t words = rows.words.cols, covered = std::min(logits.cols, words * 32);
  for (int64_t r = 0; r < rows.rows; ++r) {
    if (row_mask[r] < 0) continue;
    G4_ASSERT(row_mask[r] < rows.words.rows, "mask_logits: row " + std::to_string(r) + " names a mask that is not there");
    const auto* mask = reinterpret_cast<const uint32_t*>(rows.words.as<int32_t>() + row_mask[r] * words);
    float* row = logits.as<float>() + r * logits.cols;
    for (int64_t t = 0; t < covered; ++t)
      if (!((mask[t >> 5] >> (t & 31)) & 1u)) row[t] = -std::numeric_limits<float>::infinity();
    std::fill(row + covered, row + logits.cols, -std::numeric_limits<float>::infinity());
  }
}

static void no_graphs() { throw Error(ErrorKind::kUnsupported, "the cpu backend has no graph capture (CUDA graphs need --backend cuda)"); }
void CpuBackend::begin_capture() { no_graphs(); }
void CpuBackend::end_capture(std::unique_ptr<RecordedStep>&) { no_graphs(); }
void CpuBackend::replay(const RecordedStep&) { no_graphs(); }

void CpuBackend::advance_step(const Tensor& token, const Tensor& ids, const Tensor& positions) {
  ids.as<int32_t>()[0] = int32_t(token.as<int64_t>()[0]);
  positions.as<int32_t>()[0] += 1;
}

void CpuBackend::tokens_to_ids(const Tensor& tokens, const Tensor& ids) {
  check_tokens_to_ids(tokens, ids);
  for (int64_t r = 0; r < tokens.rows; ++r) {
    const int64_t t = tokens.as<int64_t>()[r];
    ids.as<int32_t>()[r] = t >= 0 ? int32_t(t) : 0;
  }
}

// The reference verdict itself, on the drafts gathered into rows of their own.
void CpuBackend::judge_drafts(const Tensor& target_logits, const DraftRows& drafts, const SamplingRows& params,
                              const Tensor& verdict) {
  check_judge_drafts(target_logits, drafts, params, verdict);
  const int64_t k = drafts.count, V = target_logits.cols;
  std::vector<int32_t> tokens(static_cast<size_t>(k));
  std::vector<float> draft_logits(static_cast<size_t>(k * V));
  for (int64_t i = 0; i < k; ++i) {
    const int64_t row = drafts.first + i * drafts.step;
    const int64_t token = drafts.tokens.as<int64_t>()[row];
    tokens[size_t(i)] = token >= 0 && token < V ? int32_t(token) : -1;  // judge_drafts refuses it
    std::memcpy(draft_logits.data() + i * V, drafts.logits.as<float>() + row * V, size_t(V) * sizeof(float));
  }
  const DraftVerdict v = g4::judge_drafts(std::span(target_logits.as<const float>(), size_t((k + 1) * V)), draft_logits,
                                          tokens, V, params.as<const SamplingParams>()[0]);
  verdict.as<int64_t>()[0] = v.accepted;
  verdict.as<int64_t>()[1] = v.token;
}

}  // namespace g4
