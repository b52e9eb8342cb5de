#include "backend/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/hot_loop.h"
#include "quant/quantize.h"
#include "quant/tq4.h"
#include "util/error.h"
#include "util/half.h"

namespace g4::cpu {

namespace {

// The quantized dot products accumulate in cpu::dot's kDotLanes double sums.
static_assert(kQ8BlockSize % kDotLanes == 0);
double sum_lanes(const double (&lanes)[kDotLanes]) {
  double s = 0;
  for (double v : lanes) s += v;
  return s;
}

// How attention reads one head's part of a K or V row of each type: `at` finds it in a row, `scale`
// is what its dot product and its value are multiplied by (TQ4's norm / d), `dot` and `add` take a
// query prepared by `prepare_query`, and `finish_output` turns the weighted sum into the output.
struct F32Head {
  static const uint8_t* at(const uint8_t* row, int64_t kvh, int64_t hd, int64_t /*kv_heads*/) {
    return row + kvh * hd * 4;
  }
  static float scale(const uint8_t*, int64_t, int64_t, int64_t) { return 1.0f; }
  static void prepare_query(std::span<float> /*q*/) {}
  static double dot(const float* q, const uint8_t* head, int64_t hd) {
    return cpu::dot(q, reinterpret_cast<const float*>(head), hd);
  }
  static void add(float w, const uint8_t* head, int64_t hd, float* acc) {
    const float* v = reinterpret_cast<const float*>(head);
    for (int64_t i = 0; i < hd; ++i) acc[i] += w * v[i];
  }
  static void finish_output(std::span<float> /*acc*/) {}
};

struct Q8Head {
  static const uint8_t* at(const uint8_t* row, int64_t kvh, int64_t hd, int64_t /*kv_heads*/) {
    return row + kvh * (hd / kQ8BlockSize) * kQ8BlockBytes;
  }
  static float scale(const uint8_t*, int64_t, int64_t, int64_t) { return 1.0f; }
  static void prepare_query(std::span<float> /*q*/) {}
  static double dot(const float* q, const uint8_t* head, int64_t hd) {
    double s = 0;
    for (int64_t b = 0; b < hd / kQ8BlockSize; ++b, head += kQ8BlockBytes) {
      const int8_t* qs = reinterpret_cast<const int8_t*>(head + 2);
      double lanes[kDotLanes] = {};  // independent sums, so the loop vectorises (as cpu::dot)
      for (int64_t i = 0; i < kQ8BlockSize; i += kDotLanes)
        for (int j = 0; j < kDotLanes; ++j) lanes[j] += double(q[b * kQ8BlockSize + i + j]) * qs[i + j];
      s += double(f16_to_f32(uint16_t(head[0] | head[1] << 8))) * sum_lanes(lanes);
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
  static float scale(const uint8_t* codes, int64_t kvh, int64_t hd, int64_t kv_heads) {
    const uint8_t* norm = codes - kvh * (hd / 2) + kv_heads * (hd / 2) + 2 * kvh;
    return bf16_to_f32(uint16_t(norm[0] | norm[1] << 8)) / float(hd);
  }
  static void prepare_query(std::span<float> q) { tq4::rotate(q); }
  static double dot(const float* q_rotated, const uint8_t* codes, int64_t hd) {
    const auto& c = tq4::codebook_f32();
    double lanes[kDotLanes] = {};  // independent sums, so the loop vectorises (as cpu::dot)
    int64_t i = 0;
    for (; i + kDotLanes <= hd; i += kDotLanes, codes += kDotLanes / 2)
      for (int j = 0; j < kDotLanes; j += 2) {
        lanes[j] += double(q_rotated[i + j]) * c[codes[j / 2] & 15];
        lanes[j + 1] += double(q_rotated[i + j + 1]) * c[codes[j / 2] >> 4];
      }
    for (; i < hd; i += 2, ++codes)
      lanes[0] += double(q_rotated[i]) * c[codes[0] & 15] + double(q_rotated[i + 1]) * c[codes[0] >> 4];
    return sum_lanes(lanes);
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

// The jobs [b, e) with rows of one type; row_of(rows, fresh, kp) is the K or V row of position kp.
template <typename Head, typename RowOf>
[[gnu::always_inline]] inline void jobs_of(const AttentionArgs& a, int64_t b, int64_t e, RowOf row_of) {
  const int64_t hd = a.head_dim, kv_heads = a.kv_heads;
  const int64_t pos0 = a.positions.as<int32_t>()[0];
  const int group = a.heads / a.kv_heads;
  std::vector<float> q(static_cast<size_t>(hd)), acc(static_cast<size_t>(hd)), scores;
  for (int64_t job = b; job < e; ++job) {
    const int64_t row = job / a.heads, h = job % a.heads, kvh = h / group;
    const int64_t p = pos0 + a.q_first + row, last = a.reads_cache_only ? pos0 - 1 : p;
    const int64_t first = a.window ? std::max<int64_t>(0, p - a.window + 1) : 0;
    std::memcpy(q.data(), a.q.as<float>() + row * a.q.cols + h * hd, size_t(hd) * 4);
    Head::prepare_query(q);
    scores.assign(size_t(last - first + 1), 0.0f);
    float mx = -INFINITY;
    for (int64_t kp = first; kp <= last; ++kp) {
      const uint8_t* k = Head::at(row_of(a.cache->k, a.k_new, kp), kvh, hd, kv_heads);
      const float s = a.scale * float(double(Head::scale(k, kvh, hd, kv_heads)) * Head::dot(q.data(), k, hd));
      scores[size_t(kp - first)] = s;
      mx = std::max(mx, s);
    }
    double sum = 0;
    for (float& s : scores) sum += (s = std::exp(s - mx));
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t kp = first; kp <= last; ++kp) {
      const uint8_t* v = Head::at(row_of(a.cache->v, a.v_new, kp), kvh, hd, kv_heads);
      Head::add(float(scores[size_t(kp - first)] / sum) * Head::scale(v, kvh, hd, kv_heads), v, hd, acc.data());
    }
    Head::finish_output(acc);
    std::memcpy(a.out.as<float>() + row * a.out.cols + h * hd, acc.data(), size_t(hd) * 4);
  }
}

// Unquantized: positions before the chunk from the cache, the chunk's own from its K/V rows.
G4_HOT_LOOP void f32_jobs(const AttentionArgs& a, int64_t b, int64_t e) {
  const int64_t pos0 = a.positions.as<int32_t>()[0];
  jobs_of<F32Head>(a, b, e, [&](const Tensor& cached, const Tensor& fresh, int64_t kp) {
    const Tensor& rows = kp >= pos0 ? fresh : cached;
    return rows.as<uint8_t>() + size_t(kp >= pos0 ? kp - pos0 : cache_row(*a.cache, kp)) * rows.row_size();
  });
}

// Quantized: every position from the cache, which already holds the chunk.
template <typename Head>
[[gnu::always_inline]] inline void cached_jobs(const AttentionArgs& a, int64_t b, int64_t e) {
  jobs_of<Head>(a, b, e, [&](const Tensor& cached, const Tensor& /*fresh*/, int64_t kp) {
    return cached.as<uint8_t>() + size_t(cache_row(*a.cache, kp)) * cached.row_size();
  });
}
G4_HOT_LOOP void q8_0_jobs(const AttentionArgs& a, int64_t b, int64_t e) { cached_jobs<Q8Head>(a, b, e); }
G4_HOT_LOOP void tq4_jobs(const AttentionArgs& a, int64_t b, int64_t e) { cached_jobs<Tq4Head>(a, b, e); }

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

void attention_jobs(const AttentionArgs& a, int64_t b, int64_t e) {
  switch (a.cache->k.dtype) {
    case DType::F32: return f32_jobs(a, b, e);
    case DType::Q8_0: return q8_0_jobs(a, b, e);
    case DType::TQ4: return tq4_jobs(a, b, e);
    default: throw Error(ErrorKind::kInternal, "cpu attention over " + dtype_name(a.cache->k.dtype) + " KV rows");
  }
}

}  // namespace g4::cpu
