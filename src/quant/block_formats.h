// GGUF's block formats (llama.cpp's ggml types Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K): one
// codec per type that encodes and decodes a single block. Decoding is bit-identical to llama.cpp's
// dequantize_row_*; encoding follows its reference quantizers (quantize_row_*_ref) operation by
// operation, so it is bit-identical too (tests/test_quant.cpp checks both against llama.cpp's
// output). quantize.h is the row-level entry point.
#pragma once
#include <cstddef>
#include <cstdint>

#include "util/dtype.h"

namespace g4 {

struct BlockCodec {
  int64_t block_size;  // weights a block holds
  size_t block_bytes;
  // x: block_size finite floats. Blocks may start at any byte address.
  void (*encode)(const float* x, uint8_t* block);
  void (*decode)(const uint8_t* block, float* out);
  // False when a scale (or min) of the block is NaN or infinite: such a block decodes to NaN/inf
  // weights, so loaders reject it instead of computing garbage.
  bool (*scales_finite)(const uint8_t* block);
};

// The codec of a block-quantized dtype; nullptr for element types (F32, F16, ...).
const BlockCodec* block_codec(DType t);

}  // namespace g4
