#include "quant/random_blocks.h"

#include <cmath>
#include <string>

#include "util/error.h"
#include "util/half.h"

namespace g4 {

RandomBlockScales random_block_scales(DType t, float spread) {
  G4_CHECK(std::isfinite(spread) && spread > 0.0f, "random blocks need a positive spread");
  // What random_block draws: sub-block scales and mins of Q4_K/Q5_K in 32..63 (about 48), Q6_K's
  // scales in 64..127 (about 96); quants uniform over their range.
  float d = 0.0f, m = 0.0f;
  switch (t) {
    case DType::Q8_0: d = spread / 127.0f; break;                     // d·q, q in -128..127
    case DType::Q4_0: d = spread / 8.0f; break;                       // d·(q - 8), q in 0..15
    case DType::Q5_0: d = spread / 16.0f; break;                      // d·(q - 16), q in 0..31
    case DType::Q4_1: d = 2.0f * spread / 15.0f, m = -spread; break;  // d·q + m
    case DType::Q5_1: d = 2.0f * spread / 31.0f, m = -spread; break;
    case DType::Q4_K: d = 2.0f * spread / (15.0f * 48.0f), m = spread / 48.0f; break;  // d·sc·q - dmin·min
    case DType::Q5_K: d = 2.0f * spread / (31.0f * 48.0f), m = spread / 48.0f; break;
    case DType::Q6_K: d = spread / (32.0f * 96.0f); break;            // d·sc·(q - 32)
    default: throw Error(ErrorKind::kInternal, "random blocks: " + dtype_name(t) + " is not a block-quantized type");
  }
  const RandomBlockScales scales{f32_to_f16(d), f32_to_f16(m)};
  G4_CHECK((scales.d & 0x7fff) != 0, "random " + dtype_name(t) + " blocks: spread " + std::to_string(spread) +
                                         " is too small for an f16 scale");
  return scales;
}

}  // namespace g4
