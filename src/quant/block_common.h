// Pieces the block codecs share (internal to src/quant/): f16 fields at unaligned addresses,
// llama.cpp's rounding and nibble packing (the K-quants' 6-bit scales are in quant/k_scales.h).
#pragma once
#include <cstdint>
#include <cstring>

#include "quant/block_formats.h"
#include "util/half.h"

namespace g4::quant {

// Blocks are packed back to back (18, 22, 210 bytes...), so fields go through memcpy.
inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}
inline void store_f16(uint8_t* p, float x) {
  const uint16_t h = f32_to_f16(x);
  std::memcpy(p, &h, 2);
}
inline bool f16_finite(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return (h & 0x7c00u) != 0x7c00u;
}

// Round to nearest, ties to even, by adding 1.5 * 2^23 so the float unit rounds: the K-quant
// reference uses this exact trick, and results must match it for every input it can see
// (|x| < 2^22).
inline int nearest_int(float x) {
  const float shifted = x + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, 4);
  return (bits & 0x007fffff) - 0x00400000;
}

// out[i] = lo[i] | hi[i] << 4 (values < 16): every 4-bit layout puts one run of weights in the low
// nibbles and the next run in the high nibbles.
inline void pack_nibbles(const uint8_t* lo, const uint8_t* hi, int n, uint8_t* out) {
  for (int i = 0; i < n; ++i) out[i] = uint8_t((lo[i] & 0xF) | (hi[i] << 4));
}
inline void unpack_nibbles(const uint8_t* in, int n, uint8_t* lo, uint8_t* hi) {
  for (int i = 0; i < n; ++i) {
    lo[i] = in[i] & 0xF;
    hi[i] = in[i] >> 4;
  }
}

// The codecs of each family (legacy_blocks.cpp, k_blocks.cpp), for block_codec's table.
extern const BlockCodec kQ8_0Codec, kQ4_0Codec, kQ4_1Codec, kQ5_0Codec, kQ5_1Codec;
extern const BlockCodec kQ4_KCodec, kQ5_KCodec, kQ6_KCodec;

}  // namespace g4::quant
