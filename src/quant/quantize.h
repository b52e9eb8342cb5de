// Row conversions between float32 and the dtypes weights are stored in: F32, F16, BF16 and GGUF's
// block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; block_formats.h), shared by the
// exporter (encode) and the CPU backend (decode).
//
// Block formats are llama.cpp's, bit for bit both ways: decode_row equals its dequantize_row_* and
// encode_row its reference quantizers (quantize_row_*_ref, what llama-quantize uses without an
// importance matrix). E.g. Q8_0: blocks of 32 values, each an f16 scale d = max|x| / 127 followed by
// 32 int8 q = roundf(x * (1 / d)); decoding gives q * f16(d).
#pragma once
#include <cstdint>

#include "util/dtype.h"

namespace g4 {

// Writes n values of `dtype` to `out`. Throws g4::Error for a row length that is not a multiple of
// the block size, or a value the dtype cannot represent: a finite value beyond F16's range, or a
// non-finite value in a block format.
void encode_row(DType dtype, const float* x, int64_t n, void* out);
// Reads n values of `dtype` into float32 (n a multiple of the block size). A block whose scale is
// NaN/inf decodes to non-finite values; loaders check with first_nonfinite_block.
void decode_row(DType dtype, const void* in, int64_t n, float* out);
// Index of the first block of a row of n values whose scale or minimum is NaN/inf, or -1 (always -1
// for element types).
int64_t first_nonfinite_block(DType dtype, const void* in, int64_t n);

}  // namespace g4
