// Element types of tensors, in files and in backend memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace g4 {

// Q* are GGUF's block formats (llama.cpp's ggml types): a row is a sequence of blocks, each block a
// fixed number of weights stored in a fixed number of bytes (src/quant/block_formats.h has layouts).
// TQ4 is not a file type: the rows of a TurboQuant 4-bit KV cache (quant/tq4.h), whose layout
// depends on the head dimension, so a TQ4 tensor's elements are its bytes (backend/backend.h,
// kv_cache_cols, says how a row holds its head vectors).
enum class DType : uint8_t { F32, F16, BF16, Q8_0, I32, I64, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, TQ4 };

// Q8_0: blocks of 32 weights, each block = f16 scale + 32 int8 values.
inline constexpr int64_t kQ8BlockSize = 32;
inline constexpr int64_t kQ8BlockBytes = 34;
// K-quants group 256 weights in a super-block.
inline constexpr int64_t kQkBlockSize = 256;

std::string dtype_name(DType t);
// Weights a block holds (1 for element types) and the bytes it takes.
int64_t block_size(DType t);
size_t block_bytes(DType t);
inline bool is_block_quantized(DType t) { return block_size(t) > 1; }
// Bytes of one row of `cols` elements; throws unless cols is a multiple of the block size.
size_t row_bytes(DType t, int64_t cols);

}  // namespace g4
