#include "backend/cpu/quantized_kv.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "quant/quantize.h"
#include "quant/tq4.h"
#include "util/error.h"
#include "util/half.h"

namespace g4::cpu {

namespace {

// One head's part of a cache row, and how attention reads it.
struct Q8Head {
  static const uint8_t* at(const uint8_t* row, int64_t kvh, int64_t hd, int64_t /*kv_heads*/) {
    return row + kvh * (hd / kQ8BlockSize) * kQ8BlockBytes;
  }
  static void prepare_query(std::span<float> /*q*/) {}
  static double dot(const float* q, const uint8_t* head, int64_t hd) {
    double s = 0;
    for (int64_t b = 0; b < hd / kQ8BlockSize; ++b, head += kQ8BlockBytes) {
      const int8_t* qs = reinterpret_cast<const int8_t*>(head + 2);
      double block = 0;
      for (int64_t i = 0; i < kQ8BlockSize; ++i) block += double(q[b * kQ8BlockSize + i]) * qs[i];
      s += double(f16_to_f32(uint16_t(head[0] | head[1] << 8))) * block;
    }
    return s;
  }
  static void add(float w, const uint8_t* head, int64_t hd, float* acc) {
    for (int64_t b = 0; b < hd / kQ8BlockSize; ++b, head += kQ8BlockBytes) {
      const float wd = w * f16_to_f32(uint16_t(head[0] | head[1] << 8));
      const int8_t* qs = reinterpret_cast<const int8_t*>(head + 2);
      for (int64_t i = 0; i < kQ8BlockSize; ++i) acc[b * kQ8BlockSize + i] += wd * float(qs[i]);
    }
  }
  static void finish_output(std::span<float> /*acc*/) {}
};

// TQ4: `at` is the head's codes; its norm lies after every head's codes.
struct Tq4Head {
  static const uint8_t* at(const uint8_t* row, int64_t kvh, int64_t hd, int64_t /*kv_heads*/) {
    return row + kvh * (hd / 2);
  }
  static float norm_over_d(const uint8_t* codes, int64_t kvh, int64_t hd, int64_t kv_heads) {
    const uint8_t* norm = codes - kvh * (hd / 2) + kv_heads * (hd / 2) + 2 * kvh;
    return bf16_to_f32(uint16_t(norm[0] | norm[1] << 8)) / float(hd);
  }
  static void prepare_query(std::span<float> q) { tq4::rotate(q); }
  static double dot(const float* q_rotated, const uint8_t* codes, int64_t hd) {
    const auto& c = tq4::codebook_f32();
    double s = 0;
    for (int64_t i = 0; i < hd / 2; ++i)
      s += double(q_rotated[2 * i]) * c[codes[i] & 15] + double(q_rotated[2 * i + 1]) * c[codes[i] >> 4];
    return s;
  }
  static void add(float w, const uint8_t* codes, int64_t hd, float* acc) {
    const auto& c = tq4::codebook_f32();
    for (int64_t i = 0; i < hd / 2; ++i) {
      acc[2 * i] += w * c[codes[i] & 15];
      acc[2 * i + 1] += w * c[codes[i] >> 4];
    }
  }
  static void finish_output(std::span<float> acc) { tq4::rotate_back(acc); }
};

template <typename Head>
void attention_jobs(const AttentionArgs& a, int64_t b, int64_t e) {
  const int64_t hd = a.head_dim, kv_heads = a.kv_heads;
  const int64_t pos0 = a.positions.as<int32_t>()[0];
  const int group = a.heads / a.kv_heads;
  const KvCache& cache = *a.cache;
  const size_t row_bytes = cache.k.row_size();
  auto head = [&](const Tensor& rows, int64_t kp, int64_t kvh) {
    return Head::at(rows.as<uint8_t>() + size_t(cache_row(cache, kp)) * row_bytes, kvh, hd, kv_heads);
  };
  // A TQ4 head's norm / d scales its dot product and its value; Q8_0 scales per block inside.
  auto head_scale = [&](const uint8_t* h, int64_t kvh) {
    if constexpr (std::is_same_v<Head, Tq4Head>) return Tq4Head::norm_over_d(h, kvh, hd, kv_heads);
    return 1.0f;
  };
  std::vector<float> q(static_cast<size_t>(hd)), acc(static_cast<size_t>(hd)), scores;
  for (int64_t job = b; job < e; ++job) {
    const int64_t row = job / a.heads, h = job % a.heads, kvh = h / group;
    const int64_t p = pos0 + a.q_first + row;
    const int64_t first = a.window ? std::max<int64_t>(0, p - a.window + 1) : 0;
    std::memcpy(q.data(), a.q.as<float>() + row * a.q.cols + h * hd, size_t(hd) * 4);
    Head::prepare_query(q);
    scores.assign(size_t(p - first + 1), 0.0f);
    float mx = -INFINITY;
    for (int64_t kp = first; kp <= p; ++kp) {
      const uint8_t* k = head(cache.k, kp, kvh);
      const float s = a.scale * float(double(head_scale(k, kvh)) * Head::dot(q.data(), k, hd));
      scores[size_t(kp - first)] = s;
      mx = std::max(mx, s);
    }
    double sum = 0;
    for (float& s : scores) sum += (s = std::exp(s - mx));
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t kp = first; kp <= p; ++kp) {
      const uint8_t* v = head(cache.v, kp, kvh);
      Head::add(float(scores[size_t(kp - first)] / sum) * head_scale(v, kvh), v, hd, acc.data());
    }
    Head::finish_output(acc);
    std::memcpy(a.out.as<float>() + row * a.out.cols + h * hd, acc.data(), size_t(hd) * 4);
  }
}

void encode_q8_0_row(const float* x, int64_t n, uint8_t* row) {
  for (int64_t b = 0; b < n / kQ8BlockSize; ++b, x += kQ8BlockSize, row += kQ8BlockBytes) {
    if (std::all_of(x, x + kQ8BlockSize, [](float v) { return std::isfinite(v); })) {
      encode_row(DType::Q8_0, x, kQ8BlockSize, row);
    } else {
      const uint16_t nan = f32_to_f16(std::numeric_limits<float>::quiet_NaN());
      std::memset(row, 0, size_t(kQ8BlockBytes));
      row[0] = uint8_t(nan), row[1] = uint8_t(nan >> 8);
    }
  }
}

void encode_tq4_row(const float* x, int kv_heads, int hd, uint8_t* row) {
  std::vector<uint8_t> codes(static_cast<size_t>(hd));
  uint8_t* norms = row + int64_t(kv_heads) * (hd / 2);
  for (int h = 0; h < kv_heads; ++h) {
    const uint16_t norm = tq4::encode({x + int64_t(h) * hd, size_t(hd)}, codes);
    tq4::pack_codes(codes, {row + int64_t(h) * (hd / 2), size_t(hd / 2)});
    norms[2 * h] = uint8_t(norm), norms[2 * h + 1] = uint8_t(norm >> 8);
  }
}

}  // namespace

int64_t cache_row(const KvCache& c, int64_t p) {
  const int32_t page = c.table.as<int32_t>()[(p / c.page_positions) % c.table.rows];
  G4_ASSERT(page >= 0, "attention: position " + std::to_string(p) + " has no KV page");
  return page * c.page_stride + p % c.page_positions;
}

void encode_kv_row(DType dtype, const float* x, int kv_heads, int head_dim, uint8_t* row) {
  if (dtype == DType::Q8_0) return encode_q8_0_row(x, int64_t(kv_heads) * head_dim, row);
  G4_ASSERT(dtype == DType::TQ4, "encode_kv_row: " + dtype_name(dtype) + " is not a quantized KV type");
  const size_t bytes = size_t(kv_cache_cols(dtype, kv_heads, head_dim));
  std::memset(row, 0, bytes);  // the padding too: a page's bytes depend on its values alone
  encode_tq4_row(x, kv_heads, head_dim, row);
}

void quantized_attention_jobs(const AttentionArgs& a, int64_t b, int64_t e) {
  if (a.cache->k.dtype == DType::Q8_0) return attention_jobs<Q8Head>(a, b, e);
  G4_ASSERT(a.cache->k.dtype == DType::TQ4, "quantized attention over " + dtype_name(a.cache->k.dtype));
  attention_jobs<Tq4Head>(a, b, e);
}

}  // namespace g4::cpu
