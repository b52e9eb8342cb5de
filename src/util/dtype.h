// Element types of tensors, in files and in backend memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace g4 {

enum class DType : uint8_t { F32, F16, BF16, Q8_0, I32, I64 };

// Q8_0 (GGUF's layout): blocks of 32 weights, each block = f16 scale + 32 int8 values.
inline constexpr int64_t kQ8BlockSize = 32;
inline constexpr int64_t kQ8BlockBytes = 34;

std::string dtype_name(DType t);
// Bytes of one row of `cols` elements (Q8_0 needs cols % 32 == 0).
size_t row_bytes(DType t, int64_t cols);

}  // namespace g4
