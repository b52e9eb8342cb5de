// Q4_K/Q5_K's 6-bit sub-block scales and mins: 8 sub-blocks, each a scale and a min, in 12 bytes.
// Sub-blocks 0-3 hold their values in the low 6 bits of bytes j (scale) and j+4 (min); sub-blocks
// 4-7 put the low 4 bits in byte j+4 and their top 2 bits in the spare top bits of bytes j-4
// (scale) and j (min). Host and device code (the CPU codecs and the CUDA kernels) share these.
#pragma once
#include <cstdint>
#include <cstring>

#include "util/host_device.h"

namespace g4 {

// Sub-block j's scale and min from the 12 bytes read as three little-endian words (w0 = bytes
// 0-3, ...): word shifts instead of byte indexing, so a GPU thread keeps the bytes in registers
// even when j is only known at run time.
G4_HOST_DEVICE void k_scale_min(int j, uint32_t w0, uint32_t w1, uint32_t w2, int* scale, int* min) {
  const int shift = 8 * (j & 3);
  const uint32_t a = w0 >> shift, b = w1 >> shift, c = w2 >> shift;
  if (j < 4) {
    *scale = int(a & 63);
    *min = int(b & 63);
  } else {
    *scale = int((c & 0xF) | ((a >> 2) & 0x30));
    *min = int(((c >> 4) & 0xF) | ((b >> 2) & 0x30));
  }
}

G4_HOST_DEVICE void k_scale_min(int j, const uint8_t* packed, int* scale, int* min) {
  uint32_t w[3];
  std::memcpy(w, packed, sizeof w);
  k_scale_min(j, w[0], w[1], w[2], scale, min);
}

// Writes sub-block j's scale and min (both < 64); sub-blocks must be written in order 0..7 into
// zeroed bytes.
G4_HOST_DEVICE void set_k_scale_min(int j, uint8_t scale, uint8_t min, uint8_t* packed) {
  if (j < 4) {
    packed[j] = scale;
    packed[j + 4] = min;
  } else {
    packed[j + 4] = uint8_t((scale & 0xF) | ((min & 0xF) << 4));
    packed[j - 4] |= uint8_t((scale >> 4) << 6);
    packed[j] |= uint8_t((min >> 4) << 6);
  }
}

}  // namespace g4
