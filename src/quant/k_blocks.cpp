// The K-quants: super-blocks of 256 weights with per-sub-block scales.
//   Q4_K / Q5_K: d, dmin (f16), 12 bytes of 6-bit scales/mins for 8 sub-blocks of 32 (quant/k_scales.h),
//     [Q5_K: qh, 32 bytes: bit 2c / 2c+1 of qh[l] is the 5th bit of weight l / l+32 of chunk c],
//     qs, 128 bytes: chunk c of 64 weights keeps weight l in the low nibble of byte 32c+l and
//     weight 32+l in the high nibble. w = d·scale·q − dmin·min.
//   Q6_K: ql (128 bytes), qh (64), 16 int8 scales (one per 16 weights), d (f16); w = d·scale·(q − 32).
// The encoders are llama.cpp's reference algorithms, operation for operation in the same order and
// float precision, so their output is bit-identical: make_qkx2_quants (a search over 21 or 16
// candidate scales for the best weighted fit with a minimum) for Q4_K/Q5_K, make_qx_quants (19
// candidate scales around max/32, weights x²) for Q6_K.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/block_common.h"
#include "quant/k_scales.h"

namespace g4::quant {
namespace {

constexpr int kSuper = 256;
constexpr int kSub = 32;
constexpr float kGroupMaxEps = 1e-15f;  // below this a group counts as all zero

// Fits x ≈ scale·L − min_out (L in 0..nmax, min_out ≥ 0) minimising Σ weights·diff²: the plain
// max/min fit first, then nstep+1 candidate scales (nmax + rmin + rdelta·is)/(max − min), each
// refined by weighted least squares, keeping the best. Returns the scale.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* min_out,
                       uint8_t* Laux, float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *min_out = -min;
    return 0.0f;
  }
  float iscale = float(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = uint8_t(std::max(0, std::min(nmax, l)));
    const float diff = scale * float(L[i]) + min - x[i];
    best_error += weights[i] * (diff * diff);
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * float(is) + float(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - min))));
      Laux[i] = uint8_t(l);
      const float w = weights[i];
      sum_l += w * float(l);
      sum_l2 += w * float(l) * float(l);
      sum_xl += w * float(l) * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * float(Laux[i]) + this_min - x[i];
        cur_error += weights[i] * (diff * diff);
      }
      if (cur_error < best_error) {
        std::memcpy(L, Laux, size_t(n));
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *min_out = -min;
  return scale;
}

// Q4_K (kBits 4) and Q5_K (kBits 5).
template <int kBits>
struct KBlock {
  static constexpr int kMax = (1 << kBits) - 1;
  static constexpr int kScales = 4;
  static constexpr int kHigh = 16;                              // Q5_K's qh
  static constexpr int kQs = kBits == 5 ? kHigh + 32 : kHigh;   // the nibbles
  static constexpr size_t kBytes = size_t(kQs) + kSuper / 2;

  static void encode(const float* x, uint8_t* block) {
    uint8_t L[kSuper], Laux[kSub];
    float weights[kSub], mins[8], scales[8];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      const float* xs = x + kSub * j;
      float sum_x2 = 0;
      for (int l = 0; l < kSub; ++l) sum_x2 += xs[l] * xs[l];
      const float av_x = std::sqrt(sum_x2 / float(kSub));
      for (int l = 0; l < kSub; ++l) weights[l] = av_x + std::fabs(xs[l]);
      scales[j] = kBits == 4 ? make_qkx2_quants(kSub, kMax, xs, weights, L + kSub * j, &mins[j], Laux, -1.0f, 0.1f, 20)
                             : make_qkx2_quants(kSub, kMax, xs, weights, L + kSub * j, &mins[j], Laux, -0.5f, 0.1f, 15);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    // Scales and mins become 6-bit multiples of d = max_scale/63 and dmin = max_min/63.
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    uint8_t* packed = block + kScales;
    std::memset(packed, 0, 12);
    for (int j = 0; j < 8; ++j) {
      // uint8_t first, then the clamp: the reference's order (it matters only for huge ratios).
      const uint8_t ls = std::min<uint8_t>(63, uint8_t(nearest_int(inv_scale * scales[j])));
      const uint8_t lm = std::min<uint8_t>(63, uint8_t(nearest_int(inv_min * mins[j])));
      set_k_scale_min(j, ls, lm, packed);
    }
    store_f16(block, max_scale / 63.0f);
    store_f16(block + 2, max_min / 63.0f);
    // Requantise against the rounded scales; a sub-block whose scale rounded to 0 keeps the search's L.
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      k_scale_min(j, packed, &sc, &m);
      const float d = load_f16(block) * float(sc);
      if (!d) continue;
      const float dm = load_f16(block + 2) * float(m);
      for (int i = 0; i < kSub; ++i)
        L[kSub * j + i] = uint8_t(std::max(0, std::min(kMax, nearest_int((x[kSub * j + i] + dm) / d))));
    }
    uint8_t low[kSuper];
    for (int i = 0; i < kSuper; ++i) low[i] = L[i] & 0xF;
    for (int c = 0; c < 4; ++c) pack_nibbles(low + 64 * c, low + 64 * c + 32, 32, block + kQs + 32 * c);
    if constexpr (kBits == 5) {
      uint8_t* qh = block + kHigh;
      std::memset(qh, 0, 32);
      for (int i = 0; i < kSuper; ++i) qh[i % 32] |= uint8_t((L[i] >> 4) << (i / 32));
    }
  }

  static void decode(const uint8_t* block, float* out) {
    const float d = load_f16(block);
    const float dmin = load_f16(block + 2);
    uint8_t q[kSuper];
    for (int c = 0; c < 4; ++c) unpack_nibbles(block + kQs + 32 * c, 32, q + 64 * c, q + 64 * c + 32);
    if constexpr (kBits == 5) {
      const uint8_t* qh = block + kHigh;
      for (int i = 0; i < kSuper; ++i) q[i] |= uint8_t(((qh[i % 32] >> (i / 32)) & 1) << 4);
    }
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      k_scale_min(j, block + kScales, &sc, &m);
      const float scale = d * float(sc);
      const float min = dmin * float(m);
      for (int i = 0; i < kSub; ++i) out[kSub * j + i] = scale * float(q[kSub * j + i]) - min;
    }
  }

  static bool finite(const uint8_t* block) { return f16_finite(block) && f16_finite(block + 2); }

  static constexpr BlockCodec codec() { return {kSuper, kBytes, &encode, &decode, &finite}; }
};

// Q6_K's per-16 fit: L = nmax + round(iscale·x) in 0..2·nmax−1 for 19 candidate iscales around
// −nmax/max, keeping the one whose least-squares scale (weights x²) explains x best.
float make_qx_quants(int n, int nmax, const float* x, uint8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::memset(L, 0, size_t(n));
    return 0.0f;
  }
  auto quant = [&](float iscale, int i) { return std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i]))); };
  float iscale = float(-nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = quant(iscale, i);
    L[i] = uint8_t(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * float(l);
    suml2 += w * float(l) * float(l);
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(float(nmax) + 0.1f * float(is)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = quant(iscale, i);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * float(l);
      suml2 += w * float(l) * float(l);
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = uint8_t(quant(iscale, i) + nmax);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Q6_K keeps weight k of a 128-weight half h (k = 32g + l, g = 0..3) in nibble g/2 of ql[64h + 32(g%2) + l]
// and in bits 2g..2g+1 of qh[32h + l]; its scale is scales[k_global / 16].
struct Q6K {
  static constexpr int kQl = 0, kQh = 128, kScales = 192, kD = 208;

  static void encode(const float* x, uint8_t* block) {
    uint8_t L[kSuper];
    float scales[16];
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < 16; ++ib) {
      scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
      if (std::fabs(scales[ib]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[ib]);
        max_scale = scales[ib];
      }
    }
    std::memset(block, 0, 210);
    if (max_abs_scale < kGroupMaxEps) return;  // all zero: d = 0
    const float iscale = -128.0f / max_scale;
    store_f16(block + kD, 1 / iscale);
    int8_t* sc = reinterpret_cast<int8_t*>(block + kScales);
    for (int ib = 0; ib < 16; ++ib) sc[ib] = int8_t(std::min(127, nearest_int(iscale * scales[ib])));
    for (int j = 0; j < 16; ++j) {
      const float d = load_f16(block + kD) * float(sc[j]);
      if (!d) continue;
      for (int i = 0; i < 16; ++i)
        L[16 * j + i] = uint8_t(std::max(-32, std::min(31, nearest_int(x[16 * j + i] / d))) + 32);
    }
    for (int k = 0; k < kSuper; ++k) {
      const int h = k / 128, g = (k % 128) / 32, l = k % 32;
      block[kQl + 64 * h + 32 * (g % 2) + l] |= uint8_t((L[k] & 0xF) << (4 * (g / 2)));
      block[kQh + 32 * h + l] |= uint8_t((L[k] >> 4) << (2 * g));
    }
  }

  static void decode(const uint8_t* block, float* out) {
    const float d = load_f16(block + kD);
    const int8_t* sc = reinterpret_cast<const int8_t*>(block + kScales);
    for (int k = 0; k < kSuper; ++k) {
      const int h = k / 128, g = (k % 128) / 32, l = k % 32;
      const int low = (block[kQl + 64 * h + 32 * (g % 2) + l] >> (4 * (g / 2))) & 0xF;
      const int high = (block[kQh + 32 * h + l] >> (2 * g)) & 3;
      out[k] = d * float(sc[k / 16]) * float((low | high << 4) - 32);
    }
  }

  static bool finite(const uint8_t* block) { return f16_finite(block + kD); }
};

}  // namespace

const BlockCodec kQ4_KCodec = KBlock<4>::codec();
const BlockCodec kQ5_KCodec = KBlock<5>::codec();
const BlockCodec kQ6_KCodec{kSuper, 210, &Q6K::encode, &Q6K::decode, &Q6K::finite};

}  // namespace g4::quant
