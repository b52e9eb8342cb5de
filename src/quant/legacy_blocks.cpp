// The 32-weight formats: Q8_0, and Q4_0/Q4_1/Q5_0/Q5_1 (4 or 5 bits a weight; "_0" symmetric with
// an f16 scale d, w = d·(q − 2^(bits−1)); "_1" with a scale and an f16 minimum m, w = d·q + m).
// Layout of the 4/5-bit ones: d, [m], [qh: bit k = 5th bit of weight k, little endian], qs: byte j
// holds weight j in its low nibble and weight j+16 in its high nibble.
#include <cfloat>
#include <cmath>

#include "quant/block_common.h"

namespace g4::quant {
namespace {

constexpr int kBlock = 32;

void encode_q8_0(const float* x, uint8_t* block) {
  float amax = 0.0f;
  for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(block, d);
  int8_t* q = reinterpret_cast<int8_t*>(block + 2);
  for (int i = 0; i < kBlock; ++i) q[i] = int8_t(std::roundf(x[i] * inverse));
}

void decode_q8_0(const uint8_t* block, float* out) {
  const float d = load_f16(block);
  const int8_t* q = reinterpret_cast<const int8_t*>(block + 2);
  for (int i = 0; i < kBlock; ++i) out[i] = float(q[i]) * d;
}

bool q8_0_finite(const uint8_t* block) { return f16_finite(block); }

// Q4_0, Q4_1, Q5_0, Q5_1 differ only in the bit count and whether a minimum is stored.
template <int kBits, bool kHasMin>
struct SmallBlock {
  static constexpr int kMax = (1 << kBits) - 1;
  static constexpr int kOffset = kHasMin ? 0 : 1 << (kBits - 1);  // the stored q of a zero weight
  static constexpr int kHighBits = kHasMin ? 4 : 2;                // offset of qh (5-bit types)
  static constexpr int kQs = kHighBits + (kBits == 5 ? 4 : 0);     // offset of the nibbles

  static void encode(const float* x, uint8_t* block) {
    uint8_t q[kBlock];
    if constexpr (kHasMin) {
      float min = FLT_MAX, max = -FLT_MAX;
      for (int i = 0; i < kBlock; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
      }
      const float d = (max - min) / float(kMax);
      const float inverse = d ? 1.0f / d : 0.0f;
      store_f16(block, d);
      store_f16(block + 2, min);
      for (int i = 0; i < kBlock; ++i) {
        const float v = (x[i] - min) * inverse + 0.5f;
        // The reference clamps Q4_1 but not Q5_1 (whose v stays below 32 anyway); same casts here.
        q[i] = kBits == 4 ? uint8_t(std::min(kMax, int(int8_t(v)))) : uint8_t(v);
      }
    } else {
      // d comes from the signed value of largest magnitude (the first one on ties), so that value
      // maps to q = 0 exactly and the other side gets the extra level.
      float amax = 0.0f, max = 0.0f;
      for (int i = 0; i < kBlock; ++i) {
        if (amax < std::fabs(x[i])) {
          amax = std::fabs(x[i]);
          max = x[i];
        }
      }
      const float d = max / float(-kOffset);
      const float inverse = d ? 1.0f / d : 0.0f;
      store_f16(block, d);
      for (int i = 0; i < kBlock; ++i) q[i] = uint8_t(std::min(kMax, int(int8_t(x[i] * inverse + (kOffset + 0.5f)))));
    }
    pack_nibbles(q, q + kBlock / 2, kBlock / 2, block + kQs);
    if constexpr (kBits == 5) {
      uint8_t* qh = block + kHighBits;
      for (int b = 0; b < 4; ++b) qh[b] = 0;
      for (int i = 0; i < kBlock; ++i) qh[i / 8] |= uint8_t(((q[i] >> 4) & 1) << (i % 8));
    }
  }

  static void decode(const uint8_t* block, float* out) {
    const float d = load_f16(block);
    uint8_t q[kBlock];
    unpack_nibbles(block + kQs, kBlock / 2, q, q + kBlock / 2);
    if constexpr (kBits == 5) {
      const uint8_t* qh = block + kHighBits;
      for (int i = 0; i < kBlock; ++i) q[i] |= uint8_t(((qh[i / 8] >> (i % 8)) & 1) << 4);
    }
    if constexpr (kHasMin) {
      const float m = load_f16(block + 2);
      for (int i = 0; i < kBlock; ++i) out[i] = float(q[i]) * d + m;
    } else {
      for (int i = 0; i < kBlock; ++i) out[i] = float(int(q[i]) - kOffset) * d;
    }
  }

  static bool finite(const uint8_t* block) { return f16_finite(block) && (!kHasMin || f16_finite(block + 2)); }

  static constexpr BlockCodec codec() {
    return {kBlock, size_t(kQs + kBlock / 2), &encode, &decode, &finite};
  }
};

}  // namespace

const BlockCodec kQ8_0Codec{kBlock, 2 + kBlock, &encode_q8_0, &decode_q8_0, &q8_0_finite};
const BlockCodec kQ4_0Codec = SmallBlock<4, false>::codec();
const BlockCodec kQ4_1Codec = SmallBlock<4, true>::codec();
const BlockCodec kQ5_0Codec = SmallBlock<5, false>::codec();
const BlockCodec kQ5_1Codec = SmallBlock<5, true>::codec();

}  // namespace g4::quant
