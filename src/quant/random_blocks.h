// Random GGUF blocks for synthetic weights (`g4 bench --synthetic 31b --weights q4_k_m`): quant
// bytes from the counter hash, sub-block scales random in a narrow range, block scales chosen so
// the weights spread over about [-spread, spread]. Host and device make the same bytes for the
// same (seed, block index), so every backend holds the same weights (Backend::fill_uniform).
#pragma once
#include <cstdint>

#include "quant/k_scales.h"
#include "util/dtype.h"
#include "util/host_device.h"
#include "util/uniform_hash.h"

namespace g4 {

// A tensor's block scales as f16 bits, the same in every block: d, and m = Q4_1/Q5_1's minimum or
// the K-quants' dmin (0 for the other types).
struct RandomBlockScales {
  uint16_t d = 0, m = 0;
};

// Scales for weights of type t (block-quantized) spread over about [-spread, spread]; throws
// g4::Error when spread is not positive or too small for an f16 scale.
RandomBlockScales random_block_scales(DType t, float spread);

// Writes block `index` of a random tensor of block type t: block_bytes(t) bytes at `out`.
G4_HOST_DEVICE void random_block(DType t, RandomBlockScales scales, uint64_t seed, uint64_t index, uint8_t* out) {
  uint64_t counter = index * 32;  // 32 hashes (256 bytes) per block, more than any block needs
  auto random_bytes = [&](uint8_t* dst, int n) {
    for (int i = 0; i < n; i += 8) {
      const uint64_t bits = hash_bits(seed, counter++);
      for (int k = 0; k < 8 && i + k < n; ++k) dst[i + k] = uint8_t(bits >> (8 * k));
    }
  };
  auto put_f16 = [](uint8_t* p, uint16_t h) {
    p[0] = uint8_t(h);
    p[1] = uint8_t(h >> 8);
  };
  uint8_t sub[16];  // random bits for the sub-block scales
  switch (t) {
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q5_0:  // d, then random qh and quants
      put_f16(out, scales.d);
      random_bytes(out + 2, t == DType::Q8_0 ? 32 : t == DType::Q4_0 ? 16 : 20);
      break;
    case DType::Q4_1:
    case DType::Q5_1:  // d, m, then random qh and quants
      put_f16(out, scales.d);
      put_f16(out + 2, scales.m);
      random_bytes(out + 4, t == DType::Q4_1 ? 16 : 20);
      break;
    case DType::Q4_K:
    case DType::Q5_K:  // d, dmin, scales and mins in 32..63, then random qh and quants
      put_f16(out, scales.d);
      put_f16(out + 2, scales.m);
      random_bytes(sub, 16);
      for (int i = 4; i < 16; ++i) out[i] = 0;
      for (int j = 0; j < 8; ++j) set_k_scale_min(j, uint8_t(32 + (sub[j] & 31)), uint8_t(32 + (sub[8 + j] & 31)), out + 4);
      random_bytes(out + 16, t == DType::Q4_K ? 128 : 160);
      break;
    case DType::Q6_K:  // random ql and qh, int8 scales in 64..127, d
      random_bytes(out, 192);
      random_bytes(sub, 16);
      for (int i = 0; i < 16; ++i) out[192 + i] = uint8_t(64 + (sub[i] & 63));
      put_f16(out + 208, scales.d);
      break;
    default: break;
  }
}

}  // namespace g4
