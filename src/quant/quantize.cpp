#include "quant/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "util/error.h"
#include "util/half.h"

namespace g4 {

namespace {

void encode_q8_0_block(const float* x, uint8_t* block) {
  float amax = 0.0f;
  for (int64_t i = 0; i < kQ8BlockSize; ++i) {
    G4_CHECK(std::isfinite(x[i]), "Q8_0 cannot hold the non-finite value " + std::to_string(x[i]));
    amax = std::max(amax, std::fabs(x[i]));
  }
  const float d = amax / 127.0f;
  const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t d16 = f32_to_f16(d);
  std::memcpy(block, &d16, 2);
  int8_t* q = reinterpret_cast<int8_t*>(block + 2);
  for (int64_t i = 0; i < kQ8BlockSize; ++i) q[i] = int8_t(std::roundf(x[i] * inverse));
}

void decode_q8_0_block(const uint8_t* block, float* out) {
  uint16_t d16;
  std::memcpy(&d16, block, 2);
  const float d = f16_to_f32(d16);
  const int8_t* q = reinterpret_cast<const int8_t*>(block + 2);
  for (int64_t i = 0; i < kQ8BlockSize; ++i) out[i] = d * float(q[i]);
}

uint16_t encode_f16(float x) {
  const uint16_t h = f32_to_f16(x);
  G4_CHECK(!std::isfinite(x) || (h & 0x7c00u) != 0x7c00u,
           "the value " + std::to_string(x) + " is outside the F16 range (use bf16 or f32)");
  return h;
}

// Rows may start at any byte (safetensors offsets and GGUF alignment 1 allow odd addresses), so
// 16-bit values go through memcpy, never through a uint16_t pointer; compilers emit plain loads.
void store_u16(void* row, int64_t i, uint16_t v) { std::memcpy(static_cast<uint8_t*>(row) + 2 * i, &v, 2); }
uint16_t load_u16(const void* row, int64_t i) {
  uint16_t v;
  std::memcpy(&v, static_cast<const uint8_t*>(row) + 2 * i, 2);
  return v;
}

}  // namespace

void encode_row(DType dtype, const float* x, int64_t n, void* out) {
  switch (dtype) {
    case DType::F32: std::memcpy(out, x, size_t(n) * 4); return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) store_u16(out, i, f32_to_bf16(x[i]));
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) store_u16(out, i, encode_f16(x[i]));
      return;
    case DType::Q8_0:
      G4_CHECK(n % kQ8BlockSize == 0, "Q8_0 rows need a multiple of 32 elements, got " + std::to_string(n));
      for (int64_t b = 0; b < n / kQ8BlockSize; ++b)
        encode_q8_0_block(x + b * kQ8BlockSize, static_cast<uint8_t*>(out) + b * kQ8BlockBytes);
      return;
    default: throw Error("cannot store weights as " + dtype_name(dtype));
  }
}

void decode_row(DType dtype, const void* in, int64_t n, float* out) {
  switch (dtype) {
    case DType::F32: std::memcpy(out, in, size_t(n) * 4); return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(load_u16(in, i));
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(load_u16(in, i));
      return;
    case DType::Q8_0:
      for (int64_t b = 0; b < n / kQ8BlockSize; ++b)
        decode_q8_0_block(static_cast<const uint8_t*>(in) + b * kQ8BlockBytes, out + b * kQ8BlockSize);
      return;
    default: throw Error("cannot use a " + dtype_name(dtype) + " tensor as a weight");
  }
}

}  // namespace g4
