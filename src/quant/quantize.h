// Row conversions between float32 and the dtypes weights are stored in (F32, F16, BF16, Q8_0),
// shared by the exporter (encode) and the CPU backend (decode).
//
// Q8_0 is GGUF's, as llama.cpp's reference quantiser defines it: blocks of 32 values, each an f16
// scale d = max|x| / 127 followed by 32 int8 q = roundf(x * (1 / d)) (all zero when max|x| = 0).
// Decoding gives q * f16(d), so |x - x̂| <= d/2 + 127 * |d - f16(d)| per value.
#pragma once
#include <cstdint>

#include "util/dtype.h"

namespace g4 {

// Writes n values of `dtype` to `out` (Q8_0 needs n % 32 == 0). Throws g4::Error for a value the
// dtype cannot represent: a finite value beyond F16's range, or a non-finite value in Q8_0.
void encode_row(DType dtype, const float* x, int64_t n, void* out);
// Reads n values of `dtype` into float32.
void decode_row(DType dtype, const void* in, int64_t n, float* out);

}  // namespace g4
