#include "quant/quantize.h"

#include <cmath>
#include <cstring>

#include "quant/block_formats.h"
#include "util/error.h"
#include "util/half.h"

namespace g4 {

namespace {

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

const BlockCodec& codec_for_row(DType dtype, int64_t n, bool encoding) {
  const BlockCodec* codec = block_codec(dtype);
  if (!codec)
    throw Error(encoding ? "cannot store weights as " + dtype_name(dtype)
                         : "cannot use a " + dtype_name(dtype) + " tensor as a weight");
  G4_CHECK(n % codec->block_size == 0, dtype_name(dtype) + " rows need a multiple of " +
                                           std::to_string(codec->block_size) + " elements, got " + std::to_string(n));
  return *codec;
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
    default: break;
  }
  const BlockCodec& codec = codec_for_row(dtype, n, true);
  for (int64_t i = 0; i < n; ++i)
    G4_CHECK(std::isfinite(x[i]), dtype_name(dtype) + " cannot hold the non-finite value " + std::to_string(x[i]));
  for (int64_t b = 0; b < n / codec.block_size; ++b)
    codec.encode(x + b * codec.block_size, static_cast<uint8_t*>(out) + b * codec.block_bytes);
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
    default: break;
  }
  const BlockCodec& codec = codec_for_row(dtype, n, false);
  for (int64_t b = 0; b < n / codec.block_size; ++b)
    codec.decode(static_cast<const uint8_t*>(in) + b * codec.block_bytes, out + b * codec.block_size);
}

int64_t first_nonfinite_block(DType dtype, const void* in, int64_t n) {
  const BlockCodec* codec = block_codec(dtype);
  if (!codec) return -1;
  for (int64_t b = 0; b < n / codec->block_size; ++b)
    if (!codec->scales_finite(static_cast<const uint8_t*>(in) + b * codec->block_bytes)) return b;
  return -1;
}

}  // namespace g4
